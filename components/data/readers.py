"""Reading data files as rows, never all at once: each file (or hub split) is a :class:`Table` whose rows
are read in ranges, by worker processes when there are several (``components/distributed/workers.py``).

- JSON lines are scanned first (every line parsed: a bad line is named with its line number, or skipped
  and counted with ``data.on_error=skip``; the columns of every row are collected) in byte ranges, then
  read again range by range by the conversion, which writes Arrow shards. Nothing holds the file's rows.
- csv, parquet, ``.arrow`` files, save_to_disk folders and hub splits are Arrow tables already
  (``datasets``), memory-mapped and read in slices.
- A ``.json`` file holding one document (an array, ``{"data": [...]}``) has to be parsed whole.

A table applies ``data.ignore_columns`` and ``data.columns`` to every row it yields, and knows where each
row came from (``file:line (row n)`` for JSON lines, ``file, row n`` otherwise) for error messages.
"""

from __future__ import annotations

import codecs
import functools
import importlib
import itertools
import json
import math
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed.workers import SHARD_ROWS, Workers, ranges

if TYPE_CHECKING:
    from datasets import Dataset

Row = dict[str, Any]

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
BUILDERS[".txt"] = "text"  # one document per blank-line-separated block (components/data/textcorpus.py)
# compressed text files (``x.jsonl.gz``): the suffix -> how to decompress (``zstd`` needs ``zstandard``,
# as it does for ``datasets``)
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma", ".zst": "zstd"}
COMPRESSIBLE = (".jsonl", ".json", ".csv", ".txt")
PROBE_ROWS = 5  # when this many first rows (or all, if fewer) fail alike, the format or mapping is wrong
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
BLOCK = 4 << 20  # bytes read at a time
MIN_RANGE = 1 << 20  # the smallest byte range a scan task reads


class RowError(ValueError):
    """A problem with one row; the loader adds the file and line/row (or skips it with on_error=skip).
    ``key`` and ``hint`` name the knob that fixes it when every row has the problem."""

    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.key, self.hint = key, hint


def row_error(where: str, err: RowError, key: str) -> ConfigError:
    """A bad row (``on_error=raise``), named by its file and line or row."""
    return ConfigError(
        f"{where}: {err}",
        key=key,
        hint=(f"{err.hint}; or " if err.hint else "")
        + "fix the row, or set data.on_error=skip to drop bad rows and count them",
    )


def file_type(path: Path) -> tuple[str, str | None] | None:
    """(the data suffix, the compression or None) of a file the loader reads, by its name; else None."""
    last = path.suffix.lower()
    if last in COMPRESSIONS:
        inner = Path(path.stem).suffix.lower()
        return (inner, COMPRESSIONS[last]) if inner in COMPRESSIBLE else None
    return (last, None) if last in BUILDERS else None


