"""hydratune components: small typed builders, one module per config group.

``register_all()`` imports every component module, which registers its structured-config schema with
Hydra (``recipes.register_all()`` adds the recipes' on top: components never import recipes). It must
stay cheap: component modules import torch / transformers / peft lazily, inside the functions that
need them, so that composing and checking a config never pays for them.
"""

from __future__ import annotations

import importlib

COMPONENT_MODULES: tuple[str, ...] = (
    "components.config",
    "components.model",
    "components.data",
    "components.peft",
    "components.strategy",
    "components.auto",
    "components.precision",
    "components.quantization",
    "components.optimizer",
    "components.scheduler",
    "components.tracker",
    "components.launcher",
)


def register_all() -> None:
    """Import every component module that registers a schema (idempotent)."""
    for name in COMPONENT_MODULES:
        importlib.import_module(name)
