"""Streaming SFT data (``data.streaming=true``): the rows of data.path read lazily, one at a time, converted
and checked exactly as a loaded row is (``ChatDataset``'s format detection, column mapping, ``to_chat`` and
the row checks), for corpora larger than memory or disk.

A :class:`RowStream` is one rank's share of the rows, endless (pass after pass over data.path), each row
with the :class:`Position` after it, which is where the stream resumes from. Ranks read disjoint rows:
whole files each when the files divide evenly among them, else every ``world``-th row (a JSON line that
is not this rank's is never parsed); a hub dataset is split by ``datasets.distributed.split_dataset_by_node``.
:func:`open_stream` first reads and checks the first :data:`PROBE` rows of the stream the way ``load()``
reads a file (the format is detected on them), before any model loads; rows after them are checked as
they are read (a bad one names its file and line, or is skipped and counted with ``data.on_error=skip``).

JSON lines resume at a byte offset; the other formats skip the rows before the position (compressed JSON
lines, csv and hub datasets by reading them, parquet and Arrow without decoding them).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.file_bytes import (
    BUILDERS,
    bom_of,
    csv_delimiter,
    data_suffix,
    file_type,
    first_line,
)
from hydratune.components.data.formats import TURN_NOTES
from hydratune.components.data.json_files import bad_line, check_head, parse_line, read_json
from hydratune.components.data.layout import Part, looks_local
from hydratune.components.data.readers import (
    ListTable,
    RowError,
    Table,
    chain,
    hub_error,
    read_arrow,
    row_error,
)
from hydratune.components.data.rows import CHAT_TOOLS_COLUMN, LoadReport, Row, scratch_workers

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset

    from hydratune.components.data.chats import ChatDataset
    from hydratune.components.distributed.workers import Workers

PROBE = 1000  # rows of the stream read and checked before the model loads (mode=plan: the same rows)
KEY = "data.path"
STREAM = "_stream"  # the column carrying each streamed row's Position (dropped before the collator)
HEAD = 1 << 16  # bytes of a JSON lines file looked at before its rows (BOM, not JSON lines at all)


class Dropped(Exception):
    """Raised by a stream step for a row the length policy leaves out (``data.on_overlong=drop``)."""


@dataclass
class Position:
    """Where one rank's stream stands (after a row), and what this rank has read so far. JSON-able: it
    rides along with each row (``_stream``) and is what a checkpoint stores."""

    epoch: int = 0  # complete passes over data.path before this one
    file: int = 0  # index of the file in the stream's files (0 for a hub dataset)
    row: int = 0  # rows of that file passed (every rank's; a hub dataset: this rank's)
    line: int = 0  # its lines passed (JSON lines: blank ones too; else the rows)
    offset: int | None = 0  # the byte they end at (JSON lines not compressed), else None
    index: int = 0  # rows of the whole stream passed in this pass (every rank's)
    read: int = 0  # this rank's rows read, every pass
    skipped: int = 0  # of which bad (data.on_error=skip)
    dropped: int = 0  # of which too long (data.on_overlong=drop)
    keys: dict[str, int] = dataclasses.field(default_factory=dict)  # message keys not used: rows naming each

    def as_dict(self) -> dict[str, Any]:
        """The position as a flat record (``keys`` as a JSON string: one Arrow type for every row)."""
        return dataclasses.asdict(self) | {"keys": json.dumps(self.keys)}

    @classmethod
    def of(cls, record: dict[str, Any]) -> Position:
        known = {f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record}
        if isinstance(known.get("keys"), str):
            known["keys"] = json.loads(known["keys"])
        return cls(**known)  # a position saved before ``keys`` was counted starts it empty

    def counts(self) -> dict[str, Any]:
        """This rank's rows read, skipped and dropped, and the message keys not used (for the summary)."""
        return {"read": self.read, "skipped": self.skipped, "dropped": self.dropped, "keys": dict(self.keys)}


# ----------------------------------------------------------------------------------------------- readers
Raw = tuple[int, Any, "int | None"]  # (line or row number in the file, the row or its JSON line, byte offset)


