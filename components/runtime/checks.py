"""Checks of the composed config that run before any model is loaded (cheap; no weights)."""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.registry import check_known_keys
from hydratune.components.data.stream_prepare import check_streaming
from hydratune.components.distributed.mesh import Mesh
from hydratune.components.recipe import DATA_KINDS
from hydratune.components.runtime.diskspace import DiskFull, check_room_before_load, planned_run_dir
from hydratune.components.runtime.run import Components, batch_plan, world_size
from hydratune.components.strategy import own_loop_refusal


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
    check_vision_split(comps)
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
    refusal = strategy.device_refusal(device, dtype, recipe.owns_loop)
    if refusal is not None:
        raise refusal
    if cfg.merge and strategy.shards_parameters:
        raise ConfigError(
            f"merge=true cannot fold an adapter into {strategy.label}-sharded weights in the training job",
            key="merge",
            hint="drop merge and merge the saved adapter afterwards (peft's merge_and_unload on one device)",
        )
    check_split(cfg, comps, device, dtype)
    refusal = strategy.combination_refusal(recipe, comps.peft, quant, dtype, comps.data, comps.model)
    if refusal is None and strategy.shards_parameters:
        refusal = quant.sharding_refusal(dtype, strategy.label)
    if refusal is None and recipe.owns_loop:
        refusal = own_loop_refusal(strategy, recipe, dtype)
    if refusal is not None:
        raise refusal


def split_recipe_refusal(recipe: Any) -> str | None:
    """Why ``recipe`` cannot train a model split over ranks (tensor, sequence or expert parallel), None when
    it can: the split engines are verified with the Trainer recipes that declare ``splits_model``."""
    if recipe.inference_only:
        return "trains nothing (one whole model per process)"
    if recipe.owns_loop:
        return "runs its own loop, which does not split a model"
    if not recipe.splits_model:
        return "is not one the split engines are verified with (recipe=sft is)"
    return None


def check_split(cfg: DictConfig, comps: Components, device: str, dtype: str) -> None:
    """A model split over ranks (``strategy.tp_size`` / ``strategy.sp_size``): the mesh divides the world,
    the model's heads and sizes divide by it, and nothing it cannot go with is asked for (the recipe, the
    engine's knobs, quantization, PEFT, the attention on packed rows), each refused with its fix. ``dtype``:
    the run's resolved precision (``batch_plan``)."""
    from hydratune.components.distributed.mesh import ModelDims, check_model

    split, recipe = comps.strategy.model_split, comps.recipe
    mesh = split.mesh(world_size(comps))
    if mesh.ep > 1:
        check_expert_split(comps, mesh)
    if mesh.tp == 1 and mesh.sp == 1:  # data parallel, or pipeline stages (strategy=pipeline checks those)
        return
    knob = "strategy.tp_size" if mesh.tp > 1 else "strategy.sp_size"
    what = "tensor parallel" if mesh.tp > 1 else "sequence parallel"
    drop = f"drop {knob} (or set it to 1)"
    mesh.check()
    why = split_recipe_refusal(recipe)
    if why is not None:
        raise ConfigError(f"{what} ({knob}): recipe={recipe.name} {why}", key=knob, hint=drop)
    refusal = split.split_refusal(device, dtype)
    if refusal is not None:
        raise refusal
    peft = type(comps.peft).__name__
    refused = [  # (refused, key, why, fix)
        (
            comps.quantization.enabled,
            "quantization",
            f"{what} with a quantized base: the engines split torch Linear layers, not bitsandbytes' ones",
            f"quantization=none, or {drop}",
        ),
        (
            mesh.tp > 1 and comps.peft.enabled,
            "peft",
            f"tensor parallel with peft={peft}: the engines (DeepSpeed AutoTP, DTensor in pipeline stages) "
            "split the base layers and leave an adapter's layers whole beside them (not supported)",
            "peft=none (full fine-tuning), or strategy.sp_size for long sequences with an adapter",
        ),
        (
            mesh.sp > 1 and comps.peft.adds_virtual_tokens,
            "peft",
            f"sequence parallel with {peft}: its virtual tokens are prepended to every row, so the ranks' "
            "slices of a row would not be the row",
            "peft=lora, or drop strategy.sp_size",
        ),
    ]
    for bad, key, why, fix in refused:
        if bad:
            raise ConfigError(why, key=key, hint=fix)
    check_model(mesh, ModelDims.from_config(comps.model.load_config()))
    if mesh.sp > 1:
        check_sequence_split(cfg, comps, device)


