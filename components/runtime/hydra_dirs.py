"""The run and sweep dirs Hydra makes for a command: checked before Hydra writes into them
(:class:`RunDirCheck`, the Hydra callback ``conf/config.yaml`` names), and removed again when a run stopped
before writing anything of value (:func:`remove_unused_run_dir`; components/runtime/created.py knows what
this run created)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError, print_error

#: what a run dir holds before anything of value is written: Hydra's config and log, the start-up files
STARTUP_FILES = (
    ".hydra",
    "versions.json",
    "frozen_config.yaml",
    "data_fingerprint.json",
    "deepspeed.json",
    "fsdp.json",
    ".workers",
    ".interrupt",
)


def startup_clutter(path: Path) -> bool:
    """A run dir's entry written before anything of value: :data:`STARTUP_FILES` and Hydra's log."""
    return path.name in STARTUP_FILES or path.suffix == ".log"


def remove_unused_run_dir() -> None:
    """After a run failed before writing anything of value (or ``mode=plan`` finished): remove what this run
    created (components/runtime/created.py): its run dir when it holds only start-up clutter, and the folders
    above it that this run created and left empty; in a pinned run dir that existed, only what this run
    added there."""
    from hydra.core.hydra_config import HydraConfig

    from hydratune.components.runtime.created import MADE, remove_unused

    if HydraConfig.initialized():
        run_dir = Path(HydraConfig.get().runtime.output_dir)
    elif MADE:  # interrupted between RunDirCheck recording the dir and Hydra's job set-up
        run_dir = MADE[-1].path
    else:
        return
    detach_file_handlers(run_dir.resolve())  # Hydra's file handler holds the log open (and would reopen it)
    remove_unused(run_dir, startup_clutter)


def detach_file_handlers(directory: Path) -> None:
    """Close and remove every logging file handler writing under ``directory`` (from every logger), so
    nothing reopens a log file in a removed run dir."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in logging.root.manager.loggerDict)]
    for logger in loggers:
        for handler in list(getattr(logger, "handlers", [])):
            if isinstance(handler, logging.FileHandler) and directory in Path(handler.baseFilename).parents:
                logger.removeHandler(handler)
                handler.close()


class RunDirCheck(Callback):
    """Hydra callback (``hydra.callbacks`` in conf/config.yaml): fail early, naming the key, when the run
    or sweep dir cannot be created (Hydra would crash with a traceback while creating it). It sees the
    config Hydra composed for the job, so checking costs no composition of its own."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydratune.components.config.scriptvalues import check_one_line
        from hydratune.components.runtime.created import remember
        from hydratune.components.runtime.multinode import quiet_hydra_files
        from hydratune.components.runtime.resume import check_run_dir

        quiet_hydra_files(config)  # a multi-node job writes its .hydra/ itself, once (execute)
        try:
            check_one_line(config.hydra.run.dir, "hydra.run.dir")  # it reaches job scripts and their comments
            check_run_dir(Path(config.hydra.run.dir), config.get("resume"))  # before Hydra writes .hydra/
        except ConfigError as err:
            print_error(err)
            sys.exit(2)
        remember(Path(config.hydra.run.dir))  # a cleanup removes only what this run creates
        exit_unless_writable(Path(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra_plugins.hydratune.submitit_slurm import SUBMITIT_TARGET
        from hydratune.components.config.scriptvalues import check_one_line
        from hydratune.components.distributed.slurm_sweep import check_submitit_values
        from hydratune.components.runtime.created import remember
        from hydratune.components.runtime.sweepdir import check_sweep_dir

        try:
            check_one_line(config.hydra.sweep.dir, "hydra.sweep.dir")
            check_sweep_dir(Path(config.hydra.sweep.dir))
            if config.hydra.get("launcher", {}).get("_target_") == SUBMITIT_TARGET:
                check_submitit_values(config.hydra.launcher)  # each point's sbatch script
        except ConfigError as err:
            print_error(err)
            sys.exit(2)
        remember(Path(config.hydra.sweep.dir))
        exit_unless_writable(Path(config.hydra.sweep.dir), "hydra.sweep.dir")
        wait_for_every_slurm_point(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """``-m … mode=plan`` writes nothing: the sweep dir (its ``multirun.yaml``) goes too, unless a
        refused point left its error there."""
        from hydratune.components.runtime.created import remove_unused

        if config.get("mode") == "plan":
            remove_unused(Path(config.hydra.sweep.dir), lambda p: p.name == "multirun.yaml")


def wait_for_every_slurm_point(config: DictConfig) -> None:
    """``hydra/launcher=submitit_slurm``: launch through hydratune's subclass of the plugin's launcher
    (hydra_plugins/hydratune/submitit_slurm.py), which waits for every sweep point however its job ends and
    names the failed ones (the plugin waits forever for a job that ended without a result when SLURM has no
    accounting). Hydra instantiates the launcher from this same config right after this callback. The class
    is registered with Hydra's plugins here too: Hydra's scan of ``hydra_plugins`` misses it under an
    editable install (``pip install -e``), whose import hook ``pkgutil`` cannot list."""
    from hydra.core.plugins import Plugins
    from omegaconf import open_dict, read_write

    from hydra_plugins.hydratune.submitit_slurm import SUBMITIT_TARGET, TARGET, SlurmLauncher

    if config.hydra.get("launcher", {}).get("_target_") == SUBMITIT_TARGET:
        Plugins.instance().class_name_to_class.setdefault(TARGET, SlurmLauncher)
        with read_write(config.hydra.launcher), open_dict(config.hydra.launcher):
            config.hydra.launcher._target_ = TARGET


def exit_unless_writable(run_dir: Path, key: str) -> None:
    """Print a ConfigError naming ``key`` and exit 2 unless ``run_dir`` can be created and written: it is
    created and a probe file written there (``os.access`` says yes to root even under /proc)."""
    import uuid

    probe = run_dir / f".hydratune-write-probe.{uuid.uuid4().hex}"  # its own: nodes may probe the dir at once
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        print_error(
            ConfigError(
                f"cannot create the run dir {run_dir}: {err.strerror or err}",
                key=key,
                hint=f"run from a writable directory, or pass {key}=/writable/path",
            )
        )
        sys.exit(2)  # SystemExit passes through Hydra's error reporting, which catches Exceptions only
