"""What a launcher and its workers hand each other through the run dir, and how it reads their ends.

The frozen config (:data:`FROZEN`) every worker loads, each rank's done / stopped record
(:data:`RANK_DONE`, :data:`RANK_STOPPED`), the relay flag (:data:`RELAYS`); the launcher clears what an
earlier launch left (:func:`clear_markers`), reads the results (:func:`finished_ranks`) and tells an
interrupted run from a failed one (:func:`raise_if_stopped`, :class:`WorkerFailed`, :class:`NodeLost`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

FROZEN = "frozen_config.yaml"
RANK_DONE = ".rank{rank}.done.json"  # a worker wrote its result: its exit code no longer matters
RANK_STOPPED = ".rank{rank}.stopped.json"  # a worker checkpointed after a signal and exits 75
ELASTIC_PROCESSES = "torch.distributed.elastic.multiprocessing.api"  # its logger reports failed workers
RELAYS = "HYDRATUNE_SIGNAL_RELAY"  # set for the workers of ``Local.launch``: they accept its relayed signals

#: the workers' entry point, called with the run dir (recipes/worker.py's ``run_worker``, given by the CLI)
Worker = Callable[[str], Any]


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
