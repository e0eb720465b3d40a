"""PEFT components: which parameters train. Full, freeze, BitFit, and peft's LoRA/DoRA/IA3/prefix/p-tuning.

Every option has ``validate()`` (field checks, no torch), ``check_targets(names)`` (run against the
model built on the meta device, before weights load), ``apply(model) -> model`` (the model ready to
train), ``peft_config()`` (the ``peft.PeftConfig``, or None), ``is_adapter`` (saving writes the
adapter only) and ``trainable_params(arch)`` (what it trains, for the memory estimate). Nothing here
loads weights from a hub.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, knob
from hydratune.components.config.registry import component
from hydratune.components.memory.arch import (
    Arch,
    expert_lora_params,
    extra_module_params,
    lora_inputs,
    lora_params,
    param_counts,
    targeted_linears,
)

if TYPE_CHECKING:
    from peft import PeftConfig
    from torch import nn

TASK_TYPES = ("CAUSAL_LM", "SEQ_CLS")
#: heads of sequence-classification (reward) models: freshly initialised, so they must train and be saved
CLASSIFIER_HEADS = ("score", "classifier")
#: init_lora_weights values that need extra config or data this component does not expose
_UNSUPPORTED_INITS = ("eva", "corda", "loftq")
_PLAIN_INITS = ("gaussian", "olora", "pissa", "orthogonal", "mica")
_LAYER_LIST = re.compile(r"^(?:(?P<prefix>.*)\.)?(?:layers|h|blocks)\.(?P<index>\d+)$")
_NOT_LINEAR = re.compile(r"norm|emb|act|drop|rotary|pool", re.IGNORECASE)


# ---- helpers -------------------------------------------------------------------------------------
def trainable_summary(model: nn.Module) -> str:
    """'trainable 12,345 / 1,234,567 params (1.00%)'."""

    def size(p: nn.Parameter) -> int:
        return int(getattr(p, "ds_numel", p.numel()))  # ZeRO-3 partitions leave an empty local tensor

    total = sum(size(p) for p in model.parameters())
    trainable = sum(size(p) for p in model.parameters() if p.requires_grad)
    return f"trainable {trainable:,} / {total:,} params ({100 * trainable / max(total, 1):.2f}%)"


def decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The decoder blocks as (qualified name, module): the longest ModuleList named layers / h / blocks, a
    vision-language model's image encoder passed over."""
    from torch import nn

    from hydratune.components.modeling.vision import in_vision_part

    lists = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and re.search(r"(^|\.)(layers|h|blocks)$", name)
        and not in_vision_part(name)
    ]
    if not lists:
        raise ConfigError(
            f"cannot find the decoder layers of {type(model).__name__} (no ModuleList named layers/h/blocks)",
            key="peft.last_n_layers",
            hint="set peft.last_n_layers=0 and list what should train in peft.modules",
        )
    name, layers = max(lists, key=lambda item: len(item[1]))
    return [(f"{name}.{i}", layer) for i, layer in enumerate(layers)]


def count_layers(module_names: list[str]) -> int | None:
    """Number of decoder layers judged from module names alone (None if there is no layer list)."""
    from hydratune.components.modeling.vision import in_vision_part

    counts: dict[str, int] = {}
    for name in module_names:
        m = _LAYER_LIST.match(name)
        if m and in_vision_part(name):  # a vision-language model's image encoder is not the decoder
            continue
        if m:
            prefix = m.group("prefix") or ""
            counts[prefix] = max(counts.get(prefix, 0), int(m.group("index")) + 1)
    return max(counts.values()) if counts else None


def matches(name: str, pattern: str) -> bool:
    """A parameter/module name matches a glob pattern as a whole dotted segment run anywhere in it.

    ``lm_head`` matches ``lm_head.weight``; ``norm`` matches ``model.norm.weight`` but not
    ``model.layers.0.input_layernorm.weight``; ``*layernorm*`` matches every layernorm.
    """
    return any(
        fnmatch.fnmatchcase(name, p) for p in (pattern, f"*.{pattern}", f"{pattern}.*", f"*.{pattern}.*")
    )


