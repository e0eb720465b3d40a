"""Graceful interruption: SIGTERM / SIGINT / SIGUSR1, and a scheduler's pre-emption signal (SLURM's
``--signal``, USR2 under submitit: the launcher's ``preemption_signals``) finish the current step, write a
checkpoint and stop; a second signal exits at once. After a pre-emption signal the launcher then requeues
the job (``Launcher.after_interrupt``); SIGTERM followed by the pre-emption signal (what SLURM sends a job it
pre-empts) counts as one pre-emption, not as two signals.

Under hydratune's own multi-process launcher the signal may reach the launching process only (``kill``,
``docker stop``), the workers only, or both (Ctrl-C, SLURM signalling a whole job step). The launcher
relays its signal once to every local worker as ``RELAY`` (SIGUSR2), naming the original in the run dir's
``RELAY_FILE``; a worker that already had the signal itself ignores the relay, so one signal never counts
as two. The ranks then agree, step by step, on whether any of them was asked to stop (one all-reduce), so
all of them stop after the same step and write one checkpoint together.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

SIGNALS = tuple(s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None)
RELAY = signal.SIGUSR2
RELAY_FILE = ".interrupt"  # in the run dir: the name of the signal the launcher relays
WORKERS_DIR = ".workers"  # in the run dir: <host>.<launcher pid>.<rank>.pid of each worker, for the relay

#: the launching process of this worker (``accept_relays``)
_launcher: list[int] = []
#: the signal relayed to this worker by its launcher (set by ``accept_relays``' handler), and the live handler
_relayed: list[int] = []
_active: list[GracefulInterrupt] = []
#: a pre-emption signal that came before training set up its handler (``defer``)
_deferred: list[int] = []


STOPPING = "finishing this step and writing a checkpoint"
FINISHING = "finishing final/ and the summary (training is done)"


def announce(signum: int, who: str = "", doing: str = STOPPING) -> None:
    name = signal.Signals(signum).name
    print(
        f"\nhydratune: {name} received{who}: {doing} (send {name} again to stop at once)",
        file=sys.stderr,
        flush=True,
    )


#: the all-reduced flag of a rank that received a pre-emption signal: PREEMPTED + signum (beats any signum)
PREEMPTED = 1000


class GracefulInterrupt:
    """Turns the first signal into 'save and stop after this step' (the loop driver asks :meth:`agreed`
    after every step: ``components/runtime/driver.py``); the second one kills. ``preemption``: the launcher's
    pre-emption signals, handled too (they may be the local launcher's ``RELAY`` signal elsewhere, so they
    are not in :data:`SIGNALS`)."""

    def __init__(self, preemption: frozenset[int] = frozenset()) -> None:
        self.preemption = preemption
        self.signum: int | None = None
        self.via_relay = False  # the stop came from the launcher's relay: the direct signal may follow it
        self.finishing = False  # training is over: a signal now finishes final/ (Session._finish)
        self._previous: dict[int, Any] = {}

    def install(self) -> GracefulInterrupt:
        for sig in (*SIGNALS, *sorted(self.preemption - set(SIGNALS))):
            self._previous[sig] = signal.signal(sig, self._handle)
        _active.append(self)
        if _relayed and self.signum is None:  # relayed while the model was loading
            self.signum, self.via_relay = _relayed[0], True
        if _deferred and self.signum is None:  # pre-empted while the model was loading: stop after step 1
            self.signum = _deferred[0]
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self in _active:
            _active.remove(self)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.via_relay:  # the signal the launcher relayed, arriving itself too (Ctrl-C, SLURM): one signal
            self.via_relay = False
            return
        if self.signum is not None and signum == signal.SIGINT and launcher_died():
            return  # torch's parent-death SIGINT, sent again as the dead launcher's threads are reaped
        if self.signum is not None and signum in self.preemption and not self.preempted:
            self.signum = signum  # SIGTERM, then the pre-emption signal: one pre-emption (requeued after)
            announce(signum, " (pre-emption)", FINISHING if self.finishing else STOPPING)
            return
        if self.signum is not None:  # second signal: no more grace
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        announce(signum, doing=FINISHING if self.finishing else STOPPING)

    def relayed(self, signum: int) -> None:
        """The launcher relayed ``signum``: the same as receiving it, unless a signal came already (the
        launcher's second signal kills the workers itself)."""
        if self.signum is None:
            self.signum, self.via_relay = signum, True
            announce(signum, " (relayed by the launcher)", FINISHING if self.finishing else STOPPING)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def preempted(self) -> bool:
        """The stop is the scheduler's pre-emption: the launcher requeues the job after the checkpoint."""
        return self.signum in self.preemption

    def agreed(self) -> bool:
        """Whether any rank was asked to stop (a collective call on every rank when a process group is up;
        the signal then is a pre-emption signal if any rank received one, else the largest signal number
        any rank received)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.requested
        import torch

        on_gpu = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        flag = torch.tensor(
            [(self.signum or 0) + PREEMPTED * self.preempted], dtype=torch.int64, device=device
        )
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        preempted, agreed = divmod(int(flag.item()), PREEMPTED)
        if agreed and (self.signum is None or (preempted and not self.preempted)):
            self.signum = agreed
        # the answer is the all-reduced flag only: a signal handled while this rank waited in the all-reduce
        # set self.signum after its flag was sent, and the other ranks do not know it until the next step
        return bool(agreed)


def accept_relays(run_dir: Path) -> None:
    """In a worker of hydratune's launcher, before anything else: take ``RELAY`` as the signal named in
    ``RELAY_FILE``, and register this process for relays (``WORKERS_DIR``). A relay before training starts
    is kept: the first step then ends with a checkpoint. (If the launcher dies, torch's spawn has the kernel
    send its workers SIGINT, once per thread of the dead launcher: they checkpoint and stop, counting it
    once.)"""
    import socket

    def handle(signum: int, frame: FrameType | None) -> None:
        original = _relay_signal(run_dir)
        if not _relayed:
            _relayed.append(original)
        for handler in _active:
            handler.relayed(original)

    signal.signal(RELAY, handle)
    _launcher[:] = [os.getppid()]
    workers = run_dir / WORKERS_DIR
    workers.mkdir(exist_ok=True)
    rank = os.environ.get("RANK", "0")  # named by its launcher too: several launchers may share a host
    (workers / pid_file_name(socket.gethostname(), _launcher[0], rank)).write_text(str(os.getpid()))
    if (run_dir / RELAY_FILE).is_file() and not _relayed:  # the launcher's signal came before we registered
        _relayed.append(_relay_signal(run_dir))


def pid_file_name(host: str, launcher_pid: int, rank: int | str) -> str:
    return f"{host}.{launcher_pid}.{rank}.pid"


def defer(signals: frozenset[int]) -> None:
    """Until training installs its handler: remember a pre-emption signal instead of dying of it, so the
    first step ends with a checkpoint (and the job is requeued) like a signal during training."""

    def handle(signum: int, frame: FrameType | None) -> None:
        if not _deferred:
            _deferred.append(signum)
            announce(signum, " (pre-emption, before training)")

    for sig in signals:
        signal.signal(sig, handle)


def launcher_died() -> bool:
    """In a worker of hydratune's launcher: that process is gone or going. The kernel sends the worker its
    parent-death SIGINT each time a thread of the dying launcher exits, handing the worker to the next one,
    so ``getppid()`` names the launcher until its last thread is gone; its main thread (the one that started
    the workers) is a zombie from the first of those signals on. Under load a later one was taken for a
    second Ctrl-C, and the worker killed itself in the middle of the checkpoint it had announced."""
    return bool(_launcher) and (os.getppid() != _launcher[0] or exiting(_launcher[0]))


def exiting(pid: int) -> bool:
    """Whether process ``pid`` has exited or its main thread has (a zombie while its other threads end):
    Linux's ``/proc/<pid>/stat``; False where there is no ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return Path("/proc/self/stat").is_file()  # no entry: gone (unless this system has no /proc)
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X", "x")


def _relay_signal(run_dir: Path) -> int:
    try:
        return int(signal.Signals[(run_dir / RELAY_FILE).read_text().strip()])
    except (OSError, KeyError):
        return int(signal.SIGTERM)


class SignalRelay:
    """In the process that started the workers: the first SIGTERM / SIGINT / SIGUSR1 is relayed once to
    every local worker (they checkpoint and exit 75); a second one kills them."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.signum: int | None = None
        self.killed = False  # a second signal: the workers were sent SIGKILL
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalRelay:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def pid_files(self) -> list[Path]:
        """The pid files of this launcher's workers (``accept_relays``)."""
        import socket

        return list((self.run_dir / WORKERS_DIR).glob(pid_file_name(socket.gethostname(), os.getpid(), "*")))

    def worker_pids(self) -> list[int]:
        pids = []
        for path in self.pid_files():
            try:
                pids.append(int(path.read_text()))
            except (OSError, ValueError):
                continue
        return pids

    def worker_ranks(self) -> list[int]:
        """The global ranks of this launcher's workers that have registered so far."""
        return sorted(int(path.name.split(".")[-2]) for path in self.pid_files())

    def _send(self, sig: int) -> None:
        for pid in self.worker_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # second signal: stop the workers at once
            name = signal.Signals(signum).name
            print(f"\nhydratune: {name} again: stopping the workers now", file=sys.stderr)
            self.killed = True
            self._send(signal.SIGKILL)
            return
        self.signum = signum
        # the file first, then the pids: a worker registering meanwhile either is signalled or finds the file
        (self.run_dir / RELAY_FILE).write_text(signal.Signals(signum).name)
        announce(signum, " (relaying it to the workers)")
        self._send(RELAY)