def _open(path: Path, compression: str | None) -> Any:
    """``path`` opened for reading bytes, decompressed as it is read."""
    if compression is None:
        return path.open("rb")
    if compression == "zstd":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(path.open("rb")))
    return importlib.import_module(compression).open(path, "rb")


def _is_document(path: Path, first: bytes) -> bool:
    """A ``.json`` file, or a ``.jsonl`` file whose first line opens one JSON document (an array, or an
    object spread over lines): read whole, as ``load()`` reads it."""
    if data_suffix(path) == ".json":
        return True
    head = first.strip()
    if head.startswith(b"["):
        return True
    if not head.startswith(b"{"):
        return False
    try:
        json.loads(head)
    except (ValueError, RecursionError):
        return True
    return False


def json_rows(path: Path, at: Position, *, skip: bool, stats: dict[str, int]) -> Iterator[Raw]:
    """A JSON lines file's non-blank lines from ``at`` (its byte offset, else its line count), unparsed;
    a JSON document (``.json``, a pretty-printed ``.jsonl``) is read whole and its rows given."""
    compression = (file_type(path) or (data_suffix(path), None))[1]
    with _open(path, compression) as f:  # the first non-blank line whole, and what follows it
        first = b""
        while not first.strip() and (line := f.readline()):
            first += line
        raw = first + f.read(HEAD)
    bom = bom_of(raw, str(path), KEY)
    head = raw[bom : max(len(first), raw.rfind(b"\n") + 1)]  # whole lines only
    if _is_document(path, first[bom:]):
        whole = read_json(path, key=KEY, skip=skip, stats=stats, workers=scratch_workers())
        for index, line, row in whole.read(at.row, whole.rows):
            yield (index + 1 if line is None else line), row, None
        return
    if not at.line and not skip:
        check_head(iter(head.splitlines()), str(path), KEY)
    with _open(path, compression) as f:
        number, offset = 0, 0 if compression is None else None
        if at.line and offset is not None and at.offset is not None:
            f.seek(at.offset)
            number, offset = at.line, at.offset
        for line in iter(f.readline, b""):
            number += 1
            offset = None if offset is None else offset + len(line)
            if number <= at.line:  # compressed: no seeking, the lines before are read and passed over
                continue
            if number == 1:
                line = line[bom:]
            if line.strip():
                yield number, line, offset


def table_rows(path: Path, at: Position) -> Iterator[Raw]:
    """A csv / tsv or parquet file's rows from ``at``, read by ``datasets`` in streaming mode (the builder
    that ``load()`` reads them with, the same delimiter; a csv's CRLF line breaks inside fields become
    ``\\n`` as there)."""
    import datasets

    suffix = data_suffix(path)
    crlf, options = False, {}
    if BUILDERS[suffix] == "csv":
        with _open(path, (file_type(path) or (suffix, None))[1]) as f:
            head = f.read(HEAD)
        crlf, options["delimiter"] = b"\r\n" in head, csv_delimiter(head, suffix)
    rows = iter([])
    try:
        table = datasets.load_dataset(
            BUILDERS[suffix], data_files=[str(path)], split="train", streaming=True, **options
        )
        rows = iter(table.skip(at.row) if at.row else table)
        for number in range(at.row + 1, 1 << 62):
            row = next(rows)
            if crlf:
                row = {k: v.replace("\r\n", "\n") if isinstance(v, str) else v for k, v in row.items()}
            yield number, row, None
    except StopIteration:
        return
    except Exception as err:
        errors = chain(err)
        if "corresponds to no data" in str(err) or any(type(e).__name__ == "EmptyDataError" for e in errors):
            return
        raise ConfigError(
            f"cannot read {path}: {first_line(errors[-1])}",
            key=KEY,
            hint=f"check that it is a valid {suffix[1:]} file",
        ) from None


def arrow_rows(part: Part, at: Position) -> Iterator[Raw]:
    """An ``.arrow`` file's or a ``save_to_disk`` folder's rows from ``at`` (memory-mapped: the rows before
    are not read)."""
    table = read_arrow(part.path, part.split, key=KEY)
    for index, _, row in table.read(at.row, table.rows):
        yield index + 1, row, None


