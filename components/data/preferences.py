"""Preference data: pairs for reward and DPO (``PreferenceDataset``: explicit, implicit, HH) and KTO's
unpaired feedback (``UnpairedPreferenceDataset``)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import knob
from hydratune.components.config.registry import component
from hydratune.components.data import images as image_rows
from hydratune.components.data.formats import (
    as_messages,
    hh_messages,
    json_turns,
    parse_messages,
    split_shared,
)
from hydratune.components.data.readers import RowError, Table
from hydratune.components.data.rows import (
    MAX_LENGTH,
    MAX_LENGTH_HINT,
    PREFERENCE_FORMATS,
    PREFERENCE_SIGNATURES,
    LoadedData,
    LoadReport,
    Row,
    add_count,
    scratch_workers,
)
from hydratune.components.data.source import Source
from hydratune.components.data.tables import Converted, pick
from hydratune.components.distributed.workers import SHARD_ROWS, Workers

if TYPE_CHECKING:
    from datasets import Dataset


@component("data")
@dataclass(frozen=True)
class PreferenceDataset(Source):
    """Preference pairs for reward modelling and DPO, loaded as ``prompt``, ``chosen``, ``rejected`` message
    lists. ``explicit``: a prompt column and the two responses (text becomes one user / assistant message).
    ``implicit`` (UltraFeedback): ``chosen`` and ``rejected`` are whole conversations that start with the
    same turns; those turns are the prompt and the rest the responses, so no token is in both (a ``prompt``
    column is then not used). ``hh`` (Anthropic HH-RLHF): the same, from ``"\\n\\nHuman: ...
    \\n\\nAssistant: ..."`` transcripts."""

    CANONICAL: ClassVar[tuple[str, ...]] = ("prompt", "chosen", "rejected")
    kind: ClassVar[str] = "preference"
    reads_images: ClassVar[bool] = True

    format: str = "auto"  # auto | explicit | implicit (shared leading turns) | hh (Human:/Assistant: text)
    max_length: int = knob(1024, MAX_LENGTH, hint=MAX_LENGTH_HINT)  # tokens of prompt + response

    def prompt_limit(self) -> tuple[int, str, str]:
        return self.max_length, "data.max_length", "truncate"

    def reads_task_columns(self, columns: list[str]) -> set[str]:
        """The pair's columns; ``images`` / ``image`` with data.images."""
        return set(self.CANONICAL) | (set(image_rows.IMAGE_COLUMNS) if self.images else set())

    def validate(self) -> None:
        super().validate()
        if self.format not in PREFERENCE_FORMATS:
            raise ConfigError(
                f"unknown format '{self.format}'", key="data.format", hint=f"one of {PREFERENCE_FORMATS}"
            )

    def formats_hint(self) -> str:
        accepted = "; ".join(f"{name}: {what}" for name, what in PREFERENCE_SIGNATURES.items())
        return (
            f"formats accepted: {accepted}. Set data.format, or map your columns, e.g. "
            "data.columns='{prompt: question, chosen: good, rejected: bad}'"
        )

    def detect(self, row: Row, report: LoadReport) -> str:
        """``format``, or (``auto``) what the first row of data.path holds: HH transcripts, conversations
        that start with a non-assistant turn (implicit), else responses to a prompt column (explicit)."""
        if self.format != "auto":
            report.info["format"] = self.format
            return self.format
        chosen, fmt = row.get("chosen"), "explicit"
        if isinstance(chosen, str) and re.match(r"\s*Human:", chosen) and "\n\nAssistant:" in chosen:
            fmt = "hh"
        elif (turns := json_turns(chosen)) is not None:
            try:
                first = parse_messages(turns, "chosen", self.roles)[0]["role"]
            except RowError:
                first = "assistant"  # explicit's conversion names the problem
            fmt = "explicit" if first == "assistant" else "implicit"
        report.info["format"] = f"{fmt} (detected)"
        return fmt

    def to_pair(self, row: Row, fmt: str, images: image_rows.RowImages | None = None) -> Row:
        """One row of format ``fmt`` as ``prompt``/``chosen``/``rejected`` message lists. ``images``
        (data.images: this row's ``RowImages``; explicit pairs): the prompt's images (``images``, checked),
        as TRL's DPO collator reads them; the responses are text."""
        if fmt == "explicit":
            prompt = as_messages(row.get("prompt"), "user", "prompt", self.roles, images=images)
            out = {
                "prompt": prompt,
                "chosen": self.messages(row.get("chosen"), "assistant", "chosen"),
                "rejected": self.messages(row.get("rejected"), "assistant", "rejected"),
            }
            if images is not None:
                out[image_rows.IMAGES_COLUMN] = images.finish(row, {"prompt": prompt})
            return out
        if self.images:
            raise RowError(
                "data.images reads the images of explicit pairs (prompt with images, text chosen / "
                f"rejected); this file's pairs are {fmt}",
                key="data.format",
                hint="write the pairs as prompt / chosen / rejected columns (data.format=explicit), or "
                "data.images=false",
            )
        if fmt == "hh":
            return split_shared(
                hh_messages(row.get("chosen"), "chosen"), hh_messages(row.get("rejected"), "rejected")
            )
        return split_shared(
            self.messages(row.get("chosen"), "assistant", "chosen"),
            self.messages(row.get("rejected"), "assistant", "rejected"),
        )

    def load(self, workers: Workers | None = None) -> LoadedData:
        """Train/eval with ``prompt``, ``chosen`` and ``rejected``, each a list of messages. The format is
        detected on data.path and applied to data.eval_path too."""
        workers = workers or scratch_workers()
        fmt: str | None = None
        report = LoadReport()

        def build(tables: list[Table], path: str, key: str) -> Dataset:
            nonlocal fmt
            if fmt is None and tables[0].shape:
                report.info["format"] = f"{tables[0].shape} (dataset_info.json)"
            kind = fmt = fmt or tables[0].shape or self.detect(tables[0].head(1)[0], report)
            needed = self.CANONICAL if kind == "explicit" else self.CANONICAL[1:]
            self.require(tables, needed, f"of a preference pair (format={kind})")
            pair = functools.partial(self.to_pair, fmt=kind)
            flags = {"identical": identical_pair}
            columns, used = self.CANONICAL, needed
            if self.images:
                columns, used = (*columns, image_rows.IMAGES_COLUMN), (*used, *image_rows.IMAGE_COLUMNS)
            table, done = self.convert(tables, pair, columns, key, report, workers, used, flags)
            return drop_identical(table, done, key, self.on_error, report)

        return self.load_splits(build, report, workers)