def data_suffix(path: Path) -> str:
    """``.jsonl`` for ``x.jsonl`` and ``x.jsonl.gz`` alike; a file of no known type: its last suffix."""
    kind = file_type(path)
    return kind[0] if kind else path.suffix.lower()


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from, outermost first."""
    found: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and seen not in found:
        found.append(seen)
        seen = seen.__cause__ or seen.__context__
    return found


# ---------------------------------------------------------------------------------------------- tables


@dataclass
class Table:
    """The rows of one file, save_to_disk folder or split, or hub split: ``rows`` of them, with every
    column any row has (``columns``, after the mapping). ``drop`` (ignored and replaced columns) and
    ``rename`` (theirs -> ours, ``data.columns``) are applied to each row read."""

    source: str
    columns: list[str]
    rows: int
    drop: frozenset[str] = frozenset()
    rename: dict[str, str] = field(default_factory=dict)
    # a conversion each row needs before the data option's own (a LLaMA-Factory entry's,
    # components/data/llamafactory.py): ``columns`` are then what it gives, and ``shape`` the format it gives
    prepare: Callable[[Row], Row] | None = None
    shape: str | None = None
    # where the rows' relative image paths are resolved (None: the file's folder; components/data/images.py)
    image_dir: Path | None = None

    def ranges(self, parts: int) -> list[tuple[int, int]]:
        """Row ranges for ``parts`` tasks (in order, covering every row)."""
        return ranges(self.rows, parts)

    def read(self, start: int, stop: int) -> Iterator[tuple[int, int | None, Row]]:
        """(row index, source line or None, row) for rows ``start`` to ``stop``, mapped."""
        for index, line, row in self._raw(start, stop):
            yield index, line, self.mapped(row)

    def _raw(self, start: int, stop: int) -> Iterator[tuple[int, int | None, Row]]:
        raise NotImplementedError

    def mapped(self, row: Row) -> Row:
        if not self.drop and not self.rename:
            return row
        kept = {k: v for k, v in row.items() if k not in self.drop and k not in self.rename}
        return kept | {ours: row[theirs] for theirs, ours in self.rename.items() if theirs in row}

    def head(self, n: int) -> list[Row]:
        """The first ``n`` rows (mapped)."""
        return [row for _, _, row in self.read(0, min(n, self.rows))]

    def where(self, index: int, line: int | None) -> str:
        """``file:line (row n)`` for JSON lines, else ``file, row n`` (rows count from 1, header excluded)."""
        if line is not None:
            return f"{self.source}:{line} (row {index + 1})"
        return f"{self.source}, row {index + 1}"

    def apply_mapping(self, drop: set[str], rename: dict[str, str]) -> None:
        """Drop ``drop`` and rename ``rename`` (theirs -> ours, replacing an ``ours`` column the file has)
        in every row this table yields, and in ``columns``."""
        targets = set(rename.values())
        self.drop = frozenset(self.drop | drop | (targets - set(rename)))
        self.rename = dict(rename)
        present = [c for c in self.columns if c not in drop]
        self.columns = [c for c in present if c not in targets and c not in rename] + [
            ours for theirs, ours in rename.items() if theirs in present
        ]


@dataclass
class ListTable(Table):
    """Rows held in a list: a ``.json`` file that is one document (parsed whole), or a stream's first rows
    (``components/data/stream.py``; ``lines``: the JSON line each came from)."""

    data: list[Row] = field(default_factory=list)
    lines: list[int] | None = None

    def _raw(self, start: int, stop: int) -> Iterator[tuple[int, int | None, Row]]:
        for i in range(start, stop):
            yield i, None if self.lines is None else self.lines[i], self.data[i]


@dataclass
class ArrowTable(Table):
    """An Arrow-backed ``datasets.Dataset`` (csv, parquet, .arrow, save_to_disk, hub), memory-mapped and
    read in slices; ``crlf``: a csv written with CRLF line ends, whose in-field line breaks become ``\\n``."""

    dataset: Any = None
    crlf: bool = False

    def _raw(self, start: int, stop: int) -> Iterator[tuple[int, int | None, Row]]:
        names = self.dataset.column_names
        for a in range(start, stop, SHARD_ROWS):
            batch = self.dataset[a : min(a + SHARD_ROWS, stop)]
            for i, values in enumerate(zip(*(batch[c] for c in names), strict=True)):
                row = dict(zip(names, values, strict=True))
                if self.crlf:
                    row = {k: v.replace("\r\n", "\n") if isinstance(v, str) else v for k, v in row.items()}
                yield a + i, None, row


@dataclass(frozen=True)
class Span:
    """One byte range of a JSON lines file, as its scan found it."""

    start: int
    end: int
    first_line: int  # the number of the range's first line (from 1)
    first_row: int  # the index of the range's first row in the file
    rows: int


@dataclass
class JsonLinesTable(Table):
    """A JSON lines file read back range by range (``spans``: what the scan found); bad lines are the ones
    the scan skipped (``data.on_error=skip``)."""

    path: Path = Path()
    spans: list[Span] = field(default_factory=list)

    def ranges(self, parts: int) -> list[tuple[int, int]]:
        """One task per scanned byte range (cut at ``rows``)."""
        out = [(s.first_row, min(s.first_row + s.rows, self.rows)) for s in self.spans]
        return [(a, b) for a, b in out if b > a] or [(0, 0)]

    def _raw(self, start: int, stop: int) -> Iterator[tuple[int, int | None, Row]]:
        for span in self.spans:
            if span.first_row + span.rows <= start or span.first_row >= stop:
                continue
            index = span.first_row
            for number, line in enumerate(lines(self.path, span.start, span.end), start=span.first_line):
                row = parse_line(line)
                if not isinstance(row, dict):
                    continue  # a bad line the scan skipped and counted
                if index >= stop:
                    return
                if index >= start:
                    yield index, number, row
                index += 1


# -------------------------------------------------------------------------------------- JSON lines


def lines(path: Path, start: int, end: int) -> Iterator[bytes]:
    """The lines of ``path`` between byte ``start`` and ``end`` (both at line starts), read a block at a
    time (split as ``bytes.splitlines`` does, so line numbers match a whole-file split)."""
    with open(path, "rb") as f:
        f.seek(start)
        left, rest = end - start, b""
        while left > 0:
            block = f.read(min(BLOCK, left))
            if not block:
                break
            left -= len(block)
            block = rest + block
            cut = block.rfind(b"\n") + 1 if left > 0 else len(block)
            rest = block[cut:]
            yield from block[:cut].splitlines()
        if rest:
            yield from rest.splitlines()


def parse_line(line: bytes) -> Row | str | None:
    """A JSON lines line as an object; None for a blank line; the problem (text) for a bad one."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"not UTF-8 text (byte {err.start} of the line)"
    if not text.strip():
        return None
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        return f"malformed JSON ({err.msg}, column {err.colno})"
    except RecursionError:  # json's parser recurses once per nested bracket
        return "JSON nested too deeply to parse"
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    return row


