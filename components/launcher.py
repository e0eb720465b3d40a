"""Launcher component: how many processes run the recipe, on how many nodes."""

from __future__ import annotations

from dataclasses import dataclass

from components.errors import ConfigError
from components.registry import component


@component("launcher")
@dataclass
class Local:
    """Processes on this machine (``nproc_per_node``), optionally one node of a multi-node job.

    With one process the recipe runs in the CLI's own process. Under an external launcher
    (``torchrun``, ``accelerate launch``, ``deepspeed``) the ranks come from the environment.
    """

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    rdzv_endpoint: str | None = None

    def validate(self) -> None:
        if self.nproc_per_node < 1:
            raise ConfigError("nproc_per_node must be >= 1", key="launcher.nproc_per_node")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(
                f"node_rank {self.node_rank} is not in [0, nnodes={self.nnodes})", key="launcher.node_rank"
            )

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes
