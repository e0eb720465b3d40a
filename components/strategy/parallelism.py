"""How a run splits the model over its ranks: the one parallel description.

The keys users know stay where they were, on every strategy option: ``strategy.tp_size``, ``sp_size``,
``pp_size``, ``ep_size`` and the pipeline's ``schedule``, ``stages_per_rank`` and ``split``, declared once
here (:class:`ParallelKnobs`, a base of every strategy) and read as one frozen :class:`Parallel`, from which
the run's one :class:`~hydratune.components.distributed.mesh.Mesh` is built (:meth:`Parallel.mesh`) and
whose own rules (the pipeline's schedule) are checked here (:meth:`Parallel.refusal`). :data:`AXES` is the
table of axes. An engine declares the axes it trains with (``Strategy.axes``) and its one
``axis_refusal``; what each axis refuses of the rest of the run (recipe, adapter, quantization, model,
attention) is one table, ``components/runtime/split_checks.py``. A new axis: a row of :data:`AXES`, its
knob below, a dimension of the mesh, its row of refusals, and the engines that declare it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, knob
from hydratune.components.distributed.mesh import Mesh
from hydratune.components.memory.parallel import SCHEDULES


@dataclass(frozen=True)
class Axis:
    """One way of splitting the model over ranks: its mesh dimension, the knob that sizes it, what it is."""

    name: str  # the mesh dimension ("tp")
    title: str  # "tensor parallel"
    splits: str  # what each of its ranks holds a part of

    @property
    def knob(self) -> str:
        """The key that sizes it (``strategy.tp_size``)."""
        return f"strategy.{self.name}_size"


#: every axis a run can split the model along, in the mesh's order
AXES = {
    axis.name: axis
    for axis in (
        Axis("tp", "tensor parallel", "each layer's projections"),
        Axis("sp", "sequence parallel", "each micro-batch's tokens"),
        Axis("pp", "pipeline stages", "the decoder layers, cut into stages"),
        Axis("ep", "expert parallel", "a mixture's experts"),
    )
}
#: the pipeline's own knobs: meaningful with pipeline stages only
PIPELINE_KNOBS = {"schedule": "1f1b", "stages_per_rank": 1, "split": ()}


@dataclass(frozen=True)
class Parallel:
    """The sizes of a run's axes (``tp x sp x pp`` ranks hold one copy of the model; ``ep`` splits a mixture's
    experts within the data-parallel ranks) and how pipeline stages are scheduled."""

    tp: int = 1
    sp: int = 1
    pp: int = 1
    ep: int = 1
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved_1f1b
    stages_per_rank: int = 1  # > 1: interleaved 1F1B's virtual stages
    split: tuple[int, ...] = ()  # the first layer of stages 1..N-1; () = balanced by parameter count

    def size(self, axis: str) -> int:
        return int(getattr(self, axis))

    @property
    def asked(self) -> tuple[str, ...]:
        """The axes above 1, in :data:`AXES` order."""
        return tuple(axis for axis in AXES if self.size(axis) > 1)

    @property
    def num_stages(self) -> int:
        """Pipeline stages in all: ``pp x stages_per_rank``."""
        return self.pp * self.stages_per_rank

    def mesh(self, world: int) -> Mesh:
        """``world`` processes as ``dp x tp x sp x pp`` (and ``ep`` within ``dp``): the run's one mesh."""
        return Mesh(world, tp=self.tp, sp=self.sp, pp=self.pp, ep=self.ep)

    def refusal(self) -> ConfigError | None:
        """The pipeline's own rules: a known schedule, virtual stages exactly under the interleaved one, and
        no pipeline knob set without stages (it would be silently unused)."""
        if self.pp == 1:
            unused = [k for k, default in PIPELINE_KNOBS.items() if getattr(self, k) != default]
            if unused:
                return ConfigError(
                    f"strategy.{unused[0]} schedules pipeline stages, and strategy.pp_size is 1 (none)",
                    key=f"strategy.{unused[0]}",
                    hint=f"strategy.pp_size=2 (or more) for pipeline stages, or drop strategy.{unused[0]}",
                )
            return None
        for axis in ("sp", "ep"):
            if self.size(axis) > 1:
                knob = AXES[axis].knob
                return ConfigError(
                    f"pipeline stages (strategy.pp_size={self.pp}) with {AXES[axis].title} "
                    f"({knob}={self.size(axis)}): the staged loop splits a stage's layers over "
                    "tensor-parallel ranks only",
                    key=knob,
                    hint=f"{knob}=1 (strategy.tp_size splits each stage's layers), or drop strategy.pp_size",
                )
        if self.schedule not in SCHEDULES:
            return ConfigError(
                f"unknown schedule '{self.schedule}'", key="strategy.schedule", hint=f"one of {SCHEDULES}"
            )
        if self.schedule == "interleaved_1f1b" and self.stages_per_rank < 2:
            return ConfigError(
                "interleaved_1f1b runs several stages per rank",
                key="strategy.stages_per_rank",
                hint="strategy.stages_per_rank=2 (or more), or strategy.schedule=1f1b",
            )
        if self.schedule != "interleaved_1f1b" and self.stages_per_rank != 1:
            return ConfigError(
                f"{self.schedule} runs one stage per rank",
                key="strategy.stages_per_rank",
                hint="strategy.stages_per_rank=1, or strategy.schedule=interleaved_1f1b",
            )
        return None


@dataclass(frozen=True)
class ParallelKnobs:
    """The parallel keys of every strategy option (``strategy.tp_size`` ...), read as :attr:`parallel`. An
    option whose engine does not train an axis refuses a size above 1 for it, naming the options that do."""

    #: tensor parallel ranks: each layer's projections split over them (DeepSpeed AutoTP; FSDP: transformers'
    #: tp_plan, GPU only; pipeline stages: DTensor); world / (tp x sp x pp) data-parallel replicas
    tp_size: int = knob(1, AT_LEAST_ONE)
    #: sequence parallel ranks: each micro-batch's tokens split over them (DeepSpeed Ulysses; FSDP: context
    #: parallel, ring attention, GPU only)
    sp_size: int = knob(1, AT_LEAST_ONE)
    #: pipeline stages: the decoder layers cut into that many, trained by the staged loop, whose data-parallel
    #: side is this option's (ddp: whole stages; zero1: ZeRO-1 states; zero2 / zero3 / fsdp: FSDP2 per stage)
    pp_size: int = knob(1, AT_LEAST_ONE)
    #: expert parallel ranks: a mixture's experts split over them, tokens sent there and back (DeepSpeed
    #: AutoEP, ZeRO 0-2)
    ep_size: int = knob(1, AT_LEAST_ONE)
    #: pipeline stages: their schedule, gpipe | 1f1b | interleaved_1f1b (needs stages_per_rank >= 2)
    schedule: str = "1f1b"
    #: pipeline stages: more than one per rank is interleaved 1F1B (virtual stages, a smaller bubble)
    stages_per_rank: int = knob(1, AT_LEAST_ONE)
    #: pipeline stages: the first layer of stages 1..N-1, e.g. [12] for 2 stages; [] = balanced by parameters
    split: list[int] = knob([], AT_LEAST_ONE)

    @property
    def parallel(self) -> Parallel:
        """The parallel description these keys make."""
        return Parallel(
            tp=self.tp_size,
            sp=self.sp_size,
            pp=self.pp_size,
            ep=self.ep_size,
            schedule=self.schedule,
            stages_per_rank=self.stages_per_rank,
            split=tuple(self.split),
        )
