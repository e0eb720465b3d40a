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
from dataclasses import dataclass
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
    """A SLURM job per run (per multirun point) through hydra-submitit-launcher: ``hydra/launcher=
    submitit_slurm`` submits, SLURM starts ``tasks_per_node`` = GPUs per node processes on ``nodes``
    nodes, and each reads its rank from ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``."""

    started_per_rank: ClassVar[bool] = True

    def spawns_workers(self) -> bool:
        return False  # SLURM started every process already

    def rank_env(self) -> None:
        """Map SLURM's variables to torch.distributed's (the first node of the allocation is master)."""
        env = os.environ
        if "SLURM_PROCID" not in env:
            return
        env.setdefault("RANK", env["SLURM_PROCID"])
        env.setdefault("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
        env.setdefault("WORLD_SIZE", env.get("SLURM_NTASKS", "1"))
        env.setdefault("LOCAL_WORLD_SIZE", env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0])
        env.setdefault("MASTER_ADDR", first_host(env.get("SLURM_JOB_NODELIST", "127.0.0.1")))
        env.setdefault("MASTER_PORT", str(29500 + int(env.get("SLURM_JOB_ID", "0")) % 1000))


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
