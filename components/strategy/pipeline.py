"""``strategy=pipeline``: the decoder layers cut into stages over ``torch.distributed.pipelining``, trained
by our own loop (``components/runtime/pipeline_loop.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, Range, knob, one_of
from hydratune.components.config.registry import component
from hydratune.components.distributed.mesh import Mesh
from hydratune.components.memory.parallel import SCHEDULES
from hydratune.components.memory.shapes import StrategyShape
from hydratune.components.strategy.core import BatchPlan, ModelSplit, Strategy, first_refusal


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
    # replicas
    pp_size: int = knob(2, Range(2), hint="one stage would be no pipeline")
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved_1f1b (needs stages_per_rank >= 2)
    stages_per_rank: int = knob(1, AT_LEAST_ONE)  # > 1: interleaved_1f1b (virtual stages, a smaller bubble)
    # the first layer of stages 1..N-1, e.g. [12] for 2 stages; [] = balanced by parameter count
    split: list[int] = knob([], AT_LEAST_ONE)
    tp_size: int = knob(1, AT_LEAST_ONE)  # tensor-parallel ranks inside each stage (3D: pp x dp x tp)
    # over the data-parallel replicas: 0 every replica keeps the stage whole; 1 ZeRO-1, each keeps the
    # optimizer states of its partition (torch's ZeroRedundancyOptimizer); 3 FSDP2 on each stage: parameters,
    # gradients and states sharded, a layer gathered for its forward and backward (ZeRO-3); 2 the same
    # without resharding between forward and backward (ZeRO-2's memory in flight)
    zero_stage: int = knob(0, one_of(0, 1, 2, 3))

    shards_parameters: ClassVar[bool] = True  # no rank holds the whole model: saving gathers it
    parallel_dims: ClassVar[tuple[str, ...]] = ("pp", "tp")  # strategy=auto tries their sizes
    needs_process_group: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True
    splits_layers: ClassVar[bool] = True

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
        return self.pp_size * self.stages_per_rank

    def mesh(self, world_size: int) -> Mesh:
        return Mesh(world_size, tp=self.tp_size, pp=self.pp_size)

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

    def validate(self) -> None:
        super().validate()
        if self.zero_stage and self.tp_size > 1:
            how = (
                "ZeRO-1 (torch's ZeroRedundancyOptimizer) shards plain tensors, not the tensor-parallel "
                "stages' DTensors"
                if self.zero_stage == 1
                else "FSDP2 over tensor-parallel stages (a 2-D data x tensor mesh per stage) is not wired"
            )
            raise ConfigError(
                f"strategy.zero_stage={self.zero_stage} in the pipeline loop with tp_size={self.tp_size}: "
                + how,
                key="strategy.zero_stage",
                hint="strategy.zero_stage=0 with strategy.tp_size > 1, or strategy.tp_size=1",
            )
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"unknown schedule '{self.schedule}'",
                key="strategy.schedule",
                hint=f"one of {SCHEDULES}",
            )
        if self.schedule == "interleaved_1f1b" and self.stages_per_rank < 2:
            raise ConfigError(
                "interleaved_1f1b runs several stages per rank",
                key="strategy.stages_per_rank",
                hint="strategy.stages_per_rank=2 (or more), or strategy.schedule=1f1b",
            )
        if self.schedule != "interleaved_1f1b" and self.stages_per_rank != 1:
            raise ConfigError(
                f"{self.schedule} runs one stage per rank",
                key="strategy.stages_per_rank",
                hint="strategy.stages_per_rank=1, or strategy.schedule=interleaved_1f1b",
            )

    def combination_refusal(
        self, recipe: Any, peft: Any, quantization: Any, dtype: str, data: Any = None, model: Any = None
    ) -> ConfigError | None:
        refused = {
            "recipe": (
                not recipe.trains_in_stages,
                f"recipe={recipe.name} does not train through the pipeline loop (its loss is not the "
                "causal-LM cross-entropy on its data's labels that the stages compute)",
                "recipe=sft, or strategy=fsdp / a DeepSpeed zero stage for this recipe",
            ),
            "quantization": (
                quantization.enabled,
                "a quantized base is not cut into pipeline stages",
                "quantization=none (or strategy=ddp / zero2 for QLoRA)",
            ),
            "peft": (
                peft.adds_virtual_tokens,
                "prompt-learning adapters prepend virtual tokens to the first stage's input, which the "
                "pipeline's fixed-shape activations do not carry",
                "peft=lora (or none), or another strategy for this adapter",
            ),
            "precision": (
                dtype == "fp16",
                "fp16 loss scaling is not wired across pipeline stages",
                "precision=bf16 (or fp32)",
            ),
            "data.packing": (
                data is not None and bool(getattr(data, "packing", False)),
                "packed rows are not split into pipeline micro-batches: the stages pad rows to one length",
                "data.packing=false",
            ),
            "model.compile": (
                bool(getattr(model, "compile", False)),
                "torch.compile is not applied to pipeline stages",
                "model.compile=false",
            ),
            "model.liger": (
                getattr(model, "liger", None) is True,
                "Liger's kernels patch the whole model's modules, not pipeline stages",
                "model.liger=null (off under strategy=pipeline)",
            ),
        }
        return first_refusal(refused)

    def training_args(self, device: str, plan: BatchPlan | None = None) -> dict[str, Any]:
        """The trainer only prepares data, optimizer and schedule here: nothing of its own training loop
        applies (no Liger patching, no torch.compile of the cut model)."""
        return {**super().training_args(device, plan), "use_liger_kernel": False, "torch_compile": False}

    def check(self, plan: BatchPlan, device: str) -> None:
        """The mesh (pp_size divides the world), the model (a family cut here, enough layers, a valid
        split) and the schedule (1F1B with fewer micro-batches than stages)."""
        self.mesh(plan.world_size).check()
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
        return stages.plan_stages(model, self.num_stages, self.pp_size, self.split, balance=balanced_split)

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
        mesh = self.mesh(plan.world_size)
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
