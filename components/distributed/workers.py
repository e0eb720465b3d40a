"""Data preparation across worker processes: a list of tasks (each reads a range of rows and writes its
own Arrow shard) run in order by ``num_proc`` processes, with progress for the user.

A task is a picklable callable ``task(tick) -> result`` (a module-level function with its arguments bound
by ``functools.partial``: tables are memory-mapped files, so they pickle as paths) that reports the rows it
has done with ``tick(n)``; the results come back in task order. The processes are forked from a lean
server process (multiprocessing's ``forkserver``, with the data modules, ``datasets`` and the tokenizers
preloaded once, no torch): each holds what it reads and tokenizes, not a copy of the run's own process
(its models' libraries, its threads). Work below ``PARALLEL_FROM`` runs in this process. A
``ConfigError`` raised by a task (a bad row, named) is re-raised in the caller, the first one in task order,
so the error is the same whatever the number of processes.

Progress: on a terminal a bar (rich), otherwise a plain line every ``PROGRESS_EVERY`` seconds
(``data: tokenizing train  40,000/100,000 rows  8,012 rows/s  eta 0:00:07``), so a log file shows that a
long preparation is moving.
"""

from __future__ import annotations

import datetime
import errno
import functools
import hashlib
import logging
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hydratune.components.config.errors import ConfigError

log = logging.getLogger("hydratune")

T = TypeVar("T")
Tick = Callable[[int], None]
Task = Callable[[Tick], Any]

PROGRESS_EVERY = 5.0  # seconds between plain progress lines
SHARD_ROWS = 2048  # rows per batch written to an Arrow shard (memory held: one batch per process)
MAP_ROWS = 256  # rows per batch of ``Workers.map_rows`` (tokenizing: progress moves every few hundred)
FIRST_LINE_AFTER = 2.0  # a preparation shorter than this prints no progress at all
#: the least work (by unit) that worker processes are started for (starting them costs a few seconds)
#: a worker's OSError of these is raised again in the parent (which names the disk), not as a traceback
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
PARALLEL_FROM = {"rows": 20_000, "bytes": 16 << 20}
#: what the server process the workers are forked from imports once
PRELOAD = [
    "datasets",
    "transformers.tokenization_utils_tokenizers",
    "hydratune.components.data",
    "hydratune.components.text.sft_tokens",
]

_DONE: list[Any] = []  # in a worker process: the shared row counter of its pool (multiprocessing.Value)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity: taskset, cgroups cpusets, SLURM)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def data_processes(num_proc: int | None) -> int:
    """The processes a data preparation uses: ``data.num_proc``, else every core this process may run on
    (one process prepares while the other ranks of the job wait for it), at least one."""
    return num_proc if num_proc else max(1, available_cores())


