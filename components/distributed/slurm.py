"""Inside a SLURM job: the job step's tasks, the pre-emption signal, requeueing; and the sbatch script that
``launcher=slurm`` writes for a job submitted by hand.

A SLURM job reaches hydratune in two ways. hydra-submitit-launcher (``hydratune -m launcher=slurm
hydra/launcher=submitit_slurm``) submits one job per sweep point whose ``srun`` tasks each run the Hydra job;
``hydratune launcher=slurm`` alone writes :func:`sbatch_script` into the run dir, whose ``srun`` tasks each
run ``python -m hydratune.recipes.worker <run dir>``. Either way every task is one rank (``SLURM_PROCID``).

Pre-emption: SLURM sends the job's ``--signal`` (submitit: ``USR2``, or ``SUBMITIT_PREEMPT_SIGNAL``, or the
``signal`` of the launcher's ``additional_parameters``; the generated script: ``launcher.signal``) to every
task ``signal_delay_s`` before the time limit, or when an administrator or a test sends it. hydratune treats
it as a stop signal (every rank finishes the same step and checkpoints), then rank 0 requeues the job
(:func:`requeue`): under submitit through submitit's own handler (its ``max_num_timeout`` still applies),
else with ``scontrol requeue``. The requeued job starts again in the same run dir and continues from that
checkpoint (``SLURM_RESTART_COUNT`` >= 1; components/runtime/resume.py ``continue_in_place``).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.scriptvalues import check_one_line, check_sbatch_option, check_slurm_name

SUBMITIT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"  # submitit's own knob (submitit/core/job_environment.py)
SUBMITIT_DEFAULT_SIGNAL = "USR2"
SCRIPT = "slurm.sbatch"  # the generated job script, in the run dir
LOG = "slurm-%j.out"  # the job's output, in the run dir (appended to by every start of the job)


def in_job_step() -> bool:
    """True in a task that ``srun`` started (a rank of a SLURM job), not in the batch script or an
    ``salloc`` shell."""
    return "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ


def under_submitit() -> bool:
    """True in a task of a job that submitit submitted."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm"


def submitit_without_multirun() -> bool:
    """``hydra/launcher=submitit_slurm`` on a single run: Hydra uses its launcher only with ``-m``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return False
    hydra = HydraConfig.get()
    return hydra.mode != RunMode.MULTIRUN and hydra.runtime.choices.get("hydra/launcher") == "submitit_slurm"


def step_tasks() -> int:
    """The number of tasks of this job step (its ranks); 1 outside a step."""
    if not in_job_step():
        return 1
    return int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or 1)


def restarts() -> int:
    """How many times SLURM requeued this job (0 on its first start)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def job_id() -> str | None:
    """This job's id as ``scontrol`` takes it (an array task's own id)."""
    return os.environ.get("SLURM_JOB_ID")


def signal_number(spec: str, key: str = "launcher.signal") -> int:
    """``USR2``, ``SIGUSR2``, ``12`` or sbatch's ``[{R|B}:]USR2[@seconds]`` as a signal number."""
    name = str(spec).split("@", 1)[0].rsplit(":", 1)[-1].strip().upper()
    try:
        return int(
            signal.Signals(int(name) if name.isdigit() else signal.Signals["SIG" + name.removeprefix("SIG")])
        )
    except (KeyError, ValueError):
        raise ConfigError(
            f"unknown signal '{spec}'", key=key, hint="a signal name such as USR2, USR1 or TERM"
        ) from None


def submitit_signals() -> set[int]:
    """The pre-emption signals of a submitit job: submitit's (``SUBMITIT_PREEMPT_SIGNAL``, default USR2) and
    the one the Hydra launcher config's ``additional_parameters.signal`` makes SLURM send instead."""
    names = {os.environ.get(SUBMITIT_SIGNAL_ENV, SUBMITIT_DEFAULT_SIGNAL)}
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        extra = HydraConfig.get().launcher.get("additional_parameters") or {}
        if extra.get("signal"):
            names.add(str(extra["signal"]))
    return {signal_number(n, key="hydra.launcher.additional_parameters.signal") for n in names}


@dataclass(frozen=True)
class Requeue:
    """What the launcher did after the pre-emption checkpoint: ``done`` = the job goes back in the queue."""

    done: bool
    note: str

    def __str__(self) -> str:
        return self.note