def linear_leaf_names(module_names: list[str]) -> list[str]:
    """Short names of the leaf modules that look like linear layers (for error messages)."""
    names = set(module_names)
    parents = {n.rsplit(".", 1)[0] for n in names if "." in n}
    leaves = {n.rsplit(".", 1)[-1] for n in names if n and n not in parents}
    return sorted(x for x in leaves if not x.isdigit() and not _NOT_LINEAR.search(x))


def _as_targets(value: Any) -> str | list[str]:
    """A bare module name becomes a one-item list (peft would full-match a string against whole names);
    ``all-linear`` and regexes stay strings."""
    if isinstance(value, str):
        return [value] if value != "all-linear" and re.fullmatch(r"\w+", value) else value
    return [str(x) for x in value]


def _module_matches(module_names: list[str], target: str) -> bool:
    """peft's rule for a list entry: the module's name equals ``target`` or ends with ``.target``."""
    return any(n == target or n.endswith(f".{target}") for n in module_names)


def _is_seq_cls(model: nn.Module) -> bool:
    return type(model).__name__.endswith("ForSequenceClassification")


def _set_trainable(
    model: nn.Module, keep: Callable[[str], bool], what: str, key: str, hint: str
) -> nn.Module:
    """Set ``requires_grad`` from ``keep(name)``; refuse to train nothing.

    Tied parameters (``lm_head.weight`` is ``embed_tokens.weight``) train if any of their names is kept;
    a sequence classifier's fresh head always trains (it would stay random otherwise).
    """
    heads = tuple(f"{h}." for h in CLASSIFIER_HEADS) if _is_seq_cls(model) else ()
    wanted: dict[int, bool] = {}
    params: dict[int, nn.Parameter] = {}
    head_ids: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        params[id(p)] = p
        wanted[id(p)] = wanted.get(id(p), False) or bool(keep(name))
        if name.startswith(heads):
            head_ids.add(id(p))
    if not any(want for pid, want in wanted.items() if pid not in head_ids):
        raise ConfigError(
            f"{what} leaves no parameter of {type(model).__name__} to train", key=key, hint=hint
        )
    for pid, p in params.items():
        p.requires_grad_(wanted[pid] or pid in head_ids)
    return model


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


def _check_patterns(patterns: list[str], module_names: list[str], key: str) -> None:
    """Each glob pattern must match a module or one of its weight/bias parameters."""
    candidates = [c for n in module_names if n for c in (n, f"{n}.weight", f"{n}.bias")]
    for pattern in patterns:
        if not any(matches(c, pattern) for c in candidates):
            raise ConfigError(
                f"'{pattern}' matches no module or parameter of the model",
                key=key,
                hint=f"use names such as {', '.join(linear_leaf_names(module_names)[:20])}, lm_head or norm",
            )


# ---- components ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Peft:
    """Base of every PEFT option: all parameters train, no adapter."""

    #: a parameter-efficient method: only some parameters train (False only for full fine-tuning)
    enabled: ClassVar[bool] = True
    #: virtual tokens are prepended to every row (prompt learning): flattened rows would share them
    adds_virtual_tokens: ClassVar[bool] = False

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
        _check_patterns(self.modules, module_names, "peft.modules")

    def apply(self, model: nn.Module) -> nn.Module:
        self.validate()
        layers = decoder_layers(model) if self.last_n_layers else []
        if self.last_n_layers > len(layers):
            raise ConfigError(f"the model has only {len(layers)} decoder layers", key="peft.last_n_layers")
        open_prefixes = tuple(f"{name}." for name, _ in layers[len(layers) - self.last_n_layers :])

        def keep(name: str) -> bool:
            return name.startswith(open_prefixes) or any(matches(name, pat) for pat in self.modules)

        return _set_trainable(
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
        _check_patterns(self.extra_modules, module_names, "peft.extra_modules")

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

        return _set_trainable(model, keep, "peft=bitfit", "peft", "use peft=lora")


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
        return _as_targets(self.exclude_modules) if self.exclude_modules else None

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
        return _as_targets(self.target_modules)

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
                if not _module_matches(module_names, target):
                    raise ConfigError(
                        f"target module '{target}' matches no module of the model",
                        key="peft.target_modules",
                        hint=hint,
                    )
        # the names come from the causal-LM build, which has no classifier head
        for name in self.modules_to_save or []:
            if name not in CLASSIFIER_HEADS and not _module_matches(module_names, name):
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
        return _as_targets(self.feedforward_modules)

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
