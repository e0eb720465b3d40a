"""The PEFT options of the peft library: the ``PeftModel`` wrapping (:class:`Adapter`), adapters on named
modules (LoRA, DoRA, IA3: :class:`TargetedAdapter`), virtual tokens (prefix tuning, p-tuning:
:class:`PromptLearning`), and an adapter merged back into the weights (:func:`merge_and_unload`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, FRACTION, POSITIVE, knob
from hydratune.components.config.registry import component
from hydratune.components.memory.arch import (
    Arch,
    expert_lora_params,
    lora_inputs,
    lora_params,
    targeted_linears,
)
from hydratune.components.peft.selective import Peft
from hydratune.components.peft.targets import (
    CLASSIFIER_HEADS,
    as_targets,
    linear_leaf_names,
    module_matches,
)

if TYPE_CHECKING:
    from peft import PeftConfig
    from torch import nn

TASK_TYPES = ("CAUSAL_LM", "SEQ_CLS")
#: init_lora_weights values that need extra config or data this component does not expose
_UNSUPPORTED_INITS = ("eva", "corda", "loftq")
_PLAIN_INITS = ("gaussian", "olora", "pissa", "orthogonal", "mica")


@contextmanager
def _peft_errors(key: str, hint: str) -> Iterator[None]:
    """Report peft's ValueErrors about our settings as ConfigErrors naming the key."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as e:
        from peft.utils.error import NoMatchingPeftModuleError

        if isinstance(e, NoMatchingPeftModuleError):
            key, hint = "peft.target_modules", "use all-linear or the names of the model's linear layers"
        raise ConfigError(f"peft rejected the settings: {e}", key=key, hint=hint) from e


@dataclass(frozen=True)
class Adapter(Peft):
    """Base of the peft-library methods: ``task_type`` and the ``PeftModel`` wrapping."""

    task_type: str = "CAUSAL_LM"  # SEQ_CLS for reward models (their score head is then saved too)

    @property
    def is_adapter(self) -> bool:
        return True

    def for_task(self, task: str) -> Peft:
        """A sequence classifier's adapter is SEQ_CLS: peft then saves the fresh score head with it."""
        return dataclasses.replace(self, task_type="SEQ_CLS") if task == "seq_cls" else self

    def validate(self) -> None:
        if self.task_type not in TASK_TYPES:
            raise ConfigError(
                f"unknown task_type '{self.task_type}'",
                key="peft.task_type",
                hint=f"use one of {', '.join(TASK_TYPES)}",
            )

    def _config(self) -> PeftConfig:
        raise NotImplementedError

    def peft_config(self) -> PeftConfig:
        self.validate()
        with _peft_errors("peft", "check the peft.* settings"):
            return self._config()

    def apply(self, model: nn.Module) -> nn.Module:
        from peft import get_peft_model

        config = self.peft_config()
        with _peft_errors("peft", "check the peft.* settings"):
            return get_peft_model(model, config)


