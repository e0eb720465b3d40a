"""hydratune recipes: one thin runner per pipeline (sft; reward, dpo, ppo, grpo build on the same parts)."""

from __future__ import annotations

import importlib

RECIPE_MODULES: tuple[str, ...] = (
    "recipes.sft",
    "recipes.reward",
    "recipes.dpo",
    "recipes.ppo",
    "recipes.grpo",
    "recipes.generate",
    "recipes.best_of_n",
    "recipes.eval",
)


def register_all() -> None:
    """Register every structured-config schema Hydra composes with: the components' first, then the
    recipes' (idempotent)."""
    import components

    components.register_all()
    for name in RECIPE_MODULES:
        importlib.import_module(name)
