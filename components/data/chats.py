"""SFT data (``ChatDataset``): conversations, alpaca, prompt/completion and raw text rows as messages, with
the length policy and what each row trains."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, Range, knob
from hydratune.components.config.registry import component
from hydratune.components.data import images as image_rows
from hydratune.components.data.formats import (
    alpaca_history,
    last_answer,
    parse_messages,
    parse_tools,
    text_of,
    turn_text,
)
from hydratune.components.data.readers import Table
from hydratune.components.data.rows import (
    CHAT_TOOLS_COLUMN,
    COMPLETION_FORMATS,
    FORMAT_COLUMNS,
    FORMATS,
    MAX_LENGTH,
    MAX_LENGTH_HINT,
    ON_OVERLONG,
    PACKING_STRATEGIES,
    SIGNATURES,
    LoadedData,
    LoadReport,
    Messages,
    Pair,
    Row,
    add_count,
    scratch_workers,
)
from hydratune.components.data.source import Source
from hydratune.components.data.tables import first_rows, note_unanswered, pick, token_lengths
from hydratune.components.data.textcorpus import TEXT_UNITS
from hydratune.components.distributed.workers import Workers

if TYPE_CHECKING:
    from datasets import Dataset


#: what the conversion of chat rows counts (``LoadReport.flags``): conversations that end after their last
#: assistant turn (named in the summary), and what the chat template checks look for (a leading system
#: turn, tool calls, tool schemas)
def _unanswered(row: Row) -> bool:
    return row["messages"][-1]["role"] != "assistant"


def _system(row: Row) -> bool:
    return row["messages"][0]["role"] == "system"


def _tool_calls(row: Row) -> bool:
    return any(m.get("tool_calls") for m in row["messages"])


def _tools(row: Row) -> bool:
    return bool(row.get(CHAT_TOOLS_COLUMN))


def _reasoning_turns(row: Row) -> bool:
    return any(m.get("reasoning_content") for m in row["messages"])


def _untrained_turns(row: Row) -> bool:
    return any(m.get("train") is False for m in row["messages"])


CHAT_FLAGS: dict[str, Callable[[Row], bool]] = {
    "unanswered": _unanswered,
    "system": _system,
    "tool_calls": _tool_calls,
    "tools": _tools,
    "reasoning": _reasoning_turns,
    "untrained turns": _untrained_turns,
}


def text_row(row: Row) -> Row:
    """A language-modelling row: its ``text``."""
    return {"text": text_of(row, "text")}


@component("data")
@dataclass(frozen=True)
class ChatDataset(Source):
    """SFT data: chat ``messages``, ShareGPT ``conversations``, alpaca, prompt/completion or raw ``text``,
    loaded as ``messages`` + ``answer`` (conversational) or ``text`` (language modelling)."""

    CANONICAL: ClassVar[tuple[str, ...]] = (
        *("messages", "conversations", "instruction", "input", "output", "prompt", "completion", "text"),
        "history",  # alpaca's earlier [question, answer] pairs (LLaMA-Factory's alpaca shape)
        "system",
        "tools",  # CHAT_TOOLS_COLUMN: the tool schemas a row's conversation may call
    )
    kind: ClassVar[str] = "chat"
    reads_images: ClassVar[bool] = True

    format: str = "auto"  # auto | messages | sharegpt | alpaca | prompt_completion | text
    system_prompt: str | None = None  # prepended as a system turn to rows that have none
    # a chat template without a system role (Gemma): true folds the system turn into the first user turn,
    # false refuses such rows before load
    fold_system: bool = True
    # assistant turns' reasoning (reasoning_content, reasoning or thinking) goes to the chat template as
    # reasoning_content (a template that does not render it is refused before load); false drops it and
    # counts the rows ("message keys ignored")
    keep_reasoning: bool = True
    max_length: int = knob(1024, MAX_LENGTH, hint=MAX_LENGTH_HINT)  # tokens per example (see on_overlong)
    on_overlong: str = "truncate"  # truncate | drop | error: rows longer than max_length tokens
    # the share of the train split's tokens to train that truncation at max_length must keep, else the run
    # is refused before load (0: train on whatever is left)
    min_trained_fraction: float = knob(0.5, Range(0, 1))
    packing: bool = False
    packing_strategy: str = "bfd"  # bfd (best-fit, boundary-safe) | bfd_split | wrapped
    # each micro-batch flattened into one row (position_ids restart per example): no pad tokens, same
    # examples per step; ignored with packing (bfd packing is padding-free already)
    padding_free: bool = True
    # data.streaming: examples taken from the stream together, shuffled together (stream_shuffle, seeded by
    # data.seed) and packed together (data.packing); a resume prepares at most one such window again
    stream_window: int = knob(1000, AT_LEAST_ONE)
    stream_shuffle: bool = True
    # a .txt file's documents: paragraph (blank-line-separated blocks) | line (each non-blank line) | file
    text_unit: str = "paragraph"

    def validate(self) -> None:
        super().validate()
        if self.format not in FORMATS:
            raise ConfigError(f"unknown format '{self.format}'", key="data.format", hint=f"one of {FORMATS}")
        if self.packing_strategy not in PACKING_STRATEGIES:
            raise ConfigError(
                f"unknown '{self.packing_strategy}'",
                key="data.packing_strategy",
                hint=f"one of {PACKING_STRATEGIES}",
            )
        if self.text_unit not in TEXT_UNITS:
            raise ConfigError(
                f"unknown '{self.text_unit}'", key="data.text_unit", hint=f"one of {', '.join(TEXT_UNITS)}"
            )
        if self.on_overlong not in ON_OVERLONG:
            raise ConfigError(
                f"unknown '{self.on_overlong}'", key="data.on_overlong", hint=f"one of {ON_OVERLONG}"
            )

    def formats_hint(self) -> str:
        accepted = "; ".join(f"{name}: {' + '.join(cols)}" for name, cols in SIGNATURES.items())
        return (
            f"formats accepted: {accepted}. Set data.format, or map your columns, e.g. "
            "data.columns='{messages: conversations}' or data.columns='{prompt: question, completion: reply}'"
        )

    def detect(self, columns: list[str], path: str, report: LoadReport) -> str:
        """``format``, or (``auto``) the one format whose columns the file has."""
        if self.format != "auto":
            report.info["format"] = self.format
            return self.format
        found = [name for name, needed in SIGNATURES.items() if all(c in columns for c in needed)]
        if len(found) == 1:
            report.info["format"] = f"{found[0]} (detected)"
            return found[0]
        accepted = "; ".join(f"{name}: {' + '.join(cols)}" for name, cols in SIGNATURES.items())
        problem = f"is ambiguous: it fits formats {', '.join(found)}" if found else "matches no format"
        raise ConfigError(
            f"{path} {problem} (columns: {', '.join(columns)}; formats accepted: {accepted})",
            key="data.format",
            hint="set data.format, or map your columns, e.g. data.columns='{messages: conversations}' "
            "or data.columns='{prompt: question, completion: reply}'",
        )

    def turn_options(self) -> dict[str, Any]:
        """Chat turns carry per-turn training flags and reasoning (``parse_turn``)."""
        return {"flags": True, "reasoning": self.keep_reasoning}

    def reads_task_columns(self, columns: list[str]) -> set[str]:
        """``tools``, beside chat messages (``messages`` or ShareGPT ``conversations``); ``images`` /
        ``image`` with data.images."""
        found = {"tools"} if {"messages", "conversations"} & set(columns) else set()
        return found | (set(image_rows.IMAGE_COLUMNS) if self.images else set())

    def load(self, workers: Workers | None = None) -> LoadedData:
        """Train/eval in the canonical shape: ``messages`` + ``answer``, or ``text``. The format is detected
        on data.path and applied to data.eval_path too. ``workers``: where the Arrow shards go and how many
        processes write them (default: one, in a temporary dir)."""
        workers = workers or scratch_workers()
        fmt: str | None = None
        tools: bool | None = None  # decided on data.path, so both splits have the same columns
        report = LoadReport()

        def build(tables: list[Table], path: str, key: str) -> Dataset:
            nonlocal fmt, tools
            fmt = fmt or self.detect(tables[0].columns, path, report)
            if tools is None:
                tools = any(CHAT_TOOLS_COLUMN in t.columns for t in tables)
            return self.convert_chat(tables, fmt, tools, key, report, workers)

        return self.load_splits(build, report, workers)

    def convert_chat(
        self, tables: list[Table], fmt: str, tools: bool, key: str, report: LoadReport, workers: Workers
    ) -> Dataset:
        """``tables`` as canonical rows of format ``fmt`` (:meth:`converter`); conversations are counted by
        ``CHAT_FLAGS``, those that end after their last assistant turn named in ``report``."""
        convert_row, columns, used = self.converter(tables, fmt, tools)
        if fmt == "text":
            return self.convert(tables, convert_row, columns, key, report, workers, used)[0]
        table, done = self.convert(tables, convert_row, columns, key, report, workers, used, CHAT_FLAGS)
        if done.images.rows and self.packing:  # the hook the model phase (issue 36) may lift
            raise ConfigError(
                f"{done.images.rows:,} rows of {key} have images, and data.packing=true: packing joins rows "
                "tokenized before training, while image rows are tokenized batch by batch by the model's "
                "processor, each image's tokens expanded beside its pixels; packed, a row's image tokens "
                "would lose their pixels, and keeping packed documents apart needs varlen attention, which "
                "the vision-language models' attention paths here do not take (TRL refuses packing and "
                "padding-free batches for vision datasets too)",
                key="data.packing",
                hint="data.packing=false",
            )
        note_unanswered(done, key, report)
        untrained = done.flags.get("untrained turns", 0)
        if untrained:
            name = f"rows with assistant turns flagged not to train ({key})"
            report.info[name] = (
                f"{untrained} (weight 0 / training false: kept as context, not trained; the first: "
                f"{done.firsts['untrained turns']})"
            )
        return table

    def converter(
        self, tables: list[Table], fmt: str, tools: bool
    ) -> tuple[Callable[..., Row], tuple[str, ...], tuple[str, ...]]:
        """(row -> canonical row, its columns, the columns it reads) for rows of format ``fmt`` (``tables``
        must have its columns; ``tools``: the rows carry tool schemas)."""
        self.require(tables, SIGNATURES[fmt], f"needed by format={fmt}")
        used = FORMAT_COLUMNS[fmt]
        if fmt == "text":
            return text_row, ("text",), used
        columns = ("messages", "answer", *(("completion_turns",) if fmt in COMPLETION_FORMATS else ()))
        columns += (CHAT_TOOLS_COLUMN,) if tools else ()
        if self.images:
            columns += (image_rows.IMAGES_COLUMN,)
            used += image_rows.IMAGE_COLUMNS
        return functools.partial(self.to_chat, fmt=fmt, tools=tools), columns, used

    def to_chat(
        self, row: Row, fmt: str, *, tools: bool = False, images: image_rows.RowImages | None = None
    ) -> Row:
        """One row of format ``fmt`` as ``{"messages": [...], "answer": str}``, plus ``completion_turns``
        (the number of last turns that are the completion) for prompt/completion formats and ``tools`` (JSON
        text of the row's tool schemas, or None) when the data has them. A ``system`` column, else
        ``system_prompt``, becomes a leading system turn unless the messages already start with one.
        ``images`` (data.images: this row's ``RowImages``, made by ``convert_range``): the ``images``
        column, the row's images checked (components/data/images.py); None: text rows."""
        completion: Messages = []
        if fmt in ("messages", "sharegpt"):
            column = SIGNATURES[fmt][0]
            options = self.turn_options()
            messages = parse_messages(row.get(column), column, self.roles, images=images, **options)
        elif fmt == "alpaca":
            user = text_of(row, "instruction")
            extra = text_of(row, "input", required=False)
            answer = [{"role": "assistant", "content": text_of(row, "output")}]
            history = alpaca_history(row.get("history"))
            messages = [
                *history,
                {"role": "user", "content": f"{user}\n\n{extra}" if extra.strip() else user},
            ]
            messages += answer
            # with history, every answer trains (as LLaMA-Factory trains them): the completion is every turn
            # after the first question
            completion = messages[1:] if history else answer
        else:
            completion = self.messages(row.get("completion"), "assistant", "completion", images)
            messages = self.messages(row.get("prompt"), "user", "prompt", images) + completion
        system = text_of(row, "system", required=False) or self.system_prompt
        if system and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": system}, *messages]
        found = None
        if images is not None:
            if fmt == "alpaca":  # the text columns' <image> placeholders (the other formats' are parsed)
                for turn in messages:
                    turn["content"] = images.content_parts(turn["content"], 0, "instruction")
            found = images.finish(row, {"messages": messages})
        out: Row = {"messages": messages, "answer": turn_text(messages[last_answer(messages)])}
        if found is not None:
            out[image_rows.IMAGES_COLUMN] = found
        if fmt in COMPLETION_FORMATS:
            out["completion_turns"] = len(completion)
        if tools:
            out[CHAT_TOOLS_COLUMN] = parse_tools(row.get(CHAT_TOOLS_COLUMN))
        return out

    def enforce_length(self, data: LoadedData, tokenizer: Any, workers: Workers | None = None) -> LoadedData:
        """Apply ``on_overlong`` to rows longer than ``max_length`` tokens (``truncate`` leaves them to the
        trainer, which cuts them; ``drop`` removes and counts them; ``error`` names the first). The rows are
        measured in batches by ``workers``."""
        import numpy as np

        if self.on_overlong == "truncate":
            return data
        if image_rows.IMAGES_COLUMN in data["train"].column_names:
            raise ConfigError(
                f"data.on_overlong={self.on_overlong} measures rows with the tokenizer, and these rows have "
                "images, whose tokens only the model's processor counts",
                key="data.on_overlong",
                hint="data.on_overlong=truncate (the trainer cuts rows at data.max_length)",
            )
        workers = workers or scratch_workers()
        out = {}
        for name, table in data.items():
            lengths = token_lengths(table, tokenizer, workers, f"measuring {name} rows")
            long = np.flatnonzero(lengths > self.max_length)
            if long.size and self.on_overlong == "error":
                first = int(long[0])
                raise ConfigError(
                    f"{self.path} ({name}): row {first} has {lengths[first]} tokens > data.max_length="
                    f"{self.max_length} ({long.size} such rows)",
                    key="data.max_length",
                    hint="raise data.max_length, or set data.on_overlong=truncate or drop",
                )
            if long.size:
                add_count(data.stats, "dropped (too long)", int(long.size))
            out[name] = pick(table, np.flatnonzero(lengths <= self.max_length)) if long.size else table
        return self._finish(out, data.report)

    def prompt_limit(self) -> tuple[int, str, str]:
        return self.max_length, "data.max_length", self.on_overlong

    def pairs(self, data: LoadedData, split: str, limit: int | None = None) -> list[Pair] | None:
        """(the conversation before the last assistant turn with content, that turn's content) per row of
        ``split`` (its first ``limit``); None for raw-text data."""
        if "messages" not in data[split].column_names:
            return None
        out: list[Pair] = []
        for messages in first_rows(data[split], limit)["messages"]:
            last = last_answer(messages)
            out.append((messages[:last], turn_text(messages[last])))
        return out