@dataclass(frozen=True)
class TargetedAdapter(Adapter):
    """Adapters on named modules: ``target_modules`` is ``all-linear``, a list of names or a regex."""

    target_modules: Any = "all-linear"  # all-linear | [q_proj, v_proj, ...] | a regex on full names
    modules_to_save: list[str] | None = None  # extra modules trained in full and saved with the adapter
    # modules never adapted: a list of names or a regex on full names (peft's exclude_modules); None: on a
    # vision-language model its vision tower and projector (the language model alone), else none; []: none
    exclude_modules: Any = None

    def for_model(self, exclusion: str | None) -> Peft:
        """Unset ``exclude_modules`` becomes ``exclusion`` (a VLM's vision tower and projector)."""
        if self.exclude_modules is None and exclusion:
            return dataclasses.replace(self, exclude_modules=exclusion)
        return self

    @property
    def adapts_vision(self) -> bool:
        return self.exclude_modules is not None

    def excluded(self) -> str | list[str] | None:
        """``exclude_modules`` as peft takes it (None or [] : nothing excluded)."""
        return as_targets(self.exclude_modules) if self.exclude_modules else None

    def is_excluded(self, name: str) -> bool:
        """peft's rule for ``exclude_modules``: a regex full-matches, a list entry matches by name suffix."""
        excluded = self.excluded()
        if excluded is None:
            return False
        if isinstance(excluded, str):
            return re.fullmatch(excluded, name) is not None
        return any(name == e or name.endswith(f".{e}") for e in excluded)

    def targets(self) -> str | list[str]:
        """``all-linear``, a list of names, or a regex string (peft full-matches it against module names)."""
        return as_targets(self.target_modules)

    def validate(self) -> None:
        super().validate()
        t = self.target_modules
        if not (isinstance(t, str) or (isinstance(t, list | tuple) and all(isinstance(x, str) for x in t))):
            raise ConfigError(
                f"must be all-linear, a list of module names or a regex, got {t!r}",
                key="peft.target_modules",
            )
        if isinstance(t, list | tuple) and not t:
            raise ConfigError("is empty", key="peft.target_modules", hint="use all-linear or name modules")
        if isinstance(t, str) and t != "all-linear":
            try:
                re.compile(t)
            except re.error as e:
                raise ConfigError(f"'{t}' is not a valid regex: {e}", key="peft.target_modules") from e

    def check_targets(self, module_names: list[str]) -> None:
        self.validate()
        targets = self.targets()
        module_names = [n for n in module_names if not self.is_excluded(n)]  # what peft may adapt
        hint = f"use all-linear or names such as {', '.join(linear_leaf_names(module_names)[:20])}"
        if targets == "all-linear":
            pass
        elif isinstance(targets, str):
            if not any(re.fullmatch(targets, n) for n in module_names):
                raise ConfigError(
                    f"regex '{targets}' matches no module name of the model (it must match the full name, "
                    "e.g. model.layers.0.self_attn.q_proj)",
                    key="peft.target_modules",
                    hint=hint,
                )
        else:
            for target in targets:
                if not module_matches(module_names, target):
                    raise ConfigError(
                        f"target module '{target}' matches no module of the model",
                        key="peft.target_modules",
                        hint=hint,
                    )
        # the names come from the causal-LM build, which has no classifier head
        for name in self.modules_to_save or []:
            if name not in CLASSIFIER_HEADS and not module_matches(module_names, name):
                raise ConfigError(
                    f"'{name}' matches no module of the model",
                    key="peft.modules_to_save",
                    hint="name whole modules such as lm_head or embed_tokens",
                )

    def saved_modules(self) -> list[str] | None:
        """``modules_to_save``, plus the score head for SEQ_CLS: it is freshly initialised, so an adapter
        saved without it would reload with a random head."""
        extra = list(self.modules_to_save or [])
        if self.task_type == "SEQ_CLS" and "score" not in extra:
            extra.append("score")
        return extra or None