def hub_rows(data: ChatDataset, at: Position, rank: int, world: int, held: int = 0) -> Iterator[Raw]:
    """A hub dataset's rows after its first ``held`` (its eval rows), for ``rank`` of ``world``
    (``split_dataset_by_node``), from ``at`` (the rows before it are read again and passed over)."""
    import datasets
    from datasets.distributed import split_dataset_by_node

    try:
        table = datasets.load_dataset(data.path, data.subset, split=data.split, streaming=True)
        table = table.skip(held) if held else table
        table = split_dataset_by_node(table, rank=rank, world_size=world) if world > 1 else table
        rows = iter(table.skip(at.row) if at.row else table)
        for number in range(at.row + 1, 1 << 62):
            yield number, next(rows), None
    except StopIteration:
        return
    except ConfigError:
        raise
    except Exception as err:
        raise hub_error(data.path, data.subset, data.split, err, KEY) from None


# ------------------------------------------------------------------------------------------------ stream
Step = tuple[Callable[[Row], Row], tuple[str, ...]]  # (row -> new columns, columns it removes)


class RowStream:
    """One rank's rows of data.path, converted and checked one by one, endless; each with the
    :class:`Position` after it. ``map`` adds a per-row step (as ``Dataset.map`` does: the step's columns
    replace ``remove_columns``); ``dataset()`` is the ``datasets.IterableDataset`` the trainer reads (its
    rows tokenized by a step: ``components/data/stream_prepare.py``), starting at ``start``."""

    def __init__(
        self,
        data: ChatDataset,
        parts: list[Part | None],
        convert: Callable[[Row], Row],
        probe: Dataset,
        *,
        rank: int = 0,
        world: int = 1,
        fmt: tuple[str, bool] = ("text", False),
    ) -> None:
        self.data, self.parts, self.convert, self.probe = data, parts, convert, probe
        self.fmt = fmt  # (the format detected on its first rows, whether its rows carry tool schemas)
        self.rank, self.world = rank, world
        self.local = parts != [None]
        # whole files per rank when they divide evenly (a row cap counts rows of every file: by rows then)
        self.by_files = self.local and len(parts) % world == 0 and data.max_samples is None
        self.steps: list[Step] = []
        self.start = Position()
        self.mapper = Table(KEY, [], 0)  # data.ignore_columns and data.columns, as a loaded table's
        self.mapper.apply_mapping(set(data.ignore_columns), data.mapping())
        self.head: Position | None = None  # where the stream starts after the rows it holds out for eval

    @property
    def column_names(self) -> list[str]:
        return list(self.probe.column_names)

    def map(self, fn: Callable[[Row], Row], remove_columns: Any = ()) -> RowStream:
        """This stream with ``fn`` applied to every row (the probe rows too)."""
        drop = tuple(remove_columns or ())
        out = self._copy()
        out.steps = [*self.steps, (fn, drop)]
        out.probe = self.probe.map(fn, remove_columns=list(drop))
        return out

    def then(self, fn: Callable[[Row], Row], remove_columns: Any = ()) -> RowStream:
        """This stream with ``fn`` applied to every row read from now on (not to the probe rows, which were
        checked already; ``remove_columns`` as for ``map``); ``fn`` may raise :class:`Dropped`, ``RowError``
        or a ``ConfigError`` (named by row)."""
        out = self._copy()
        out.steps = [*self.steps, (fn, tuple(remove_columns or ()))]
        return out

    def with_probe(self, probe: Dataset) -> RowStream:
        """This stream with its first rows as checked (and changed) before training."""
        out = self._copy()
        out.probe = probe
        return out

    def _copy(self) -> RowStream:
        out = RowStream.__new__(RowStream)
        out.__dict__.update(self.__dict__)
        out.start = dataclasses.replace(self.start)
        return out

    def convert_rows(self, tables: list[Table], key: str, report: LoadReport, workers: Workers) -> Dataset:
        """Rows of other files (its eval rows) converted as ``load()`` converts them, in this stream's
        format."""
        return self.data.convert_chat(tables, *self.fmt, key, report, workers)

    def describe(self) -> str:
        """How the ranks split the rows, for the summary."""
        if self.world == 1:
            return "one process: every row"
        if not self.local:
            return f"{self.world} ranks: datasets' split_dataset_by_node (disjoint rows)"
        if self.by_files:
            each, files = len(self.parts) // self.world, len(self.parts)
            return f"{self.world} ranks: whole files, {each} of {files} each (file i: rank i % {self.world})"
        return f"{self.world} ranks: rows dealt in turn (row i: rank i % {self.world})"

    # -- reading -------------------------------------------------------------------------------------
    def raw(self, part: Part | None, at: Position, *, whole: bool = False) -> Iterator[Raw]:
        """The rows of one file (or of the hub dataset: this rank's, after its eval rows; ``whole``: every
        row) from ``at``."""
        if part is None:
            if whole:
                return hub_rows(self.data, at, 0, 1)
            return hub_rows(self.data, at, self.rank, self.world, self.head.index if self.head else 0)
        if part.path.is_dir() or data_suffix(part.path) == ".arrow":
            return arrow_rows(part, at)
        if BUILDERS[data_suffix(part.path)] == "json":
            return json_rows(part.path, at, skip=self.data.on_error == "skip", stats={})
        if BUILDERS[data_suffix(part.path)] == "text":
            from hydratune.components.data.textcorpus import text_rows

            return text_rows(part.path, at.row, KEY, getattr(self.data, "text_unit", "paragraph"))
        return table_rows(part.path, at)

    def rows(self, start: Position) -> Iterator[tuple[Row, Position]]:
        """This rank's rows from ``start``, pass after pass, each with the position after it. A whole pass
        without a row to train on is an error (nothing to train)."""
        at = dataclasses.replace(start)
        while True:
            whole_pass = at.file == 0 and at.line == 0
            given = False
            for row, _ in self.one_pass(at):  # at: updated in place
                given = True
                yield row, dataclasses.replace(at)
            if whole_pass and not given:
                raise ConfigError(
                    f"rank {self.rank} of {self.world} got no row of {self.data.path} to train on "
                    f"({at.read} read, {at.skipped} skipped, {at.dropped} dropped)",
                    key=KEY,
                    hint="check the data (the summary counts skipped / dropped rows), or use fewer processes",
                )
            at = Position(epoch=at.epoch + 1, **at.counts())

    def one_pass(self, start: Position) -> Iterator[tuple[Row, Position]]:
        """The rows of this pass from ``start``; ``at`` (the position after each) is updated in place."""
        at = start
        cap = self.data.max_samples
        for fi in range(start.file, len(self.parts)):
            if self.by_files and fi % self.world != self.rank:
                continue
            if fi != at.file:
                at.file, at.row, at.line, at.offset = fi, 0, 0, 0
            held = self.head if self.local else None  # a hub dataset's reader passes over its eval rows
            if held is not None and fi < held.file:  # held out for eval, every row of it
                continue
            if held is not None and fi == held.file and at.row < held.row:  # the rest of it
                at.row, at.line, at.offset, at.index = held.row, held.line, held.offset, held.index
            part = self.parts[fi]
            for number, raw, offset in self.raw(part, dataclasses.replace(at)):
                at.row, at.line, at.offset, at.index = at.row + 1, number, offset, at.index + 1
                if cap is not None and at.index > cap:
                    return
                if self.local and not self.by_files and (at.index - 1) % self.world != self.rank:
                    continue
                at.read += 1
                row = self.row(part, raw, number, at)
                if row is not None:
                    yield row, at

    def where(self, part: Part | None, number: int, at: Position, raw: Any) -> str:
        """``file:line (row n)`` for a JSON line, else ``file, row n`` (as ``load()`` names rows)."""
        if part is None:
            return f"{self.data.path}[{self.data.split}], row {at.row} of rank {self.rank}"
        if isinstance(raw, bytes):
            return f"{part.path}:{number} (row {at.row})"
        return f"{part.path}, row {at.row}"

    def row(self, part: Part | None, raw: Any, number: int, at: Position) -> Row | None:
        """One raw row parsed, converted and put through the steps; None (counted in ``at``) when it is
        skipped (bad, ``on_error=skip``) or dropped (too long, ``on_overlong=drop``)."""
        skip = self.data.on_error == "skip"
        where = self.where(part, number, at, raw)
        if isinstance(raw, bytes):
            assert part is not None
            raw = parsed(part.path, number, raw, skip=skip)
            if raw is None:
                at.skipped += 1
                return None
        try:
            row = self.mapper.mapped(raw)
            self.data.task_columns(Table(where, list(row), 1))
            TURN_NOTES.clear()  # this row's message keys not used
            out = self.convert(row)
            for key in dict.fromkeys(TURN_NOTES):
                at.keys[key] = at.keys.get(key, 0) + 1
            for fn, drop in self.steps:
                out = {k: v for k, v in out.items() if k not in drop} | fn(out)
            return out
        except RowError as err:
            if not skip:
                raise row_error(where, err, KEY) from None
            at.skipped += 1
        except Dropped:
            at.dropped += 1
        except ConfigError as err:  # a step's (the chat template cannot render or mask this row)
            raise ConfigError(f"{where}: {err.args[0]}", key=err.key, hint=err.hint) from None
        return None

    def dataset(self) -> IterableDataset:
        """The rows as a ``datasets.IterableDataset`` (each with its :class:`Position` in ``_stream``),
        starting at ``self.start`` when iteration starts."""
        from datasets import IterableDataset
        from datasets.iterable_dataset import ExamplesIterable

        def examples() -> Iterator[tuple[int, Row]]:
            for n, (row, at) in enumerate(self.rows(self.start)):
                yield n, {**row, STREAM: at.as_dict()}

        return IterableDataset(ExamplesIterable(examples, {}))


