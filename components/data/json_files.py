"""JSON files as tables: a ``.jsonl`` file (or a ``.json`` one holding JSON lines) scanned in parallel byte
ranges, every line parsed once (a bad line named with its number, or skipped and counted), then read back
range by range; a ``.json`` file holding one document parsed whole."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.file_bytes import BLOCK, bom_length, data_suffix, decompressed, not_utf8
from hydratune.components.data.readers import PROBE_ROWS, ListTable, Row, Table
from hydratune.components.distributed.workers import Workers

MIN_RANGE = 1 << 20  # the smallest byte range a scan task reads


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
