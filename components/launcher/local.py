"""The ``local`` launcher: processes on this machine, optionally one node of a multi-node job.

It starts ``nproc_per_node`` workers itself with torch's elastic launch API (no shell string); with
``nnodes`` > 1 every node runs the same command into one pinned run dir, and the nodes meet in a roll call
and watch each other (components/distributed/rendezvous.py). Also what every launcher shares: the
process-environment helpers and the launcher keys that may differ between nodes or runs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range, knob
from hydratune.components.config.registry import component
from hydratune.components.launcher.handoff import (
    ELASTIC_PROCESSES,
    RELAYS,
    NodeLost,
    QuietStop,
    Worker,
    WorkerFailed,
    clear_markers,
    exit_codes,
    finished_ranks,
    first_failure,
    raise_if_stopped,
)


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

    def job_script(self, run_dir: Path, worker: Worker) -> str | None:
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
        self, run_dir: Path, worker: Worker, run_id: str | None = None, config: dict | None = None
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
