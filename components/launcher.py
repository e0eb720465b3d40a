"""Launcher component: how many processes run the recipe, on how many nodes, started by whom.

``local`` starts ``nproc_per_node`` workers itself with torch's elastic launch API (no shell string):
the CLI composes and resolves the config once, writes it to the run dir (``frozen_config.yaml``), and
every worker loads that file, so all ranks share one run dir and one config. With ``nnodes`` > 1 every node
runs the same command into one pinned run dir; the nodes meet in a roll call and watch each other
(components/distributed/rendezvous.py). ``slurm`` (via hydra-submitit-launcher) and ``deepspeed``
(hostfile: components/distributed/hostfile.py) jobs start the processes from outside; each then reads its
rank from the environment and runs as one of those workers. The CLI hands ``launch`` the workers' entry
point (``run_worker`` of recipes/worker.py): components never import recipes.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, NON_NEGATIVE, PORT, POSITIVE, Range, knob
from hydratune.components.config.registry import component

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


#: launcher keys that may differ between the nodes of one job (each node's own)
PER_NODE = ("launcher.node_rank", "launcher.rdzv_timeout")
#: launcher keys that place a job on machines: a resumed run may change them (components/runtime/resume.py)
PLACEMENT = (
    *PER_NODE,
    "launcher.master_addr",
    "launcher.master_port",
    "launcher.rdzv_endpoint",
    "launcher.run_id",
    "launcher.collective_timeout",
    "launcher.max_restarts",
    "launcher.start_method",
    "launcher.hostfile",
    "launcher.include",
    "launcher.transport",
    "launcher.ssh_port",
)
C10D_PORT = 29400  # torch's default port of a c10d endpoint given without one


@component("launcher")
@dataclass(frozen=True)
class Local:
    """Processes on this machine (``nproc_per_node``), optionally one node of a multi-node job.

    Multi-node: run the same command on every node, with the run dir pinned to a shared filesystem
    (``hydra.run.dir=/shared/...``: the run id every node rendezvous under is derived from it), and
    ``launcher.nnodes=N launcher.node_rank=i launcher.master_addr=<node 0> launcher.master_port=<port>``
    (static rendezvous), or ``launcher.rdzv_endpoint=<host:port>`` (c10d rendezvous, node ranks assigned
    on arrival). The nodes meet in a roll call first (components/distributed/rendezvous.py): a node that
    does not come within ``rdzv_timeout`` seconds is named; a collective that waits longer than
    ``collective_timeout`` seconds fails (a node that froze).
    """

    nproc_per_node: int = knob(1, AT_LEAST_ONE)
    nnodes: int = knob(1, AT_LEAST_ONE)
    node_rank: int = knob(0, NON_NEGATIVE)  # below nnodes
    master_addr: str = "127.0.0.1"
    master_port: int = knob(29500, Range(1, 65535, also=(0,)))  # 0 = a free port (single node only)
    rdzv_endpoint: str | None = None
    # seconds every node waits for the others to join (then names the missing ones)
    rdzv_timeout: float = knob(300.0, POSITIVE)
    run_id: str | None = None  # null = derived from the pinned run dir (the same on every node)
    # seconds a collective may wait for the other ranks (torch's default)
    collective_timeout: float = knob(1800.0, POSITIVE)
    max_restarts: int = knob(0, NON_NEGATIVE)
    start_method: str = "spawn"  # spawn | forkserver | fork

    def validate(self) -> None:
        if self.node_rank >= self.nnodes:
            raise ConfigError(
                f"node_rank {self.node_rank} is not in [0, nnodes={self.nnodes})", key="launcher.node_rank"
            )
        if self.start_method not in ("spawn", "forkserver", "fork"):
            raise ConfigError(f"unknown start method '{self.start_method}'", key="launcher.start_method")
        if self.rdzv_endpoint is not None:
            self.endpoint()  # a malformed endpoint is named here
        if self.nnodes > 1 and not self.rdzv_endpoint and not self.master_port:
            raise ConfigError(
                "master_port=0 (a free port) works on one node only: the other nodes must know the port",
                key="launcher.master_port",
                hint="give every node the same launcher.master_port (e.g. 29500)",
            )

    def endpoint(self) -> tuple[str, int]:
        """The rendezvous endpoint every node meets at: the c10d endpoint, or node 0's master address."""
        if not self.rdzv_endpoint:
            return self.master_addr, self.master_port
        host, _, port = (
            self.rdzv_endpoint.rpartition(":") if ":" in self.rdzv_endpoint else (self.rdzv_endpoint, "", "")
        )
        if not host or (port and not port.isdigit()):
            raise ConfigError(
                f"rdzv_endpoint '{self.rdzv_endpoint}' is not host[:port]",
                key="launcher.rdzv_endpoint",
                hint="e.g. launcher.rdzv_endpoint=10.0.0.1:29400 (the same on every node)",
            )
        return host.strip("[]"), int(port or C10D_PORT)

    def rendezvous_id(self, pinned_run_dir: str | None) -> str:
        """The run id every node's rendezvous uses: ``run_id``, else one derived from the pinned run dir
        (every node knows it); never random per process. ``pinned_run_dir`` None: the run dir is made per
        process (a timestamp), which a multi-node job cannot share: refused."""
        import hashlib

        if self.run_id:
            return self.run_id
        if pinned_run_dir is None:
            if self.nnodes > 1:
                raise ConfigError(
                    f"launcher.nnodes={self.nnodes}, but the run dir is made per process (hydra.run.dir "
                    "holds a timestamp): the nodes would write different run dirs and never rendezvous",
                    key="hydra.run.dir",
                    hint="pin it to a directory on a filesystem every node shares, the same on every "
                    "node: hydra.run.dir=/shared/runs/<name>",
                )
            return f"hydratune-{uuid.uuid4().hex[:12]}"
        return f"hydratune-{hashlib.sha256(pinned_run_dir.encode()).hexdigest()[:12]}"

    def describe(self, run_id: str) -> str:
        """One line for ``mode=plan``: processes, nodes, rendezvous and timeouts."""
        procs = f"{self.nnodes} node(s) x {self.nproc_per_node} process(es) = world {self.world_size}"
        if self.nnodes == 1:
            return f"launcher: {procs}"
        host, port = self.endpoint()
        kind = (
            "c10d (node ranks by arrival)" if self.rdzv_endpoint else f"static, this node is {self.node_rank}"
        )
        return (
            f"launcher: {procs}; rendezvous {kind} at {host}:{port}, run id {run_id}; waits "
            f"launcher.rdzv_timeout={self.rdzv_timeout:g} s for every node; a collective fails after "
            f"launcher.collective_timeout={self.collective_timeout:g} s"
        )

    def training_args(self) -> dict[str, Any]:
        """TrainingArguments fields: the process group's timeout (``ddp_timeout``)."""
        return {"ddp_timeout": int(self.collective_timeout)}

    def writes_run_files(self) -> bool:
        """Whether this node writes the run's shared files (the frozen config, ``.hydra/``): node 0 of a
        static rendezvous, every node of a c10d one (they hold the same config), so each is written once."""
        return self.node_rank == 0

    #: a scheduler starts every rank with this same command (srun): ranks come from its environment
    started_per_rank: ClassVar[bool] = False
    #: several nodes run this same hydratune command, each starting its own workers, sharing one run dir
    one_command_per_node: ClassVar[bool] = True

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
        SLURM: hydratune.components.distributed.slurm.Requeue)."""
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

        timeout = int(self.rdzv_timeout)
        if self.rdzv_endpoint:
            host, port = self.endpoint()
            backend, endpoint, configs = "c10d", f"{host}:{port}", {"join_timeout": timeout}
        else:
            port = self.master_port or free_port()
            if self.nnodes == 1 and self.master_port == 29500:
                port = free_port()  # a lone node never collides with another job's default port
            configs = {"rank": self.node_rank, "timeout": timeout}
            backend, endpoint = "static", f"{self.master_addr}:{port}"
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

    def roll_call(self, run_dir: Path, run_id: str, config: dict[str, Any]) -> Any:
        """This node's part in the multi-node roll call (components/distributed/rendezvous.py)."""
        from hydratune.components.distributed.rendezvous import RollCall

        host, port = self.endpoint()
        return RollCall(
            host=host,
            port=port,
            nnodes=self.nnodes,
            node_rank=None if self.rdzv_endpoint else self.node_rank,
            run_id=run_id,
            timeout=self.rdzv_timeout,
            run_dir=run_dir,
            config=config,
            key="launcher.rdzv_endpoint" if self.rdzv_endpoint else "launcher.master_addr",
        )

    def launch(
        self,
        run_dir: Path,
        worker: Callable[[str], Any],
        run_id: str | None = None,
        config: dict | None = None,
    ) -> Any:
        """Start the workers on the frozen config in ``run_dir``: each process calls ``worker(run_dir)``
        (a module-level function, pickled by name for the spawned processes); rank 0's result (the
        objective). ``run_id``: the rendezvous id (:meth:`rendezvous_id`); ``config``: this node's flat
        config without :data:`PER_NODE` keys, which every node of a multi-node job must share.

        Several nodes first meet in a roll call (a missing node, another config, an unshared run dir: a
        ``RendezvousError`` naming it, nothing started), then watch each other while the workers run.

        A SIGTERM / SIGINT / SIGUSR1 to this process is relayed to the workers
        (components/distributed/interrupt.py): they finish the step, checkpoint together and exit 75, and so
        does this process (``Interrupted``)."""
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch

        from hydratune.components.distributed.interrupt import SignalRelay
        from hydratune.components.distributed.rendezvous import Ending

        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.nproc_per_node)))
        os.environ[RELAYS] = "1"
        clear_markers(run_dir)
        run_id = run_id or self.rendezvous_id(None)
        roster = self.roll_call(run_dir, run_id, config or {}).gather() if self.nnodes > 1 else None
        relay = SignalRelay(run_dir)
        quiet = QuietStop(relay)
        loggers = [logging.getLogger(n) for n in (ELASTIC_PROCESSES, "torch.multiprocessing.spawn")]
        for logger in loggers:
            logger.addFilter(quiet)
        try:
            if roster is not None:
                roster.watch(relay.worker_ranks)
            with relay:
                results = elastic_launch(self.launch_config(run_id), worker)(str(run_dir))
        except ChildFailedError as err:
            return self._after_failure(run_dir, err, relay, roster)
        except BaseException:
            if roster is not None:
                roster.publish(Ending("failed", "its launcher stopped"))
                roster.leave(run_dir, linger=True)
            raise
        finally:
            for logger in loggers:
                logger.removeFilter(quiet)
        if roster is not None:
            roster.publish(Ending("done"))
            roster.leave(run_dir)
        return (results or {}).get(0)

    def _after_failure(self, run_dir: Path, err: Any, relay: Any, roster: Any) -> Any:
        """A worker of this node failed (``err``: torch's ChildFailedError): rank 0's result when every
        failed worker had finished anyway; else ``Interrupted`` (they checkpointed after a signal), or
        ``WorkerFailed`` naming the rank, or, when they lost another node, that node (``NodeLost``)."""
        from hydratune.components.config.errors import EXIT_NODE_LOST, Interrupted
        from hydratune.components.distributed.rendezvous import Ending

        failed = dict(err.failures)
        done = finished_ranks(run_dir)
        ending = Ending("failed", first_failure(failed))
        try:
            if all(rank in done for rank in failed):
                # every worker had finished and written its result; a crash in interpreter teardown
                # (seen with gloo: "terminate called without an active exception") changes nothing
                ending = Ending("done")
                return done.get(0)
            try:
                raise_if_stopped(run_dir, failed)
            except Interrupted:
                ending = Ending("stopped")
                raise
            if relay.signum is not None:  # the second signal: the workers were killed
                reason = f"the workers were stopped at once ({signal.Signals(relay.signum).name} twice)"
                raise WorkerFailed(failed, exit_code=128 + relay.signum, reason=reason) from None
            if roster is not None and EXIT_NODE_LOST in exit_codes(failed):
                ending = Ending("lost", "its ranks lost another node")
                raise NodeLost(failed, roster.verdict(ending).blame()) from None
            raise WorkerFailed(failed) from None
        finally:
            if roster is not None:
                roster.publish(ending)
                roster.leave(run_dir, linger=ending.how in ("failed", "lost"))


