"""Launcher component: how many processes run the recipe, on how many nodes, started by whom.

``local`` starts ``nproc_per_node`` workers itself with torch's elastic launch API (no shell string):
the CLI composes and resolves the config once, writes it to the run dir (``frozen_config.yaml``), and
every worker loads that file, so all ranks share one run dir and one config. ``slurm`` (via
hydra-submitit-launcher) and ``deepspeed`` (hostfile) jobs start the processes from outside; each then
reads its rank from the environment and runs as one of those workers. The CLI hands ``launch`` the
workers' entry point (``run_worker`` of recipes/worker.py): components never import recipes.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from components.config.errors import ConfigError
from components.config.registry import component

FROZEN = "frozen_config.yaml"
RANK_DONE = ".rank{rank}.done.json"  # a worker wrote its result: its exit code no longer matters
RANK_STOPPED = ".rank{rank}.stopped.json"  # a worker checkpointed after a signal and exits 75
ELASTIC_PROCESSES = "torch.distributed.elastic.multiprocessing.api"  # its logger reports failed workers
RELAYS = "HYDRATUNE_SIGNAL_RELAY"  # set for the workers of ``Local.launch``: they accept its relayed signals


def inside_launched_worker() -> bool:
    """True in a process started by a distributed launcher (torchrun, accelerate, deepspeed, ours)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def single_process_env() -> None:
    """The rendezvous variables of a one-process job (DeepSpeed needs them even alone; without them it
    goes looking for MPI)."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


@component("launcher")
@dataclass(frozen=True)
class Local:
    """Processes on this machine (``nproc_per_node``), optionally one node of a multi-node job.

    Multi-node: run the same command on every node with ``launcher.nnodes=N launcher.node_rank=i
    launcher.master_addr=<node 0> launcher.master_port=<port>`` (static rendezvous), or give every node
    ``launcher.rdzv_endpoint=<host:port>`` (c10d rendezvous, node ranks assigned on arrival).
    """

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500  # 0 = a free port (single node only)
    rdzv_endpoint: str | None = None
    max_restarts: int = 0
    start_method: str = "spawn"  # spawn | forkserver | fork

    def validate(self) -> None:
        if self.nproc_per_node < 1:
            raise ConfigError("nproc_per_node must be >= 1", key="launcher.nproc_per_node")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(
                f"node_rank {self.node_rank} is not in [0, nnodes={self.nnodes})", key="launcher.node_rank"
            )
        if self.start_method not in ("spawn", "forkserver", "fork"):
            raise ConfigError(f"unknown start method '{self.start_method}'", key="launcher.start_method")

    #: a scheduler starts every rank with this same command (srun): ranks come from its environment
    started_per_rank: ClassVar[bool] = False

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def rank_env(self) -> None:
        """Set torch.distributed's RANK / WORLD_SIZE / MASTER_* from the scheduler's variables (nothing to
        do here: the launcher that starts the workers sets them)."""

    def spawns_workers(self) -> bool:
        """Whether this process must start workers (more than one, and not already inside a launch)."""
        return self.world_size > 1 and not inside_launched_worker()

    def preemption_signals(self) -> frozenset[int]:
        """Signals that mean "checkpoint, then come back" (a scheduler's pre-emption): none here."""
        return frozenset()

    def after_interrupt(self, signum: int) -> Any:
        """After every rank checkpointed on ``signum``: what the launcher did about it (None: nothing;
        SLURM: components.distributed.slurm.Requeue)."""
        return None

    def requeued(self) -> bool:
        """This process is a rank of a job the scheduler started again in the same run dir (it continues
        from its own last checkpoint)."""
        return False

    def job_script(self, run_dir: Path, worker: Callable[[str], Any]) -> str | None:
        """The batch script this launcher writes into ``run_dir`` to start ``worker`` on every rank (None:
        it starts the workers itself); ``mode=plan`` prints it."""
        return None

    def launch_config(self, run_id: str) -> Any:
        from torch.distributed.launcher.api import LaunchConfig

        if self.rdzv_endpoint:
            backend, endpoint, configs = "c10d", self.rdzv_endpoint, {}
        else:
            port = self.master_port or free_port()
            if self.nnodes == 1 and self.master_port == 29500:
                port = free_port()  # a lone node never collides with another job's default port
            backend, endpoint, configs = "static", f"{self.master_addr}:{port}", {"rank": self.node_rank}
        return LaunchConfig(
            min_nodes=self.nnodes,
            max_nodes=self.nnodes,
            nproc_per_node=self.nproc_per_node,
            run_id=run_id,
            rdzv_backend=backend,
            rdzv_endpoint=endpoint,
            rdzv_configs=configs,
            max_restarts=self.max_restarts,
            monitor_interval=0.5,
            start_method=self.start_method,
            signals_to_handle="SIGHUP,SIGQUIT",  # not TERM, INT, USR1: SignalRelay relays those
        )

    def launch(self, run_dir: Path, worker: Callable[[str], Any]) -> Any:
        """Start the workers on the frozen config in ``run_dir``: each process calls ``worker(run_dir)``
        (a module-level function, pickled by name for the spawned processes); rank 0's result (the
        objective).

        A SIGTERM / SIGINT / SIGUSR1 to this process is relayed to the workers
        (components/distributed/interrupt.py): they finish the step, checkpoint together and exit 75, and so
        does this process (``Interrupted``)."""
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch

        from components.distributed.interrupt import SignalRelay

        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.nproc_per_node)))
        os.environ[RELAYS] = "1"
        clear_markers(run_dir)
        launch_config = self.launch_config(run_id=f"hydratune-{uuid.uuid4().hex[:8]}")
        relay = SignalRelay(run_dir)
        quiet = QuietStop(relay)
        loggers = [logging.getLogger(n) for n in (ELASTIC_PROCESSES, "torch.multiprocessing.spawn")]
        for logger in loggers:
            logger.addFilter(quiet)
        try:
            with relay:
                results = elastic_launch(launch_config, worker)(str(run_dir))
        except ChildFailedError as err:
            done = finished_ranks(run_dir)
            local = range(self.node_rank * self.nproc_per_node, (self.node_rank + 1) * self.nproc_per_node)
            if all(rank in done for rank in local):
                # every worker had finished and written its result; a crash in interpreter teardown
                # (seen with gloo: "terminate called without an active exception") changes nothing
                return done.get(0)
            raise_if_stopped(run_dir, err.failures, local)
            if relay.signum is not None:  # the second signal: the workers were killed
                reason = f"the workers were stopped at once ({signal.Signals(relay.signum).name} twice)"
                raise WorkerFailed(err.failures, exit_code=128 + relay.signum, reason=reason) from None
            raise WorkerFailed(err.failures) from None
        finally:
            for logger in loggers:
                logger.removeFilter(quiet)
        return (results or {}).get(0)


