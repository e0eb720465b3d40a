"""The strategy interface: the core every strategy implements (:class:`Strategy`: identity, capabilities,
the axes its engine trains, memory shape, refusals and checks, TrainingArguments, generated files, the live
check) and the extensions a strategy opts into by subclassing them, in the manner of NeMo-RL's
``PolicyInterface`` / ``ColocatablePolicyInterface``: :class:`ModelSplit` (the engine's hooks for a model
split over ranks) and :class:`OwnLoop` (the hooks of the loops we own). Callers reach an extension through
``strategy.model_split`` (:data:`WHOLE` for a strategy that does not split the model) and
``strategy.loop_hooks`` (None without them), never through defaults every strategy carries. How the model is
split is not an engine's field: every option carries the parallel keys (``parallelism.py``: one
:class:`~hydratune.components.strategy.parallelism.Parallel`, the mesh's one source). Also here: the run's
:class:`BatchPlan`, the helpers the strategy modules share, and ``training_options()`` (every option of
conf/strategy/ that trains). The strategies themselves: ``data_parallel.py`` (single, ddp), ``fsdp.py``,
``deepspeed.py`` (zero0..zero3pp), ``pipeline.py`` (the staged engine: pipeline stages).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed.mesh import Mesh
from hydratune.components.memory.shapes import SINGLE, StrategyShape
from hydratune.components.strategy.parallelism import AXES, ParallelKnobs

DEVICES = ("auto", "cpu", "cuda", "mps")
MULTI_PROCESS = {"MULTI_GPU", "MULTI_CPU", "MULTI_MPS", "MULTI_XPU"}  # plain multi-process (DDP) types


def detect_device(requested: str = "auto") -> str:
    """'cuda', 'mps' or 'cpu': the requested one, or the best one present."""
    import torch

    if requested != "auto":
        if requested == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                "CUDA was requested but no GPU is visible", key="strategy.device", hint="use auto"
            )
        return requested
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


@dataclass(frozen=True)
class BatchPlan:
    """What a strategy needs to know about the run, resolved once, so DeepSpeed and the trainer agree."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    world_size: int
    max_grad_norm: float
    dtype: str  # resolved precision: fp32 | bf16 | fp16
    dtype_reason: str = ""  # why (precision=auto says what it read: the device, the model's size)
    precision: Any = None  # the precision component (fp16 loss-scaling knobs)
    optimizer: Any = None  # the optimizer component (DeepSpeed's own optimizer under offload)
    hidden_size: int | None = None  # sizes the ZeRO buckets; None = DeepSpeed's defaults
    largest_param: int | None = None  # elements of the biggest weight (vocab x hidden): NVMe swap buffers
    gpus_per_node: int = 1  # processes per node: ZeRO++ hpZ's default secondary partition
    mesh: Mesh | None = None  # the strategy's split of world_size (None: data parallel only)
    attention: str | None = None  # the model's resolved attn implementation (Ulysses wraps it)
    architecture: Any = None  # the model's config (None: not readable here): the pipeline's stage split

    @property
    def data_parallel_size(self) -> int:
        """Replicas that each see their own micro-batches: world / (tp x sp x pp)."""
        return self.mesh.dp if self.mesh is not None else self.world_size

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps * self.data_parallel_size


def _mixed(dtype: str) -> str:
    return "no" if dtype == "fp32" else dtype


@dataclass
class PreparedLoop:
    """The trained modules of a loop we own after :meth:`OwnLoop.prepare_loop`, as the loop calls them, and
    its optimizer; ``engine``: the one DeepSpeed engine around all of them (it scales, accumulates, clips
    and steps by itself), else None."""

    modules: dict[str, Any]
    optimizer: Any
    engine: Any = None


def first_refusal(rules: dict[str, tuple[bool, str, str]]) -> ConfigError | None:
    """The ConfigError of the first rule that applies (``{key: (applies, message, hint)}``), or None."""
    for key, (applies, message, hint) in rules.items():
        if applies:
            return ConfigError(message, key=key, hint=hint)
    return None


