"""hydratune recipes: one thin runner per pipeline, one module each (`recipes/<name>.py` is `recipe=<name>`).

A recipe registers itself with ``@recipe`` (components/recipe.py): ``register_all()`` imports every module of
this package but the entry points, so a new recipe is its module alone.
"""

from __future__ import annotations

import importlib
import pkgutil

#: the package's entry points, not recipes: the CLI (``hydratune``, ``python -m hydratune``), one rank of a
# launched job
ENTRY_POINTS = ("cli", "worker")


def recipe_modules() -> list[str]:
    """Every recipe module of this package, by name."""
    found = (m.name for m in pkgutil.iter_modules(__path__) if not m.ispkg)
    return sorted(f"{__name__}.{name}" for name in found if name not in ENTRY_POINTS)


def register_all() -> None:
    """Register every structured-config schema Hydra composes with: the components' first, then the
    recipes' (idempotent)."""
    from hydratune import components

    components.register_all()
    for name in recipe_modules():
        importlib.import_module(name)