def exit_codes(failures: dict[int, Any]) -> set[int]:
    return {int(getattr(f, "exitcode", 1) or 1) for f in failures.values()}


def first_failure(failures: dict[int, Any]) -> str:
    rank, failure = min(failures.items())
    return f"rank {rank} exited with code {getattr(failure, 'exitcode', 1)} (its output is on that node)"


def clear_markers(run_dir: Path) -> None:
    """Before the workers start: remove what an earlier launch into this run dir left (the relayed signal's
    name, the pid files of this host's launchers that are gone, the ranks' done / stopped records), so a
    run resumed into its own run dir neither stops at once on a stale signal nor reports a stale result.
    Every node of a multi-node job clears before the roll call ends, so none clears what another wrote
    for this launch."""
    from hydratune.components.distributed.interrupt import RELAY_FILE, WORKERS_DIR

    pid_files = (run_dir / WORKERS_DIR).glob(f"{socket.gethostname()}.*.pid")
    stale = [run_dir / RELAY_FILE, *(p for p in pid_files if not alive(launcher_of(p)))]
    stale += [p for pattern in (RANK_DONE, RANK_STOPPED) for p in run_dir.glob(pattern.format(rank="*"))]
    for path in stale:
        path.unlink(missing_ok=True)


def launcher_of(pid_file: Path) -> int:
    """The launcher pid in a worker's pid file (``<host>.<launcher pid>.<rank>.pid``; 0: another form)."""
    part = pid_file.name.split(".")[-3] if pid_file.name.count(".") >= 3 else ""
    return int(part) if part.isdigit() else 0


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class QuietStop(logging.Filter):
    """Drops torch elastic's failure reports (tracebacks) and its notices of ending the other ranks for a
    run stopped by a signal (workers that exited 75 after their checkpoint, or were killed by a second
    signal: an interrupted run is not a failed one), and for workers that lost another node (exit 69: they
    said so in one line, the launcher names the node)."""

    def __init__(self, relay: Any) -> None:
        super().__init__()
        self.relay = relay

    def filter(self, record: logging.LogRecord) -> bool:
        from hydratune.components.config.errors import EXIT_INTERRUPTED, EXIT_NODE_LOST

        message = record.getMessage()
        ours = any(f"exitcode: {code})" in message for code in (EXIT_INTERRUPTED, EXIT_NODE_LOST))
        if ours or (self.relay.killed and "failed (exitcode" in message):
            return False
        stopping = "Terminating process" in message or "Closing process" in message
        stopped = any(self.relay.run_dir.glob(RANK_STOPPED.format(rank="*")))
        return not (stopping and (stopped or self.relay.killed))