@component("peft")
@dataclass(frozen=True)
class LoRA(TargetedAdapter):
    """Low-rank adapters (peft LoRA); ``use_dora=true`` makes them DoRA."""

    lora_adapter: ClassVar[bool] = True
    r: int = knob(16, AT_LEAST_ONE)  # the rank
    alpha: float = knob(32.0, POSITIVE)
    dropout: float = knob(0.05, FRACTION)
    bias: str = "none"  # none | all | lora_only
    use_rslora: bool = False  # scale by alpha/sqrt(r) instead of alpha/r
    use_dora: bool = False
    init_lora_weights: Any = True  # true | false | gaussian | olora | pissa | pissa_niter_<n> | orthogonal
    # a mixture's experts (fused 3-D parameters, not Linear modules): e.g. [mlp.experts.gate_up_proj,
    # mlp.experts.down_proj] beside named target_modules (all-linear already reaches the router and every
    # expert); peft puts r adapters per expert on each (LoraConfig.target_parameters)
    target_parameters: list[str] | None = None

    def trainable_params(self, arch: Arch) -> int:
        plain = lora_params(
            arch, self.r, self.target_modules, dora=self.use_dora, modules_to_save=self.modules_to_save
        )
        experts = expert_lora_params(arch, self.r, self.target_modules, self.target_parameters or [])
        return plain + arch.num_layers * experts

    def check_targets(self, module_names: list[str]) -> None:
        super().check_targets(module_names)
        experts = any(n.endswith(".experts") for n in module_names)
        if experts and self.targets() == "all-linear" and (self.dropout or self.use_dora):
            raise ConfigError(
                "on a mixture of experts, all-linear puts adapters on the experts too (peft's ParamWrapper), "
                "which take no dropout and no DoRA",
                key="peft.dropout" if self.dropout else "peft.use_dora",
                hint="peft.dropout=0 (peft=lora), or adapt the attention only: "
                "peft.target_modules=[q_proj,k_proj,v_proj,o_proj]",
            )
        for target in self.target_parameters or []:
            module = target.rpartition(".")[0]
            if not module or not any(n == module or n.endswith("." + module) for n in module_names):
                experts = sorted(
                    {n.split(".layers.")[-1].split(".", 1)[-1] for n in module_names if n.endswith("experts")}
                )
                raise ConfigError(
                    f"target parameter '{target}' names no module of the model",
                    key="peft.target_parameters",
                    hint=f"a mixture's experts, e.g. {experts[0]}.gate_up_proj and {experts[0]}.down_proj"
                    if experts
                    else "target_parameters reaches a mixture of experts' weights; this model has none",
                )

    def adapter_inputs(self, arch: Arch) -> int:
        return lora_inputs(arch, self.target_modules)

    @property
    def adapter_dropout(self) -> bool:
        return self.dropout > 0

    @property
    def trains_base_biases(self) -> bool:
        return self.bias != "none"

    def validate(self) -> None:
        super().validate()
        targets = self.target_parameters
        if targets is not None and (
            not isinstance(targets, list | tuple) or not all(isinstance(t, str) for t in targets)
        ):
            raise ConfigError(
                f"must be a list of parameter names, got {targets!r}", key="peft.target_parameters"
            )
        if targets and (self.dropout or self.use_dora):
            raise ConfigError(
                "adapters on expert parameters (peft's ParamWrapper) take no dropout and no DoRA",
                key="peft.dropout" if self.dropout else "peft.use_dora",
                hint="peft.dropout=0 (and peft=lora, not dora) with peft.target_parameters",
            )
        if self.bias not in ("none", "all", "lora_only"):
            raise ConfigError(
                f"unknown bias '{self.bias}'", key="peft.bias", hint="use none, all or lora_only"
            )
        init = self.init_lora_weights
        if isinstance(init, bool):
            return
        if init in _UNSUPPORTED_INITS:
            raise ConfigError(
                f"init_lora_weights={init} needs extra config or data that hydratune does not pass",
                key="peft.init_lora_weights",
                hint=f"use true, false or one of {', '.join(_PLAIN_INITS)}",
            )
        if not (init in _PLAIN_INITS or (isinstance(init, str) and re.fullmatch(r"pissa_niter_\d+", init))):
            raise ConfigError(
                f"unknown init_lora_weights {init!r}",
                key="peft.init_lora_weights",
                hint=f"use true, false or one of {', '.join(_PLAIN_INITS)}, pissa_niter_<n>",
            )

    def _config(self) -> PeftConfig:
        from peft import LoraConfig

        return LoraConfig(
            task_type=self.task_type,
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.targets(),
            bias=self.bias,
            use_rslora=self.use_rslora,
            use_dora=self.use_dora,
            init_lora_weights=self.init_lora_weights,
            modules_to_save=self.saved_modules(),
            target_parameters=list(self.target_parameters) if self.target_parameters else None,
            exclude_modules=self.excluded(),
        )


@component("peft")
@dataclass(frozen=True)
class DoRA(LoRA):
    """Weight-decomposed low-rank adaptation: LoRA plus a learned magnitude per output feature."""

    use_dora: bool = True