@dataclass
class Scanned:
    """What the scan of one byte range found."""

    lines: int = 0
    rows: int = 0
    keys: dict[str, None] = field(default_factory=dict)
    skipped: int = 0
    first_bad: tuple[int, str] | None = None  # (line within the range, from 1; the problem)


def scan_range(
    path: Path, start: int, end: int, skip: bool, tick: Callable[[int], None], limit: int = -1
) -> Scanned:
    """Parse every line of a byte range: rows, their columns, bad lines (the first one stops the scan
    unless ``skip``); ``limit`` >= 0: only the first ``limit`` rows count (their columns)."""
    out = Scanned()
    done = 0
    for out.lines, line in enumerate(lines(path, start, end), start=1):
        done += len(line) + 1
        if done >= 1 << 20:
            tick(done)
            done = 0
        row = parse_line(line)
        if row is None:
            continue
        if isinstance(row, str):
            if not skip:
                out.first_bad = (out.lines, row)
                return out
            out.skipped += 1
            continue
        if out.rows == limit:
            continue
        out.rows += 1
        out.keys.update(dict.fromkeys(row))
    tick(done)
    return out


def cut_points(path: Path, start: int, parts: int) -> list[int]:
    """Byte offsets that split ``path`` (from ``start``) into about ``parts`` ranges of at least
    ``MIN_RANGE`` bytes, each cut just after a newline."""
    size = path.stat().st_size
    parts = max(1, min(parts, (size - start) // MIN_RANGE))
    points = [start]
    with open(path, "rb") as f:
        for k in range(1, parts):
            f.seek(max(points[-1], start + (size - start) * k // parts))
            f.readline()  # to the next line start
            if f.tell() >= size:
                break
            if f.tell() > points[-1]:
                points.append(f.tell())
    return [*points, size]


def check_first_lines(path: Path, source: str, start: int, key: str) -> None:
    """If none of the first ``PROBE_ROWS`` non-blank lines (all, if fewer) is a JSON object, the file is not
    JSON lines at all: say so instead of offering to skip (which would drop every line)."""
    check_head(lines(path, start, path.stat().st_size), source, key)


def check_head(file_lines: Iterator[bytes], source: str, key: str) -> None:
    """:func:`check_first_lines` on a file's lines (from its first; a stream's, decompressed as read)."""
    head: list[bytes] = []
    seen: list[bytes] = []
    for line in file_lines:
        seen.append(line)
        if line.strip():
            head.append(line)
        if len(head) == PROBE_ROWS:
            break
    if not head or any(isinstance(parse_line(line), dict) for line in head):
        return
    for number, line in enumerate(seen, start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as err:  # e.g. latin-1: say so, not "not JSON lines"
            raise not_utf8(source, number, line[err.start], key) from None
    which = "the only line is" if len(head) == 1 else f"none of the first {len(head)} lines is"
    raise ConfigError(
        f"{source}: {which} a JSON object, so this is not JSON lines (one {{...}} object per line); "
        f"it starts {head[0][:60].decode('utf-8', 'replace')!r}",
        key=key,
        hint="write one JSON object per line (double quotes, not Python's single-quoted dicts), or a "
        ".json file holding one array of objects, or a .csv file with a header row",
    )


def not_utf8(source: str, line: int, byte: int, key: str) -> ConfigError:
    return ConfigError(
        f"{source}:{line}: not UTF-8 text (byte 0x{byte:02x}; latin-1 or cp1252 perhaps)",
        key=key,
        hint="re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 in.jsonl > out.jsonl)",
    )


def bad_line(source: str, line: int, problem: str, key: str) -> ConfigError:
    return ConfigError(
        f"{source}:{line}: {problem}",
        key=key,
        hint="fix the line, or set data.on_error=skip to drop bad rows and count them",
    )


def scan_json_lines(
    path: Path,
    source: str,
    start: int,
    *,
    key: str,
    skip: bool,
    limit: int | None,
    workers: Workers,
    stats: dict[str, int],
) -> JsonLinesTable:
    """Scan a JSON lines file (from byte ``start``, after a BOM) in parallel byte ranges: the first bad line
    stops the load, named with its line (``skip``: counted in ``stats``), and the table's columns are every
    column of its first ``limit`` rows (all, None)."""
    if not skip:
        check_first_lines(path, source, start, key)
    points = cut_points(path, start, 4 * workers.num_proc)
    bounds = list(itertools.pairwise(points))
    tasks = [functools.partial(scan_range, path, a, b, skip) for a, b in bounds]
    scans = workers.run(tasks, f"reading {Path(source).name}", points[-1] - start, unit="bytes")
    spans, line, row = [], 1, 0
    for (a, b), scan in zip(bounds, scans, strict=True):
        if scan.first_bad is not None:
            number, problem = scan.first_bad
            raise bad_line(source, line + number - 1, problem, key)
        spans.append(Span(a, b, line, row, scan.rows))
        line, row = line + scan.lines, row + scan.rows
    skipped = sum(s.skipped for s in scans)
    if skipped:
        stats["skipped rows"] = stats.get("skipped rows", 0) + skipped
    total = row if limit is None else min(row, limit)
    keys: dict[str, None] = {}
    for span, scan in zip(spans, scans, strict=True):
        if span.first_row >= total:
            break
        if span.first_row + span.rows > total:  # the range the limit cuts: the columns of its rows kept
            scan = scan_range(path, span.start, span.end, True, lambda n: None, total - span.first_row)
        keys.update(scan.keys)
    return JsonLinesTable(source, list(keys), total, path=path, spans=spans)


# ------------------------------------------------------------------------------------- files as tables


def decompressed(path: Path, key: str, workers: Workers) -> Path:
    """``path`` itself, or (``.gz``, ``.bz2``, ``.xz``, ``.zst``) a decompressed copy in ``workers.dir``,
    written a block at a time."""
    kind = file_type(path)
    compression = kind[1] if kind else None
    if compression is None:
        return path
    out = workers.file("decompressed").with_suffix(kind[0] if kind else "")
    try:
        with open_compressed(path, compression) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, BLOCK)
    except Exception as err:  # each library raises its own error for a damaged or mislabelled file
        raise ConfigError(
            f"{path} is not a valid {compression} file ({first_line(err)})",
            key=key,
            hint=f"check the file, or rename it without '{path.suffix}' if it is not compressed",
        ) from None
    return out


def open_compressed(path: Path, compression: str) -> Any:
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return importlib.import_module(compression).open(path, "rb")


def bom_length(path: Path, source: str, key: str) -> int:
    """Bytes of a UTF-8 byte order mark at the start (Windows editors and Excel write one); UTF-16 is
    refused by name (its BOM would otherwise read as a malformed first line)."""
    with open(path, "rb") as f:
        return bom_of(f.read(3), source, key)


def bom_of(head: bytes, source: str, key: str) -> int:
    """:func:`bom_length` of a file whose first bytes are ``head``."""
    if head.startswith(UTF16_BOMS):
        raise ConfigError(
            f"{source} is UTF-16 text, not UTF-8",
            key=key,
            hint="re-encode the file as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8, or 'Save as UTF-8')",
        )
    return len(UTF8_BOM) if head.startswith(UTF8_BOM) else 0


def is_json_lines(path: Path, start: int, suffix: str) -> bool:
    """Whether a ``.jsonl`` / ``.json`` file holds one object per line rather than one document: its first
    non-blank line is a whole JSON object, and (for ``.json``) more follows; a ``.jsonl`` file that is one
    document (a pretty-printed array or object) is read as one."""
    first, more = None, False
    for line in lines(path, start, path.stat().st_size):
        if not line.strip():
            continue
        if first is not None:
            more = True
            break
        first = line
    if first is None:
        return suffix == ".jsonl"
    parsed = parse_line(first)
    if isinstance(parsed, dict):
        return suffix == ".jsonl" or more
    if suffix == ".json" or first.lstrip()[:1] not in (b"[", b"{"):
        return suffix == ".jsonl"
    return not _parses_whole(path, start)


def _parses_whole(path: Path, start: int) -> bool:
    try:
        json.loads(path.read_bytes()[start:])
    except (ValueError, RecursionError):
        return False
    return True


def read_json_document(path: Path, source: str, start: int, key: str) -> ListTable | None:
    """A ``.json`` file holding one document: a list of objects, a dict of equal-length columns, or a dict
    with one list of objects (``{"data": [...]}``). None when it turns out to be JSON lines."""
    raw = path.read_bytes()[start:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise not_utf8(source, raw.count(b"\n", 0, err.start) + 1, raw[err.start], key) from None
    if not text.strip():
        return ListTable(source, [], 0)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # one object per line in a .json file
            return None
        raise ConfigError(
            f"{source}:{err.lineno}: malformed JSON ({err.msg}, column {err.colno})", key=key
        ) from None
    except RecursionError:
        raise ConfigError(f"{source}: JSON nested too deeply to parse", key=key) from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1 and all(isinstance(r, dict) for r in lists[0]):
            data = lists[0]
        elif data and len(lists) == len(data) and len({len(v) for v in lists}) == 1:
            data = [dict(zip(data, values, strict=True)) for values in zip(*lists, strict=True)]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ConfigError(
            f"{source} is not a list of JSON objects (nor JSON lines)",
            key=key,
            hint='use one object per line, or [{"messages": [...]}, ...]',
        )
    keys: dict[str, None] = {}
    for row in data:
        keys.update(dict.fromkeys(row))
    return ListTable(source, list(keys), len(data), data=data)


def read_json(
    path: Path, *, key: str, skip: bool, stats: dict[str, int], workers: Workers, limit: int | None = None
) -> Table:
    """A ``.jsonl`` file, or a ``.json`` file holding one document or, despite its name, JSON lines
    (compressed ones decompressed first; a UTF-8 BOM skipped)."""
    source = str(path)
    plain = decompressed(path, key, workers)
    start = bom_length(plain, source, key)
    suffix = data_suffix(path)
    if not is_json_lines(plain, start, suffix):
        document = read_json_document(plain, source, start, key)
        if document is not None:
            document.rows = document.rows if limit is None else min(limit, document.rows)
            return document
    return scan_json_lines(
        plain, source, start, key=key, skip=skip, limit=limit, workers=workers, stats=stats
    )


def csv_check(path: Path, source: str, key: str, workers: Workers) -> tuple[bool, bool]:
    """A csv file's text checked a block at a time: UTF-8 (a bad byte named with its line), and whether it
    has CRLF line ends; returns ``(crlf, empty)``."""
    plain = decompressed(path, key, workers)
    crlf, empty, line, pending, tail = False, True, 1, b"", b""
    with open(plain, "rb") as f:
        f.read(bom_length(plain, source, key))
        while True:
            block = f.read(BLOCK)
            data = pending + block
            try:
                _, used = codecs.utf_8_decode(data, "strict", not block)
            except UnicodeDecodeError as err:
                line += data.count(b"\n", 0, err.start)
                raise not_utf8(source, line, data[err.start], key) from None
            crlf = crlf or b"\r\n" in tail + data
            empty = empty and not data.strip()
            line += data.count(b"\n", 0, used)
            pending, tail = data[used:], data[-1:]
            if not block:
                return crlf, empty


def read_table(path: Path, *, key: str, workers: Workers, limit: int | None = None) -> Table:
    """A ``.csv`` (or compressed ``.csv.gz``...) or ``.parquet`` file through ``datasets.load_dataset`` (a
    csv's UTF-8 is checked first, so a bad byte is reported with its line). Quoted csv fields may span
    lines; a BOM is skipped, and in a file with CRLF line ends the line breaks inside fields become ``\\n``
    too."""
    import datasets

    source, crlf, suffix = str(path), False, data_suffix(path)
    if suffix == ".csv":
        crlf, empty = csv_check(path, source, key, workers)
        if empty:
            return ListTable(source, [], 0)
    try:
        table = datasets.load_dataset(BUILDERS[suffix], data_files=[str(path)], split="train")
    except Exception as err:
        errors = chain(err)
        if "corresponds to no data" in str(err) or any(type(e).__name__ == "EmptyDataError" for e in errors):
            return ListTable(source, [], 0)
        raise ConfigError(
            f"cannot read {path}: {first_line(errors[-1])}",
            key=key,
            hint=f"check that it is a valid {suffix[1:]} file",
        ) from None
    return arrow_table(source, table, limit, crlf=crlf)


def arrow_table(source: str, dataset: Dataset, limit: int | None, crlf: bool = False) -> ArrowTable:
    dataset = undecoded_images(dataset)
    rows = len(dataset) if limit is None else min(limit, len(dataset))
    return ArrowTable(source, list(dataset.column_names), rows, dataset=dataset, crlf=crlf)


def undecoded_images(dataset: Dataset) -> Dataset:
    """``dataset`` with its ``Image`` features (alone or in a list) read as ``{"bytes", "path"}``: the
    image bytes as stored, not decoded (components/data/images.py opens and checks them). Only the
    features change, the Arrow storage is the same: nothing is read or written (``cast_column`` would
    rewrite a list of images through ``map``, next to the user's files; this is its own path for one
    ``Image``)."""
    import copy

    from datasets import Image, List, Sequence
    from datasets.arrow_dataset import update_metadata_with_features

    undecoded = {}
    for name, feature in dataset.features.items():
        inner = getattr(feature, "feature", None)
        if isinstance(feature, Image) and feature.decode:
            undecoded[name] = Image(decode=False)
        elif isinstance(feature, (List, Sequence)) and isinstance(inner, Image) and inner.decode:
            undecoded[name] = List(Image(decode=False))
    if not undecoded:
        return dataset
    out = copy.deepcopy(dataset)
    for name, feature in undecoded.items():
        out._info.features[name] = feature
    out._data = update_metadata_with_features(out._data, out._info.features)
    return out


def read_arrow(path: Path, split: str | None, *, key: str, limit: int | None = None) -> Table:
    """An ``.arrow`` file (``Dataset.from_file``), a ``save_to_disk`` folder or one split of one
    (``datasets.load_from_disk``)."""
    import datasets

    source = str(path) + (f"[{split}]" if split is not None else "")
    try:
        if path.is_file():
            table = datasets.Dataset.from_file(str(path))
        else:
            table = datasets.load_from_disk(str(path))
            table = table[split] if isinstance(table, datasets.DatasetDict) else table
    except Exception as err:
        what = "an Arrow file" if path.is_file() else "a save_to_disk folder"
        raise ConfigError(
            f"cannot read {source} as {what}: {first_line(chain(err)[-1])}",
            key=key,
            hint="write it with Dataset.save_to_disk (a folder) or point at the .arrow file of one",
        ) from None
    return arrow_table(source, table, limit)


def read_hub(name: str, *, split: str, subset: str | None, key: str, limit: int | None = None) -> Table:
    """One split of a Hugging Face Hub dataset (or of one already in the local datasets cache)."""
    import datasets

    try:
        table = datasets.load_dataset(name, subset, split=split)
    except Exception as err:
        raise hub_error(name, subset, split, err, key) from None
    return arrow_table(f"{name}[{split}]", table, limit)


def hub_error(name: str, subset: str | None, split: str, err: Exception, key: str) -> ConfigError:
    """A hub dataset that could not be loaded (offline: only what the local datasets cache holds)."""
    what = f"'{name}'" + (f" (subset '{subset}')" if subset else "") + f", split '{split}'"
    return ConfigError(
        f"could not load hub dataset {what}: {first_line(err)}. Offline (no network, or "
        "HF_HUB_OFFLINE=1) only datasets already in the local cache can be loaded",
        key=key,
        hint="point the path at a local .jsonl/.json/.parquet/.csv file or directory, or run once "
        "with network access to cache the dataset",
    )


def is_blank(value: Any) -> bool:
    """None or a csv/parquet NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))