# ----------------------------------------------------------------------------------------------- opening
def parsed(path: Path, number: int, line: bytes, *, skip: bool) -> Row | None:
    """Line ``number`` of a JSON lines file as a row (it is not blank); None for a bad one with ``skip``, a
    ConfigError naming the file and line otherwise."""
    row = parse_line(line)
    if isinstance(row, str):
        if not skip:
            raise bad_line(str(path), number, row, KEY)
        return None
    return row


def head(shell: RowStream) -> Iterator[tuple[int, Part | None, int, Any, int | None]]:
    """(file index, part, line or row number, raw row, byte offset after it) of the stream's rows in file
    order, every rank's, one pass, up to ``data.max_samples`` rows."""
    cap, n = shell.data.max_samples, 0
    for fi, part in enumerate(shell.parts):
        for number, raw, offset in shell.raw(part, Position(), whole=True):
            if cap is not None and n >= cap:
                return
            n += 1
            yield fi, part, number, raw, offset


@dataclass
class Head:
    """One of the stream's first rows, as read before training: its file, line or row number, the row
    (None: a bad JSON line, skipped and counted) and the byte offset after it."""

    file: int
    source: str
    number: int
    row: Row | None
    offset: int | None
    lines: bool  # a JSON line (named by its line number)


def first_rows(shell: RowStream, limit: int, report: LoadReport) -> list[Head]:
    """The first ``limit`` rows of the stream (every rank's, in file order), parsed (a bad JSON line: an
    error naming it, or skipped and counted in ``report``)."""
    skip = shell.data.on_error == "skip"
    out = []
    for fi, part, number, raw, offset in islice(head(shell), limit):
        source = f"{shell.data.path}[{shell.data.split}]" if part is None else str(part.path)
        lines = isinstance(raw, bytes)
        if lines:
            assert part is not None
            raw = parsed(part.path, number, raw, skip=skip)
            if raw is None:
                report.stats["skipped rows"] = report.stats.get("skipped rows", 0) + 1
        out.append(Head(fi, source, number, raw, offset, lines))
    if not any(h.row is not None for h in out):
        raise ConfigError(
            f"{shell.data.path} holds no rows" + (" that could be read" if report.stats else ""),
            key=KEY,
            hint="check the file (or data.split for a hub dataset)",
        )
    return out


