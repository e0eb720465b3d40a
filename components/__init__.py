"""hydratune components: small typed builders, one module per config group, and packages by concern.

The top-level modules are the groups' components (the modules ``conf/`` names in ``_target_``, plus
``recipe.py``, the recipe contract; a group too large for one module is a package of them,
:data:`GROUP_PACKAGES`, whose ``__init__`` re-exports its components under the ``_target_`` paths
``conf/`` and saved run dirs name): ``register_all()`` imports every one of them, which registers their
structured-config schemas with Hydra (``hydratune.recipes.register_all()`` adds the recipes' on top:
components never import recipes). It must stay cheap: component modules import torch / transformers / peft
lazily, inside the functions that need them, so that composing and checking a config never pays for them. The
packages (``config``, ``runtime``, ``text``, ``modeling``, ``distributed``, ``generation``, ``rl``,
``memory``, ``commands``) hold what the components and recipes share; ARCHITECTURE.md draws the layout.
"""

from __future__ import annotations

import importlib
import pkgutil

#: the groups whose components are a package (``hydratune.components.strategy.DeepSpeed`` re-exported by its
#: ``__init__`` from ``components/strategy/deepspeed.py``), not one module
GROUP_PACKAGES = ("strategy", "data", "launcher", "peft")


def group_modules() -> list[str]:
    """The top-level modules of this package and the group packages (the config groups' components), by
    name."""
    return sorted(
        f"{__name__}.{m.name}"
        for m in pkgutil.iter_modules(__path__)
        if (not m.ispkg or m.name in GROUP_PACKAGES) and not m.name.startswith("_")
    )


def register_all() -> None:
    """Import every component module, registering its schemas (idempotent)."""
    importlib.import_module("hydratune.components.config.schema")  # the top-level schema (train:, estimate:)
    for name in group_modules():
        importlib.import_module(name)