def raise_if_stopped(run_dir: Path, failures: dict[int, Any]) -> None:
    """Every failed worker checkpointed after a signal (whatever ended it then), or exited 75 that way:
    the run was interrupted, not broken."""
    import json

    from hydratune.components.config.errors import EXIT_INTERRUPTED, Interrupted

    stopped = {int(p.name.split(".")[1][4:]): p for p in run_dir.glob(RANK_STOPPED.format(rank="*"))}
    if stopped and (all(rank in stopped for rank in failures) or exit_codes(failures) == {EXIT_INTERRUPTED}):
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


class NodeLost(WorkerFailed):
    """This node's ranks stopped because another node went away mid-run (exit ``EXIT_NODE_LOST``)."""

    def __init__(self, failures: dict[int, Any], blame: str) -> None:
        from hydratune.components.config.errors import EXIT_NODE_LOST

        ranks = ", ".join(str(r) for r in sorted(failures))
        blame = blame or "a rank on another node stopped answering (which node could not be told)"
        super().__init__(
            failures,
            exit_code=EXIT_NODE_LOST,
            reason=f"{blame}; rank(s) {ranks} here stopped with it (a collective lost its peer)",
        )


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

    def job_script(self, run_dir: Path, worker: Callable[[str], Any]) -> str | None:
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
        self,
        run_dir: Path,
        worker: Callable[[str], Any],
        run_id: str | None = None,
        config: dict | None = None,
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


