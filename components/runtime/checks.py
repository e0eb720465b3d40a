"""Checks of the composed config that run before any model is loaded (cheap; no weights)."""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.registry import check_known_keys
from hydratune.components.data.stream_prepare import check_streaming
from hydratune.components.recipe import DATA_KINDS
from hydratune.components.runtime.diskspace import DiskFull, check_room_before_load, planned_run_dir
from hydratune.components.runtime.run import Components, batch_plan, world_size
from hydratune.components.runtime.split_checks import check_split
from hydratune.components.strategy import axis_refusal, own_loop_refusal


def check_train(cfg: DictConfig) -> None:
    """What the shared ``train:`` node's knobs mean together (each knob's range: ``check_values``)."""
    t = cfg.train
    if t.max_steps <= 0 and t.epochs <= 0:
        raise ConfigError("nothing to train: epochs <= 0 and max_steps <= 0", key="train.epochs")


def check_recipe_data(comps: Components) -> None:
    """The data option must hold what the recipe reads (``Recipe.data_kinds`` vs the data's ``kind``)."""
    recipe, data = comps.recipe, comps.data
    if data.kind in recipe.data_kinds:
        return
    wanted = " or ".join(DATA_KINDS[kind] for kind in recipe.data_kinds)
    raise ConfigError(
        f"recipe={recipe.name} needs {wanted}, got {DATA_KINDS[data.kind]} ({type(data).__name__})",
        key="data",
        hint=f"use data={recipe.demo()}, or a data option of that kind with your data.path",
    )


def check_combinations(cfg: DictConfig, comps: Components, device: str) -> None:
    """Cross-group rules: what cannot work together, said with what to change."""
    comps.precision.resolve(device)  # raises for bf16/fp16/tf32 the device cannot do
    inference = comps.recipe.inference_only  # generates with the model, trains nothing
    if comps.model.adapter and not inference:
        raise ConfigError(
            f"{comps.model.from_run} left an adapter alone: training starts from a whole model",
            key="model.from_run",
            hint=f"hydratune export {comps.model.from_run} (merges it into its base) and pass "
            "model.name_or_path=<the export dir>, or re-run that recipe with merge=true",
        )
    if comps.quantization.needs_adapter and not comps.peft.is_adapter and not inference:
        raise ConfigError(
            "a quantized base model cannot be trained directly: QLoRA trains an adapter on top of it",
            key="peft",
            hint="add peft=lora (or dora / ia3), or drop quantization",
        )
    if cfg.merge and not comps.peft.is_adapter:
        raise ConfigError(
            "merge=true needs an adapter to merge", key="merge", hint="use peft=lora or drop merge"
        )
    if cfg.merge and comps.quantization.enabled:
        raise ConfigError(
            "merging an adapter into a quantized base loses precision",
            key="merge",
            hint="merge offline into the unquantized base, or drop merge=true",
        )
    comps.optimizer.check_device(device)
    check_strategy(cfg, comps, device)
    check_loss_scaling(comps, device)
    weights = comps.model.dtype
    if comps.precision.resolve(device) == "fp16" and weights == "bfloat16":
        raise ConfigError(
            "precision=fp16 with model.dtype=bfloat16: fp16 loss scaling cannot unscale bf16 gradients",
            key="model.dtype",
            hint="use precision=bf16, or model.dtype=auto",
        )


def check_loss_scaling(comps: Components, device: str) -> None:
    """fp16 loss-scaling knobs: DeepSpeed's config takes them all, torch's GradScaler only some."""
    if comps.precision.resolve(device) == "fp16" and not comps.strategy.scales_loss:
        comps.precision.check_grad_scaler()


