"""Checks of the composed config that run before any model is loaded (cheap; no weights)."""

from __future__ import annotations

import logging
import math

from omegaconf import DictConfig

from components.errors import ConfigError
from components.registry import check_known_keys
from components.run import Components, batch_plan, world_size


def check_train(cfg: DictConfig) -> None:
    """Ranges of the shared ``train:`` node."""
    t = cfg.train
    positive = ("micro_batch_size", "gradient_accumulation_steps", "log_every", "keep_last")
    for key in positive:
        if t[key] < 1:
            raise ConfigError(f"must be >= 1, got {t[key]}", key=f"train.{key}")
    if t.max_steps <= 0 and t.epochs <= 0:
        raise ConfigError("nothing to train: epochs <= 0 and max_steps <= 0", key="train.epochs")
    for key in ("eval_every", "save_every", "eval_generations", "num_workers"):
        if t[key] is not None and t[key] < 0:
            raise ConfigError(f"must be >= 0, got {t[key]}", key=f"train.{key}")
    if t.max_steps < -1:
        raise ConfigError(
            f"must be -1 or > 0, got {t.max_steps}",
            key="train.max_steps",
            hint="train.max_steps=-1 trains for train.epochs; a positive number caps the optimizer steps",
        )
    if not math.isfinite(t.max_grad_norm) or t.max_grad_norm < 0:
        raise ConfigError(
            f"must be a finite number >= 0, got {t.max_grad_norm}",
            key="train.max_grad_norm",
            hint="train.max_grad_norm=1.0 (0 disables clipping)",
        )


def require_preferences(recipe: str, comps: Components) -> None:
    """Reward and DPO need prompt / chosen / rejected data (their ``check``)."""
    if type(comps.data).__name__ != "PreferenceDataset":
        raise ConfigError(
            f"recipe={recipe} needs preference pairs, got {type(comps.data).__name__}",
            key="data",
            hint=f"use data=demo_{recipe} or a PreferenceDataset option with prompt/chosen/rejected columns",
        )


def require_prompts(recipe: str, comps: Components) -> None:
    """On-policy RL (PPO, GRPO) samples its own responses: it needs prompts (and the columns its rewards
    read)."""
    if type(comps.data).__name__ != "PromptDataset":
        raise ConfigError(
            f"recipe={recipe} needs prompts, got {type(comps.data).__name__}",
            key="data",
            hint=f"use data=demo_{recipe} or a PromptDataset option with a prompt column",
        )


def check_combinations(cfg: DictConfig, comps: Components, device: str) -> None:
    """Cross-group rules: what cannot work together, said with what to change."""
    comps.precision.resolve(device)  # raises for bf16/fp16/tf32 the device cannot do
    inference = getattr(comps.recipe, "inference_only", False)  # generates with the model, trains nothing
    if getattr(comps.model, "adapter", None) and not inference:
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
    check_device(comps.optimizer, device)
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
    from components.strategy import DeepSpeed

    if comps.precision.resolve(device) == "fp16" and not isinstance(comps.strategy, DeepSpeed):
        comps.precision.check_grad_scaler()


def check_device(component: object, device: str) -> None:
    check = getattr(component, "check_device", None)
    if callable(check):
        check(device)


