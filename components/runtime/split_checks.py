"""What a model split over ranks refuses of the rest of the run: one table, a row per axis.

:data:`REFUSALS` holds, for each axis of ``components/strategy/parallelism.py`` ``AXES``, what it cannot go
with: the recipe (an axis it does not declare in ``Recipe.splits``, the axes it was verified with), the
adapter, the quantization, the precision, the data, the model and its attention, each refused with its key
and its fix. The engine's own limits (what its knobs cannot do with an axis) are its ``axis_refusal``; the
sizes the model must divide are the mesh's (``distributed/mesh.py`` ``check_model``); a pipeline's stage plan
is the staged engine's (``Pipeline.check``). :func:`check_split` runs all of them before any weight loads,
for ``mode=plan`` and training alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed.mesh import Mesh
from hydratune.components.strategy.parallelism import AXES


@dataclass(frozen=True)
class SplitRun:
    """What a rule reads: the run's components (the support matrix's cells have no data, model or optimizer:
    None), its mesh and its resolved precision."""

    comps: Any
    mesh: Mesh
    dtype: str

    @property
    def peft_name(self) -> str:
        return type(self.comps.peft).__name__


@dataclass(frozen=True)
class Refusal:
    """One cell of the table: ``key`` refused when ``applies(run)``, saying ``why(run)``, fixed by ``fix``."""

    key: str
    applies: Callable[[SplitRun], bool]
    why: Callable[[SplitRun], str]
    fix: str | Callable[[SplitRun], str]  # a fix that depends on the run: a function of it

    def check(self, run: SplitRun) -> ConfigError | None:
        if not self.applies(run):
            return None
        return ConfigError(
            self.why(run), key=self.key, hint=self.fix if isinstance(self.fix, str) else self.fix(run)
        )


def _adapter_without_tp(run: SplitRun) -> str:
    """An adapter under tensor parallel: the combinations that train it (each passes ``mode=plan``,
    tests/unit/test_fix_hints.py): without pipeline stages, sequence parallel over the same ranks; with them,
    the stages alone."""
    from hydratune.components.strategy.core import axis_refusal, options_training

    mesh = run.mesh
    if mesh.pp > 1:
        return (
            f"peft=none (full fine-tuning), or strategy.tp_size=1 (an adapter trains in the {mesh.pp} "
            "pipeline stages alone; pipeline stages split no sequences)"
        )
    options = options_training("sp", mesh.tp)
    strategy = run.comps.strategy
    moved = dataclasses.replace(strategy, tp_size=1, sp_size=mesh.tp) if "sp" in strategy.axes else None
    option = "" if moved is not None and axis_refusal(moved) is None else f"strategy={options[0]} "
    return (
        f"peft=none (full fine-tuning), or {option}strategy.tp_size=1 strategy.sp_size={mesh.tp} (sequence "
        f"parallel trains an adapter: each row's tokens split over the same ranks; options that train it: "
        f"{', '.join(options)})"
    )


def _vision(axis: str) -> Refusal:
    """A vision-language model is not split along ``axis``: the engines know a decoder's layers, not an image
    encoder beside them (not verified)."""
    return Refusal(
        AXES[axis].knob,
        lambda r: bool(getattr(r.comps.model, "is_vision", False)),
        lambda r: (
            f"{r.comps.model.name_or_path} is a vision-language model: splitting it over ranks "
            "(tensor / sequence parallel, pipeline stages) is not supported"
        ),
        "use data parallel, FSDP or ZeRO (strategy=ddp / fsdp / zero2 / zero3 ...)",
    )


def _quantized(what: str, fix: str) -> Refusal:
    return Refusal("quantization", lambda r: r.comps.quantization.enabled, lambda r: what, fix)


#: axis -> what it refuses, in the order it is checked (after the recipe's ``Recipe.splits``)
REFUSALS: dict[str, tuple[Refusal, ...]] = {
    "tp": (
        _vision("tp"),
        _quantized(
            "tensor parallel with a quantized base: the engines split torch Linear layers, not "
            "bitsandbytes' ones",
            "quantization=none, or drop strategy.tp_size (or set it to 1)",
        ),
        Refusal(
            "peft",
            lambda r: r.comps.peft.enabled,
            lambda r: (
                f"tensor parallel with peft={r.peft_name}: the engines (DeepSpeed AutoTP, DTensor in "
                "pipeline stages) split the base layers and leave an adapter's layers whole beside them (not "
                "supported)"
            ),
            _adapter_without_tp,
        ),
    ),
    "sp": (
        _vision("sp"),
        _quantized(
            "sequence parallel with a quantized base: the engines split torch Linear layers, not "
            "bitsandbytes' ones",
            "quantization=none, or drop strategy.sp_size (or set it to 1)",
        ),
        Refusal(
            "peft",
            lambda r: r.comps.peft.adds_virtual_tokens,
            lambda r: (
                f"sequence parallel with {r.peft_name}: its virtual tokens are prepended to every row, "
                "so the ranks' slices of a row would not be the row"
            ),
            "peft=lora, or drop strategy.sp_size",
        ),
    ),
    "pp": (
        _vision("pp"),
        _quantized(
            "a quantized base is not cut into pipeline stages",
            "quantization=none (or strategy=ddp / zero2 for QLoRA)",
        ),
        Refusal(
            "peft",
            lambda r: r.comps.peft.adds_virtual_tokens,
            lambda r: (
                "prompt-learning adapters prepend virtual tokens to the first stage's input, which the "
                "pipeline's fixed-shape activations do not carry"
            ),
            "peft=lora (or none), or another strategy for this adapter",
        ),
        Refusal(
            "precision",
            lambda r: r.dtype == "fp16",
            lambda r: "fp16 loss scaling is not wired across pipeline stages",
            "precision=bf16 (or fp32)",
        ),
        Refusal(
            "data.packing",
            lambda r: bool(getattr(r.comps.data, "packing", False)),
            lambda r: (
                "packed rows are not split into pipeline micro-batches: the stages pad rows to one length"
            ),
            "data.packing=false",
        ),
        Refusal(
            "model.compile",
            lambda r: bool(getattr(r.comps.model, "compile", False)),
            lambda r: "torch.compile is not applied to pipeline stages",
            "model.compile=false",
        ),
        Refusal(
            "model.liger",
            lambda r: getattr(r.comps.model, "liger", None) is True,
            lambda r: "Liger's kernels patch the whole model's modules, not pipeline stages",
            "model.liger=null (off with pipeline stages)",
        ),
    ),
    "ep": (
        Refusal(
            "peft",
            lambda r: r.comps.peft.enabled,
            lambda r: (
                f"expert parallel with peft={r.peft_name.lower()}: adapters on split experts are not verified"
            ),
            "peft=none (full fine-tuning), or strategy.ep_size=1",
        ),
        _quantized(
            "expert parallel with a quantized base is not supported",
            "quantization=none, or strategy.ep_size=1",
        ),
        # DeepSpeed builds the optimizer after AutoEP (the experts in their own groups): its Adam only
        Refusal(
            "optimizer",
            lambda r: not getattr(r.comps.optimizer, "deepspeed_cpu_adam", True),
            lambda r: (
                "expert parallel trains with DeepSpeed's own AdamW (built after the experts are split, "
                f"each in its own group); optimizer={type(r.comps.optimizer).__name__.lower()} is not one it "
                "builds"
            ),
            "optimizer=adamw, or strategy.ep_size=1",
        ),
    ),
}
assert set(REFUSALS) == set(AXES), "every axis has its row of refusals"


def recipe_refusal(recipe: Any, axis: str, size: int) -> ConfigError | None:
    """``recipe`` along ``axis``: only the axes it declares (``Recipe.splits``) were verified with it."""
    from hydratune.components.config.registry import RECIPES

    if axis in recipe.splits:
        return None
    title, knob = AXES[axis].title, AXES[axis].knob
    verified = [f"recipe={name}" for name, cls in RECIPES.items() if axis in cls.splits]
    if recipe.inference_only:
        why = f"recipe={recipe.name} trains nothing (one whole model per process)"
    elif recipe.owns_loop:
        why = f"recipe={recipe.name} runs its own loop, which does not split a model"
    else:
        why = f"verified with {', '.join(verified) or 'no recipe'} only, not recipe={recipe.name}"
        why += " (the stages compute the causal-LM loss of its token rows)" if axis == "pp" else ""
    return ConfigError(
        f"{title} ({knob}={size}): {why}",
        key=knob,
        hint=f"drop {knob} (or set it to 1)" + (f", or {' / '.join(verified)}" if verified else ""),
    )


def refusal(comps: Any, mesh: Mesh, dtype: str) -> ConfigError | None:
    """The first refusal of the table for the axes ``mesh`` splits, the recipe's first on each axis."""
    run = SplitRun(comps, mesh, dtype)
    for axis in AXES:
        size = getattr(mesh, axis)
        if size == 1:
            continue
        found = recipe_refusal(comps.recipe, axis, size)
        for rule in REFUSALS[axis]:
            found = found or rule.check(run)
        if found is not None:
            return found
    return None


