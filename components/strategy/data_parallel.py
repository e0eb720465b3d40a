"""A whole model on every process, through plain accelerate: one process (``strategy=single``) or
torch DistributedDataParallel's replicas (``strategy=ddp``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import POSITIVE, knob
from hydratune.components.config.registry import component
from hydratune.components.memory.shapes import StrategyShape
from hydratune.components.strategy.core import MULTI_PROCESS, BatchPlan, OwnLoop, Strategy


@component("strategy")
@dataclass(frozen=True)
class Single(OwnLoop, Strategy):
    """One process on one device (GPU if present, else CPU)."""

    max_processes: ClassVar[int | None] = 1

    def applicable(self, world_size: int) -> bool:
        return world_size == 1


@component("strategy")
@dataclass(frozen=True)
class DDP(OwnLoop, Strategy):
    """torch DistributedDataParallel: one process per device, gradients all-reduced."""

    backend: str = "auto"  # auto = nccl on GPU, gloo on CPU
    # None: the model decides (CausalLM.training_args): True for a vision-language model, whose tower a
    # batch without images leaves unused, else False
    find_unused_parameters: bool | None = None
    bucket_cap_mb: int = knob(25, POSITIVE)  # MB of gradients per all-reduce bucket
    broadcast_buffers: bool = False

    #: pipeline stages (``strategy.pp_size``): the staged loop, each replica holding its stages whole
    axes: ClassVar[frozenset[str]] = frozenset({"pp"})

    @property
    def stage_sharding(self) -> int | None:
        return 0

    def validate(self) -> None:
        super().validate()
        if self.backend not in ("auto", "nccl", "gloo", "mpi", "ccl"):
            raise ConfigError(f"unknown backend '{self.backend}'", key="strategy.backend")

    def training_args(self, device: str, plan: BatchPlan | None = None) -> dict[str, Any]:
        args = super().training_args(device, plan)
        args.update(
            ddp_backend=None if self.backend == "auto" else self.backend,
            ddp_bucket_cap_mb=self.bucket_cap_mb,
            ddp_broadcast_buffers=self.broadcast_buffers,
        )
        if self.find_unused_parameters is not None:  # else the model's training_args say
            args["ddp_find_unused_parameters"] = self.find_unused_parameters
        return args

    def expected_distributed_types(self, world_size: int) -> set[str]:
        return {"NO"} if world_size == 1 else MULTI_PROCESS

    def applicable(self, world_size: int) -> bool:
        return world_size > 1  # on one rank it is strategy=single

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        return StrategyShape("ddp")