def requeue(signum: int) -> Requeue:
    """After every rank checkpointed on the pre-emption signal: rank 0 puts the job back in the queue (the
    other ranks return at once)."""
    if int(os.environ.get("SLURM_PROCID", 0)) != 0:
        return Requeue(True, "rank 0 requeues the job")
    handler = signal.getsignal(signum)
    if under_submitit() and type(getattr(handler, "__self__", None)).__module__.startswith("submitit"):
        return _submitit_requeue(handler, signum)
    job = job_id()
    if job is None:
        return Requeue(False, "not requeued: no SLURM_JOB_ID (not a SLURM job)")
    done = subprocess.run(
        ["scontrol", "requeue", job], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode:
        return Requeue(False, f"not requeued: scontrol requeue {job}: {(done.stderr or done.stdout).strip()}")
    return Requeue(True, f"requeued job {job}: it continues from this checkpoint in the same run dir")


def _submitit_requeue(handler: Callable[..., Any], signum: int) -> Requeue:
    """submitit's own pre-emption handler: it re-pickles the job (its ``checkpoint``), counts time-outs
    against ``max_num_timeout``, runs ``scontrol requeue`` and exits; or raises why it does not requeue."""
    try:
        handler(signum, None)
    except SystemExit:
        return Requeue(True, f"requeued job {job_id()} (by submitit): it continues from this checkpoint")
    except Exception as err:  # submitit's UncompletedJobError: e.g. "timed-out too many times"
        return Requeue(False, f"not requeued: {err}")
    return Requeue(False, "not requeued: submitit's handler returned without requeueing")


def check_script_knobs(launcher: Any) -> None:
    """The job script's knobs, each for its field (``Slurm.validate``: before load, ``mode=plan`` too):
    SLURM names for account, partition and QOS, one line for the job name and every ``setup`` line,
    options for ``sbatch_args``."""
    for name, listed in (("partition", True), ("account", False), ("qos", False)):
        value = getattr(launcher, name)
        if value is not None:
            check_slurm_name(value, f"launcher.{name}", listed=listed)
    if launcher.job_name is not None:
        check_one_line(launcher.job_name, "launcher.job_name")
    for i, arg in enumerate(launcher.sbatch_args):
        check_sbatch_option(arg, f"launcher.sbatch_args[{i}]")
    for i, line in enumerate(launcher.setup):
        check_one_line(line, f"launcher.setup[{i}]", hint="one shell command per entry, each on one line")


def sbatch_script(
    launcher: Any, run_dir: Path, worker_module: str, job_name: str, python: str = sys.executable
) -> str:
    """The job script that runs the frozen config in ``run_dir``: one ``srun`` task per GPU, each a rank
    (``python -m <worker_module> <run dir>``), the first node of the allocation as the rendezvous master, the
    pre-emption signal to every task and ``--requeue``. Submitted again (after a ``scancel``, or requeued by
    SLURM), it continues from the run dir's latest whole checkpoint."""
    check_script_knobs(launcher)
    run_dir = Path(check_one_line(run_dir.resolve(), "hydra.run.dir"))
    cwd = check_one_line(Path.cwd(), "the working directory", hint="start hydratune from another directory")
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:
        check_one_line(pythonpath, "PYTHONPATH", hint="unset PYTHONPATH or fix it")
    check_one_line(python, "the Python interpreter")
    check_one_line(job_name, "launcher.job_name")
    gpus = launcher.nproc_per_node if launcher.gpus_per_node is None else launcher.gpus_per_node
    options: list[tuple[str, Any]] = [
        ("job-name", job_name),
        ("nodes", launcher.nnodes),
        ("ntasks-per-node", launcher.nproc_per_node),
        ("gpus-per-node", gpus or None),
        ("cpus-per-task", launcher.cpus_per_task),
        ("mem", launcher.mem),
        ("time", launcher.time),
        ("partition", launcher.partition),
        ("account", launcher.account),
        ("qos", launcher.qos),
        ("output", run_dir / LOG),
        ("open-mode", "append"),
        ("signal", f"{signal.Signals(signal_number(launcher.signal)).name[3:]}@{launcher.signal_delay_s}"),
    ]
    lines = [
        "#!/bin/bash",
        f"# hydratune's job script for the run dir {shlex.quote(str(run_dir))}",
        "# (every rank loads its frozen_config.yaml). Submit it with:",
        f"#   sbatch {shlex.quote(str(run_dir / SCRIPT))}",
        "# Submitted again, or requeued after the pre-emption signal, it continues from the run dir's",
        "# latest whole checkpoint.",
    ]
    lines += [f"#SBATCH --{key}={shlex.quote(str(value))}" for key, value in options if value is not None]
    lines += ["#SBATCH --requeue"] if launcher.requeue else ["#SBATCH --no-requeue"]
    lines += [f"#SBATCH {arg}" for arg in launcher.sbatch_args]
    port = (
        "$((29500 + SLURM_JOB_ID % 1000))  # a port of its own per job"
        if launcher.master_port == 29500
        else str(launcher.master_port)
    )
    lines += [
        "set -euo pipefail",
        f"cd {shlex.quote(cwd)}",
        *([f"export PYTHONPATH={shlex.quote(pythonpath)}"] if pythonpath else []),
        *launcher.setup,
        "# rendezvous: the first node of the allocation is the master; each srun task reads its rank from",
        "# SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS (components/launcher/slurm_job.py Slurm.rank_env)",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"export MASTER_PORT={port}",
        'echo "hydratune: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST,'
        ' master $MASTER_ADDR:$MASTER_PORT"',
        f"srun --kill-on-bad-exit=1 {shlex.join([python, '-m', worker_module, str(run_dir)])}",
        "",
    ]
    return "\n".join(lines)