@component("launcher")
@dataclass(frozen=True)
class DeepSpeedLauncher(Local):
    """Processes started by DeepSpeed's launcher from a hostfile (``hostfile`` lists ``host slots=N``;
    ``include`` filters it, as ``deepspeed --include``): one command here starts every host's processes
    through ``transport`` (DeepSpeed's ``--launcher``: pdsh over ssh by default). Before anything starts,
    the hostfile, its hosts and the transport are checked (``mode=plan`` too) and passwordless ssh is tried;
    the run's environment reaches every host through a private ``.deepspeed_env``
    (components/distributed/hostfile.py). Every process runs as a worker of the same run dir, which must be
    on a filesystem all hosts share. ``nproc_per_node``: the GPUs per node when no hostfile is given."""

    # null: the hostfile's first host (127.0.0.1 without a hostfile)
    master_addr: str | None = None  # type: ignore[assignment]
    hostfile: str | None = None
    include: str | None = None  # e.g. "node1:0,1@node2" (deepspeed's --include)
    transport: str = (
        "pdsh"  # DeepSpeed's --launcher: pdsh (over ssh) | openmpi | mpich | impi | mvapich | slurm
    )
    ssh_port: int | None = knob(None, PORT)  # DeepSpeed's --ssh_port (pdsh and its ssh check); null = 22

    one_command_per_node: ClassVar[bool] = False  # one deepspeed command starts every node's processes

    def validate(self) -> None:
        from hydratune.components.distributed.hostfile import TRANSPORTS, check_hosts

        super().validate()
        if self.transport not in TRANSPORTS:
            raise ConfigError(
                f"unknown transport '{self.transport}' (DeepSpeed's --launcher)",
                key="launcher.transport",
                hint="one of: " + ", ".join(TRANSPORTS),
            )
        if self.hostfile and not Path(self.hostfile).is_file():
            raise ConfigError(f"hostfile not found: {self.hostfile}", key="launcher.hostfile")
        hosts = self.hosts()
        if hosts is not None and self.spawns_workers():
            check_hosts(hosts, self.transport)

    def spawns_workers(self) -> bool:  # type: ignore[override]
        return not inside_launched_worker()

    def hosts(self) -> Any:
        """The hostfile's hosts that the run uses (``hostfile.Hosts``), or None without a hostfile."""
        from hydratune.components.distributed.hostfile import read_hosts

        return read_hosts(self.hostfile, self.include) if self.hostfile else None

    def describe(self, run_id: str) -> str:
        from hydratune.components.distributed.hostfile import forwarded, shown

        hosts = self.hosts()
        if hosts is None:
            return f"launcher: deepspeed on this host, {self.nproc_per_node} process(es)"
        reach = f"through {self.transport} over ssh" if hosts.multi else "on this host (no transport needed)"
        return (
            f"launcher: deepspeed --hostfile {self.hostfile}: {hosts.describe()} {reach}; every host gets "
            f"{shown(forwarded())}"
            " (+ your .deepspeed_env)"
        )

    def command(self, run_dir: Path, worker: Callable[[str], Any], quiet: bool = False) -> list[str]:
        """The ``deepspeed`` command (an argument list, no shell) running the frozen config's workers: every
        process runs ``worker``'s module (``python -m <module> <run dir>``). DeepSpeed's runner is started by
        this interpreter (``python -m deepspeed.launcher.runner``), so a venv that is not activated (its
        ``deepspeed`` script not on ``PATH``) launches the same installation. ``quiet``: DeepSpeed's runner
        logs no command line (it would show the exported secrets)."""
        hosts = self.hosts()
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner"]
        if hosts is not None:
            cmd += ["--hostfile", str(self.hostfile), "--launcher", self.transport]
            cmd += ["--no_ssh_check"]  # launch() tried every host itself; one local host needs no ssh
            cmd += ["--force_multi"] if hosts.multi and len(hosts.names) == 1 else []  # one remote host
            cmd += ["--ssh_port", str(self.ssh_port)] if self.ssh_port else []
        if self.include:
            cmd += ["--include", self.include]
        if hosts is None:
            cmd += ["--num_nodes", "1", "--num_gpus", str(self.nproc_per_node)]
        master = self.master_addr or (hosts.names[0] if hosts is not None else "127.0.0.1")
        cmd += ["--master_addr", master, "--master_port", str(self.master_port), "--no_local_rank"]
        cmd += ["--log_level", "warning"] if quiet else []
        return [*cmd, "--module", worker.__module__, str(run_dir)]

    def launch(
        self,
        run_dir: Path,
        worker: Callable[[str], Any],
        run_id: str | None = None,
        config: dict | None = None,
    ) -> Any:
        """Check that passwordless ssh reaches every host, then run the ``deepspeed`` command with the run's
        environment for every host in a private ``.deepspeed_env`` (``DS_ENV_FILE``); rank 0's result."""
        import shlex
        import subprocess
        import sys

        from hydratune.components.config.trust import secret_name
        from hydratune.components.distributed.hostfile import (
            check_remote_line,
            check_ssh,
            environment_file,
            forwarded,
            shown,
        )

        hosts = self.hosts()
        if hosts is not None and hosts.multi and self.transport == "pdsh":
            check_remote_line(run_dir, self.master_addr or hosts.names[0])
        if hosts is not None:
            check_ssh(hosts, self.ssh_port)
        clear_markers(run_dir)
        variables = forwarded()
        with environment_file(variables) as (env_file, skipped):
            cmd = self.command(run_dir, worker, quiet=any(secret_name(k) for k in variables))
            print(f"hydratune: {shlex.join(cmd)}", file=sys.stderr, flush=True)
            if hosts is not None and hosts.multi:
                left = f"; left out (the runner's command line cannot carry them): {', '.join(skipped)}"
                print(
                    f"hydratune: every host gets {shown(variables)}{left if skipped else ''}", file=sys.stderr
                )
            proc = subprocess.run(cmd, env={**os.environ, "DS_ENV_FILE": str(env_file)}, check=False)
        done = finished_ranks(run_dir)
        if 0 in done:
            return done[0]
        code = proc.returncode or 1
        reason = f"deepspeed exited with code {code} before rank 0 finished (the output above says why)"
        raise WorkerFailed({0: type("Failure", (), {"exitcode": code})()}, exit_code=code, reason=reason)


def shared_by_nodes(launcher: Any) -> bool:
    """Whether a composed ``launcher`` node (before anything is instantiated: Hydra's callbacks) runs the
    same hydratune command on each of several nodes that share one run dir."""
    target = str(launcher.get("_target_", ""))
    known = {f"{cls.__module__}.{cls.__qualname__}": cls for cls in (Local, Slurm, DeepSpeedLauncher)}
    cls = known.get(target)
    return cls is not None and cls.one_command_per_node and int(launcher.get("nnodes", 1) or 1) > 1
