"""FSDP2 over the data-parallel replicas of each pipeline stage (``strategy=pipeline strategy.zero_stage=3``;
torchtitan's PP x FSDP; 2: no resharding between forward and backward): every decoder layer of a stage one
``fully_shard`` unit, the stage itself the root unit (its embedding, final norm and head).
``torch.distributed.pipelining`` knows FSDP modules: it syncs the gradients on a stage's last micro-batch only
and reshards after it. The gradients are reduce-scattered as sums (the loss is already divided by the step's
trained tokens of every replica, as the Trainer's ``num_items_in_batch`` does), so the step is the one a
single process takes on the whole batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn


def shard_stages(stages: Sequence[nn.Module], dp_mesh: Any, reshard_after_forward: bool) -> None:
    """``fully_shard`` each stage's layers, then the stage, over ``dp_mesh`` (in place: the cut model's
    parameters become DTensors, each replica holding a shard); gradients summed over the replicas."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for stage in stages:
        for layer in stage.layers:
            fully_shard(layer, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(stage, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
        for unit in stage.modules():
            if isinstance(unit, FSDPModule):
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
