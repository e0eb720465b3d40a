"""Checks of the composed config that run before any model is loaded (cheap; no weights)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from components.config import GROUPS
from components.errors import ConfigError

if TYPE_CHECKING:
    from components.run import Components


def check_known_keys(cfg: DictConfig) -> None:
    """Keys forced in with ``+group.key=…`` that the option's schema does not know."""
    nodes = [(group, cfg[group]) for group in GROUPS if group != "tracker"]
    nodes += [(f"tracker.{name}", node) for name, node in (cfg.tracker or {}).items()]
    for path, node in nodes:
        schema = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(schema):
            continue
        known = {f.name for f in dataclasses.fields(schema)}
        for key in node:
            if key not in known:
                allowed = ", ".join(sorted(k for k in known if k != "_target_"))
                raise ConfigError(
                    f"unknown key '{key}' for {path} option '{schema.__name__}'",
                    key=f"{path}.{key}",
                    hint=f"known keys: {allowed}",
                )


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
        if t[key] < 0:
            raise ConfigError(f"must be >= 0, got {t[key]}", key=f"train.{key}")
    if t.max_grad_norm < 0:
        raise ConfigError("must be >= 0 (0 disables clipping)", key="train.max_grad_norm")


def check_combinations(cfg: DictConfig, comps: Components, device: str) -> None:
    """Cross-group rules: what cannot work together, said with what to change."""
    comps.precision.resolve(device)  # raises for bf16/fp16/tf32 the device cannot do
    if comps.quantization.needs_adapter and not comps.peft.is_adapter:
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
    weights = comps.model.dtype
    if comps.precision.resolve(device) == "fp16" and weights == "bfloat16":
        raise ConfigError(
            "precision=fp16 with model.dtype=bfloat16: fp16 loss scaling cannot unscale bf16 gradients",
            key="model.dtype",
            hint="use precision=bf16, or model.dtype=auto",
        )


def warnings_for(cfg: DictConfig, comps: Components) -> list[str]:
    """Legal but suspicious settings: said once at start, never fatal."""
    notes = []
    if comps.model.init == "pretrained" and comps.optimizer.lr > 1e-3:
        notes.append(
            f"optimizer.lr={comps.optimizer.lr:g} is very high for a pretrained model (the default is "
            "tuned for the tiny random-init demo): typical values are 1e-5..5e-5 (full), 1e-4..3e-4 (LoRA)"
        )
    return notes


def check_before_load(cfg: DictConfig, comps: Components) -> str:
    """Everything that can be checked before weights are touched, cheapest first; returns the device."""
    check_known_keys(cfg)
    check_train(cfg)
    for _, component in comps.items():
        validate = getattr(component, "validate", None)
        if callable(validate):
            validate()
    device = comps.strategy.resolve_device()  # first torch import
    check_combinations(cfg, comps, device)
    recipe_check = getattr(comps.recipe, "check", None)
    if callable(recipe_check):
        recipe_check(cfg, comps)
    comps.peft.check_targets(comps.model.module_names())  # meta-device model: no weights, no memory
    for note in warnings_for(cfg, comps):
        logging.getLogger("hydratune").warning(note)
    return device
