"""Learning-rate schedule component: cosine, linear, constant; each with warmup."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import FRACTION, NON_NEGATIVE, knob
from hydratune.components.config.registry import component

if TYPE_CHECKING:
    import torch

KINDS = ("cosine", "linear", "constant")


@component("scheduler")
@dataclass(frozen=True)
class Schedule:
    """``kind`` with warmup: ``warmup_steps`` if > 0, else ``warmup_ratio`` of the total steps."""

    kind: str = "cosine"
    warmup_steps: int = knob(0, NON_NEGATIVE)
    warmup_ratio: float = knob(0.0, FRACTION)  # of the total steps (when warmup_steps is 0)
    min_lr_ratio: float = knob(0.0, FRACTION)  # cosine: floor as a fraction of the peak lr

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"unknown schedule '{self.kind}'", key="scheduler.kind", hint=f"one of {KINDS}")

    def _hf_name_and_kwargs(self) -> tuple[str, dict[str, Any]]:
        if self.kind == "cosine" and self.min_lr_ratio > 0:
            return "cosine_with_min_lr", {"min_lr_rate": self.min_lr_ratio}
        return {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[self.kind], {}

    def warmup(self, total_steps: int) -> int:
        return self.warmup_steps if self.warmup_steps > 0 else round(self.warmup_ratio * total_steps)

    def training_args(self) -> dict[str, Any]:
        """TrainingArguments fields; the trainer builds the schedule once it knows the step count."""
        name, kwargs = self._hf_name_and_kwargs()
        # transformers 5: warmup_steps < 1 is read as a ratio of the total steps
        warmup: float = self.warmup_steps if self.warmup_steps > 0 else self.warmup_ratio
        return {"lr_scheduler_type": name, "lr_scheduler_kwargs": kwargs, "warmup_steps": warmup}

    def build(self, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
        """The schedule for our own loops (PPO)."""
        from transformers import get_scheduler

        name, kwargs = self._hf_name_and_kwargs()
        return get_scheduler(
            name,
            optimizer,
            num_warmup_steps=self.warmup(total_steps),
            num_training_steps=total_steps,
            scheduler_specific_kwargs=kwargs,
        )
