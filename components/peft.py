"""PEFT components: which parameters train. Full, freeze, BitFit, and peft's LoRA/DoRA/IA3/prefix/p-tuning.

Every option has ``apply(model) -> model`` (returns the model ready to train), ``check_targets(names)``
(run against the model built on the meta device, before weights load) and ``is_adapter`` (saving
writes the adapter only).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from components.errors import ConfigError
from components.registry import component

if TYPE_CHECKING:
    from torch import nn

TASK_TYPES = ("CAUSAL_LM", "SEQ_CLS")


def trainable_summary(model: nn.Module) -> str:
    """'trainable 12,345 / 1,234,567 params (1.00%)'."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return f"trainable {trainable:,} / {total:,} params ({100 * trainable / max(total, 1):.2f}%)"


def decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The decoder blocks: the longest ModuleList whose name ends in layers / h / blocks."""
    from torch import nn

    lists = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and re.search(r"(^|\.)(layers|h|blocks)$", name)
    ]
    if not lists:
        raise ConfigError(
            "cannot find the model's decoder layers", key="peft", hint="use peft.modules instead"
        )
    name, layers = max(lists, key=lambda item: len(item[1]))
    return [(f"{name}.{i}", layer) for i, layer in enumerate(layers)]


def matches(name: str, pattern: str) -> bool:
    """A parameter/module name matches a glob pattern anywhere along its dotted path."""
    return (
        fnmatch.fnmatch(name, pattern)
        or fnmatch.fnmatch(name, f"*.{pattern}")
        or (fnmatch.fnmatch(name, f"*.{pattern}.*") or fnmatch.fnmatch(name, f"{pattern}.*"))
    )


def linear_leaf_names(module_names: list[str]) -> list[str]:
    """Short names of the projection-like leaves, for error messages."""
    leaves = {n.rsplit(".", 1)[-1] for n in module_names if n}
    return sorted(x for x in leaves if not x.isdigit() and x not in ("layers", "model", "self_attn", "mlp"))


@dataclass
class Peft:
    """Base: every parameter trains."""

    @property
    def is_adapter(self) -> bool:
        return False

    def check_targets(self, module_names: list[str]) -> None:
        """Called with the meta-device model's module names before any weight is loaded."""

    def peft_config(self) -> Any:
        return None

    def apply(self, model: nn.Module) -> nn.Module:
        for p in model.parameters():
            p.requires_grad_(True)
        return model


@component("peft")
@dataclass
class FullFineTune(Peft):
    """Full fine-tuning: every parameter trains."""


def _freeze_all_but(model: nn.Module, keep: Any, what: str, key: str) -> nn.Module:
    """Set requires_grad from ``keep(name)``; refuse to train nothing."""
    n = 0
    for name, p in model.named_parameters():
        p.requires_grad_(bool(keep(name)))
        n += p.requires_grad
    if n == 0:
        raise ConfigError(f"{what} leaves no parameter to train on this model", key=key)
    return model


@component("peft")
@dataclass
class Freeze(Peft):
    """Freeze the model except its last ``last_n_layers`` decoder layers and the ``modules`` patterns."""

    last_n_layers: int = 2
    modules: list[str] = field(default_factory=list)  # e.g. [lm_head, norm]: glob patterns on names

    def check_targets(self, module_names: list[str]) -> None:
        if self.last_n_layers < 0:
            raise ConfigError("must be >= 0", key="peft.last_n_layers")
        for pattern in self.modules:
            if not any(matches(n, pattern) for n in module_names):
                raise ConfigError(
                    f"'{pattern}' matches no module of the model",
                    key="peft.modules",
                    hint=f"module names include: {', '.join(linear_leaf_names(module_names)[:20])}",
                )

    def apply(self, model: nn.Module) -> nn.Module:
        layers = decoder_layers(model)
        if self.last_n_layers > len(layers):
            raise ConfigError(f"the model has only {len(layers)} layers", key="peft.last_n_layers")
        open_prefixes = tuple(f"{name}." for name, _ in layers[len(layers) - self.last_n_layers :])

        def keep(name: str) -> bool:
            return name.startswith(open_prefixes) or any(matches(name, pat) for pat in self.modules)

        return _freeze_all_but(model, keep, "peft=freeze", "peft.last_n_layers")


@component("peft")
@dataclass
class BitFit(Peft):
    """BitFit: train only the bias terms (plus ``extra_modules``). peft has no tuner for it."""

    extra_modules: list[str] = field(default_factory=list)

    def apply(self, model: nn.Module) -> nn.Module:
        if not any(name.endswith("bias") for name, _ in model.named_parameters()):
            raise ConfigError(
                f"BitFit trains bias terms, and {type(model).__name__} has none (Llama/Mistral linear layers "
                "are bias-free): it would train nothing",
                key="peft",
                hint="use peft=lora, or a model with biases (Qwen2, GPT-2, or attention_bias=true)",
            )

        def keep(name: str) -> bool:
            return name.endswith("bias") or any(matches(name, pat) for pat in self.extra_modules)

        return _freeze_all_but(model, keep, "peft=bitfit", "peft")