def clear_markers(run_dir: Path) -> None:
    """Before the workers start: remove what an earlier launch into this run dir left (the relayed signal's
    name, this host's worker pid files, the ranks' done / stopped records), so a run resumed into its own
    run dir neither stops at once on a stale signal nor reports a stale result."""
    from components.distributed.interrupt import RELAY_FILE, WORKERS_DIR

    stale = [run_dir / RELAY_FILE, *(run_dir / WORKERS_DIR).glob(f"{socket.gethostname()}.*.pid")]
    stale += [p for pattern in (RANK_DONE, RANK_STOPPED) for p in run_dir.glob(pattern.format(rank="*"))]
    for path in stale:
        path.unlink(missing_ok=True)


class QuietStop(logging.Filter):
    """Drops torch elastic's failure reports (tracebacks) and its notices of ending the other ranks for a
    run stopped by a signal: workers that exited 75 after their checkpoint, or were killed by a second
    signal. An interrupted run is not a failed one."""

    def __init__(self, relay: Any) -> None:
        super().__init__()
        self.relay = relay

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "exitcode: 75" in message or (self.relay.killed and "failed (exitcode" in message):
            return False
        stopping = "Terminating process" in message or "Closing process" in message
        stopped = any(self.relay.run_dir.glob(RANK_STOPPED.format(rank="*")))
        return not (stopping and (stopped or self.relay.killed))


def raise_if_stopped(run_dir: Path, failures: dict[int, Any], local: range) -> None:
    """Every local worker checkpointed after a signal (whatever ended it then), or every failed one exited
    75 that way: the run was interrupted, not broken."""
    import json

    from components.config.errors import EXIT_INTERRUPTED, Interrupted

    stopped = {int(p.name.split(".")[1][4:]): p for p in run_dir.glob(RANK_STOPPED.format(rank="*"))}
    codes = {int(getattr(f, "exitcode", 1) or 1) for f in failures.values()}
    if stopped and (all(rank in stopped for rank in local) or codes == {EXIT_INTERRUPTED}):
        record = json.loads(stopped[min(stopped)].read_text())
        raise Interrupted(record["signum"], record["step"], record["checkpoint"])


class WorkerFailed(RuntimeError):
    """A worker process failed; ``exit_code`` is the first failed rank's."""

    def __init__(self, failures: dict[int, Any], exit_code: int | None = None, reason: str = "") -> None:
        rank, failure = min(failures.items())
        worker_code = int(getattr(failure, "exitcode", 1) or 1)
        self.exit_code = exit_code or (worker_code if 0 < worker_code < 256 else 128 + abs(worker_code))
        reason = reason or f"worker rank {rank} failed with exit code {worker_code} (its output is above)"
        super().__init__(reason)


