"""The ``hydratune`` command: compose the config with Hydra, check it, run the recipe.

hydratune [group=option ...] [group.key=value ...]     one run (run dir under outputs/)
hydratune -m group=a,b                                  a Hydra multirun sweep (under multirun/)
hydratune --cfg job [overrides]                         print the composed config, run nothing
hydratune mode=plan [overrides]                         compose + check everything, load nothing
hydratune replay <run dir> [overrides]                  re-run a run dir's exact resolved config
hydratune report <multirun dir>                         table + overlay plot of a sweep's points
hydratune ls                                            recipes, groups and their options, experiments
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

import components
from components.errors import ConfigError
from components.resolvers import register_resolvers

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings(
    "ignore", category=FutureWarning
)  # library deprecation chatter, not the user's concern


def execute(cfg: DictConfig) -> Any:
    """Instantiate the groups, check them before any model is loaded, then run the recipe."""
    from components.checks import check_before_load
    from components.run import Components

    comps = Components.from_config(cfg)
    device = check_before_load(cfg, comps)
    if cfg.mode == "plan":
        print(OmegaConf.to_yaml(cfg, resolve=True))
        print(f"# checks passed; device: {device}; nothing was loaded (mode=plan)")
        return None
    if cfg.mode != "train":
        raise ConfigError(f"unknown mode '{cfg.mode}'", key="mode", hint="train or plan")

    from components.run import RunContext, hydra_run_dir
    from components.rundir import RunDir

    ctx = RunContext(cfg=cfg, components=comps, run_dir=RunDir(hydra_run_dir()), device=device)
    metrics = comps.recipe.run(ctx)
    print(f"run dir: {ctx.run_dir.path}")
    objective = (metrics or {}).get(cfg.objective) if cfg.objective else None
    return float(objective) if isinstance(objective, (int, float)) else metrics  # a scalar for Optuna & co


@hydra.main(version_base=None, config_path="pkg://conf", config_name="config")
def _hydra_app(cfg: DictConfig) -> Any:
    from components.errors import EXIT_INTERRUPTED, Interrupted

    try:
        return execute(cfg)
    except ConfigError as err:
        print_error(err)
        sys.exit(2)
    except Interrupted as stop:
        print(f"hydratune: {stop}. Resume with: hydratune resume=true (or resume=<run dir>)", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


def print_error(err: ConfigError) -> None:
    """One paragraph on stderr, no traceback."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False).print(
        f"[bold red]hydratune: error:[/] {escape(str(err))}", soft_wrap=True
    )


def replay_argv(args: list[str]) -> list[str]:
    """``replay <run dir> [overrides]`` → Hydra args that compose exactly that run's saved config."""
    if not args:
        raise ConfigError(
            "replay needs a run dir", key="replay", hint="hydratune replay outputs/<date>/<run>"
        )
    saved = Path(args[0]).expanduser().resolve() / ".hydra"
    if not (saved / "config.yaml").is_file():
        raise ConfigError(f"{saved / 'config.yaml'} not found: not a run dir", key="replay")
    return [
        "--config-path",
        str(saved),
        "--config-name",
        "config",
        "hydra.run.dir=outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}_replay_${run_tag:}",
        "hydra.sweep.dir=multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}_replay_${run_tag:}",
        *args[1:],
    ]


def check_output_dir(args: list[str]) -> None:
    """Fail early, naming the path, when the run dir of a single run cannot be created (Hydra would
    crash with a traceback while creating it)."""
    if any(a.startswith("-") for a in args):  # sweeps, --cfg, --help, replay's --config-path: Hydra's job
        return
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    try:
        with initialize_config_module(config_module="conf", version_base=None):
            run_dir = Path(compose("config", overrides=args, return_hydra_config=True).hydra.run.dir)
    except Exception:  # composition errors are Hydra's to report, with its own message
        return
    finally:
        GlobalHydra.instance().clear()
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists() or p == Path(p.anchor))
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(
            f"cannot create the run dir {run_dir}: {existing} is not a writable directory",
            key="hydra.run.dir",
            hint="run from a writable directory, or pass hydra.run.dir=/writable/path",
        )


def main(argv: list[str] | None = None) -> None:
    """Console entry point (``hydratune`` and ``python -m recipes``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    register_resolvers()
    components.register_all()
    try:
        if args and args[0] in ("ls", "list"):
            from components.catalog import render

            print(render())
            return
        if args and args[0] == "report":
            from components.report import write_report

            if len(args) != 2:
                raise ConfigError(
                    "report takes one multirun dir",
                    key="report",
                    hint="hydratune report multirun/<date>/<time>",
                )
            markdown, _ = write_report(Path(args[1]))
            print(markdown + f"\nwrote {Path(args[1]) / 'report.md'}, report.csv, report.png")
            return
        if args and args[0] == "replay":
            args = replay_argv(args[1:])
        check_output_dir(args)
    except ConfigError as err:
        print_error(err)
        sys.exit(2)
    sys.argv = [sys.argv[0] or "hydratune", *args]
    _hydra_app()


if __name__ == "__main__":
    main()