def identical_pair(row: Row) -> bool:
    """A pair whose chosen and rejected responses are the same turns: nothing to prefer."""
    return bool(row["chosen"] == row["rejected"])


def drop_identical(table: Dataset, done: Converted, key: str, on_error: str, report: LoadReport) -> Dataset:
    """Pairs with identical chosen and rejected (``identical_pair``, counted by the conversion) refused,
    naming how many and the first; ``on_error=skip``: dropped and counted."""
    n = done.flags.get("identical", 0)
    if not n:
        return table
    first = done.firsts["identical"]
    if on_error != "skip":
        raise ConfigError(
            f"{n} of {done.rows} pairs {'has' if n == 1 else 'have'} the same 'chosen' and 'rejected' "
            f"response (nothing to prefer; the first: {first})",
            key=key,
            hint="drop those rows, or set data.on_error=skip to drop them and count them",
        )
    keep, pairs = [], table.select_columns(["chosen", "rejected"])
    for a in range(0, len(pairs), SHARD_ROWS):
        batch = pairs[a : a + SHARD_ROWS]
        same = [c == r for c, r in zip(batch["chosen"], batch["rejected"], strict=True)]
        keep += [a + i for i, s in enumerate(same) if not s]
    add_count(report.stats, "dropped (identical chosen/rejected)", n)
    report.info.setdefault("first identical pair dropped", f"{first} (data.on_error=skip)")
    return pick(table, keep)


@component("data")
@dataclass(frozen=True)
class UnpairedPreferenceDataset(Source):
    """Unpaired preference data for KTO: one ``completion`` to a ``prompt`` per row and its ``label``
    (``true``: desirable, ``false``: undesirable), loaded as ``prompt`` / ``completion`` message lists
    and ``label``. Text becomes one user / assistant message; message lists are taken as they are. A
    label that is not a JSON boolean is a row error (``"yes"``, ``1`` and ``null`` are refused)."""

    CANONICAL: ClassVar[tuple[str, ...]] = ("prompt", "completion", "label")
    kind: ClassVar[str] = "unpaired"

    max_length: int = knob(1024, MAX_LENGTH, hint=MAX_LENGTH_HINT)  # tokens of prompt + completion

    def prompt_limit(self) -> tuple[int, str, str]:
        return self.max_length, "data.max_length", "truncate"

    def to_row(self, row: Row) -> Row:
        """One row as ``prompt`` / ``completion`` message lists and a boolean ``label``."""
        label = row.get("label")
        if not isinstance(label, bool):
            raise RowError(
                f"column 'label' should be true or false, got {label!r} ({type(label).__name__})",
                key="data.columns",
                hint="write the label as a JSON boolean: true (desirable) or false (undesirable)",
            )
        return {
            "prompt": self.messages(row.get("prompt"), "user", "prompt"),
            "completion": self.messages(row.get("completion"), "assistant", "completion"),
            "label": label,
        }

    def load(self, workers: Workers | None = None) -> LoadedData:
        """Train/eval with ``prompt`` and ``completion`` (lists of messages) and ``label`` (bool)."""
        workers = workers or scratch_workers()
        report = LoadReport()

        def build(tables: list[Table], path: str, key: str) -> Dataset:
            self.require(tables, self.CANONICAL, "of an unpaired preference row")
            return self.convert(tables, self.to_row, self.CANONICAL, key, report, workers)[0]

        return self.load_splits(build, report, workers)