def finished_ranks(run_dir: Path) -> dict[int, Any]:
    """{rank: result} of the workers that reported completion in ``run_dir``."""
    import json

    found = {}
    for path in run_dir.glob(RANK_DONE.format(rank="*")):
        data = json.loads(path.read_text())
        found[int(data["rank"])] = data.get("result")
    return found


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
    """

    # the generated job script (submitit takes these from hydra.launcher.* instead)
    gpus_per_node: int | None = None  # None = one GPU per task (nproc_per_node); 0 on a CPU-only cluster
    cpus_per_task: int | None = None
    mem: str | None = None  # sbatch --mem per node, e.g. 400G (0 = all of it)
    time: str | None = None  # sbatch --time, e.g. 04:00:00 (None = the partition's default)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    job_name: str | None = None  # None = hydratune-<run dir name>
    signal: str = "USR2"  # the pre-emption signal SLURM sends every task signal_delay_s before the time limit
    signal_delay_s: int = 120
    requeue: bool = True  # sbatch --requeue: the job may go back to the queue (after the pre-emption signal)
    sbatch_args: list[str] = field(default_factory=list)  # more #SBATCH options, e.g. ["--exclusive"]
    setup: list[str] = field(default_factory=list)  # shell lines before srun, e.g. ["module load cuda/12.4"]

    started_per_rank: ClassVar[bool] = True

    def validate(self) -> None:
        super().validate()
        from components.distributed.slurm import signal_number

        signal_number(self.signal)
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
        from components.distributed.slurm import in_job_step, step_tasks

        return step_tasks() if in_job_step() else self.nproc_per_node * self.nnodes

    def spawns_workers(self) -> bool:
        """Outside a SLURM job step: write the job script (``launch``); inside one, this process is a rank."""
        from components.distributed.slurm import in_job_step

        return not in_job_step()

    def preemption_signals(self) -> frozenset[int]:
        from components.distributed.slurm import in_job_step, signal_number, submitit_signals, under_submitit

        if not in_job_step():
            return frozenset()
        return frozenset(submitit_signals() if under_submitit() else {signal_number(self.signal)})

    def after_interrupt(self, signum: int) -> Any:
        from components.distributed.slurm import requeue

        return requeue(signum) if signum in self.preemption_signals() else None

    def requeued(self) -> bool:
        from components.distributed.slurm import in_job_step, restarts

        return in_job_step() and restarts() > 0

    def rank_env(self) -> None:
        """Map SLURM's variables to torch.distributed's (the first node of the allocation is master); a
        one-task job stays a single process (accelerate would take a set LOCAL_RANK as a process group)."""
        from components.distributed.slurm import step_tasks

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

    def job_script(self, run_dir: Path, worker: Callable[[str], Any]) -> str | None:
        from components.distributed.slurm import sbatch_script

        name = self.job_name or f"hydratune-{run_dir.name}"
        return sbatch_script(self, run_dir, worker.__module__, name)

    def launch(self, run_dir: Path, worker: Callable[[str], Any]) -> Any:
        """Write the job script for the frozen config in ``run_dir`` and print how to submit it (nothing
        is submitted: the script is for you to read, change and ``sbatch``)."""
        from components.distributed.slurm import SCRIPT, submitit_without_multirun

        script = run_dir / SCRIPT
        script.write_text(self.job_script(run_dir, worker) or "")
        tasks = f"{self.nnodes} node(s) x {self.nproc_per_node} task(s)"
        print(f"hydratune: wrote the SLURM job script {script} ({tasks}); submit it with:\n")
        print(f"    sbatch {script}\n")
        if submitit_without_multirun():
            print("hydratune: hydra/launcher=submitit_slurm submits only with -m (a multirun, even of 1 run)")
        return None


@component("launcher")
@dataclass(frozen=True)
class DeepSpeedLauncher(Local):
    """Processes started by the ``deepspeed`` launcher from a hostfile (``hostfile`` lists ``host
    slots=N``); hydratune prints the command, and each process runs as a worker of the same run."""

    hostfile: str | None = None
    include: str | None = None  # e.g. "node1:0,1@node2" (deepspeed's --include)

    def validate(self) -> None:
        super().validate()
        if self.hostfile and not Path(self.hostfile).is_file():
            raise ConfigError(f"hostfile not found: {self.hostfile}", key="launcher.hostfile")

    def spawns_workers(self) -> bool:  # type: ignore[override]
        return not inside_launched_worker()

    def command(self, run_dir: Path, worker: Callable[[str], Any]) -> list[str]:
        """The ``deepspeed`` command (an argument list, no shell) running the frozen config's workers: every
        process runs ``worker``'s module (``python -m <module> <run dir>``)."""
        cmd = ["deepspeed"]
        if self.hostfile:
            cmd += ["--hostfile", self.hostfile]
        if self.include:
            cmd += ["--include", self.include]
        if not self.hostfile:
            cmd += ["--num_nodes", "1", "--num_gpus", str(self.nproc_per_node)]
        cmd += ["--master_addr", self.master_addr, "--master_port", str(self.master_port), "--no_local_rank"]
        return [*cmd, "--module", worker.__module__, str(run_dir)]

    def launch(self, run_dir: Path, worker: Callable[[str], Any]) -> Any:
        import subprocess

        clear_markers(run_dir)
        proc = subprocess.run(self.command(run_dir, worker), check=False)
        done = finished_ranks(run_dir)
        if 0 in done:
            return done[0]
        raise WorkerFailed({0: type("Failure", (), {"exitcode": proc.returncode or 1})()})