def check_strategy(cfg: DictConfig, comps: Components, device: str) -> None:
    """What the chosen strategy cannot do with the launcher, device, precision, quantization or the
    recipe's own loop; the strategy says its own part (``Strategy.check``, ``device_refusal``, its
    ``OwnLoop`` hooks' ``loop_refusal``)."""
    strategy, quant, recipe = comps.strategy, comps.quantization, comps.recipe
    world = world_size(comps)
    limit = strategy.max_processes
    if limit is not None and world > limit and not recipe.inference_only:  # inference: a model per process
        runs = "one process" if limit == 1 else f"at most {limit} processes"
        raise ConfigError(
            f"strategy {strategy.label} runs {runs}, but the launcher asks for {world}",
            key="strategy",
            hint="use strategy=ddp (or zero1/zero2/zero3/fsdp) with several processes",
        )
    plan = batch_plan(cfg, comps, device)
    strategy.check(plan, device)
    dtype = plan.dtype  # precision=auto resolved with the model's size
    refusal = axis_refusal(strategy, device, dtype)  # the engine's limits of its axes on this device
    refusal = refusal or strategy.device_refusal(device, dtype, recipe.owns_loop)
    if refusal is not None:
        raise refusal
    if cfg.merge and strategy.shards_parameters:
        raise ConfigError(
            f"merge=true cannot fold an adapter into {strategy.label}-sharded weights in the training job",
            key="merge",
            hint="drop merge and merge the saved adapter afterwards (peft's merge_and_unload on one device)",
        )
    check_split(cfg, comps, world, device, dtype)  # the model split over ranks: runtime/split_checks.py
    refusal = quant.sharding_refusal(dtype, strategy.label) if strategy.shards_parameters else None
    if refusal is None and recipe.owns_loop:
        refusal = own_loop_refusal(strategy, recipe, dtype)
    if refusal is not None:
        raise refusal


def check_freeze(comps: Components) -> None:
    """``model.freeze`` (a vision-language model's parts) leaves something to train: an adapter option
    trains the language model alone by default, so freezing it leaves nothing."""
    frozen = list(comps.model.freeze)
    if "language_model" in frozen and comps.peft.freezes_base and not comps.peft.adapts_vision:
        raise ConfigError(
            f"model.freeze={frozen} freezes the language model, which is all that "
            f"{type(comps.peft).__name__} adapts on a vision-language model by default: nothing would train",
            key="model.freeze",
            hint="drop language_model from model.freeze, or put adapters on the vision modules too "
            "(peft.exclude_modules=[])",
        )


def warnings_for(cfg: DictConfig, comps: Components, device: str = "cpu") -> list[str]:
    """Legal but suspicious settings: said once at start, never fatal."""
    notes = []
    try:
        config = comps.model.load_config()
        trained = str(getattr(config, "dtype", None))  # transformers 5: torch_dtype is a deprecated alias
    except Exception:  # no config reachable offline: nothing to compare with
        trained = None
    overflow = comps.precision.warn_model_dtype(trained, device)
    if overflow:
        notes.append(overflow)
    if comps.model.init == "pretrained" and comps.optimizer.lr > 1e-3:
        notes.append(
            f"optimizer.lr={comps.optimizer.lr:g} is very high for a pretrained model (the default is "
            "tuned for the tiny random-init demo): typical values are 1e-5..5e-5 (full), 1e-4..3e-4 (LoRA)"
        )
    notes += unmodelled_notes(comps)
    notes += schedule_warnings(cfg, comps)
    notes += split_warnings(cfg, comps)
    notes += comps.recipe.warnings(cfg, comps)
    return notes


def unmodelled_notes(comps: Components) -> list[str]:
    """What the memory estimate (and so the disk check and ``strategy=auto``) does not model of this model:
    said, never a refusal (the model trains all the same)."""
    from hydratune.components.memory.spec import arch_of_model

    try:
        arch = arch_of_model(comps.model)
    except ConfigError:  # no architecture numbers offline: nothing estimated
        return []
    return [f"memory estimate: {note}" for note in arch.unmodelled]


def split_warnings(cfg: DictConfig, comps: Components) -> list[str]:
    """Ulysses' loss weights each micro-batch of a sequence-parallel group alike: with accumulation or
    several data-parallel replicas that is not one process's token-weighted mean over the global batch."""
    mesh = comps.strategy.parallel.mesh(world_size(comps))
    if mesh.sp == 1 or (cfg.train.gradient_accumulation_steps == 1 and mesh.dp == 1):
        return []
    return [
        f"strategy.sp_size={mesh.sp} with {cfg.train.gradient_accumulation_steps} accumulation step(s) x "
        f"{mesh.dp} data-parallel replica(s): the Trainer's Ulysses loss averages the micro-batches' "
        "token means, where one process averages every label token of the global batch alike (equal when "
        "micro-batches hold as many label tokens; docs/nd_parallel.md)"
    ]


