"""The device mesh of a run: how its processes split into data (dp), tensor (tp), sequence (sp) and pipeline
(pp) parallel groups, ``dp x tp x sp x pp = world``. Pure arithmetic (no torch): the strategy says its sizes
(:meth:`components.strategy.Strategy.mesh`), the batch plan, ``mode=plan`` and the memory estimate read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.config.errors import ConfigError


@dataclass(frozen=True)
class Mesh:
    """``world`` processes as ``dp x tp x sp x pp``; ``dp`` is what is left: world / (tp x sp x pp)."""

    world: int
    tp: int = 1
    sp: int = 1
    pp: int = 1

    @property
    def model_parallel(self) -> int:
        """Processes that hold one copy of the model between them (tp x sp x pp)."""
        return self.tp * self.sp * self.pp

    @property
    def dp(self) -> int:
        """Data-parallel replicas: each sees its own micro-batches (the batch arithmetic's multiplier)."""
        return max(1, self.world // self.model_parallel)

    @property
    def is_data_parallel_only(self) -> bool:
        return self.model_parallel == 1

    def check(self) -> None:
        """tp x sp x pp must divide the world size (a ConfigError naming the knobs and the fix)."""
        for dim in ("tp", "sp", "pp"):
            if getattr(self, dim) < 1:
                raise ConfigError(f"{dim}_size must be >= 1", key=f"strategy.{dim}_size")
        if self.world % self.model_parallel:
            first = next(dim for dim in ("tp", "sp", "pp") if getattr(self, dim) > 1)
            raise ConfigError(
                f"tp x sp x pp = {self.tp} x {self.sp} x {self.pp} = {self.model_parallel} does not divide "
                f"the world size {self.world}",
                key=f"strategy.{first}_size",
                hint=f"launcher.nproc_per_node x launcher.nnodes must be a multiple of {self.model_parallel}",
            )

    def describe(self) -> str:
        """``dp 1 x tp 2 x sp 1 x pp 1 = 2 processes``."""
        sizes = " x ".join(f"{dim} {getattr(self, dim)}" for dim in ("dp", "tp", "sp", "pp"))
        return f"{sizes} = {self.world} process{'es' if self.world != 1 else ''}"