def as_tables(rows: list[Head]) -> list[Table]:
    """``rows`` as one table per file (what ``load()``'s checks and conversion take), held in memory."""
    files: dict[int, ListTable] = {}
    for h in rows:
        table = files.setdefault(h.file, ListTable(h.source, [], 0, lines=[] if h.lines else None))
        if h.row is not None:
            table.data.append(h.row)
            table.columns += [c for c in h.row if c not in table.columns]
            table.rows += 1
            if table.lines is not None:
                table.lines.append(h.number)
    return [table for table in files.values() if table.rows]


def held_out(shell: RowStream) -> int:
    """How many of the stream's first rows are its eval rows: data.eval_size, or by default the share
    ``load()`` holds out of a file of as many rows (5%, at most 1,000: the stream's rows are counted up
    to 20,000); none with data.eval_path, a folder's validation split or data.eval_fraction=0."""
    from hydratune.components.data.rows import DEFAULT_EVAL_FRACTION, DEFAULT_EVAL_ROWS

    data = shell.data
    layout = data.layout(data.path, data.split) if shell.local else None
    if data.eval_path or (layout is not None and layout.eval) or data.eval_fraction == 0:
        return 0
    if data.eval_size:
        return data.eval_size
    enough = round(DEFAULT_EVAL_ROWS / DEFAULT_EVAL_FRACTION)  # from here on, the cap holds
    return data.held_out(sum(1 for _ in islice(head(shell), enough)))