def schedule_warnings(cfg: DictConfig, comps: Components) -> list[str]:
    """A warmup as long as the whole run (known before load when ``train.max_steps`` caps it): the
    learning rate never reaches optimizer.lr."""
    steps, warmup = int(cfg.train.max_steps), int(comps.scheduler.warmup_steps)
    if steps <= 0 or warmup < steps:
        return []
    return [
        f"scheduler.warmup_steps={warmup} >= train.max_steps={steps}: the learning rate is still warming "
        f"up when training ends and never reaches optimizer.lr={comps.optimizer.lr:g} "
        "(lower scheduler.warmup_steps, or use scheduler.warmup_ratio)"
    ]


def stale_accelerate_env() -> list[str]:
    """``ACCELERATE_*`` variables left over from ``accelerate launch`` / an old shell: they would silently
    override the composed config (mixed precision, DeepSpeed, FSDP), so hydratune drops them."""
    import os

    keep = ("ACCELERATE_LOG_LEVEL", "ACCELERATE_DEBUG_MODE", "ACCELERATE_DISABLE_RICH")
    stale = sorted(k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_")) and k not in keep)
    for key in stale:
        del os.environ[key]
    return stale


def check_generated(cfg: DictConfig, comps: Components, device: str) -> None:
    """The generated DeepSpeed config, checked by DeepSpeed's own config class."""
    from hydratune.components.strategy import validate_deepspeed_config

    files = comps.strategy.files(batch_plan(cfg, comps, device), device)
    if "deepspeed.json" in files:
        validate_deepspeed_config(files["deepspeed.json"])


def check_disk(cfg: DictConfig, comps: Components, *, planned_elsewhere: bool) -> None:
    """A checkpoint and the final model fit the run dir's disk (runtime/diskspace.py). A plan for another
    host (``mode=plan`` of a GPU setup on a host without one) says so as a warning: its disk is elsewhere."""
    try:
        check_room_before_load(cfg, comps, planned_run_dir())
    except DiskFull as err:
        if not planned_elsewhere:
            raise
        logging.getLogger("hydratune").warning("%s (this host; check the GPU host's disk)", err)


def planned_for_gpus(cfg: DictConfig, device: str) -> bool:
    """``mode=plan`` of a GPU setup (``estimate.num_gpus`` / ``estimate.gpu_memory`` given) on a host that
    has none: the run's disk is the GPU host's."""
    estimate = cfg.get("estimate") or {}
    gpus_given = estimate.get("num_gpus", 0) or str(estimate.get("gpu_memory", "auto")) != "auto"
    return cfg.mode == "plan" and bool(gpus_given) and device == "cpu"


def check_before_load(cfg: DictConfig, comps: Components, device: str | None = None) -> str:
    """Everything that can be checked before weights are touched, cheapest first; returns the device
    (``device`` overrides detection: ``mode=plan`` plans for a GPU from a host without one)."""
    device_given = device is not None
    check_known_keys(cfg)
    if cfg.mode not in ("train", "plan"):
        raise ConfigError(f"unknown mode '{cfg.mode}'", key="mode", hint="train or plan")
    check_train(cfg)
    for _, component in comps.items():
        component.validate()
    check_recipe_data(comps)
    device = device or comps.strategy.resolve_device()  # first torch import
    check_combinations(cfg, comps, device)
    check_generated(cfg, comps, device)
    comps.recipe.check(cfg, comps)
    check_streaming(cfg, comps)  # data.streaming: what a stream cannot do
    # meta-device model: no weights, no memory; a VLM's vision modules are not adapted by default
    comps.peft.for_model(comps.model.adapter_exclusion()).check_targets(comps.model.module_names())
    check_freeze(comps)
    check_disk(cfg, comps, planned_elsewhere=device_given or planned_for_gpus(cfg, device))
    stale = stale_accelerate_env()
    if stale:
        logging.getLogger("hydratune").warning(
            "ignoring %s: the composed config decides precision and strategy", ", ".join(stale)
        )
    for note in warnings_for(cfg, comps, device):
        logging.getLogger("hydratune").warning(note)
    return device
