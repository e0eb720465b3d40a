"""The Arrow tables rows are kept in: their features (message lists as JSON turns where a turn carries more
keys), conversion of a range of rows, picking and measuring rows."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydratune.components.data import images as image_rows
from hydratune.components.data.formats import TURN_NOTES
from hydratune.components.data.readers import RowError, Table, row_error
from hydratune.components.data.rows import CHAT_TOOLS_COLUMN, LoadReport, Row
from hydratune.components.distributed.workers import SHARD_ROWS, Workers, ranges

if TYPE_CHECKING:
    from datasets import Dataset


#: the columns of converted rows that hold message lists; each is an Arrow list of {role, content} structs,
#: or, where a turn carries more keys (tool calls), of turns stored as JSON, so each reads back with exactly
#: its own keys (a struct would give every turn every key, ``None`` where absent, which templates such as
#: ``'tool_calls' in message`` misread, and would merge the argument keys of different tool calls)
MESSAGE_COLUMNS = ("messages", "prompt", "chosen", "rejected", "completion")
SCALAR_TYPES = {"completion_turns": "int64", "label": "bool"}  # the others are text
PLAIN_TURN = frozenset(("role", "content"))


def row_features(columns: tuple[str, ...], json_turns: bool = False) -> Any:
    """The Arrow types of converted rows with ``columns`` (message lists as JSON turns, or as structs)."""
    from datasets import Features, Json, List, Value

    turn = Json() if json_turns else {"role": Value("string"), "content": Value("string")}
    return Features(
        {
            c: List(turn)
            if c in MESSAGE_COLUMNS
            else image_rows.image_feature()
            if c == image_rows.IMAGES_COLUMN
            else Value(SCALAR_TYPES.get(c, "string"))
            for c in columns
        }
    )


def plain_turns(rows: list[Row], columns: tuple[str, ...]) -> bool:
    """Whether every turn of every message list in ``rows`` is exactly ``{role, content}``, content text
    (content parts, an image row's, are kept as JSON turns)."""
    lists = [c for c in columns if c in MESSAGE_COLUMNS]
    return all(
        turn.keys() == PLAIN_TURN and isinstance(turn["content"], str)
        for row in rows
        for c in lists
        for turn in row[c]
    )


def empty_rows(columns: tuple[str, ...]) -> Dataset:
    from datasets import Dataset

    return Dataset.from_dict({c: [] for c in columns}, features=row_features(columns))


def with_json_turns(tables: list[Dataset]) -> list[Dataset]:
    """``tables`` with the same types: where any stores its turns as JSON, the others cast to it."""
    json_features = next((t.features for t in tables if stores_json_turns(t)), None)
    if json_features is None:
        return tables
    return [t if stores_json_turns(t) else t.cast(json_features) for t in tables]


def stores_json_turns(table: Dataset) -> bool:
    from datasets import Json

    lists = [f for name, f in table.features.items() if name in MESSAGE_COLUMNS]
    return any(isinstance(getattr(f, "feature", None), Json) for f in lists)


@dataclass
class Converted:
    """What converting one range of rows wrote (``paths``: Arrow shards, in order; a range whose turns
    turned out to need JSON after a first part went out as structs has two) and met: rows skipped
    (``data.on_error=skip``) and rows flagged, each with where the first one came from."""

    paths: list[Path] = field(default_factory=list)
    rows: int = 0
    skipped: int = 0
    first_skip: str | None = None
    flags: dict[str, int] = field(default_factory=dict)
    firsts: dict[str, str] = field(default_factory=dict)
    keys: dict[str, int] = field(default_factory=dict)  # message keys not used -> rows (``TURN_NOTES``)
    images: image_rows.ImageCounts = field(default_factory=image_rows.ImageCounts)  # data.images

    def merge(self, other: Converted) -> None:
        """Add ``other``, a later range (its first rows come after these)."""
        self.paths += other.paths
        self.rows += other.rows
        self.skipped += other.skipped
        self.first_skip = self.first_skip or other.first_skip
        for name, n in other.flags.items():
            self.flags[name] = self.flags.get(name, 0) + n
            self.firsts.setdefault(name, other.firsts[name])
        for key, n in other.keys.items():
            self.keys[key] = self.keys.get(key, 0) + n
        self.images.merge(other.images)


def convert_one(
    fn: Callable[..., Row], row: Row, images: image_rows.TableImages | None
) -> tuple[Row, image_rows.RowImages | None]:
    """``fn(row)``; image rows (``images``, the table's): ``fn(row, images=...)`` with a fresh
    ``RowImages`` for this row, returned with the converted row (nothing outlives the row)."""
    if images is None:
        return fn(row), None
    seen = images.row()
    return fn(row, images=seen), seen


def convert_range(
    table: Table,
    span: tuple[int, int],
    fn: Callable[..., Row],
    columns: tuple[str, ...],
    path: Path,
    key: str,
    skip: bool,
    flags: Mapping[str, Callable[[Row], bool]],
    tick: Callable[[int], None],
    images: image_rows.TableImages | None = None,
) -> Converted:
    """Rows ``span`` of ``table`` through ``fn`` into Arrow shards (``path``, a batch at a time). A
    ``RowError`` names the file and line/row (``skip``: the row is dropped and counted). ``images`` (image
    rows: data.images): the table's folder and data.image_max_pixels; each row converted with its own
    ``RowImages`` (``convert_one``), its images counted."""
    from datasets.arrow_writer import ArrowWriter

    out, batch = Converted(), []
    writer: Any = None
    json_turns = False

    def close() -> None:
        if writer is not None:
            writer.finalize()
            writer.close()

    def flush() -> None:
        nonlocal writer, batch, json_turns
        if not json_turns and not plain_turns(batch, columns):  # from here on, turns as JSON
            close()
            writer, json_turns = None, True
        if writer is None:
            name = path.with_name(f"{path.stem}-{len(out.paths)}.arrow")
            writer = ArrowWriter(features=row_features(columns, json_turns), path=str(name))
            out.paths.append(name)
        writer.write_batch({c: [row[c] for row in batch] for c in columns})
        tick(len(batch))
        out.rows += len(batch)
        batch = []

    for index, line, row in table.read(*span):
        TURN_NOTES.clear()
        try:
            converted, seen = convert_one(fn, row, images)
        except RowError as err:
            where = table.where(index, line)
            if not skip:
                raise row_error(where, err, key) from None
            out.skipped += 1
            out.first_skip = out.first_skip or f"{where}: {err}"
            continue
        for key in dict.fromkeys(TURN_NOTES):
            out.keys[key] = out.keys.get(key, 0) + 1
        if seen is not None:
            out.images.add_row(seen)
        for name, test in flags.items():
            if test(converted):
                out.flags[name] = out.flags.get(name, 0) + 1
                out.firsts.setdefault(name, table.where(index, line))
        batch.append(converted)
        if len(batch) == SHARD_ROWS:
            flush()
    if batch:
        flush()
    close()
    return out


def prepared(table: Table, fn: Callable[..., Row]) -> Callable[..., Row]:
    """``fn`` after the table's own row conversion (``Table.prepare``), when it has one (``fn``'s keyword
    arguments, a row's ``images``, passed on to it)."""
    return fn if table.prepare is None else functools.partial(_then, table.prepare, fn)


def _then(first: Callable[[Row], Row], then: Callable[..., Row], row: Row, **more: Any) -> Row:
    return then(first(row), **more)


def note_unanswered(converted: Converted, key: str, report: LoadReport) -> None:
    """Count the conversations whose last turn is not the assistant's (that turn is not trained) and name
    the first, in the load's report (the summary and ``mode=plan`` show it)."""
    n = converted.flags.get("unanswered", 0)
    if n:
        name = f"conversations ending after the last assistant turn ({key})"
        first = converted.firsts["unanswered"]
        report.info[name] = f"{n} (the turns after it are not trained; the first: {first})"


def first_rows(table: Dataset, limit: int | None) -> Dataset:
    """The first ``limit`` rows of ``table`` (all: None)."""
    return table if limit is None or limit >= len(table) else pick(table, range(limit))


def pick(table: Dataset, indices: Any) -> Dataset:
    """``table``'s rows at ``indices`` (an index mapping kept in memory, 8 bytes a row: nothing is copied
    or written next to the memory-mapped files)."""
    return table.select(indices, keep_in_memory=True)


def token_lengths(table: Dataset, tokenizer: Any, workers: Workers, label: str) -> Any:
    """Every row's token count (numpy), as ``apply_chat_template`` (conversations, with the row's tools)
    or the tokenizer (text) gives it, measured a batch at a time by ``workers``."""
    import numpy as np

    spans = ranges(len(table), 4 * workers.num_proc)
    tasks = [functools.partial(_measure, table, tokenizer, span) for span in spans]
    return np.concatenate([np.zeros(0, dtype=np.int64), *workers.run(tasks, label, len(table))])


def _measure(table: Dataset, tokenizer: Any, span: tuple[int, int], tick: Callable[[int], None]) -> Any:
    """One task of ``token_lengths``: the token counts of rows ``span``."""
    import numpy as np

    out: list[int] = []
    for a in range(span[0], span[1], SHARD_ROWS):
        batch = table[a : min(a + SHARD_ROWS, span[1])]
        out += batch_lengths(tokenizer, batch)
        tick(len(batch[table.column_names[0]]))
    return np.asarray(out, dtype=np.int64)


def batch_lengths(tokenizer: Any, batch: dict[str, list[Any]]) -> list[int]:
    """The token count of each row of a batch (columns -> values)."""
    if "messages" not in batch:
        return [len(ids) for ids in tokenizer(batch["text"])["input_ids"]]
    tools = batch.get(CHAT_TOOLS_COLUMN) or [None] * len(batch["messages"])
    texts = [
        tokenizer.apply_chat_template(m, tools=json.loads(t) if t else None, tokenize=False)
        for m, t in zip(batch["messages"], tools, strict=True)
    ]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
