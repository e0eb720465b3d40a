"""The staged engine: the decoder layers cut into stages over ``torch.distributed.pipelining``, trained by
the staged loop (``components/runtime/pipeline_loop.py``). Pipeline stages are an axis
(``strategy.pp_size``) of every option whose engine declares it: such an option trains as this engine
(:func:`with_stages`: its parallel keys and its data-parallel side, ``stage_sharding``), one place, the
saved config untouched. ``strategy=pipeline`` is its preset, the data-parallel side chosen by
``strategy.zero_stage``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import Range, knob, one_of
from hydratune.components.config.registry import component
from hydratune.components.distributed.mesh import Mesh
from hydratune.components.memory.shapes import StrategyShape
from hydratune.components.strategy.core import BatchPlan, ModelSplit, Strategy
from hydratune.components.strategy.parallelism import ParallelKnobs


@component("strategy")
@dataclass(frozen=True)
class Pipeline(ModelSplit, Strategy):
    """Pipeline parallel (``torch.distributed.pipelining``): the decoder layers cut into ``pp_size`` stages
    (x ``stages_per_rank`` under an interleaved schedule), each rank holding only its stages, micro-batches
    (``train.gradient_accumulation_steps`` per step) flowing through them on a GPipe, 1F1B or interleaved 1F1B
    schedule; with ``tp_size`` > 1 each stage's layers split over that many tensor-parallel ranks (DTensor,
    ``components/distributed/stage_tp.py``: 3D with the data-parallel replicas); ``world / (pp_size x
    tp_size)`` data-parallel replicas, each with its own data, gradients summed over them, the optimizer
    states sharded over them with ``zero_stage`` 1 and the parameters and gradients too with 2 / 3 (FSDP2 on
    each stage, torchtitan's PP x FSDP: ``components/distributed/stage_fsdp.py``). Trained by our own loop
    (``components/runtime/pipeline_loop.py``); CPU (gloo) and GPU."""

    # pipeline ranks; launcher.nproc_per_node x nnodes must be a multiple; world / pp_size data-parallel
    # replicas (tp_size: tensor-parallel ranks inside each stage, 3D: pp x dp x tp)
    pp_size: int = knob(2, Range(2), hint="one stage would be no pipeline")
    # over the data-parallel replicas: 0 every replica keeps the stage whole; 1 ZeRO-1, each keeps the
    # optimizer states of its partition (torch's ZeroRedundancyOptimizer); 3 FSDP2 on each stage: parameters,
    # gradients and states sharded, a layer gathered for its forward and backward (ZeRO-3); 2 the same
    # without resharding between forward and backward (ZeRO-2's memory in flight)
    zero_stage: int = knob(0, one_of(0, 1, 2, 3))

    shards_parameters: ClassVar[bool] = True  # no rank holds the whole model: saving gathers it
    axes: ClassVar[frozenset[str]] = frozenset({"pp", "tp"})
    searched_axes: ClassVar[tuple[str, ...]] = ("pp", "tp")
    needs_process_group: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True

    @property
    def label(self) -> str:
        tp = f" x tp {self.tp_size}" if self.tp_size > 1 else ""
        zero = {1: ", ZeRO-1 over the replicas", 2: ", FSDP2 (ZeRO-2) over the replicas",
                3: ", FSDP2 (ZeRO-3) over the replicas"}.get(self.zero_stage, "")  # fmt: skip
        return f"Pipeline (pp {self.pp_size}{tp}, {self.schedule}{zero})"

    @property
    def shards_stages(self) -> bool:
        """FSDP2 on each stage over the data-parallel replicas (``zero_stage`` 2 or 3)."""
        return self.zero_stage >= 2

    @property
    def num_stages(self) -> int:
        return self.parallel.num_stages

    @property
    def stage_sharding(self) -> int | None:
        return self.zero_stage

    def applicable(self, world_size: int) -> bool:
        ranks = self.pp_size * self.tp_size
        return world_size >= ranks and world_size % ranks == 0

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        """Each replica's stages whole (``mesh()`` says how the layers split; with ``zero_stage`` 1 the
        optimizer states sharded over the replicas, with 2 / 3 FSDP2's), the schedule's micro-batches in
        flight."""
        kind = "fsdp" if self.shards_stages else "ddp"
        return StrategyShape(
            kind, self.zero_stage, pipeline_schedule=self.schedule, pipeline_chunks=self.stages_per_rank
        )

    def axis_refusal(self, device: str | None = None, dtype: str | None = None) -> ConfigError | None:
        """Tensor-parallel stages (DTensor) keep each replica's stage and optimizer states whole: ZeRO-1
        (torch's ZeroRedundancyOptimizer) shards plain tensors, and FSDP2 over them (a 2-D data x tensor
        mesh per stage) is not wired."""
        if not (self.zero_stage and self.tp_size > 1):
            return None
        how = (
            "ZeRO-1 (torch's ZeroRedundancyOptimizer) shards plain tensors, not the tensor-parallel stages' "
            "DTensors"
            if self.zero_stage == 1
            else "FSDP2 over tensor-parallel stages (a 2-D data x tensor mesh per stage) is not wired"
        )
        return ConfigError(
            f"pipeline stages with tensor-parallel stages (strategy.tp_size={self.tp_size}) keep each "
            f"replica's stage whole, and their data-parallel side here is ZeRO-{self.zero_stage}: " + how,
            key="strategy.tp_size",
            hint=f"whole stages on every replica (strategy=ddp, or zero0, strategy.pp_size={self.pp_size} "
            f"strategy.tp_size={self.tp_size}; strategy=pipeline strategy.zero_stage=0), or "
            "strategy.tp_size=1",
        )

    def training_args(self, device: str, plan: BatchPlan | None = None) -> dict[str, Any]:
        """The trainer only prepares data, optimizer and schedule here: nothing of its own training loop
        applies (no Liger patching, no torch.compile of the cut model)."""
        return {**super().training_args(device, plan), "use_liger_kernel": False, "torch_compile": False}

    def check(self, plan: BatchPlan, device: str) -> None:
        """The mesh (pp_size divides the world), the model (a family cut here, enough layers, a valid
        split) and the schedule (1F1B with fewer micro-batches than stages)."""
        self.parallel.mesh(plan.world_size).check()
        if plan.architecture is None:
            raise ConfigError(
                "strategy=pipeline needs the model's architecture to plan its stages, and it cannot be read",
                key="model.name_or_path",
                hint="a local model dir, a cached hub model, or the architecture numbers in the model YAML",
            )
        self.stage_plan(plan.architecture)
        m = plan.gradient_accumulation_steps
        if self.schedule == "interleaved_1f1b" and m % max(1, m // self.pp_size):
            raise ConfigError(
                f"interleaved 1F1B runs its micro-batches in rounds of pp_size={self.pp_size}: "
                f"{m} micro-batches per step do not divide into them",
                key="train.gradient_accumulation_steps",
                hint=f"a multiple of {self.pp_size} (or fewer than {self.pp_size}); a smaller "
                "train.micro_batch_size keeps the global batch",
            )
        if self.schedule == "1f1b" and m < self.num_stages:
            import logging

            logging.getLogger("hydratune").warning(
                "strategy=pipeline: %d micro-batch(es) per step for %d stages: the stages take turns "
                "(bubble %.0f%%) and 1F1B runs as GPipe; raise train.gradient_accumulation_steps (a smaller "
                "train.micro_batch_size keeps the global batch)",
                m,
                self.num_stages,
                100 * self.bubble(m),
            )

    def stage_plan(self, architecture: Any) -> Any:
        """The split of a model of ``architecture`` (its config) into stages, the one the run uses and
        ``mode=plan`` prints (``components/distributed/stages.py``), or a ConfigError naming the fix: the
        family, the layer count, ``strategy.split``. Balanced like the memory estimate's stages."""
        from hydratune.components.distributed import stages
        from hydratune.components.memory.parallel import balanced_split

        why = stages.refusal(architecture)
        if why is not None:
            raise ConfigError(
                f"strategy=pipeline cannot cut this model into stages: {why}",
                key="strategy",
                hint="use strategy=fsdp or a DeepSpeed zero stage (zero3) for this model",
            )
        model = stages.meta_model(architecture)
        return stages.plan_stages(
            model, self.num_stages, self.pp_size, list(self.split), balance=balanced_split
        )

    @staticmethod
    def stage_ranks(stage_plan: Any, stage: int, mesh: Mesh) -> str:
        """What stage ``stage`` holds and the ranks holding it (split over tp ranks with tensor parallel)."""
        pipeline_rank = stage_plan.rank_of(stage)
        ranks = [r for r in range(mesh.world) if mesh.coordinates(r)["pp"] == pipeline_rank]
        split = f", each layer's projections split over tp {mesh.tp}" if mesh.tp > 1 else ""
        return f"{stage_plan.describe(stage)} on ranks {ranks}{split}"

    def bubble(self, micro_batches: int) -> float:
        """The theoretical bubble of ``micro_batches`` per step: (p - 1) / (m + p - 1), interleaved
        (p - 1) / (v m + p - 1) (the estimate's own formula)."""
        from hydratune.components.memory.parallel import bubble_fraction

        return bubble_fraction(self.pp_size, micro_batches, self.schedule, self.stages_per_rank)

    def describe(self, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
        stage_plan = self.stage_plan(plan.architecture)
        mesh = self.parallel.mesh(plan.world_size)
        m, dp = plan.gradient_accumulation_steps, mesh.dp
        described = super().describe(plan, device)
        described["batch"]["global_batch_size"] = (
            f"{plan.micro_batch_size} x {m} x {dp} (data-parallel replicas) = {plan.global_batch_size}"
        )
        described["pipeline"] = {
            "mesh": mesh.describe(),
            "schedule": f"{self.schedule}: {self.num_stages} stages, {self.stages_per_rank} per rank",
            "micro-batches per step": f"{m} (train.gradient_accumulation_steps), each of "
            f"train.micro_batch_size={plan.micro_batch_size} rows per replica",
            **{
                f"stage {s} (pipeline rank {stage_plan.rank_of(s)})": self.stage_ranks(stage_plan, s, mesh)
                for s in range(stage_plan.num_stages)
            },
            "bubble (theoretical)": round(self.bubble(m), 4),
        }
        return described


def with_stages(strategy: Strategy) -> Strategy:
    """The engine a run of ``strategy`` trains with: itself, or with pipeline stages (``strategy.pp_size``
    > 1 on an option that declares the axis) the staged engine, :class:`Pipeline`, with the option's
    parallel keys and its data-parallel side (``stage_sharding``); the option's own refusals are asked first
    (what its engine's knobs cannot do under stages), then the staged engine's."""
    sharding = getattr(strategy, "stage_sharding", None)
    if sharding is None or strategy.parallel.pp == 1 or type(strategy) is Pipeline:
        return strategy  # an option without the axis refuses pp_size itself (its validate)
    strategy.validate()
    parallel = {f.name: getattr(strategy, f.name) for f in fields(ParallelKnobs)}
    staged = Pipeline(device=strategy.device, zero_stage=sharding, **parallel)
    staged.validate()
    return staged


def stages_note(option: Strategy, staged: Strategy) -> str:
    """What the command prints when ``option`` trains as ``staged`` (:func:`with_stages`)."""
    return (
        f"strategy: {type(option).__name__} with strategy.pp_size={option.parallel.pp} trains as "
        f"{staged.label}, the stages in the pipeline loop"
    )
