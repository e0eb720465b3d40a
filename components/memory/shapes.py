"""What a strategy does to memory, as plain numbers: each strategy component says its own shape
(``Strategy.memory_shape()`` in ``components/strategy/``), and the estimate reads only this.

Pure: no torch, no Hydra (``bench/memory.py`` builds shapes on a machine without either).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hydratune.components.memory.parallel import bubble_fraction

#: ASSUMED relative throughput (1.0 = DDP): NOT measured. No throughput measurement with provenance backs
#: these numbers (docs/memory.md measures memory only); they encode the usual order single = ddp > ZeRO-0
#: > ZeRO-1 > ZeRO-2 > FSDP > ZeRO++ > ZeRO-3 > optimizer offload > parameter offload > NVMe, i.e. less
#: communication and no host round trip first. strategy=auto uses only the order (the fastest rung that
#: fits); the printed "speed (assumed)" values are these assumptions. By ZeRO stage (0-3):
ZERO_SPEED = (0.97, 0.96, 0.95, 0.73)
ZEROPP_SPEED = 0.78  # ZeRO-3 with quantized weights / a hierarchical partition (less traffic)
FSDP_SPEED = 0.80
#: the cost of moving states off the GPU, multiplied in: optimizer states (and step) / parameters
OPTIMIZER_OFFLOAD_SPEED = {"none": 1.0, "cpu": 0.32, "nvme": 0.1}
PARAM_OFFLOAD_SPEED = {"none": 1.0, "cpu": 0.77, "nvme": 0.7}
#: Gradient checkpointing recomputes the forward pass: about a third more compute.
CHECKPOINTING_SPEED = 0.75
#: ASSUMED, NOT measured either: the cost of each doubling of a model-parallel dimension, multiplied in.
#: Tensor parallel all-reduces activations twice per layer forward and twice backward (inside a node);
#: Ulysses sequence parallel all-to-alls q/k/v and the attention output (4 per layer each way); pipeline
#: parallel sends one activation per micro-batch and stage, and idles for the bubble, which is computed
#: (``parallel.bubble_fraction``), not assumed. They order the model-parallel rungs among themselves only:
#: strategy=auto tries them after every data-parallel rung on the GPUs and before any offload
#: (``ladder.Rung.tier``).
TP_SPEED = 0.88
SP_SPEED = 0.92
PP_SPEED = 0.97
EP_SPEED = 0.95  # an all-to-all each way per mixture block (ASSUMED, like the others)


@dataclass(frozen=True)
class StrategyShape:
    """What a strategy does to memory, independent of its class: where states live, how they shard."""

    kind: str  # single | ddp | fsdp | deepspeed
    stage: int = 0  # ZeRO stage (FSDP ≈ 3 with resharding, 2 without; ddp 1: torch's ZeroRedundancyOptimizer)
    offload_optimizer: str = "none"  # none | cpu | nvme
    offload_param: str = "none"  # none | cpu | nvme
    reduce_bucket_size: float = 0.0  # elements (DeepSpeed); 0 = hidden² (HF "auto", the YAMLs' null)
    allgather_bucket_size: float = 0.0
    prefetch_bucket_size: float = 0.0  # ZeRO-3; 0 = "auto" (0.9 hidden²)
    max_live_parameters: float = 1e9
    overlap_comm: bool = True
    quantized_weights: bool = False  # ZeRO++ qwZ
    hpz_partition_size: int = 1  # ZeRO++ hpZ: a secondary copy of the weights sharded inside a node
    sub_group_size: float = 1e9  # ZeRO-3: fp32 gradients are made one sub-group of this many at a time
    pipeline_schedule: str = "1f1b"  # gpipe | 1f1b | interleaved_1f1b: micro-batches in flight per stage
    pipeline_chunks: int = 1  # model chunks per pipeline rank (interleaved_1f1b: 2 or more)

    @property
    def is_deepspeed(self) -> bool:
        return self.kind == "deepspeed"

    @property
    def speed(self) -> float:
        """ASSUMED relative throughput (see ``ZERO_SPEED``): by kind and stage, times the offload costs."""
        if self.kind in ("single", "ddp"):
            base = 1.0
        elif self.kind == "fsdp":
            base = FSDP_SPEED
        elif self.stage >= 3 and (self.quantized_weights or self.hpz_partition_size > 1):
            base = ZEROPP_SPEED
        else:
            base = ZERO_SPEED[min(self.stage, 3)]
        offload = OPTIMIZER_OFFLOAD_SPEED[self.offload_optimizer] * PARAM_OFFLOAD_SPEED[self.offload_param]
        return base * offload


SINGLE = StrategyShape("single")


def parallel_speed(
    tp: int = 1,
    sp: int = 1,
    pp: int = 1,
    micro_batches: int = 1,
    shape: StrategyShape = SINGLE,
    ep: int = 1,
) -> float:
    """ASSUMED relative throughput of a tp x sp x pp split (1.0: none), times the computed pipeline bubble's
    share of busy time: each doubling of tp / sp / pp / ep costs ``TP_SPEED`` / ``SP_SPEED`` / ``PP_SPEED``
    / ``EP_SPEED``."""
    cost = TP_SPEED ** math.log2(tp) * SP_SPEED ** math.log2(sp) * PP_SPEED ** math.log2(pp)
    cost *= EP_SPEED ** math.log2(ep)
    return cost * (1 - bubble_fraction(pp, micro_batches, shape.pipeline_schedule, shape.pipeline_chunks))


def elements(value: Any) -> float:
    """DeepSpeed bucket sizes: a number of elements, or null / "auto" (0 here: hidden² at estimate time)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