def check_split(cfg: DictConfig, comps: Any, world: int, device: str, dtype: str) -> None:
    """A model split over ranks (after the engine's own limits, ``axis_refusal``): the mesh divides the world,
    the table's refusals, the model's sizes divide by the mesh, experts of a kind the engine splits, and the
    attention a sequence split runs. Raises the first ConfigError, naming its fix."""
    from hydratune.components.distributed.mesh import ModelDims, check_model

    mesh = comps.strategy.parallel.mesh(world)
    if mesh.is_data_parallel_only and mesh.ep == 1:
        return
    mesh.check()
    found = refusal(comps, mesh, dtype)
    if found is not None:
        raise found
    if mesh.tp > 1 or mesh.sp > 1 or mesh.ep > 1:
        config = comps.model.load_config()
        dims = ModelDims.from_config(config)
        check_model(mesh, dims)
        if mesh.tp > 1:
            check_tensor_split_kind(dims, mesh.tp)
        if mesh.ep > 1:
            check_expert_kind(config)
    if mesh.sp > 1:
        check_sequence_split(cfg, comps, device)


def check_tensor_split_kind(dims: Any, tp: int) -> None:
    """Tensor parallel splits a dense model's Linear layers: a mixture's fused experts have no split any
    engine here runs (DeepSpeed AutoTP dies after load on transformers' ``moe_tp_experts`` /
    ``packed_colwise`` plans; DTensor and the pipeline's stage split are not verified with experts)."""
    if dims.experts:
        raise ConfigError(
            f"tensor parallel (strategy.tp_size={tp}) cannot split a mixture of experts ({dims.experts} "
            "experts per layer): the engines split dense Linear layers, not fused experts (DeepSpeed AutoTP "
            "fails after the model loads)",
            key="strategy.tp_size",
            hint="strategy.tp_size=1; to split the experts over ranks strategy=zero1 (or zero0 / zero2) "
            "strategy.ep_size=<a divisor of the experts>, or shard the model with strategy=zero3 / fsdp",
        )


