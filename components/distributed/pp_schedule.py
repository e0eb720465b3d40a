"""Pipeline parallelism over ``torch.distributed.pipelining``: the process groups of a pp x dp x tp mesh, the
stages of a cut model as ``PipelineStage`` objects (timed, for the bubble), the schedules (GPipe, 1F1B,
interleaved 1F1B), and what a step needs around them: gradients summed over the data-parallel group and
between the two copies of a tied embedding, clipped by the norm over every stage and tensor-parallel shard,
and the whole model's weights gathered on rank 0.

The mesh is ``(pp, dp, tp)`` with pp outermost and tp innermost (torchtitan's order): rank = (pp_rank x dp +
dp_rank) x tp + tp_rank, so rank 0 is stage 0 of data-parallel replica 0, a stage's tensor-parallel ranks
are neighbours (one node), and the ranks of one pipeline are ``dp x tp`` apart.
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

from hydratune.components.config.errors import ConfigError


@dataclass
class PipelineGroups:
    """This rank's place in the pp x dp x tp mesh and its process groups."""

    pp: int
    dp: int
    pp_rank: int
    dp_rank: int
    device: torch.device
    pp_group: Any
    dp_group: Any
    tied_group: Any = None  # the first and last stage of this rank's pipeline (tied embeddings)
    tp: int = 1
    tp_rank: int = 0
    tp_group: Any = None
    tp_mesh: Any = None  # the DeviceMesh of this rank's tensor-parallel group (DTensor's)
    dp_mesh: Any = None  # the DeviceMesh of this rank's data-parallel group (FSDP2's over the replicas)

    @classmethod
    def build(cls, pp: int, device: str, tied: bool, tp: int = 1) -> PipelineGroups:
        """The groups of a ``pp x (world / (pp x tp)) x tp`` mesh (the default process group made first when
        none exists: gloo on CPU, nccl on CUDA)."""
        from torch.distributed.device_mesh import init_device_mesh

        from hydratune.components.distributed.mesh import Mesh

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device == "cuda" else "gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % (pp * tp):
            raise ConfigError(
                f"pp_size x tp_size = {pp} x {tp} does not divide the {world} processes that joined",
                key="strategy.pp_size",
                hint="launcher.nproc_per_node x launcher.nnodes must be a multiple of pp_size x tp_size",
            )
        dp = world // (pp * tp)
        where = Mesh(world, tp=tp, pp=pp).coordinates(rank)
        mesh = init_device_mesh(device, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        local = torch.cuda.current_device() if device == "cuda" else None
        tied_group = None
        if tied and pp > 1:  # every rank makes every group, in the same order
            for d in range(dp * tp):  # the (dp, tp) coordinate's first and last stage
                group = dist.new_group([d, (pp - 1) * dp * tp + d])
                if rank % (dp * tp) == d:
                    tied_group = group
        return cls(
            pp=pp,
            dp=dp,
            pp_rank=where["pp"],
            dp_rank=where["dp"],
            device=torch.device(device, local) if local is not None else torch.device(device),
            pp_group=mesh.get_group("pp"),
            dp_group=mesh.get_group("dp"),
            tied_group=tied_group,
            tp=tp,
            tp_rank=where["tp"],
            tp_group=mesh.get_group("tp"),
            tp_mesh=mesh["tp"],
            dp_mesh=mesh["dp"],
        )

    def planned(self) -> Any:
        """The :class:`~hydratune.components.distributed.mesh.Mesh` this rank's groups were built from (the
        plan's)."""
        from hydratune.components.distributed.mesh import Mesh

        return Mesh(self.world, tp=self.tp, pp=self.pp)

    def pp_rank_of(self, rank: int) -> int:
        """The pipeline rank (stage position) of global rank ``rank``."""
        return self.planned().coordinates(rank)["pp"]

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp

    def label(self) -> str:
        """``pp 2 x dp 1 = 2 processes`` (``x tp 2`` with tensor parallel stages)."""
        tp = f" x tp {self.tp}" if self.tp > 1 else ""
        return f"pp {self.pp} x dp {self.dp}{tp} = {self.world} processes"

    def check_groups(self) -> None:
        """Every rank's pipeline, data- and tensor-parallel group holds the ranks ``mode=plan`` printed
        (``Mesh.groups``); a ConfigError otherwise (a collective call)."""
        planned = self.planned()
        mine = {
            dim: dist.get_process_group_ranks(getattr(self, f"{dim}_group")) for dim in ("pp", "dp", "tp")
        }
        built = all_gather(mine)
        for dim in ("pp", "dp", "tp"):
            got = sorted({tuple(sorted(groups[dim])) for groups in built})
            want = sorted(tuple(g) for g in planned.groups(dim))
            if got != want:
                raise ConfigError(
                    f"the pipeline's {dim} groups are {got}, the plan's {want}",
                    key="strategy.pp_size",
                    hint="a bug: please report it with this message",
                )

    def describe(self) -> str:
        """What was built, checked against the process groups themselves (sizes as asked, this rank in
        them)."""
        sizes = tuple(dist.get_world_size(g) for g in (self.pp_group, self.dp_group, self.tp_group))
        if sizes != (self.pp, self.dp, self.tp) or dist.get_rank(self.pp_group) != self.pp_rank:
            raise ConfigError(
                f"the pipeline's process groups have sizes {sizes}, pp {self.pp} x dp {self.dp} x tp "
                f"{self.tp} was asked",
                key="strategy.pp_size",
                hint="a bug: please report it with this message",
            )
        self.check_groups()
        tp = f", tensor-parallel groups of {self.tp}" if self.tp > 1 else ""
        return (
            f"torch.distributed.pipelining: pipeline groups of {self.pp}, data-parallel groups of "
            f"{self.dp}{tp}, {self.world} process(es) ({dist.get_backend()})"
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

    modules: list[nn.Module]  # this rank's stage modules (hydratune.components.distributed.stages.Stage)
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
def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (the tensor itself otherwise): what collectives and files see."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def is_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor split over its mesh (each rank holds another part), not a replicated one."""
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor) and any(p.is_shard() for p in tensor.placements)


def all_reduce_grads(params: Sequence[nn.Parameter], group: Any, size: int) -> None:
    """Sum the gradients of ``params`` over ``group`` (flattened into one buffer per dtype; a tensor-parallel
    gradient's own shard)."""
    if size <= 1:
        return
    grads = [local(p.grad) for p in params if p.grad is not None]
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


def clip_grad_norm(
    params: Iterable[nn.Parameter],
    max_norm: float,
    groups: Sequence[Any],
    counted: set[int],
    tp_rank: int = 0,
) -> float:
    """The gradient norm over every stage and tensor-parallel shard (``groups``: the pipeline group, then
    the tensor-parallel one; ``counted``: ids of the parameters whose squares this rank adds, so a tied
    matrix held by two stages counts once; a parameter every tensor-parallel rank holds whole counts on
    ``tp_rank`` 0 only), and every gradient scaled as ``torch.nn.utils.clip_grad_norm_`` would on the whole
    model (``max_norm`` 0: no clipping)."""
    params = [p for p in params if p.grad is not None]
    mine = [p for p in params if id(p) in counted and (tp_rank == 0 or is_sharded(p.grad))]
    total_sq = sum((local(p.grad).detach().float().pow(2).sum() for p in mine), torch.zeros(()))
    total_sq = total_sq.to(local(params[0].grad).device) if params else total_sq
    for group in groups:
        if group is not None:
            dist.all_reduce(total_sq, group=group)
    total = float(total_sq.sqrt())
    if max_norm > 0:
        coef = min(1.0, max_norm / (total + 1e-6))
        if coef < 1.0:
            for p in params:
                local(p.grad).detach().mul_(coef)
    return total


def full_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every DTensor gathered whole (a collective call over its mesh), on the CPU."""
    from torch.distributed.tensor import DTensor

    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().contiguous().cpu()
        for k, v in state.items()
    }


def load_full_state(model: nn.Module, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Load whole tensors into ``model``, each tensor-parallel parameter taking its own shard; (missing,
    unexpected) names as ``load_state_dict`` gives them."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    with torch.no_grad():
        for name, value in state.items():
            if name not in own:
                continue
            target = own[name]
            if isinstance(target, DTensor):
                shard = distribute_tensor(value.to(target.dtype), target.device_mesh, target.placements)
                target.to_local().copy_(shard.to_local())
            else:
                target.copy_(value)
    return missing, unexpected


def shard_over_replicas(optimizer: Any, group: Any) -> Any:
    """ZeRO-1 over the data-parallel replicas: ``optimizer``'s parameter groups (the trainer's weight-decay
    groups, its hyper-parameters) in torch's ``ZeroRedundancyOptimizer``, each replica keeping the states of
    its own partition of the parameters, updating them and broadcasting the new values to the others."""
    import inspect

    from torch.distributed.optim import ZeroRedundancyOptimizer

    groups = [dict(g) for g in optimizer.param_groups]
    takes = inspect.signature(type(optimizer).__init__).parameters  # AdamW's defaults hold more than it takes
    defaults = {k: v for k, v in optimizer.defaults.items() if k in takes}
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), process_group=group, **defaults)


def optimizer_part(optimizer: Any) -> Any:
    """The optimizer whose state this rank saves and restores: under ZeRO-1 the inner optimizer over its
    own partition (each replica writes its part: no gathering to one rank), else the optimizer itself."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def optimizer_part_state(optimizer: Any) -> dict[str, Any]:
    """What a checkpoint holds of this rank's :func:`optimizer_part`: its state (DTensors as shards) with the
    outer optimizer's hyper-parameters (under ZeRO-1 the inner ones lag a step: the schedule sets the outer
    groups, copied inward only when the optimizer steps)."""
    part = optimizer_part(optimizer)
    state = local_optimizer_state(part.state_dict())
    if part is not optimizer:
        for saved, outer in zip(state["param_groups"], optimizer.param_groups, strict=True):
            saved.update({k: v for k, v in outer.items() if k != "params"})
    return state


