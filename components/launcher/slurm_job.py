"""The ``slurm`` launcher: a SLURM job whose ``srun`` tasks are the ranks (components/distributed/slurm.py
writes its job script, requeues it after pre-emption)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, NON_NEGATIVE, knob
from hydratune.components.config.registry import component
from hydratune.components.launcher.handoff import Worker
from hydratune.components.launcher.local import Local


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[03-04,07],cpu1`` → ``gpu03``."""
    import re

    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if match is None:
        return nodelist
    prefix, ranges = match.groups()
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


@component("launcher")
@dataclass(frozen=True)
class Slurm(Local):
    """A SLURM job: every ``srun`` task is one rank, reading its rank from ``SLURM_PROCID`` /
    ``SLURM_LOCALID`` / ``SLURM_NTASKS`` (the world size is the job step's task count).

    Two ways to get the job (components/distributed/slurm.py): ``hydratune -m launcher=slurm
    hydra/launcher=submitit_slurm ...`` (hydra-submitit-launcher submits one job per sweep point; the
    allocation is ``hydra.launcher.*``), or ``hydratune launcher=slurm ...`` alone, which writes a job script
    for ``nnodes`` x ``nproc_per_node`` tasks into the run dir and prints the ``sbatch`` command. Either
    way the pre-emption signal (``signal``; under submitit, submitit's) makes every rank checkpoint the same
    step, then rank 0 requeues the job, which continues in the same run dir.

    Of the knobs every launcher has: ``nproc_per_node`` is the tasks (= GPUs) per node of the job script
    (inside a job, SLURM's count rules); ``node_rank`` is unused (``SLURM_PROCID`` gives each rank);
    ``master_addr`` is replaced by the allocation's first node; ``master_port`` 29500 becomes 29500 + the job
    id % 1000 (a port per job), another value is used as is.
    """

    # the generated job script (submitit takes these from hydra.launcher.* instead)
    gpus_per_node: int | None = knob(None, NON_NEGATIVE)  # None = one GPU per task; 0 on a CPU-only cluster
    cpus_per_task: int | None = knob(None, AT_LEAST_ONE)
    mem: str | None = None  # sbatch --mem per node, e.g. 400G (0 = all of it)
    time: str | None = None  # sbatch --time, e.g. 04:00:00 (None = the partition's default)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    job_name: str | None = None  # None = hydratune-<run dir name>
    signal: str = "USR2"  # the pre-emption signal SLURM sends every task signal_delay_s before the time limit
    signal_delay_s: int = knob(120, NON_NEGATIVE)
    # sbatch --requeue: after the pre-emption signal's checkpoint, rank 0 requeues the job
    requeue: bool = True
    sbatch_args: list[str] = field(default_factory=list)  # more #SBATCH options, e.g. ["--exclusive"]
    setup: list[str] = field(default_factory=list)  # shell lines before srun, e.g. ["module load cuda/12.4"]

    started_per_rank: ClassVar[bool] = True
    one_command_per_node: ClassVar[bool] = False

    def validate(self) -> None:
        super().validate()
        from hydratune.components.distributed.slurm import check_script_knobs, signal_number

        signal_number(self.signal)
        check_script_knobs(self)
        import re

        if self.time is not None and not re.fullmatch(
            r"(\d+-)?\d+(:\d\d){0,2}|(?i:infinite|unlimited)", self.time
        ):
            raise ConfigError(
                f"'{self.time}' is not a SLURM time limit",
                key="launcher.time",
                hint="minutes, HH:MM:SS or D-HH:MM:SS, e.g. launcher.time=04:00:00",
            )
        if self.mem is not None and not re.fullmatch(r"\d+[KMGT]?", str(self.mem)):
            raise ConfigError(
                f"'{self.mem}' is not a SLURM memory size",
                key="launcher.mem",
                hint="e.g. 400G (0 = all of a node)",
            )
        if self.rdzv_endpoint:
            raise ConfigError(
                "launcher=slurm wires the rendezvous from the allocation (its first node is the master)",
                key="launcher.rdzv_endpoint",
                hint="drop launcher.rdzv_endpoint (launcher=local takes it for nodes you start yourself)",
            )

    @property
    def world_size(self) -> int:
        """Inside the job: the job step's tasks (what SLURM started); outside: what the script asks for."""
        from hydratune.components.distributed.slurm import in_job_step, step_tasks

        return step_tasks() if in_job_step() else self.nproc_per_node * self.nnodes

    def spawns_workers(self) -> bool:
        """Outside a SLURM job step: write the job script (``launch``); inside one, this process is a rank."""
        from hydratune.components.distributed.slurm import in_job_step

        return not in_job_step()

    def preemption_signals(self) -> frozenset[int]:
        from hydratune.components.distributed.slurm import (
            in_job_step,
            signal_number,
            submitit_signals,
            under_submitit,
        )

        if not in_job_step():
            return frozenset()
        return frozenset(submitit_signals() if under_submitit() else {signal_number(self.signal)})

    def after_interrupt(self, signum: int) -> Any:
        from hydratune.components.distributed.slurm import requeue

        return requeue(signum) if signum in self.preemption_signals() else None

    def requeued(self) -> bool:
        from hydratune.components.distributed.slurm import in_job_step, restarts

        return in_job_step() and restarts() > 0

    def rank_env(self) -> None:
        """Map SLURM's variables to torch.distributed's (the first node of the allocation is master); a
        one-task job stays a single process (accelerate would take a set LOCAL_RANK as a process group)."""
        from hydratune.components.distributed.slurm import step_tasks

        env = os.environ
        if step_tasks() < 2:
            return
        env.setdefault("RANK", env["SLURM_PROCID"])
        env.setdefault("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
        env.setdefault("WORLD_SIZE", str(step_tasks()))
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE", "1")
        env.setdefault("LOCAL_WORLD_SIZE", per_node.split("(")[0].split(",")[0])
        env.setdefault("MASTER_ADDR", first_host(env.get("SLURM_JOB_NODELIST", "127.0.0.1")))
        env.setdefault("MASTER_PORT", str(29500 + int(env.get("SLURM_JOB_ID", "0")) % 1000))

    def job_script(self, run_dir: Path, worker: Worker) -> str | None:
        from hydratune.components.distributed.slurm import sbatch_script

        name = self.job_name or f"hydratune-{run_dir.name}"
        return sbatch_script(self, run_dir, worker.__module__, name)

    def rendezvous_id(self, pinned_run_dir: str | None) -> str:
        """SLURM starts every rank itself (``srun``) and the job script names the run dir, so no torch
        elastic rendezvous needs an id shared by the nodes: the job's id names it."""
        return f"hydratune-slurm-{os.environ.get('SLURM_JOB_ID', 'job')}"

    def describe(self, run_id: str) -> str:
        return (
            f"launcher: slurm, {self.nnodes} node(s) x {self.nproc_per_node} task(s) = world "
            f"{self.world_size}; the rendezvous from the allocation (its first node is the master)"
        )

    def launch(
        self, run_dir: Path, worker: Worker, run_id: str | None = None, config: dict | None = None
    ) -> Any:
        """Write the job script for the frozen config in ``run_dir`` and print how to submit it (nothing
        is submitted: the script is for you to read, change and ``sbatch``). SLURM starts the ranks and
        wires their rendezvous: ``run_id`` and ``config`` (the local launcher's roll call) are not used."""
        from hydratune.components.distributed.slurm import SCRIPT, submitit_without_multirun

        script = run_dir / SCRIPT
        script.write_text(self.job_script(run_dir, worker) or "")
        tasks = f"{self.nnodes} node(s) x {self.nproc_per_node} task(s)"
        print(f"hydratune: wrote the SLURM job script {script} ({tasks}); submit it with:\n")
        print(f"    sbatch {script}\n")
        if submitit_without_multirun():
            print("hydratune: hydra/launcher=submitit_slurm submits only with -m (a multirun, even of 1 run)")
        return None