def check_expert_kind(config: Any) -> None:
    """Expert parallel splits the experts of the model types AutoEP knows (gathered back whole for final/ and
    verified against one process)."""
    from hydratune.components.distributed.model_parallel import AUTOEP_MODEL_TYPES

    kind = getattr(getattr(config, "text_config", config), "model_type", None)
    if kind not in AUTOEP_MODEL_TYPES:
        raise ConfigError(
            f"expert parallel splits the experts of {', '.join(AUTOEP_MODEL_TYPES)} models here (gathered "
            f"back whole for final/ and verified against one process); this model is {kind}",
            key="strategy.ep_size",
            hint="strategy.ep_size=1 (the experts stay whole on every rank; ZeRO still shards the optimizer "
            "state)",
        )


def check_sequence_split(cfg: DictConfig, comps: Any, device: str) -> None:
    """The attention the model is built with keeps documents apart on the rows the engine splits (packed
    rows need one that reads the position ids: the engine's ``sequence_refusal``), and on gloo the
    collator's collective runs in the training process."""
    packed = comps.data.kind == "chat" and comps.data.packing
    found = comps.strategy.model_split.sequence_refusal(comps.model.resolved_attn_implementation(), packed)
    if found is not None:
        raise found
    if device == "cpu" and cfg.train.num_workers:
        raise ConfigError(
            "sequence parallel on CPU pads every rank's batch to the longest of the step (gloo's all-gather "
            "takes equal shapes): a collective the data collator runs, so not in dataloader workers",
            key="train.num_workers",
            hint="train.num_workers=0 (the default on CPU)",
        )
