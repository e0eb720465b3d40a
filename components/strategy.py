"""Strategy component: how training is spread over devices (single device, DDP; ZeRO/FSDP build on it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.errors import ConfigError
from components.registry import component

DEVICES = ("auto", "cpu", "cuda", "mps")


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


@dataclass
class Strategy:
    """Base of every strategy: where it runs, what it adds to TrainingArguments, what it must produce."""

    device: str = "auto"

    def validate(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(
                f"unknown device '{self.device}'", key="strategy.device", hint=f"one of {DEVICES}"
            )

    def resolve_device(self) -> str:
        return detect_device(self.device)

    def training_args(self, device: str) -> dict[str, Any]:
        return {"use_cpu": device == "cpu"}

    def expected_distributed_types(self, world_size: int) -> set[str]:
        """accelerate DistributedType names this strategy may legitimately end up with."""
        return {"NO"}

    def verify(self, accelerator: Any) -> None:
        """Refuse to train when accelerate silently fell back to something else."""
        got = str(accelerator.distributed_type).rsplit(".", 1)[-1]
        want = self.expected_distributed_types(accelerator.num_processes)
        if got not in want:
            raise ConfigError(
                f"asked for strategy {type(self).__name__} but accelerate prepared '{got}' "
                f"with {accelerator.num_processes} process(es); expected one of {sorted(want)}",
                key="strategy",
                hint="check the launcher (process count) and stale ACCELERATE_* environment variables",
            )


@component("strategy")
@dataclass
class Single(Strategy):
    """One process on one device (GPU if present, else CPU)."""


@component("strategy")
@dataclass
class DDP(Strategy):
    """torch DistributedDataParallel: one process per device, gradients all-reduced."""

    backend: str = "auto"  # auto = nccl on GPU, gloo on CPU
    find_unused_parameters: bool = False
    bucket_cap_mb: int = 25
    broadcast_buffers: bool = False

    def validate(self) -> None:
        super().validate()
        if self.backend not in ("auto", "nccl", "gloo", "mpi", "ccl"):
            raise ConfigError(f"unknown backend '{self.backend}'", key="strategy.backend")

    def training_args(self, device: str) -> dict[str, Any]:
        args = super().training_args(device)
        args.update(
            ddp_backend=None if self.backend == "auto" else self.backend,
            ddp_find_unused_parameters=self.find_unused_parameters,
            ddp_bucket_cap_mb=self.bucket_cap_mb,
            ddp_broadcast_buffers=self.broadcast_buffers,
        )
        return args

    def expected_distributed_types(self, world_size: int) -> set[str]:
        return {"NO"} if world_size == 1 else {"MULTI_GPU", "MULTI_CPU", "MULTI_MPS", "MULTI_XPU"}
