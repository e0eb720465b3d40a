"""Launcher component: how many processes run the recipe, on how many nodes, started by whom.

``local`` starts ``nproc_per_node`` workers itself with torch's elastic launch API (no shell string):
the CLI composes and resolves the config once, writes it to the run dir (``frozen_config.yaml``), and
every worker loads that file, so all ranks share one run dir and one config. With ``nnodes`` > 1 every node
runs the same command into one pinned run dir; the nodes meet in a roll call and watch each other
(components/distributed/rendezvous.py). ``slurm`` (via hydra-submitit-launcher) and ``deepspeed``
(hostfile: components/distributed/hostfile.py) jobs start the processes from outside; each then reads its
rank from the environment and runs as one of those workers. The CLI hands ``launch`` the workers' entry
point (``run_worker`` of recipes/worker.py): components never import recipes.

One module per launcher: ``local.py`` (:class:`Local`, with the process-environment helpers every launcher
uses), ``slurm_job.py`` (:class:`Slurm`), ``deepspeed_runner.py`` (:class:`DeepSpeedLauncher`); ``handoff.py``
holds what they share with their workers through the run dir. This package re-exports every class under the
``_target_`` paths ``conf/launcher/`` and saved run dirs name (``hydratune.components.launcher.Local``).
"""

from __future__ import annotations

from typing import Any

from hydratune.components.launcher.deepspeed_runner import DeepSpeedLauncher
from hydratune.components.launcher.handoff import (
    ELASTIC_PROCESSES,
    FROZEN,
    RANK_DONE,
    RANK_STOPPED,
    RELAYS,
    NodeLost,
    QuietStop,
    Worker,
    WorkerFailed,
    alive,
    clear_markers,
    exit_codes,
    finished_ranks,
    first_failure,
    launcher_of,
    raise_if_stopped,
)
from hydratune.components.launcher.local import (
    C10D_PORT,
    PER_NODE,
    PLACEMENT,
    Local,
    free_port,
    inside_launched_worker,
    single_process_env,
)
from hydratune.components.launcher.slurm_job import Slurm, first_host

__all__ = [
    "C10D_PORT",
    "ELASTIC_PROCESSES",
    "FROZEN",
    "PER_NODE",
    "PLACEMENT",
    "RANK_DONE",
    "RANK_STOPPED",
    "RELAYS",
    "DeepSpeedLauncher",
    "Local",
    "NodeLost",
    "QuietStop",
    "Slurm",
    "Worker",
    "WorkerFailed",
    "alive",
    "clear_markers",
    "exit_codes",
    "finished_ranks",
    "first_failure",
    "first_host",
    "free_port",
    "inside_launched_worker",
    "launcher_of",
    "raise_if_stopped",
    "shared_by_nodes",
    "single_process_env",
]


def shared_by_nodes(launcher: Any) -> bool:
    """Whether a composed ``launcher`` node (before anything is instantiated: Hydra's callbacks) runs the
    same hydratune command on each of several nodes that share one run dir."""
    target = str(launcher.get("_target_", ""))
    known = {
        path: cls
        for cls in (Local, Slurm, DeepSpeedLauncher)
        for path in (f"{__name__}.{cls.__qualname__}", f"{cls.__module__}.{cls.__qualname__}")
    }
    cls = known.get(target)
    return cls is not None and cls.one_command_per_node and int(launcher.get("nnodes", 1) or 1) > 1
