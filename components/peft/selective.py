"""The PEFT options that choose which of the model's own parameters train, no adapter: the :class:`Peft`
base every option extends (all of them train), full fine-tuning, freeze (the last layers and named
modules), BitFit (the bias terms)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import NON_NEGATIVE, knob
from hydratune.components.config.registry import component
from hydratune.components.memory.arch import Arch, extra_module_params, param_counts
from hydratune.components.peft.targets import (
    check_patterns,
    count_layers,
    decoder_layers,
    matches,
    set_trainable,
)

if TYPE_CHECKING:
    from peft import PeftConfig
    from torch import nn


@dataclass(frozen=True)
class Peft:
    """Base of every PEFT option: all parameters train, no adapter."""

    #: a parameter-efficient method: only some parameters train (False only for full fine-tuning)
    enabled: ClassVar[bool] = True
    #: virtual tokens are prepended to every row (prompt learning): flattened rows would share them
    adds_virtual_tokens: ClassVar[bool] = False
    #: a LoRA adapter: another one (a LoRA reward run's) can sit beside it on the same PeftModel and base
    lora_adapter: ClassVar[bool] = False

    def trainable_params(self, arch: Arch) -> int:
        """Parameters the optimizer updates on ``arch`` (the memory estimate's count; no model built)."""
        return param_counts(arch).total

    def adapter_inputs(self, arch: Arch) -> int:
        """Input features summed over one layer's adapted linears: what LoRA keeps for backward."""
        return 0

    @property
    def adapter_dropout(self) -> bool:
        """The adapter applies dropout to its inputs (a mask per input element is kept)."""
        return False

    def for_task(self, task: str) -> Peft:
        """This option for a model of ``task`` (``seq_cls``: a reward model's score head): itself here."""
        return self

    def for_model(self, exclusion: str | None) -> Peft:
        """This option on a model whose modules matching ``exclusion`` (a vision-language model's vision
        tower and projector: ``CausalLM.adapter_exclusion``) take no adapter by default: itself here."""
        return self

    @property
    def adapts_vision(self) -> bool:
        """Its adapters may sit on a vision-language model's vision modules (the user set which modules
        are excluded); False: none there (the default), or no adapter at all."""
        return False

    @property
    def is_adapter(self) -> bool:
        """True when ``apply`` returns a ``peft.PeftModel`` (saving then writes the adapter only)."""
        return False

    @property
    def trains_base_biases(self) -> bool:
        """Its adapter trains the base's own biases too (LoRA's ``bias``): another adapter on the same base
        (PPO's critic adapter) would share them."""
        return False

    @property
    def freezes_base(self) -> bool:
        """True when the base weights all stay frozen and only the adapter is saved: the base may then
        load in bf16 (see CausalLM.weight_dtype)."""
        return self.is_adapter

    def validate(self) -> None:
        """Check the fields alone beyond their declared ranges (cheap: no torch); raises ConfigError."""

    def check_targets(self, module_names: list[str]) -> None:
        """Check names against the meta-device model's module names, before any weight loads."""

    def peft_config(self) -> PeftConfig | None:
        """The ``peft`` config this option builds (None when peft is not involved)."""
        return None

    def apply(self, model: nn.Module) -> nn.Module:
        """Return ``model`` ready to train."""
        for p in model.parameters():
            p.requires_grad_(True)
        return model


@component("peft")
@dataclass(frozen=True)
class FullFineTune(Peft):
    """Full fine-tuning: every parameter trains."""

    enabled: ClassVar[bool] = False


@component("peft")
@dataclass(frozen=True)
class Freeze(Peft):
    """Freeze the model except its last ``last_n_layers`` decoder layers and the ``modules`` patterns."""

    last_n_layers: int = knob(1, NON_NEGATIVE)  # 0: only the modules patterns train
    modules: list[str] = field(default_factory=list)  # glob patterns on parameter names, e.g. [lm_head, norm]

    def trainable_params(self, arch: Arch) -> int:
        layers = min(self.last_n_layers, arch.num_layers)
        return layers * param_counts(arch).layer + extra_module_params(arch, self.modules)

    def validate(self) -> None:
        if self.last_n_layers == 0 and not self.modules:
            raise ConfigError(
                "peft=freeze with last_n_layers=0 and no modules trains nothing",
                key="peft.last_n_layers",
                hint="set peft.last_n_layers>=1 or list modules, e.g. peft.modules=[lm_head]",
            )

    def check_targets(self, module_names: list[str]) -> None:
        self.validate()
        n_layers = count_layers(module_names)
        if n_layers is not None and self.last_n_layers > n_layers:
            raise ConfigError(
                f"the model has only {n_layers} decoder layers, last_n_layers={self.last_n_layers}",
                key="peft.last_n_layers",
                hint=f"use at most {n_layers}, or peft=none to train everything",
            )
        check_patterns(self.modules, module_names, "peft.modules")

    def apply(self, model: nn.Module) -> nn.Module:
        self.validate()
        layers = decoder_layers(model) if self.last_n_layers else []
        if self.last_n_layers > len(layers):
            raise ConfigError(f"the model has only {len(layers)} decoder layers", key="peft.last_n_layers")
        open_prefixes = tuple(f"{name}." for name, _ in layers[len(layers) - self.last_n_layers :])

        def keep(name: str) -> bool:
            return name.startswith(open_prefixes) or any(matches(name, pat) for pat in self.modules)

        return set_trainable(
            model, keep, "peft=freeze", "peft.modules", "raise peft.last_n_layers or fix peft.modules"
        )


@component("peft")
@dataclass(frozen=True)
class BitFit(Peft):
    """BitFit: train only the bias terms (plus ``extra_modules`` patterns). peft has no tuner for it."""

    extra_modules: list[str] = field(default_factory=list)  # glob patterns kept trainable, e.g. [lm_head]

    def trainable_params(self, arch: Arch) -> int:
        counts = param_counts(arch)
        return counts.layer_bias * arch.num_layers + extra_module_params(arch, self.extra_modules)

    def check_targets(self, module_names: list[str]) -> None:
        check_patterns(self.extra_modules, module_names, "peft.extra_modules")

    def apply(self, model: nn.Module) -> nn.Module:
        if not any(name.endswith("bias") for name, _ in model.named_parameters()):
            raise ConfigError(
                f"BitFit trains bias terms and {type(model).__name__} has none (Llama/Mistral linear layers "
                "are bias-free), so BitFit would train nothing on this model",
                key="peft",
                hint="use peft=lora, or a model with biases (Qwen2, GPT-2, or model.architecture."
                "attention_bias=true as in the tiny default)",
            )

        def keep(name: str) -> bool:
            return name.endswith("bias") or any(matches(name, pat) for pat in self.extra_modules)

        return set_trainable(model, keep, "peft=bitfit", "peft", "use peft=lora")
