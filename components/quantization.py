"""Quantization component: how base weights are stored (none here; bitsandbytes int8/nf4/fp4 build on it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.registry import component


@component("quantization")
@dataclass
class NoQuantization:
    """Weights stay in the model's dtype."""

    @property
    def enabled(self) -> bool:
        return False

    @property
    def needs_adapter(self) -> bool:
        """Quantized bases cannot be trained directly: they need a PEFT adapter on top."""
        return False

    def load_kwargs(self, compute_dtype: str) -> dict[str, Any]:
        """Extra ``from_pretrained`` kwargs (a ``quantization_config`` for quantized loads)."""
        return {}