@dataclass
class Adapter(Peft):
    """Base of the peft-library methods: ``task_type`` and the PeftModel wrapping."""

    task_type: str = "CAUSAL_LM"  # SEQ_CLS for reward models (the score head is then saved too)

    @property
    def is_adapter(self) -> bool:
        return True

    def apply(self, model: nn.Module) -> nn.Module:
        from peft import get_peft_model

        if self.task_type not in TASK_TYPES:
            raise ConfigError(
                f"unknown task_type '{self.task_type}'", key="peft.task_type", hint=f"{TASK_TYPES}"
            )
        for p in model.parameters():
            p.requires_grad_(False)
        return get_peft_model(model, self.peft_config())


@dataclass
class TargetedAdapter(Adapter):
    """Adapters attached to named modules: ``target_modules`` is ``all-linear`` or a list of names."""

    target_modules: Any = "all-linear"
    modules_to_save: list[str] | None = None

    def check_targets(self, module_names: list[str]) -> None:
        targets = self.target_modules
        if targets == "all-linear":
            return
        targets = [targets] if isinstance(targets, str) else list(targets)
        for target in targets:
            if not any(n == target or n.endswith(f".{target}") for n in module_names):
                raise ConfigError(
                    f"target module '{target}' matches no module of the model",
                    key="peft.target_modules",
                    hint=f"use all-linear or names such as {', '.join(linear_leaf_names(module_names)[:20])}",
                )

    def saved_modules(self) -> list[str] | None:
        """Reward models must save their freshly initialised score head, or it reloads random."""
        extra = list(self.modules_to_save or [])
        if self.task_type == "SEQ_CLS" and "score" not in extra:
            extra.append("score")
        return extra or None


@component("peft")
@dataclass
class LoRA(TargetedAdapter):
    """Low-rank adapters (peft LoRA); ``use_dora`` turns them into DoRA."""

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.05
    bias: str = "none"  # none | all | lora_only
    use_rslora: bool = False
    use_dora: bool = False
    init_lora_weights: Any = True

    def peft_config(self) -> Any:
        from peft import LoraConfig

        if self.r < 1:
            raise ConfigError(f"LoRA rank must be >= 1, got {self.r}", key="peft.r")
        if self.bias not in ("none", "all", "lora_only"):
            raise ConfigError("must be none, all or lora_only", key="peft.bias")
        return LoraConfig(
            task_type=self.task_type,
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            bias=self.bias,
            use_rslora=self.use_rslora,
            use_dora=self.use_dora,
            init_lora_weights=self.init_lora_weights,
            modules_to_save=self.saved_modules(),
        )


@component("peft")
@dataclass
class DoRA(LoRA):
    """Weight-decomposed low-rank adaptation: LoRA with a learned magnitude per output."""

    use_dora: bool = True


@component("peft")
@dataclass
class IA3(TargetedAdapter):
    """(IA)^3: learned rescaling vectors on attention and feed-forward activations."""

    target_modules: Any = field(default_factory=lambda: ["k_proj", "v_proj", "down_proj"])
    feedforward_modules: Any = field(default_factory=lambda: ["down_proj"])

    def peft_config(self) -> Any:
        from peft import IA3Config

        return IA3Config(
            task_type=self.task_type,
            target_modules=self.target_modules,
            feedforward_modules=self.feedforward_modules,
            modules_to_save=self.saved_modules(),
        )


@component("peft")
@dataclass
class PrefixTuning(Adapter):
    """Prefix tuning: trained key/value prefixes in every attention layer."""

    num_virtual_tokens: int = 16
    prefix_projection: bool = False
    encoder_hidden_size: int | None = None

    def peft_config(self) -> Any:
        from peft import PrefixTuningConfig

        kwargs = {"encoder_hidden_size": self.encoder_hidden_size} if self.encoder_hidden_size else {}
        return PrefixTuningConfig(
            task_type=self.task_type,
            num_virtual_tokens=self.num_virtual_tokens,
            prefix_projection=self.prefix_projection,
            **kwargs,
        )


@component("peft")
@dataclass
class PTuning(Adapter):
    """P-tuning: virtual prompt tokens produced by a small trained prompt encoder (MLP or LSTM)."""

    num_virtual_tokens: int = 16
    encoder_hidden_size: int = 128
    encoder_reparameterization_type: str = "MLP"  # MLP | LSTM

    def peft_config(self) -> Any:
        from peft import PromptEncoderConfig

        return PromptEncoderConfig(
            task_type=self.task_type,
            num_virtual_tokens=self.num_virtual_tokens,
            encoder_hidden_size=self.encoder_hidden_size,
            encoder_reparameterization_type=self.encoder_reparameterization_type,
        )


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Fold a LoRA/DoRA/IA3 adapter into the base weights (in place) and return the plain model."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        return model
    if model.peft_config[model.active_adapter].is_prompt_learning:
        raise ConfigError("prompt-learning adapters (prefix, ptuning) cannot be merged", key="merge")
    return model.merge_and_unload()