def knobs_refusal(strategy: Strategy, knobs: dict[str, bool], what: str, hint: str) -> ConfigError | None:
    """The refusal of the first of ``knobs`` (``{"offload_param": asked}``) that is asked: ``what`` does not
    do it; ``hint`` may name it as ``{key}``. None when none is asked. The form an engine's ``axis_refusal``
    takes for its own knobs that an axis cannot go with."""
    name = next((k for k, asked in knobs.items() if asked), None)
    if name is None:
        return None
    key = f"strategy.{name}"
    return ConfigError(
        f"{what} does not do {key}={getattr(strategy, name)}", key=key, hint=hint.format(key=key)
    )


def live_type(accelerator: Any) -> str:
    """accelerate's DistributedType name ('NO', 'MULTI_CPU', 'DEEPSPEED', 'FSDP', …)."""
    return str(accelerator.distributed_type).rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Strategy(ParallelKnobs):
    """The core of every strategy: where it runs, what it adds to TrainingArguments, what it must produce,
    and what the rest of hydratune may ask of it (the class variables and the methods below) instead of its
    class. What only some strategies do is an extension they opt into by subclassing it, asked through
    :attr:`model_split` (:class:`ModelSplit`: the model split over ranks) and :attr:`loop_hooks`
    (:class:`OwnLoop`: the hooks of the loops we own), never carried by every strategy as defaults. The
    parallel keys (``strategy.tp_size`` ...) are every option's (:class:`ParallelKnobs`); its engine declares
    which axes it trains (:attr:`axes`) and what it cannot do with them (:meth:`axis_refusal`)."""

    device: str = "auto"

    #: the axes this engine trains with (``parallelism.AXES``): a size above 1 for another one is refused
    axes: ClassVar[frozenset[str]] = frozenset()
    #: the axes whose sizes ``strategy=auto`` tries for this option (a subset of ``axes``)
    searched_axes: ClassVar[tuple[str, ...]] = ()

    #: parameters live sharded across ranks (ZeRO-3, FSDP): saving needs a gather, generation all ranks
    shards_parameters: ClassVar[bool] = False
    #: needs torch.distributed set up even for a single process (DeepSpeed, FSDP)
    needs_process_group: ClassVar[bool] = False
    #: the model is built already partitioned over ranks (ZeRO-3's zero.Init): no copy of it can be made
    partitions_at_load: ClassVar[bool] = False
    #: the model goes into an engine or a sharding wrapper (DeepSpeed, FSDP): recipes that run a plain model
    #: per process (generate, best_of_n, eval) cannot use it
    wraps_model: ClassVar[bool] = False
    #: at most this many processes (None: any number)
    max_processes: ClassVar[int | None] = None
    #: does its own fp16 loss scaling (DeepSpeed's config block): torch's GradScaler and its knobs are unused
    scales_loss: ClassVar[bool] = False
    #: each sharded module holds one dtype (FSDP2): a frozen base cannot load in bf16 beside fp32 adapters
    one_dtype_per_shard: ClassVar[bool] = False

    @property
    def label(self) -> str:
        """How the summary names this strategy."""
        return type(self).__name__

    @property
    def model_split(self) -> ModelSplit:
        """How this strategy splits the model over ranks: itself when it opts into :class:`ModelSplit`, else
        :data:`WHOLE` (a whole model on every rank, data parallel only)."""
        return self if isinstance(self, ModelSplit) else WHOLE

    @property
    def loop_hooks(self) -> OwnLoop | None:
        """The hooks a loop we own (PPO) runs through: itself when it opts into :class:`OwnLoop`, else None
        (such a recipe is refused before load: :func:`own_loop_refusal`)."""
        return self if isinstance(self, OwnLoop) else None

    def applicable(self, world_size: int) -> bool:
        """Whether this option makes sense for ``world_size`` ranks (the estimate's table, auto's ladder)."""
        return True

    @property
    def stage_sharding(self) -> int | None:
        """With pipeline stages (``pp`` among :attr:`axes`): the data-parallel side this option gives the
        staged loop (0 whole stages on every replica, 1 ZeRO-1's optimizer states sharded over the replicas,
        2 / 3 FSDP2 on each stage without / with resharding after forward); None: no pipeline axis."""
        return None

    def axis_refusal(self, device: str | None = None, dtype: str | None = None) -> ConfigError | None:
        """What this engine cannot do with the sizes of its :attr:`axes` together with its own knobs, on
        ``device`` in ``dtype`` (None: the rules that hold on any device). The axes it does not train at all
        are refused before this is asked (:func:`axis_refusal`); what an axis refuses of the rest of the run
        is ``components/runtime/split_checks.py``."""
        return None

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        """What this strategy does to memory (``components/memory/estimate.py`` reads only this)."""
        return SINGLE

    def required_knobs(self) -> dict[str, str]:
        """Knobs this option cannot go without (left null in its YAML), each with an example value."""
        return {}

    def device_refusal(self, device: str, dtype: str, owns_loop: bool) -> ConfigError | None:
        """Why this strategy cannot train on ``device`` in ``dtype`` (None: it can). ``owns_loop``: the
        recipe runs its own loop through the :class:`OwnLoop` hooks (PPO) rather than a Trainer."""
        return None

    def check(self, plan: BatchPlan, device: str) -> None:
        """This strategy's own checks of the run before any model loads (packages, process layout)."""

    def validate(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(
                f"unknown device '{self.device}'", key="strategy.device", hint=f"one of {DEVICES}"
            )
        refusal = axis_refusal(self)
        if refusal is not None:
            raise refusal

    def resolve_device(self) -> str:
        return detect_device(self.device)

    def training_args(self, device: str, plan: BatchPlan | None = None) -> dict[str, Any]:
        return {"use_cpu": device == "cpu"}

    def expected_distributed_types(self, world_size: int) -> set[str]:
        """accelerate DistributedType names this strategy may legitimately end up with."""
        return {"NO"}

    def before_model_load(self, ctx: Any) -> Any:
        """Runs right before the model is built (ZeRO-3 makes its config live here); returns what the run
        must keep alive while it trains (None: nothing)."""
        return None

    def gather_state_dict(self, trainer: Any) -> dict[str, Any] | None:
        """The full state dict for saving (a collective call on every rank) when parameters are sharded;
        None when each rank holds whole weights."""
        if not self.shards_parameters:
            return None
        return trainer.accelerator.get_state_dict(trainer.model_wrapped)

    def live_description(self, accelerator: Any) -> str:
        """What accelerate actually prepared: distributed type, ZeRO stage, processes."""
        plugin = getattr(accelerator.state, "deepspeed_plugin", None)
        stage = f", ZeRO stage {plugin.zero_stage}" if plugin is not None else ""
        return f"{live_type(accelerator)}{stage}, {accelerator.num_processes} process(es)"

    def files(self, plan: BatchPlan, device: str) -> dict[str, Any]:
        """Generated settings written into the run dir (e.g. ``deepspeed.json``)."""
        return {}

    def describe(self, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
        """What ``mode=plan`` prints after the data and the model: the mesh, the batch arithmetic and
        generated settings."""
        split = plan.mesh is not None and not plan.mesh.is_data_parallel_only
        batch: dict[str, Any] = {
            "micro_batch_size": plan.micro_batch_size,
            "gradient_accumulation_steps": plan.gradient_accumulation_steps,
            "world_size": plan.world_size,
            "global_batch_size": f"{plan.micro_batch_size} x {plan.gradient_accumulation_steps} x "
            f"{plan.data_parallel_size}{' data-parallel replicas' if split else ''} "
            f"= {plan.global_batch_size}",
        }
        if plan.mesh is None or (plan.mesh.is_data_parallel_only and plan.mesh.ep == 1):
            return {"batch": batch}
        mesh = plan.mesh
        if mesh.ep > 1:
            batch["each rank"] = (
                f"its own micro-batch of {plan.micro_batch_size} rows; the tokens routed to experts another "
                f"rank holds go there and back (all-to-all within each group of {mesh.ep} expert-parallel "
                "ranks)"
            )
        if mesh.tp > 1:
            batch["each rank"] = (
                f"the {mesh.tp} ranks of a tensor-parallel group read the same micro-batch of "
                f"{plan.micro_batch_size} rows, each holding 1/{mesh.tp} of every attention and MLP weight"
            )
        if mesh.sp > 1:
            batch["each rank"] = (
                f"each micro-batch of {plan.micro_batch_size} rows is split along its tokens over the "
                f"{mesh.sp} ranks of a sequence-parallel group (rows padded to a multiple of {mesh.sp} "
                "tokens)"
            )
        nodes = max(1, plan.world_size // max(1, plan.gpus_per_node))
        described = {"mesh": f"{mesh.describe()}; {mesh.per_node(nodes)}", "batch": batch}
        if plan.world_size > 1:
            described["ranks"] = mesh.layout(plan.gpus_per_node)
        return described

    def verify(self, accelerator: Any, world_size: int | None = None) -> None:
        """Refuse to train when accelerate silently fell back to something else."""
        self._verify_live(accelerator, self.expected_distributed_types(accelerator.num_processes), world_size)

    def _verify_live(self, accelerator: Any, want: set[str], world_size: int | None) -> None:
        got = live_type(accelerator)
        if got not in want:
            raise ConfigError(
                f"asked for strategy {type(self).__name__} but accelerate prepared '{got}' "
                f"with {accelerator.num_processes} process(es); expected one of {sorted(want)}",
                key="strategy",
                hint="check the launcher (process count) and stale ACCELERATE_* environment variables",
            )
        if world_size is not None and accelerator.num_processes != world_size:
            raise ConfigError(
                f"the launcher asked for {world_size} process(es) but {accelerator.num_processes} "
                "joined the process group",
                key="launcher.nproc_per_node",
                hint="check WORLD_SIZE / the external launcher's process count",
            )


# ---- the extensions a strategy opts into -------------------------------------------------------------
class ModelSplit:
    """Extension: the engine's hooks for a model split over ranks (tensor / sequence / expert parallel,
    pipeline stages) instead of whole on each: how it loads, which attention its sequence split runs, what it
    built. The sizes are the strategy's :attr:`~Strategy.parallel` (every option's keys), not this class's.
    A strategy whose engines split the model subclasses this beside :class:`Strategy` (``class
    FSDP(ModelSplit, OwnLoop, Strategy)``) and overrides what it does; the rest of hydratune asks
    ``strategy.model_split``, which is :data:`WHOLE` (this class's own answers: nothing split, data parallel
    only) for a strategy that does not."""

    @property
    def splits_sequences(self) -> bool:
        """Each micro-batch's tokens are split over ranks (Ulysses SP, context parallel): rows must keep a
        ``[micro_batch, tokens]`` shape whose token count the ranks divide."""
        return self is not WHOLE and self.parallel.sp > 1  # type: ignore[attr-defined]

    @property
    def generates_together(self) -> bool:
        """Every rank takes part in each ``generate()`` (tensor-parallel layers all-reduce inside forward):
        the eval generations run on all ranks at once, rank 0 records them."""
        return False

    def model_load_kwargs(self, plan: BatchPlan) -> dict[str, Any]:
        """What ``from_pretrained`` gets from the strategy (FSDP x TP: ``DistributedConfig``)."""
        return {}

    def sequence_refusal(self, attention: str, packed: bool) -> ConfigError | None:
        """Why this strategy's sequence split cannot run the model's ``attention`` implementation, on rows
        holding several documents when ``packed`` (None: it can)."""
        return None

    def verify_built(self, model: Any, mesh: Mesh) -> dict[str, Any]:
        """Once the trainer has built its engine (the first thing ``train()`` does): what it really built of
        ``mesh`` (process groups, this rank's shards), for the report; a ConfigError on any mismatch. {}:
        nothing split, nothing to check beyond :meth:`Strategy.verify`."""
        return {}


#: the model split of a strategy that does not split the model: a whole model on every rank
WHOLE = ModelSplit()


def options_training(axis: str, size: int) -> list[str]:
    """The strategy options that train ``axis`` at ``size`` as shipped (their engine declares it and refuses
    none of it with their own knobs), those splitting nothing else first: what a refusal of the axis names
    as the fix."""
    import dataclasses

    found = []
    for name, option in training_options().items():
        sized = dataclasses.replace(option, **{f"{axis}_size": size}) if axis in option.axes else None
        if sized is not None and axis_refusal(sized) is None:
            found.append((sized.parallel.asked != (axis,), name))
    return [name for _, name in sorted(found, key=lambda f: f[0])]


def axis_refusal(
    strategy: Strategy, device: str | None = None, dtype: str | None = None
) -> ConfigError | None:
    """Why ``strategy``'s parallel sizes cannot train (None: they can), in one order: an axis its engine does
    not train (the options that do named), tensor with sequence parallel (no engine composes them), the
    pipeline's own rules (:meth:`Parallel.refusal`), then the engine's own :meth:`Strategy.axis_refusal`."""
    parallel = strategy.parallel
    for name in parallel.asked:
        if name not in strategy.axes:
            axis, size = AXES[name], parallel.size(name)
            options = options_training(name, size)
            return ConfigError(
                f"strategy {strategy.label} does not train {axis.title} ({axis.knob}={size}: "
                f"{axis.splits} split over ranks)",
                key=axis.knob,
                hint=f"strategy={options[0]} {axis.knob}={size} launcher.nproc_per_node={size} (or a "
                f"multiple of {size} processes in all; options that do: {', '.join(options)}), "
                f"or {axis.knob}=1",
            )
    if parallel.tp > 1 and parallel.sp > 1:
        return ConfigError(
            f"tensor parallel (tp_size={parallel.tp}) and sequence parallel (sp_size={parallel.sp}) together "
            "are not supported: the engines do not compose them (DeepSpeed's AutoTP and Ulysses each make "
            "the groups the other would need; pipeline stages split no sequences)",
            key="strategy.sp_size",
            hint="use one of them (tp_size for weights that do not fit, sp_size for sequences that do not)",
        )
    return parallel.refusal() or strategy.axis_refusal(device, dtype)


class OwnLoop:
    """Extension: the hooks a loop we own runs through (PPO's, ``components/rl/loop.py``) instead of a
    Trainer: its accelerator, optimizer, the trained and frozen modules made ready, sampling, the weights
    gathered for saving, the live check and the report. A strategy that can run such a loop subclasses this
    beside :class:`Strategy` (``class DDP(OwnLoop, Strategy)``); these defaults are plain accelerate with a
    whole model per process, built on the strategy's core (:meth:`Strategy.verify`,
    :meth:`Strategy.live_description`, ``shards_parameters``). A recipe that owns its loop is refused under
    a strategy without them (:func:`own_loop_refusal`)."""

    #: a loop we own trains one engine that scales, accumulates, clips and steps by itself (DeepSpeed)
    loop_engine: ClassVar[bool] = False

    def loop_refusal(self, dtype: str) -> ConfigError | None:
        """What these hooks cannot do with this option's knobs in ``dtype`` (None: nothing)."""
        return None

    def loop_accelerator(self, device: str, plan: BatchPlan) -> Any:
        """An ``Accelerator`` for recipes that own their loop (PPO), set up as this strategy asks."""
        from accelerate import Accelerator

        handlers = plan.precision.scaler_handlers(plan.dtype) if plan.precision is not None else []
        return Accelerator(mixed_precision=_mixed(plan.dtype), cpu=device == "cpu", kwargs_handlers=handlers)

    def loop_optimizer(self, optimizer: Any, params: list[Any], device: str, plan: BatchPlan) -> Any:
        """The optimizer of a loop we own, before ``prepare_loop``: the optimizer component's torch one."""
        return optimizer.build(params, device)

    def prepare_frozen(self, accelerator: Any, build: Callable[[], Any]) -> Any:
        """A frozen model of a loop we own (PPO's reference, a reward model), made by ``build()`` and made
        ready for inference: here a whole copy on each process's device."""
        return build().to(accelerator.device).eval().requires_grad_(False)

    def shard_trained(self, accelerator: Any, module: Any) -> Any:
        """A trained module of a loop we own, before its optimizer is built: as it is here (FSDP shards
        it; DeepSpeed and DDP wrap it in :meth:`prepare_loop`)."""
        return module

    def prepare_loop(
        self,
        accelerator: Any,
        modules: dict[str, Any],
        optimizer: Any,
        combine: Callable[[dict[str, Any]], Any],
    ) -> PreparedLoop:
        """The trained ``modules`` and ``optimizer`` of a loop we own, through ``accelerator.prepare`` (the
        loop steps its schedule itself: a prepared one would step once per process). ``combine`` makes one
        module of them, for strategies that wrap exactly one (DeepSpeed)."""
        *prepared, optimizer = accelerator.prepare(*modules.values(), optimizer)
        return PreparedLoop(dict(zip(modules, prepared, strict=True)), optimizer)

    def generation(self, module: Any) -> contextlib.AbstractContextManager[None]:
        """Around sampling from a trained module of a loop we own (FSDP keeps the layers gathered)."""
        return contextlib.nullcontext()

    def gather_loop_weights(self, accelerator: Any, module: Any) -> dict[str, Any] | None:
        """The full state dict of a loop's trained ``module`` (DeepSpeed: its engine) when parameters are
        sharded, on rank 0 (a collective call on every rank); None when each rank holds whole weights."""
        if not self.shards_parameters:  # the core's (a Strategy)
            return None
        return accelerator.get_state_dict(module)

    def verify_loop(self, accelerator: Any, world_size: int, modules: list[Any]) -> None:
        """:meth:`Strategy.verify` for a loop we own, once its trained ``modules`` are sharded (FSDP checks
        them)."""
        self.verify(accelerator, world_size)  # the core's (a Strategy)

    def loop_description(self, accelerator: Any) -> str:
        """:meth:`Strategy.live_description` of a loop we own."""
        return self.live_description(accelerator)  # the core's (a Strategy)

    def loop_report(self, modules: dict[str, Any]) -> dict[str, Any]:
        """What the run report says about how a loop's modules are held (FSDP: each rank's shard)."""
        return {}


def own_loop_refusal(strategy: Strategy, recipe: Any, dtype: str) -> ConfigError | None:
    """Why ``strategy`` cannot run the loop ``recipe`` owns (None: it can): it has no :class:`OwnLoop`
    hooks, or they refuse its knobs in ``dtype`` (:meth:`OwnLoop.loop_refusal`)."""
    hooks = strategy.loop_hooks
    if hooks is None:
        return ConfigError(
            f"recipe={recipe.name} runs its own loop, which strategy {strategy.label} has no hooks for",
            key="strategy",
            hint="strategy=ddp, fsdp or a DeepSpeed zero stage for this recipe",
        )
    return hooks.loop_refusal(dtype)


def training_options() -> dict[str, Strategy]:
    """Every option of conf/strategy/ that trains, built (``auto``, which picks among these, is not one),
    fastest first in the assumed order (then by name): the estimate's every-strategy table,
    ``strategy=auto``'s ladder and the support matrix list these. Built once per conf/ (components are
    frozen: sharing them is safe)."""
    from hydratune.components.config import options

    return dict(_training_options(options.CONF))


@functools.cache
def _training_options(conf: Path) -> tuple[tuple[str, Strategy], ...]:
    from hydratune.components.config.options import options

    built = {name: option.build() for name, option in options("strategy", conf).items()}
    trains = [(name, strategy) for name, strategy in built.items() if isinstance(strategy, Strategy)]
    return tuple(sorted(trains, key=lambda item: (-item[1].memory_shape().speed, item[0])))