def check_expert_split(comps: Components, mesh: Mesh) -> None:
    """Expert parallel (``strategy.ep_size``): the mesh divides, the model is a mixture whose experts ep
    divides, and only what is verified with it is asked for (a Trainer recipe, full fine-tuning, no
    quantization), each refused with its fix."""
    from hydratune.components.distributed.mesh import ModelDims, check_model
    from hydratune.components.distributed.model_parallel import AUTOEP_MODEL_TYPES

    recipe, drop = comps.recipe, "strategy.ep_size=1"
    unverified = split_recipe_refusal(recipe)
    mesh.check()
    refused = [
        (
            unverified is not None,
            "strategy.ep_size",
            f"expert parallel: recipe={recipe.name} {unverified}",
            drop,
        ),
        (
            comps.peft.enabled,
            "peft",
            f"expert parallel with peft={type(comps.peft).__name__.lower()}: adapters on split experts are "
            "not verified",
            f"peft=none (full fine-tuning), or {drop}",
        ),
        (
            comps.quantization.enabled,
            "quantization",
            "expert parallel with a quantized base is not supported",
            f"quantization=none, or {drop}",
        ),
        (  # DeepSpeed builds the optimizer after AutoEP (the experts in their own groups): its Adam only
            not comps.optimizer.deepspeed_cpu_adam,
            "optimizer",
            f"expert parallel trains with DeepSpeed's own AdamW (built after the experts are split, each in "
            f"its own group); optimizer={type(comps.optimizer).__name__.lower()} is not one it builds",
            f"optimizer=adamw, or {drop}",
        ),
    ]
    for bad, key, why, fix in refused:
        if bad:
            raise ConfigError(why, key=key, hint=fix)
    config = comps.model.load_config()
    check_model(mesh, ModelDims.from_config(config))
    kind = getattr(getattr(config, "text_config", config), "model_type", None)
    if kind not in AUTOEP_MODEL_TYPES:
        raise ConfigError(
            f"expert parallel splits the experts of {', '.join(AUTOEP_MODEL_TYPES)} models here (gathered "
            f"back whole for final/ and verified against one process); this model is {kind}",
            key="strategy.ep_size",
            hint=f"{drop} (the experts stay whole on every rank; ZeRO still shards the optimizer state)",
        )


def check_vision_split(comps: Components) -> None:
    """A vision-language model is not split over ranks: tensor / sequence parallel and pipeline stages
    know a decoder's layers, not an image encoder beside them (not verified: refused). Data parallel, FSDP
    and ZeRO keep whole models (or shard parameters) and pass."""
    if not comps.model.is_vision:
        return
    split = comps.strategy.model_split
    mesh = split.mesh(world_size(comps))
    dims = [(f"strategy.{d}_size", size) for d, size in (("tp", mesh.tp), ("sp", mesh.sp), ("pp", mesh.pp))]
    dims = [(knob, size) for knob, size in dims if size > 1]
    if dims or split.splits_layers:
        knob = dims[0][0] if dims else "strategy"
        raise ConfigError(
            f"{comps.model.name_or_path} is a vision-language model: splitting it over ranks "
            "(tensor / sequence parallel, pipeline stages) is not supported",
            key=knob,
            hint="use data parallel, FSDP or ZeRO (strategy=ddp / fsdp / zero2 / zero3 ...)",
        )


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


def check_sequence_split(cfg: DictConfig, comps: Components, device: str) -> None:
    """The attention the model is built with keeps documents apart on the rows the engine splits (packed
    rows need one that reads the position ids), and on gloo the collator's collective runs in the
    training process."""
    packed = comps.data.kind == "chat" and comps.data.packing
    refusal = comps.strategy.model_split.sequence_refusal(comps.model.resolved_attn_implementation(), packed)
    if refusal is not None:
        raise refusal
    if device == "cpu" and cfg.train.num_workers:
        raise ConfigError(
            "sequence parallel on CPU pads every rank's batch to the longest of the step (gloo's all-gather "
            "takes equal shapes): a collective the data collator runs, so not in dataloader workers",
            key="train.num_workers",
            hint="train.num_workers=0 (the default on CPU)",
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
    notes += schedule_warnings(cfg, comps)
    notes += split_warnings(cfg, comps)
    notes += comps.recipe.warnings(cfg, comps)
    return notes


def split_warnings(cfg: DictConfig, comps: Components) -> list[str]:
    """Ulysses' loss weights each micro-batch of a sequence-parallel group alike: with accumulation or
    several data-parallel replicas that is not one process's token-weighted mean over the global batch."""
    mesh = comps.strategy.model_split.mesh(world_size(comps))
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
    axis = comps.strategy.as_pipeline()  # strategy.pp_size on ddp / zero0-1: pipeline_axis rewrites it first
    if axis is not None:
        raise ConfigError(
            f"strategy.pp_size on {type(comps.strategy).__name__} trains as {' '.join(axis)}, which the "
            "hydratune command puts in before these checks (components/runtime/run.py pipeline_axis); this "
            "config skipped it",
            key="strategy.pp_size",
            hint=f"run it through the hydratune command, or compose {' '.join(axis)}",
        )
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