@component("peft")
@dataclass(frozen=True)
class IA3(TargetedAdapter):
    """(IA)^3: learned rescaling vectors on attention and feed-forward activations."""

    target_modules: Any = field(default_factory=lambda: ["k_proj", "v_proj", "down_proj"])
    feedforward_modules: Any = field(default_factory=lambda: ["down_proj"])  # subset of target_modules

    def feedforward(self) -> str | list[str]:
        """``feedforward_modules`` normalised like ``targets()``."""
        return as_targets(self.feedforward_modules)

    def trainable_params(self, arch: Arch) -> int:
        """One scale per input feature of a feed-forward module, per output feature of the others."""
        pairs, _ = targeted_linears(arch, self.target_modules)
        ff = self.feedforward_modules or []
        lin = arch.linears()
        per_layer = sum(
            lin[k][0] if k.rsplit(".", 1)[-1] in ff else lin[k][1]
            for k in lin
            if (lin[k][0], lin[k][1]) in pairs
        )
        return per_layer * arch.num_layers

    def validate(self) -> None:
        super().validate()
        targets, ff = self.targets(), self.feedforward()
        if isinstance(targets, list) and isinstance(ff, list) and not set(ff) <= set(targets):
            raise ConfigError(
                f"feedforward_modules {sorted(set(ff) - set(targets))} are not in target_modules",
                key="peft.feedforward_modules",
                hint="feedforward_modules must be a subset of target_modules",
            )

    def _config(self) -> PeftConfig:
        from peft import IA3Config

        return IA3Config(
            task_type=self.task_type,
            target_modules=self.targets(),
            feedforward_modules=self.feedforward(),
            modules_to_save=self.saved_modules(),
            exclude_modules=self.excluded(),
        )


@dataclass(frozen=True)
class PromptLearning(Adapter):
    """Base of the virtual-token methods (they cannot be merged into the weights)."""

    num_virtual_tokens: int = knob(16, AT_LEAST_ONE)

    adds_virtual_tokens: ClassVar[bool] = True


@component("peft")
@dataclass(frozen=True)
class PrefixTuning(PromptLearning):
    """Prefix tuning: trained key/value prefixes in every attention layer."""

    prefix_projection: bool = False  # reparameterise the prefixes through an MLP
    encoder_hidden_size: int | None = knob(None, AT_LEAST_ONE)  # that MLP's width (null: the key/value width)

    def trainable_params(self, arch: Arch) -> int:
        return self.num_virtual_tokens * 2 * arch.num_layers * arch.kv_dim

    def _config(self) -> PeftConfig:
        from peft import PrefixTuningConfig

        return PrefixTuningConfig(
            task_type=self.task_type,
            num_virtual_tokens=self.num_virtual_tokens,
            prefix_projection=self.prefix_projection,
            encoder_hidden_size=self.encoder_hidden_size,
        )


@component("peft")
@dataclass(frozen=True)
class PTuning(PromptLearning):
    """P-tuning (peft PromptEncoder): virtual tokens produced by a small trained MLP or LSTM."""

    encoder_hidden_size: int = knob(128, AT_LEAST_ONE)
    encoder_reparameterization_type: str = "MLP"  # MLP | LSTM

    def trainable_params(self, arch: Arch) -> int:
        h, enc = arch.hidden_size, self.encoder_hidden_size
        return self.num_virtual_tokens * h + 2 * h * enc + enc * enc

    def validate(self) -> None:
        super().validate()
        if self.encoder_reparameterization_type not in ("MLP", "LSTM"):
            raise ConfigError(
                f"unknown encoder '{self.encoder_reparameterization_type}'",
                key="peft.encoder_reparameterization_type",
                hint="use MLP or LSTM",
            )

    def _config(self) -> PeftConfig:
        from peft import PromptEncoderConfig

        return PromptEncoderConfig(
            task_type=self.task_type,
            num_virtual_tokens=self.num_virtual_tokens,
            encoder_hidden_size=self.encoder_hidden_size,
            encoder_reparameterization_type=self.encoder_reparameterization_type,
        )


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Fold a LoRA/DoRA/IA3 adapter into the base weights (in place) and return the plain model.

    Plain models come back unchanged; prompt-learning adapters (prefix, ptuning) cannot be merged."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        return model
    config = model.peft_config[model.active_adapter]
    if config.is_prompt_learning:
        raise ConfigError(
            f"{config.peft_type.value} adapters (virtual tokens) cannot be merged into the weights",
            key="merge",
            hint="set merge=false (the adapter is saved on its own), or use peft=lora",
        )
    return model.merge_and_unload()
