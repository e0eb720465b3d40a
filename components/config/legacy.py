"""Configs saved before hydratune had one installed namespace, read as today's.

Run dirs written before ``hydratune.components`` / ``hydratune.recipes`` name their ``_target_`` paths
``components.*`` and ``recipes.*`` (``tests/fixtures/runs_ede340f``). Every saved config hydratune reads
goes through :func:`upgrade` (the CLI's compositions in ``trust.guarded_compositions``, and
:func:`load_saved` for the ones read straight from disk), so ``replay``, ``resume=`` and
``model.from_run`` of such a run build today's classes. Only these two prefixes move, and only in
``_target_`` values: a bare ``components.*`` module of another project is never imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

#: the ``_target_`` prefixes of run dirs written before the namespace, and what they are now
MOVED = {"components.": "hydratune.components.", "recipes.": "hydratune.recipes."}


def modern_target(target: str) -> str:
    """``components.strategy.DDP`` → ``hydratune.components.strategy.DDP``; anything else as it is."""
    for old, new in MOVED.items():
        if target.startswith(old):
            return new + target[len(old) :]
    return target


def upgrade(node: Any) -> Any:
    """Rewrite every ``_target_`` of ``node`` (a DictConfig, ListConfig, dict or list; nested ones too) in
    place with :func:`modern_target`; returns ``node``. Interpolations are left alone."""
    if isinstance(node, DictConfig):
        with open_dict(node):
            for key in list(node.keys()):
                if key == "_target_" and not OmegaConf.is_interpolation(node, key):
                    value = node[key]
                    if isinstance(value, str) and modern_target(value) != value:
                        node[key] = modern_target(value)
                elif not OmegaConf.is_interpolation(node, key) and OmegaConf.is_config(node._get_node(key)):
                    upgrade(node[key])
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            if not OmegaConf.is_interpolation(node, i) and OmegaConf.is_config(node._get_node(i)):
                upgrade(node[i])
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "_target_" and isinstance(value, str):
                node[key] = modern_target(value)
            else:
                upgrade(value)
    elif isinstance(node, list):
        for value in node:
            upgrade(value)
    return node


def load_saved(path: Path | str) -> DictConfig:
    """A saved config file (a run dir's ``.hydra/config.yaml``) read with OmegaConf, its targets
    upgraded."""
    return upgrade(OmegaConf.load(path))  # type: ignore[return-value]