def check_strategy(cfg: DictConfig, comps: Components, device: str) -> None:
    """What the chosen strategy cannot do with the launcher, device, precision or quantization."""
    from components.strategy import FSDP, DeepSpeed, Single

    strategy, quant = comps.strategy, comps.quantization
    name = type(strategy).__name__
    inference = getattr(comps.recipe, "inference_only", False)  # each process holds the whole model
    if isinstance(strategy, Single) and world_size(comps) > 1 and not inference:
        raise ConfigError(
            f"strategy=single runs one process, but the launcher asks for {world_size(comps)}",
            key="strategy",
            hint="use strategy=ddp (or zero1/zero2/zero3/fsdp) with several processes",
        )
    # a loop that calls fully_shard itself (PPO) runs FSDP2 over gloo; accelerate's plugin cannot
    own_fsdp = getattr(comps.recipe, "shards_with_fully_shard", False)
    if isinstance(strategy, FSDP) and device != "cuda" and not own_fsdp:
        raise ConfigError(
            f"FSDP needs GPUs: on {device} accelerate silently falls back to DDP",
            key="strategy",
            hint="use strategy=ddp or a DeepSpeed zero stage on CPU (recipe=ppo runs FSDP2 on CPU)",
        )
    if isinstance(strategy, DeepSpeed):
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(
                f"strategy {name} (ZeRO-{strategy.stage}) needs deepspeed, which is not installed",
                key="strategy",
                hint="pip install 'hydratune[deepspeed]'",
            )
        if device == "cpu" and comps.precision.resolve(device) != "fp32":
            raise ConfigError(
                "DeepSpeed on CPU trains in fp32 only (no bf16/fp16 engine on CPU)",
                key="precision",
                hint="precision=fp32 on CPU, or run on GPUs",
            )
        check_zero_partitions(cfg, comps, device)
        check_zeropp_device(comps, device)
    if cfg.merge and strategy.shards_parameters:
        raise ConfigError(
            f"merge=true cannot fold an adapter into {name}-sharded weights in the training job",
            key="merge",
            hint="drop merge and merge the saved adapter afterwards (peft's merge_and_unload on one device)",
        )
    if quant.enabled and strategy.shards_parameters:
        storage = getattr(quant, "quant_storage", "uint8")
        dtype = comps.precision.resolve(device)
        if getattr(quant, "bits", 4) == 8:
            raise ConfigError(
                "8-bit (LLM.int8) weights cannot be sharded by ZeRO-3 / FSDP",
                key="quantization",
                hint="use quantization=nf4 with quantization.quant_storage=" + dtype + ", or strategy=zero2",
            )
        if storage != dtype:
            raise ConfigError(
                f"sharding 4-bit weights under {name} needs quantization.quant_storage to match the "
                f"training dtype ({dtype}); it is {storage}",
                key="quantization.quant_storage",
                hint=f"quantization.quant_storage={dtype}",
            )


def check_zero_partitions(cfg: DictConfig, comps: Components, device: str) -> None:
    """ZeRO++ hpZ's secondary partition must tile the world: whole groups of ranks (GPUs of a node)."""
    plan = batch_plan(cfg, comps, device)
    hpz = comps.strategy.hpz_partition_size(plan)
    if hpz > 1 and plan.world_size % hpz:
        raise ConfigError(
            f"ZeRO++ hpZ partition size {hpz} does not divide the {plan.world_size} process(es)",
            key="strategy.zero_hpz_partition_size",
            hint="null (= launcher.nproc_per_node, the GPUs per node) or a divisor of the world size",
        )


def check_zeropp_device(comps: Components, device: str) -> None:
    """ZeRO++ qwZ / qgZ quantize with DeepSpeed's CUDA quantizer kernels (``QuantizerBuilder``), which a
    CPU host cannot build: refused here rather than when the model is partitioned."""
    s = comps.strategy
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        if getattr(s, key, False) and device != "cuda":
            raise ConfigError(
                f"ZeRO++ {key} needs DeepSpeed's CUDA quantizer kernels (no {device} implementation)",
                key=f"strategy.{key}",
                hint="run zero3pp on GPUs, or strategy=zero3 on this host",
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
    return notes


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
    from components.strategy import validate_deepspeed_config

    files = comps.strategy.files(batch_plan(cfg, comps, device), device)
    if "deepspeed.json" in files:
        validate_deepspeed_config(files["deepspeed.json"])


def check_before_load(cfg: DictConfig, comps: Components, device: str | None = None) -> str:
    """Everything that can be checked before weights are touched, cheapest first; returns the device
    (``device`` overrides detection: ``mode=plan`` plans for a GPU from a host without one)."""
    check_known_keys(cfg)
    if cfg.mode not in ("train", "plan"):
        raise ConfigError(f"unknown mode '{cfg.mode}'", key="mode", hint="train or plan")
    check_train(cfg)
    for _, component in comps.items():
        validate = getattr(component, "validate", None)
        if callable(validate):
            validate()
    device = device or comps.strategy.resolve_device()  # first torch import
    check_combinations(cfg, comps, device)
    check_generated(cfg, comps, device)
    recipe_check = getattr(comps.recipe, "check", None)
    if callable(recipe_check):
        recipe_check(cfg, comps)
    comps.peft.check_targets(comps.model.module_names())  # meta-device model: no weights, no memory
    stale = stale_accelerate_env()
    if stale:
        logging.getLogger("hydratune").warning(
            "ignoring %s: the composed config decides precision and strategy", ", ".join(stale)
        )
    for note in warnings_for(cfg, comps, device):
        logging.getLogger("hydratune").warning(note)
    return device