def open_stream(
    data: ChatDataset, *, rank: int = 0, world: int = 1, workers: Workers | None = None
) -> tuple[RowStream, LoadReport, Dataset | None]:
    """This rank's stream of data.path, after its first :data:`PROBE` rows were read and converted the way
    ``load()`` converts a file (format detection, column mapping, the first-rows check, every row checked:
    a bad one names its file and line before the model loads, or is skipped and counted; ``workers``
    write them as Arrow); and its eval rows when they are its first rows (:func:`held_out`: the stream then
    starts after them, every pass)."""
    workers = workers or scratch_workers()
    report = LoadReport()
    layout = data.layout(data.path, data.split) if looks_local(data.path) else None
    parts: list[Part | None] = list(layout.train) if layout else [None]
    shell = RowStream(data, parts, lambda row: row, _empty(), rank=rank, world=world)
    held = held_out(shell)
    read = first_rows(shell, max(PROBE, held), report)
    sources = data.shape(as_tables(read[:PROBE]), KEY, report)
    fmt = data.detect(sources[0].columns, data.path, report)
    tools = any(CHAT_TOOLS_COLUMN in s.columns for s in sources)
    checked_rows = data.convert_chat(sources, fmt, tools, KEY, report, workers)
    report.info.update(layout.info() if layout else {})
    convert = data.converter(sources, fmt, tools)[0]
    stream = RowStream(data, parts, convert, checked_rows, rank=rank, world=world, fmt=(fmt, tools))
    evals = hold_out(stream, read, held, report, workers) if held else None
    report.info["stream split across ranks"] = stream.describe()
    return stream, report, evals


def hold_out(stream: RowStream, read: list[Head], n: int, report: LoadReport, workers: Workers) -> Dataset:
    """The stream's first ``n`` rows converted (its eval rows); the stream starts after them, every pass."""
    data = stream.data
    if len(read) < n or (len(read) == n and next(islice(head(stream), n, None), None) is None):
        raise ConfigError(
            f"holding out the first {n} rows of the stream for eval leaves no training rows ({data.path} "
            f"has {len(read)})",
            key="data.eval_size" if data.eval_size else "data.eval_fraction",
            hint="hold out fewer rows (data.eval_size=N), or give a separate data.eval_path",
        )
    last = read[n - 1]
    in_file = sum(1 for h in read[:n] if h.file == last.file)
    stream.head = Position(file=last.file, row=in_file, line=last.number, offset=last.offset, index=n)
    evals = stream.convert_rows(data.shape(as_tables(read[:n]), KEY, LoadReport()), KEY, report, workers)
    report.info["eval rows from"] = (
        f"the first {n} rows of data.path (a stream holds out its own first rows, never trained on; "
        + ("data.eval_size" if data.eval_size else "the default: 5% of its rows, at most 1,000")
        + "; data.eval_path sets others)"
    )
    return evals


def _empty() -> Dataset:
    from datasets import Dataset

    return Dataset.from_dict({})
