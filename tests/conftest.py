"""Shared fixtures: compose configs with Hydra's API and run recipes in-process on the tiny model."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

import components
from components.resolvers import register_resolvers

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "2")
register_resolvers()
components.register_all()

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"

# Small, fast settings for end-to-end tests on the tiny model.
FAST = ["train.eval_generations=8", "train.log_every=1", "train.write_plots=false"]


@pytest.fixture
def compose_cfg() -> Iterator[Callable[..., DictConfig]]:
    """``compose_cfg("peft=lora", ...)`` → the composed config, as the CLI would build it."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base=None):
        yield lambda *overrides: compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()


@pytest.fixture
def run_recipe(compose_cfg: Callable[..., DictConfig], tmp_path: Path) -> Callable[..., Any]:
    """Run a recipe in-process: ``run_recipe("peft=lora", name="a")`` → (ctx, metrics).

    Run dirs are ``tmp_path/outputs/day/<name>``, the layout ``resume=true`` searches.
    """
    from components.checks import check_before_load
    from components.run import Components, RunContext
    from components.rundir import RunDir

    def run(*overrides: str, name: str = "run") -> tuple[RunContext, Any]:
        cfg = compose_cfg(*FAST, *overrides)
        comps = Components.from_config(cfg)
        device = check_before_load(cfg, comps)
        ctx = RunContext(cfg, comps, RunDir(tmp_path / "outputs" / "day" / name), device)
        return ctx, comps.recipe.run(ctx)

    return run


def group_options() -> list[tuple[str, str]]:
    """Every (group, option) shipped in conf/ — new options are covered automatically."""
    return sorted(
        (group.name, option.stem)
        for group in CONF.iterdir()
        if group.is_dir() and not group.name.startswith("_")
        for option in group.glob("*.yaml")
    )