def load_optimizer_part(optimizer: Any, state: dict[str, Any]) -> None:
    """Restore what :func:`optimizer_part` saved; under ZeRO-1 its hyper-parameters (the learning rate the
    schedule had reached) go back to the outer optimizer's groups too, which it copies inward at every
    step."""
    part = optimizer_part(optimizer)
    part.load_state_dict(state)
    if part is not optimizer:
        for outer, inner in zip(optimizer.param_groups, part.param_groups, strict=True):
            outer.update({k: v for k, v in inner.items() if k != "params"})


def held_states(optimizer: Any) -> int:
    """Elements of optimizer state this rank holds (its partition's under ZeRO-1)."""
    inner = optimizer_part(optimizer)
    return sum(
        local(v).numel()
        for state in inner.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def local_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's ``state_dict()`` with each DTensor as this rank's shard: what a checkpoint holds and
    ``torch.load(weights_only=True)`` reads back (:func:`shard_optimizer_state` undoes it after loading)."""
    per_param = {
        key: {name: local(v) if isinstance(v, torch.Tensor) else v for name, v in values.items()}
        for key, values in state["state"].items()
    }
    return {**state, "state": per_param}


def shard_optimizer_state(optimizer: Any) -> None:
    """After ``load_state_dict`` of :func:`local_optimizer_state`: each state tensor of a tensor-parallel
    parameter (the moments, shaped like its shard) a DTensor over the parameter's mesh again."""
    from torch.distributed.tensor import DTensor

    for group in optimizer.param_groups:
        for param in group["params"]:
            if not isinstance(param, DTensor):
                continue
            state = optimizer.state.get(param, {})
            for name, value in state.items():
                plain = isinstance(value, torch.Tensor) and not isinstance(value, DTensor)
                if plain and value.shape == param.to_local().shape:
                    state[name] = DTensor.from_local(
                        value, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
                    )


def whole_stage(
    state: dict[str, torch.Tensor], mesh: PipelineGroups, every_replica: bool = False
) -> dict[str, torch.Tensor]:
    """This rank's stage weights gathered whole on data-parallel replica 0 (``{}`` on the others): a
    collective over replica 0's tensor-parallel ranks, or with ``every_replica`` (FSDP2's shards) over all
    the replicas."""
    gathered = full_state(state) if mesh.dp_rank == 0 or every_replica else {}
    return gathered if mesh.dp_rank == 0 else {}


def gather_state_dict(
    state: dict[str, torch.Tensor], mesh: PipelineGroups, every_replica: bool = False
) -> dict[str, torch.Tensor] | None:
    """The whole model's state dict on rank 0 from each pipeline rank's part (:func:`whole_stage`, sent by
    replica 0's first tensor-parallel rank; a tied matrix arrives from both ends, the same tensor); None
    elsewhere. A collective call on every rank."""
    stage = whole_stage(state, mesh, every_replica)
    parts: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    mine = stage if mesh.tp_rank == 0 else {}
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