class Progress:
    """Rows done out of ``total`` for ``label``: a rich bar on a terminal, plain lines otherwise; silent
    for a preparation that ends before ``FIRST_LINE_AFTER`` seconds."""

    def __init__(self, label: str, total: int, *, unit: str = "rows", show: bool = True) -> None:
        self.label, self.total, self.unit, self.show = label, max(total, 0), unit, show
        self.start = self.last = time.monotonic()
        self.done = 0
        self.bar: Any = None
        self.task: Any = None

    def update(self, done: int) -> None:
        """Set the rows done so far (and show them when due)."""
        self.done = done
        if not self.show:
            return
        now = time.monotonic()
        if now - self.start < FIRST_LINE_AFTER:
            return
        if sys.stdout.isatty():
            self._bar()
        elif now - self.last >= PROGRESS_EVERY:
            self.last = now
            print(self.line(now - self.start), flush=True)

    def line(self, elapsed: float) -> str:
        """``data: <label>  n/total rows  r rows/s  eta h:mm:ss`` (bytes are shown in MB)."""
        rate = self.done / elapsed if elapsed > 0 else 0.0
        scale, unit = (2**20, "MB") if self.unit == "bytes" else (1, self.unit)
        done, total, speed = self.done / scale, self.total / scale, rate / scale
        parts = [f"data: {self.label}", f"{done:,.0f}/{total:,.0f} {unit}", f"{speed:,.0f} {unit}/s"]
        if rate > 0 and self.total > self.done:
            parts.append(f"eta {datetime.timedelta(seconds=round((self.total - self.done) / rate))}")
        return "  ".join(parts)

    def _bar(self) -> None:
        if self.bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self.bar = RichProgress(
                TextColumn(f"data: {self.label}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total)
        self.bar.update(self.task, completed=self.done)

    def finish(self) -> None:
        """Stop the bar; a preparation that showed progress ends with one summary line."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        elapsed = time.monotonic() - self.start
        if self.show and elapsed >= FIRST_LINE_AFTER:
            print(self.line(elapsed) + f"  done in {elapsed:.1f} s", flush=True)


@dataclass
class Workers:
    """How a data preparation runs its tasks: ``num_proc`` processes (1: in this process) and whether it
    shows progress. ``dir``: where the tasks write their Arrow shards (``file`` names a new one)."""

    dir: Path
    num_proc: int = 1
    show_progress: bool = True
    _names: Iterator[int] = field(default_factory=lambda: iter(range(10**9)), repr=False)

    def file(self, stem: str) -> Path:
        """A new file name in ``dir`` (``<stem>-<n>.arrow``; never one handed out before)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        return self.dir / f"{stem}-{next(self._names):05d}.arrow"

    def run(self, tasks: Sequence[Task], label: str, total: int, unit: str = "rows") -> list[Any]:
        """Each task's result, in task order; the first ``ConfigError`` (in task order) is raised.
        ``total``: the rows (or bytes, ``unit``) the tasks will ``tick``, for the progress shown."""
        progress = Progress(label, total, unit=unit, show=self.show_progress)
        try:
            if self.num_proc <= 1 or len(tasks) <= 1 or total < PARALLEL_FROM[unit]:
                outcomes = _serial(tasks, progress)
            else:
                outcomes = _parallel(tasks, progress, min(self.num_proc, len(tasks)))
        finally:
            progress.finish()
        results = []
        for kind, value in outcomes:
            if kind == "config":
                message, key, hint = value
                raise ConfigError(message, key=key, hint=hint)
            if kind == "disk":  # re-raised here, where the caller names the disk (a full cache...)
                raise OSError(*value)
            if kind == "error":
                raise RuntimeError(f"a data preparation worker failed:\n{value}")
            results.append(value)
        return results

    def map_rows(
        self,
        table: Any,
        fn: Callable[[dict[str, list[Any]], int], dict[str, list[Any]]],
        features: Any,
        label: str,
        stem: str,
        counts: dict[str, int] | None = None,
    ) -> Any:
        """``fn(batch, first)`` on every batch of ``table``'s rows (a ``datasets.Dataset``; ``first``: the
        index of the batch's first row), the batches it returns (columns -> values, any number of rows)
        written as memory-mapped Arrow shards of ``features``, in order. What ``fn`` returns under
        ``COUNTS_KEY`` (name -> number) is summed into ``counts`` (``longest``: the largest)."""
        from datasets import Dataset

        spans = ranges(len(table), 4 * self.num_proc)
        paths = [self.file(stem) for _ in spans]
        tasks = [
            functools.partial(_map, table, fn, features, s, p) for s, p in zip(spans, paths, strict=True)
        ]
        results = self.run(tasks, label, len(table))
        for _, found in results:
            _add_counts(counts if counts is not None else {}, found)
        shards = [p for p, _ in results if p is not None]
        if not shards:
            return Dataset.from_dict({name: [] for name in features}, features=features)
        return open_shards(shards)


#: the key under which a ``map_rows`` function returns its counts (not a column)
COUNTS_KEY = "__counts__"


def _add_counts(into: dict[str, int], found: dict[str, int]) -> None:
    for name, n in found.items():
        into[name] = max(into.get(name, 0), n) if name == "longest" else into.get(name, 0) + n


def _map(
    table: Any, fn: Callable[..., Any], features: Any, span: tuple[int, int], path: Path, tick: Tick
) -> tuple[Path | None, dict[str, int]]:
    """One task of ``Workers.map_rows``: rows ``span`` of ``table`` through ``fn`` into the shard ``path``
    (None when ``fn`` kept no row), and the counts ``fn`` returned (``COUNTS_KEY``), summed."""
    from datasets.arrow_writer import ArrowWriter

    writer = None
    counts: dict[str, int] = {}
    for a in range(span[0], span[1], MAP_ROWS):
        b = min(a + MAP_ROWS, span[1])
        out = fn(table[a:b], a)
        _add_counts(counts, out.pop(COUNTS_KEY, {}))
        if writer is None:
            writer = ArrowWriter(features=features, path=str(path))
        writer.write_batch(out)
        tick(b - a)
    if writer is None:
        return None, counts
    writer.finalize()
    writer.close()
    return path, counts


def _serial(tasks: Sequence[Task], progress: Progress) -> list[tuple[str, Any]]:
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        progress.update(done[0])

    outcomes = []
    for task in tasks:
        outcome = _outcome(task, tick)
        outcomes.append(outcome)
        if outcome[0] != "ok":  # a later task's result cannot matter: this error is the first
            break
    return outcomes


def _outcome(task: Task, tick: Tick) -> tuple[str, Any]:
    try:
        return "ok", task(tick)
    except ConfigError as err:
        return "config", (err.args[0], err.key, err.hint)
    except OSError as err:
        if err.errno not in DISK_ERRORS:
            return "error", traceback.format_exc()
        return "disk", (err.errno, err.strerror, err.filename)
    except Exception:  # returned, not raised: the parent names the worker's traceback
        return "error", traceback.format_exc()


def _tick(n: int) -> None:
    with _DONE[0].get_lock():
        _DONE[0].value += n


def _start(counter: Any) -> None:
    _DONE[:] = [counter]


def _child(task: Task) -> tuple[str, Any]:
    return _outcome(task, _tick)


def _parallel(tasks: Sequence[Task], progress: Progress, processes: int) -> list[tuple[str, Any]]:
    """The tasks (pickled) in ``processes`` workers forked from the lean server process; the parent shows
    the shared row counter while it waits."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    counter = context.Value("q", 0)
    with context.Pool(processes, initializer=_start, initargs=(counter,)) as pool:
        pending = pool.map_async(_child, tasks, chunksize=1)
        while not pending.ready():
            pending.wait(0.5)
            progress.update(counter.value)
        progress.update(counter.value)
        return pending.get()


def open_shards(paths: Sequence[Path], fingerprint: str | None = None) -> Any:
    """Arrow shards of the same columns, in order, as one memory-mapped ``datasets.Dataset`` (its
    fingerprint given, or made of the paths: ``datasets`` would hash every shard's state otherwise)."""
    from datasets import Dataset
    from datasets.table import ConcatenationTable, MemoryMappedTable

    tables = [MemoryMappedTable.from_file(str(p)) for p in paths]
    table = tables[0] if len(tables) == 1 else ConcatenationTable.from_tables(tables)
    fingerprint = fingerprint or hashlib.sha256("|".join(map(str, paths)).encode()).hexdigest()[:16]
    return Dataset(table, fingerprint=fingerprint)


def ranges(total: int, parts: int, minimum: int | None = None) -> list[tuple[int, int]]:
    """``[start, stop)`` row ranges covering ``total`` rows: ``parts`` of them (fewer when a range would
    hold under ``minimum`` rows, default ``SHARD_ROWS``), in order."""
    minimum = SHARD_ROWS if minimum is None else minimum
    parts = max(1, min(parts, -(-total // max(minimum, 1)))) if total else 1
    step = -(-total // parts) if total else 0
    return [(a, min(a + step, total)) for a in range(0, total, step)] if total else [(0, 0)]
