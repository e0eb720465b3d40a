"""Pipeline parallelism over ``torch.distributed.pipelining``: the process groups of a pp x dp mesh, the
stages of a cut model as ``PipelineStage`` objects (timed, for the bubble), the schedules (GPipe, 1F1B,
interleaved 1F1B), and what a step needs around them: gradients summed over the data-parallel group and
between the two copies of a tied embedding, clipped by the norm over every stage, and the whole model's
weights gathered on rank 0.

The mesh is ``(pp, dp)`` with pp outermost (torchtitan's order): rank = pp_rank x dp + dp_rank, so rank 0 is
stage 0 of data-parallel replica 0, and the ranks of one pipeline are ``dp`` apart.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from components.config.errors import ConfigError


@dataclass
class PipelineGroups:
    """This rank's place in the pp x dp mesh and its process groups."""

    pp: int
    dp: int
    pp_rank: int
    dp_rank: int
    device: torch.device
    pp_group: Any
    dp_group: Any
    tied_group: Any = None  # the first and last stage of this rank's pipeline (tied embeddings)

    @classmethod
    def build(cls, pp: int, device: str, tied: bool) -> PipelineGroups:
        """The groups of a ``pp x (world / pp)`` mesh (the default process group made first when none
        exists: gloo on CPU, nccl on CUDA)."""
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device == "cuda" else "gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % pp:
            raise ConfigError(
                f"pp_size {pp} does not divide the {world} processes that joined",
                key="strategy.pp_size",
                hint="launcher.nproc_per_node x launcher.nnodes must be a multiple of strategy.pp_size",
            )
        dp = world // pp
        mesh = init_device_mesh(device, (pp, dp), mesh_dim_names=("pp", "dp"))
        local = torch.cuda.current_device() if device == "cuda" else None
        tied_group = None
        if tied and pp > 1:  # every rank makes every group, in the same order
            for d in range(dp):
                group = dist.new_group([d, (pp - 1) * dp + d])
                if rank % dp == d:
                    tied_group = group
        return cls(
            pp=pp,
            dp=dp,
            pp_rank=rank // dp,
            dp_rank=rank % dp,
            device=torch.device(device, local) if local is not None else torch.device(device),
            pp_group=mesh.get_group("pp"),
            dp_group=mesh.get_group("dp"),
            tied_group=tied_group,
        )

    def describe(self) -> str:
        """What was built, checked against the process groups themselves (sizes as asked, this rank in
        them)."""
        sizes = (dist.get_world_size(self.pp_group), dist.get_world_size(self.dp_group))
        if sizes != (self.pp, self.dp) or dist.get_rank(self.pp_group) != self.pp_rank:
            raise ConfigError(
                f"the pipeline's process groups have sizes {sizes}, pp {self.pp} x dp {self.dp} was asked",
                key="strategy.pp_size",
                hint="a bug: please report it with this message",
            )
        return (
            f"torch.distributed.pipelining: pipeline groups of {self.pp}, data-parallel groups of {self.dp}, "
            f"{self.pp * self.dp} process(es) ({dist.get_backend()})"
        )


@dataclass
class Timing:
    """Seconds a rank spent computing its stages (forward and backward of every micro-batch) during the
    steps measured, next to those steps' wall time: the rest is the pipeline's bubble (and communication)."""

    compute: float = 0.0
    wall: float = 0.0
    steps: int = 0

    def add(self, compute: float, wall: float) -> None:
        self.compute, self.wall, self.steps = self.compute + compute, self.wall + wall, self.steps + 1


@contextlib.contextmanager
def stopwatch(add: Callable[[float], None]) -> Iterator[None]:
    """``add(seconds)`` the block took, however it ends."""
    start = time.perf_counter()
    try:
        yield
    finally:
        add(time.perf_counter() - start)


def timed_stage_class() -> type:
    """``PipelineStage`` that adds the seconds of each forward and backward chunk to ``busy``."""
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        busy = 0.0

        def add(self, seconds: float) -> None:
            self.busy += seconds

        def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            with stopwatch(self.add):
                return super().forward_one_chunk(*args, **kwargs)

        def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            with stopwatch(self.add):
                return super().backward_one_chunk(*args, **kwargs)

    return TimedStage


