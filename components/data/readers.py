"""Reading data files as rows, never all at once: each file (or hub split) is a :class:`Table` whose rows
are read in ranges, by worker processes when there are several (``components/distributed/workers.py``).

- JSON lines are scanned first (every line parsed: a bad line is named with its line number, or skipped
  and counted with ``data.on_error=skip``; the columns of every row are collected) in byte ranges, then
  read again range by range by the conversion, which writes Arrow shards. Nothing holds the file's rows.
  A ``.json`` file holding one document (an array, ``{"data": [...]}``) has to be parsed whole. Both:
  ``json_files.py``.
- csv, parquet, ``.arrow`` files, save_to_disk folders and hub splits are Arrow tables already
  (``datasets``), memory-mapped and read in slices: here.

A file's bytes come first (``file_bytes.py``: its type by name, decompressed, a byte order mark skipped).

A table applies ``data.ignore_columns`` and ``data.columns`` to every row it yields, and knows where each
row came from (``file:line (row n)`` for JSON lines, ``file, row n`` otherwise) for error messages.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.file_bytes import (
    BLOCK,
    BUILDERS,
    CSV_DELIMITERS,
    bom_length,
    csv_delimiter,
    data_suffix,
    decompressed,
    first_line,
    not_utf8,
)
from hydratune.components.distributed.workers import SHARD_ROWS, Workers, ranges

if TYPE_CHECKING:
    from datasets import Dataset

Row = dict[str, Any]

PROBE_ROWS = 5  # when this many first rows (or all, if fewer) fail alike, the format or mapping is wrong


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
    read in slices; ``crlf``: a csv written with CRLF line ends, whose in-field line breaks become ``\\n``;
    ``delimiter``: a csv's field delimiter (None: not a csv)."""

    dataset: Any = None
    crlf: bool = False
    delimiter: str | None = None

    def _raw(self, start: int, stop: int) -> Iterator[tuple[int, int | None, Row]]:
        names = self.dataset.column_names
        for a in range(start, stop, SHARD_ROWS):
            batch = self.dataset[a : min(a + SHARD_ROWS, stop)]
            for i, values in enumerate(zip(*(batch[c] for c in names), strict=True)):
                row = dict(zip(names, values, strict=True))
                if self.crlf:
                    row = {k: v.replace("\r\n", "\n") if isinstance(v, str) else v for k, v in row.items()}
                yield a + i, None, row


# ------------------------------------------------------------------------------ csv, parquet, Arrow, hub


def csv_check(path: Path, source: str, key: str, workers: Workers) -> tuple[bool, bool, str]:
    """A csv (or tsv) file's text checked a block at a time: UTF-8 (a bad byte named with its line), and
    whether it has CRLF line ends; returns ``(crlf, empty, its delimiter)`` (``csv_delimiter`` on the first
    block)."""
    plain = decompressed(path, key, workers)
    crlf, empty, line, pending, tail, delimiter = False, True, 1, b"", b"", None
    with open(plain, "rb") as f:
        f.read(bom_length(plain, source, key))
        while True:
            block = f.read(BLOCK)
            delimiter = delimiter or csv_delimiter(block[: 1 << 16], data_suffix(path))
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
                return crlf, empty, delimiter


def read_table(path: Path, *, key: str, workers: Workers, limit: int | None = None) -> Table:
    """A ``.csv`` / ``.tsv`` (or compressed ``.csv.gz``...) or ``.parquet`` file through
    ``datasets.load_dataset`` (a csv's UTF-8 is checked first, so a bad byte is reported with its line; its
    delimiter found by ``csv_delimiter``). Quoted csv fields may span lines; a BOM is skipped, and in a file
    with CRLF line ends the line breaks inside fields become ``\\n`` too."""
    import datasets

    source, crlf, suffix = str(path), False, data_suffix(path)
    options: dict[str, Any] = {}
    if BUILDERS[suffix] == "csv":
        crlf, empty, options["delimiter"] = csv_check(path, source, key, workers)
        if empty:
            return ListTable(source, [], 0)
    try:
        table = datasets.load_dataset(BUILDERS[suffix], data_files=[str(path)], split="train", **options)
    except Exception as err:
        errors = chain(err)
        if "corresponds to no data" in str(err) or any(type(e).__name__ == "EmptyDataError" for e in errors):
            return ListTable(source, [], 0)
        raise ConfigError(
            f"cannot read {path}: {first_line(errors[-1])}",
            key=key,
            hint=f"check that it is a valid {suffix[1:]} file",
        ) from None
    return arrow_table(source, table, limit, crlf=crlf, delimiter=options.get("delimiter"))


def arrow_table(
    source: str, dataset: Dataset, limit: int | None, crlf: bool = False, delimiter: str | None = None
) -> ArrowTable:
    dataset = undecoded_images(dataset)
    rows = len(dataset) if limit is None else min(limit, len(dataset))
    return ArrowTable(
        source, list(dataset.column_names), rows, dataset=dataset, crlf=crlf, delimiter=delimiter
    )


def delimiter_note(tables: list[Table]) -> dict[str, str]:
    """The summary's line for csv files read with another delimiter than a comma (found, or ``.tsv``)."""
    found = {
        Path(t.source).name: CSV_DELIMITERS[t.delimiter]
        for t in tables
        if isinstance(t, ArrowTable) and t.delimiter not in (None, ",")
    }
    if not found:
        return {}
    names = ", ".join(f"{name} ({what})" for name, what in found.items())
    return {"csv delimiter": f"{names}: not a comma (a .csv's found by csv.Sniffer, a .tsv's is a tab)"}


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
