"""What a strategy does to memory, as plain numbers: each strategy component says its own shape
(``Strategy.memory_shape()`` in ``components/strategy.py``), and the estimate reads only this.

Pure: no torch, no Hydra (``bench/memory.py`` builds shapes on a machine without either).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class StrategyShape:
    """What a strategy does to memory, independent of its class: where states live, how they shard."""

    kind: str  # single | ddp | fsdp | deepspeed
    stage: int = 0  # ZeRO stage (FSDP ≈ 3 with resharding, 2 without)
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


def elements(value: Any) -> float:
    """DeepSpeed bucket sizes: a number of elements, or null / "auto" (0 here: hidden² at estimate time)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