@dataclass
class StageSchedules:
    """This rank's stages and the schedules that run them, one per (micro-batches, sequence length): the
    stages exchange fixed-shape activations, so a step with another shape gets its own ``PipelineStage``
    objects over the same modules (built once, on first use, by every rank of the pipeline alike)."""

    modules: list[nn.Module]  # this rank's stage modules (components.distributed.stages.Stage)
    stage_ids: list[int]
    num_stages: int
    mesh: PipelineGroups
    schedule: str
    loss_fn: Callable[..., torch.Tensor]
    _built: dict[tuple[int, int, bool], tuple[Any, list[Any], str]] = field(default_factory=dict)
    _loss_seconds: float = 0.0
    _loss_kwargs: dict[str, Any] = field(default_factory=dict)  # this step's, for every micro-batch's loss

    @property
    def has_first(self) -> bool:
        return 0 in self.stage_ids

    @property
    def has_last(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def kind_for(self, micro_batches: int, train: bool) -> str:
        """The schedule a step of ``micro_batches`` runs: the configured one, except that 1F1B with fewer
        micro-batches than stages (an epoch's short last step) runs as GPipe, the order 1F1B then reduces
        to, and interleaved 1F1B with a count it cannot round as looped breadth-first; evaluation runs
        forward only (GPipe without a loss; looped breadth-first for several stages per rank)."""
        if not train:
            return "looped_bfs" if len(self.stage_ids) > 1 else "gpipe"
        if self.schedule == "1f1b" and micro_batches < self.num_stages:
            return "gpipe"
        ranks = self.mesh.pp
        if self.schedule == "interleaved_1f1b" and micro_batches % max(1, micro_batches // ranks):
            return "looped_bfs"
        return self.schedule

    def schedule_for(self, micro_batches: int, length: int, train: bool = True) -> tuple[Any, list[Any], str]:
        """The schedule for ``micro_batches`` micro-batches of ``length`` tokens (built on first use), its
        stages, and its kind (:meth:`kind_for`)."""
        from torch.distributed.pipelining import (
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleLoopedBFS,
        )

        key = (micro_batches, length, train)
        if key not in self._built:
            kind = self.kind_for(micro_batches, train)
            stage_cls = timed_stage_class()
            stages = [
                stage_cls(module, index, self.num_stages, self.mesh.device, group=self.mesh.pp_group)
                for module, index in zip(self.modules, self.stage_ids, strict=True)
            ]
            loss = self._timed_loss if train else None
            multi = {"interleaved_1f1b": ScheduleInterleaved1F1B, "looped_bfs": ScheduleLoopedBFS}
            if kind in multi:
                schedule = multi[kind](stages, micro_batches, loss_fn=loss, scale_grads=False)
            else:
                cls = Schedule1F1B if kind == "1f1b" else ScheduleGPipe
                schedule = cls(stages[0], micro_batches, loss_fn=loss, scale_grads=False)
            self._built[key] = (schedule, stages, kind)
        return self._built[key]

    def _timed_loss(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The loss of one micro-batch, with this step's ``loss_kwargs`` (given here: torch < 2.13
        has no ``schedule.step(loss_kwargs=...)`` and passes such keywords to the first stage's forward)."""
        with stopwatch(self._add_loss_seconds):
            return self.loss_fn(*args, **{**self._loss_kwargs, **kwargs})

    def _add_loss_seconds(self, seconds: float) -> None:
        self._loss_seconds += seconds

    def run(
        self,
        inputs: torch.Tensor | None,
        labels: torch.Tensor | None,
        micro_batches: int,
        length: int,
        *,
        train: bool = True,
        loss_kwargs: dict[str, Any] | None = None,
    ) -> Run:
        """One pass of the schedule over the ``micro_batches`` row chunks of ``inputs`` (token ids, read on
        the first stage) and ``labels`` (read on the last)."""
        fresh = (micro_batches, length, train) not in self._built
        schedule, stages, kind = self.schedule_for(micro_batches, length, train)
        for stage in stages:
            stage.busy = 0.0
        self._loss_seconds = 0.0
        self._loss_kwargs = loss_kwargs or {}
        args = (inputs,) if self.has_first else ()
        begun = time.perf_counter()
        if train:
            losses: list[Any] = []
            target = labels if self.has_last else None
            schedule.step(*args, target=target, losses=losses, return_outputs=False)
            result = [loss.detach() for loss in losses]
        else:
            with torch.no_grad():
                out = schedule.step(*args)
            result = [out] if out is not None else []
        busy = sum(stage.busy for stage in stages) + self._loss_seconds
        return Run(result, kind, busy, time.perf_counter() - begun, fresh)


@dataclass(frozen=True)
class Run:
    """What one pass of a schedule gave this rank: the last stage's per-micro-batch losses (train) or merged
    outputs (eval), the schedule that ran, this rank's seconds computing and in all, and whether the
    schedule was built for it (its first step pays the set-up: a shape probe, the neighbours' handshake)."""

    result: list[Any]
    kind: str
    busy: float
    wall: float
    fresh: bool


# ---- around a step -------------------------------------------------------------------------------------
def all_reduce_grads(params: Sequence[nn.Parameter], group: Any, size: int) -> None:
    """Sum the gradients of ``params`` over ``group`` (flattened into one buffer per dtype)."""
    if size <= 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for tensors in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, group=group)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float, group: Any, counted: set[int]) -> float:
    """The gradient norm over every stage (``counted``: ids of the parameters whose squares this rank adds,
    so a tied matrix held by two stages counts once), and every gradient scaled as
    ``torch.nn.utils.clip_grad_norm_`` would on the whole model (``max_norm`` 0: no clipping)."""
    params = [p for p in params if p.grad is not None]
    local = sum((p.grad.detach().float().pow(2).sum() for p in params if id(p) in counted), torch.zeros(()))
    local = local.to(params[0].grad.device) if params else local
    dist.all_reduce(local, group=group)
    total = float(local.sqrt())
    if max_norm > 0:
        coef = min(1.0, max_norm / (total + 1e-6))
        if coef < 1.0:
            for p in params:
                p.grad.detach().mul_(coef)
    return total


def gather_state_dict(state: dict[str, torch.Tensor], mesh: PipelineGroups) -> dict[str, torch.Tensor] | None:
    """The whole model's state dict on rank 0 from each pipeline rank's part (replica 0 sends it; a tied
    matrix arrives from both ends, the same tensor); None elsewhere. A collective call on every rank."""
    parts: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    mine = {k: v.detach().cpu() for k, v in state.items()} if mesh.dp_rank == 0 else {}
    dist.gather_object(mine, parts if dist.get_rank() == 0 else None, dst=0)
    if dist.get_rank() != 0:
        return None
    whole: dict[str, torch.Tensor] = {}
    for part in parts:
        whole.update(part or {})
    return whole


def all_gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (a picklable object), in rank order."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out
