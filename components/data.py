"""Data components: local files or hub datasets, normalised to one canonical shape per recipe family.

- ``ChatDataset`` (SFT): ``messages`` (OpenAI-style turns) or ``text`` (language modelling); alpaca and
  prompt/completion rows become user/assistant turns.
- ``PreferenceDataset`` (reward, DPO): ``prompt``/``chosen``/``rejected`` as message lists.
- ``PromptDataset`` (PPO, GRPO): ``prompt`` as a message list, plus ``answer`` when present.

Errors name the file, the line or row, and the column. ``on_error=skip`` drops bad rows instead and
counts them (``stats``, shown in the run's summary).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.errors import ConfigError
from components.registry import component

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
FORMATS = ("auto", "messages", "alpaca", "prompt_completion", "text")
SIGNATURES = {
    "messages": ("messages",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}
ON_ERROR = ("raise", "skip")
ON_OVERLONG = ("truncate", "drop", "error")
Messages = list[dict[str, str]]


def looks_local(path: str) -> bool:
    """A filesystem path rather than a hub dataset id."""
    return (
        path.startswith(("/", ".", "~"))
        or Path(path).suffix in BUILDERS
        or os.path.exists(os.path.expanduser(path))
    )


def check_path(path: str, key: str) -> None:
    """A local path must exist and have a supported suffix (directories are loaded by their files)."""
    if not looks_local(path):
        return
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(
            f"data file not found: {path}", key=key, hint="check the path (relative to the cwd)"
        )
    if p.is_file() and p.suffix not in BUILDERS:
        raise ConfigError(
            f"unsupported file type '{p.suffix}' for {path}",
            key=key,
            hint=f"use one of {', '.join(BUILDERS)}",
        )


def _count(stats: dict[str, int], key: str, n: int = 1) -> None:
    stats[key] = stats.get(key, 0) + n


def read_jsonl(
    path: Path, *, skip: bool = False, stats: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """Rows of a JSONL file. A line that is not UTF-8, not JSON or not an object is an error naming
    the file and line — or, with ``skip``, is dropped and counted in ``stats``."""
    rows = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            row = json.loads(line)
            problem = None if isinstance(row, dict) else "expected a JSON object per line"
        except UnicodeDecodeError as err:
            problem = f"not UTF-8 text (byte {err.start})"
        except json.JSONDecodeError as err:
            problem = f"malformed JSON ({err.msg})"
        if problem is None:
            rows.append(row)
        elif skip:
            _count(stats if stats is not None else {}, "skipped rows")
        else:
            raise ConfigError(
                f"{path}:{number}: {problem}",
                key="data.path",
                hint="fix the line, or set data.on_error=skip to drop bad rows and count them",
            )
    return rows


def load_table(
    path: str,
    *,
    split: str = "train",
    subset: str | None = None,
    skip: bool = False,
    stats: dict[str, int] | None = None,
) -> Dataset:
    """One table from a local file / directory or a hub dataset."""
    import datasets

    p = Path(path).expanduser()
    table = None
    try:
        if p.is_file() and p.suffix == ".jsonl":
            rows = read_jsonl(p, skip=skip, stats=stats)
            table = datasets.Dataset.from_list(rows) if rows else None
        elif looks_local(path):
            files = [str(p)] if p.is_file() else sorted(str(f) for f in p.iterdir() if f.suffix in BUILDERS)
            if not files:
                raise ConfigError(f"no {', '.join(BUILDERS)} files in {path}", key="data.path")
            table = datasets.load_dataset(BUILDERS[Path(files[0]).suffix], data_files=files, split="train")
        else:
            table = datasets.load_dataset(path, subset, split=split)
    except ConfigError:
        raise
    except UnicodeDecodeError:
        raise ConfigError(
            f"{path} is not UTF-8 text", key="data.path", hint="re-encode it as UTF-8"
        ) from None
    except (OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(
            f"cannot load dataset '{path}': {reason}",
            key="data.path",
            hint="hub datasets need network access; point data.path at a local jsonl/parquet/csv file",
        ) from None
    if table is None or len(table) == 0:
        raise ConfigError(f"{path} holds no rows", key="data.path", hint="check the file (or data.split)")
    return table


def as_messages(value: Any, role: str) -> Messages:
    """A string becomes one message of ``role``; a message list is kept as is."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return [{"role": m["role"], "content": m["content"]} for m in value]


@dataclass
class Source:
    """Where rows come from, how bad rows are handled and how train/eval are split (every data option)."""

    path: str = "???"
    eval_path: str | None = None
    split: str = "train"
    subset: str | None = None
    columns: dict[str, str] = field(default_factory=dict)  # canonical name -> the file's column name
    eval_fraction: float = 0.05
    eval_size: int = 0  # rows held out for eval; 0 = use eval_fraction
    max_samples: int | None = None  # use only the first N rows of data.path (before the eval split)
    seed: int = 42
    on_error: str = "raise"  # raise | skip: drop malformed / incomplete rows and count them

    def validate(self) -> None:
        check_path(self.path, "data.path")
        if self.eval_path:
            check_path(self.eval_path, "data.eval_path")
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"must be in [0, 1), got {self.eval_fraction}", key="data.eval_fraction")
        if self.eval_size < 0:
            raise ConfigError("must be >= 0", key="data.eval_size")
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError("must be >= 1 or null", key="data.max_samples")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"unknown '{self.on_error}'", key="data.on_error", hint=f"one of {ON_ERROR}")

    @property
    def stats(self) -> dict[str, int]:
        """What loading dropped, by reason (shown in the run's summary)."""
        return self.__dict__.setdefault("_stats", {})

    def load_raw(self) -> DatasetDict:
        """Train and eval tables with the canonical column names (``columns`` applied)."""
        from datasets import DatasetDict

        train = self._table(self.path)
        if self.max_samples:
            train = train.select(range(min(self.max_samples, len(train))))
        if self.eval_path:
            evals = self._table(self.eval_path)
        else:
            n = self.eval_size or round(len(train) * self.eval_fraction)
            if n >= len(train):
                raise ConfigError(f"eval split of {n} rows leaves no training rows", key="data.eval_fraction")
            if n:
                parts = train.train_test_split(test_size=n, seed=self.seed, shuffle=True)
                train, evals = parts["train"], parts["test"]
            else:
                evals = train.select([])
        return DatasetDict(train=train, eval=evals)

    def _table(self, path: str) -> Dataset:
        table = load_table(
            path, split=self.split, subset=self.subset, skip=self.on_error == "skip", stats=self.stats
        )
        mapping = {theirs: ours for ours, theirs in self.columns.items() if theirs != ours}
        missing = [c for c in mapping if c not in table.column_names]
        if missing:
            raise ConfigError(
                f"{path} has no column {missing[0]!r} (columns: {', '.join(table.column_names)})",
                key="data.columns",
            )
        return table.rename_columns(mapping) if mapping else table

    def keep_valid(self, table: Dataset, needed: tuple[str, ...], path: str) -> Dataset:
        """Rows whose ``needed`` columns exist and hold a non-empty value. A missing column always fails;
        an empty value fails naming row and column, or is dropped and counted with ``on_error=skip``."""
        for column in needed:
            if column not in table.column_names:
                raise ConfigError(
                    f"{path} is missing the column '{column}' (columns: {', '.join(table.column_names)})",
                    key="data.columns",
                    hint=f"map yours with data.columns='{{{column}: <your column>}}'",
                )

        def empty(value: Any) -> bool:
            return value is None or (
                isinstance(value, (str, list)) and not (value.strip() if isinstance(value, str) else value)
            )

        bad = [
            (i, c)
            for i, row in enumerate(table.select_columns(list(needed)))
            for c in needed
            if empty(row[c])
        ]
        if not bad:
            return table
        if self.on_error != "skip":
            i, column = bad[0]
            raise ConfigError(
                f"{path}: row {i} has no value in column '{column}' ({len({r for r, _ in bad})} such rows)",
                key="data.path",
                hint="fix the rows, or set data.on_error=skip to drop them and count them",
            )
        drop = {i for i, _ in bad}
        _count(self.stats, "skipped rows", len(drop))
        return table.select([i for i in range(len(table)) if i not in drop])

    def convert(self, table: Dataset, needed: tuple[str, ...], fn: Any, columns: tuple[str, ...]) -> Dataset:
        """Check ``needed`` columns, then map rows with ``fn`` to exactly ``columns`` (empty tables too)."""
        from datasets import Dataset

        table = self.keep_valid(table, needed, self.path)
        if len(table) == 0:
            return Dataset.from_dict({c: [] for c in columns})
        return table.map(fn, remove_columns=table.column_names)

    def _finish(self, splits: dict[str, Dataset]) -> DatasetDict:
        from datasets import DatasetDict

        if len(splits["train"]) == 0:
            raise ConfigError(f"no training rows left in {self.path} after filtering", key="data.path")
        return DatasetDict(splits)


@component("data")
@dataclass
class ChatDataset(Source):
    """SFT data: chat ``messages``, alpaca, prompt/completion or raw ``text``."""

    format: str = "auto"
    system_prompt: str | None = None
    max_length: int = 1024
    on_overlong: str = "truncate"  # truncate | drop | error: rows longer than max_length tokens
    packing: bool = False
    packing_strategy: str = "bfd"  # bfd (best-fit, boundary-safe) | wrapped

    def validate(self) -> None:
        super().validate()
        if self.format not in FORMATS:
            raise ConfigError(f"unknown format '{self.format}'", key="data.format", hint=f"one of {FORMATS}")
        if self.packing_strategy not in ("bfd", "wrapped"):
            raise ConfigError(
                f"unknown '{self.packing_strategy}'", key="data.packing_strategy", hint="bfd or wrapped"
            )
        if self.max_length < 1:
            raise ConfigError(f"must be >= 1, got {self.max_length}", key="data.max_length")
        if self.on_overlong not in ON_OVERLONG:
            raise ConfigError(
                f"unknown '{self.on_overlong}'", key="data.on_overlong", hint=f"one of {ON_OVERLONG}"
            )

    def detect(self, columns: list[str], path: str) -> str:
        if self.format != "auto":
            return self.format
        for name, needed in SIGNATURES.items():
            if all(c in columns for c in needed):
                return name
        raise ConfigError(
            f"cannot tell the format of {path} from its columns ({', '.join(columns)})",
            key="data.format",
            hint="use messages / instruction+output / prompt+completion / text columns, map yours with "
            "data.columns, or set data.format",
        )

    def load(self) -> DatasetDict:
        """Train/eval in the canonical shape: ``messages`` + ``answer``, or ``text``."""
        raw = self.load_raw()
        fmt = self.detect(raw["train"].column_names, self.path)
        self._loaded = self._finish({name: self._normalise(table, fmt) for name, table in raw.items()})
        return self._loaded

    def _normalise(self, table: Dataset, fmt: str) -> Dataset:
        if fmt == "text":
            return self.keep_valid(table, SIGNATURES[fmt], self.path).select_columns(["text"])

        def to_messages(row: dict[str, Any]) -> dict[str, Any]:
            if fmt == "messages":
                messages = as_messages(row["messages"], "user")
            elif fmt == "alpaca":
                user = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
                messages = [
                    {"role": "user", "content": user},
                    {"role": "assistant", "content": row["output"]},
                ]
            else:
                messages = as_messages(row["prompt"], "user") + as_messages(row["completion"], "assistant")
            if self.system_prompt and messages[0]["role"] != "system":
                messages = [{"role": "system", "content": self.system_prompt}, *messages]
            answers = [m["content"] for m in messages if m["role"] == "assistant"]
            return {"messages": messages, "answer": str(answers[-1]) if answers else ""}

        table = self.convert(table, SIGNATURES[fmt], to_messages, ("messages", "answer"))
        return self.keep_valid(table, ("answer",), self.path)  # every example needs an assistant turn

    def enforce_length(self, data: DatasetDict, tokenizer: Any) -> DatasetDict:
        """Apply ``on_overlong`` to rows longer than ``max_length`` tokens (``truncate`` leaves them to the
        trainer, which cuts them; ``drop`` removes and counts them; ``error`` names the first)."""
        if self.on_overlong == "truncate":
            return data

        def length(row: dict[str, Any]) -> int:
            if "messages" in row:
                return len(
                    tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True)[
                        "input_ids"
                    ]
                )
            return len(tokenizer(row["text"])["input_ids"])

        out = {}
        for name, table in data.items():
            lengths = [length(row) for row in table]
            long = [i for i, n in enumerate(lengths) if n > self.max_length]
            if long and self.on_overlong == "error":
                raise ConfigError(
                    f"{self.path} ({name}): row {long[0]} has {lengths[long[0]]} tokens > data.max_length="
                    f"{self.max_length} ({len(long)} such rows)",
                    key="data.max_length",
                    hint="raise data.max_length, or set data.on_overlong=truncate or drop",
                )
            _count(self.stats, "dropped (too long)", len(long))
            out[name] = table.select([i for i in range(len(table)) if i not in set(long)]) if long else table
        self._loaded = self._finish(out)
        return self._loaded

    def prompts(self, split: str = "eval") -> list[tuple[Messages, str]]:
        """(conversation up to the last assistant turn, that turn's content) for generation-based eval."""
        data = self.__dict__.get("_loaded") or self.load()
        if "messages" not in data[split].column_names:
            return []
        out = []
        for row in data[split]:
            messages = row["messages"]
            last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            out.append((messages[:last], messages[last]["content"]))
        return out


@component("data")
@dataclass
class PreferenceDataset(Source):
    """Preference pairs for reward modelling and DPO: ``prompt``, ``chosen``, ``rejected``."""

    max_length: int = 1024

    def load(self) -> DatasetDict:
        def to_pairs(row: dict[str, Any]) -> dict[str, Any]:
            return {
                "prompt": as_messages(row["prompt"], "user"),
                "chosen": as_messages(row["chosen"], "assistant"),
                "rejected": as_messages(row["rejected"], "assistant"),
            }

        columns = ("prompt", "chosen", "rejected")
        raw = self.load_raw()
        return self._finish({name: self.convert(t, columns, to_pairs, columns) for name, t in raw.items()})


@component("data")
@dataclass
class PromptDataset(Source):
    """Prompts for on-policy RL (PPO, GRPO): ``prompt`` messages and, when given, the reference ``answer``."""

    max_prompt_length: int = 256

    def load(self) -> DatasetDict:
        raw = self.load_raw()
        has_answer = "answer" in raw["train"].column_names

        def to_prompt(row: dict[str, Any]) -> dict[str, Any]:
            out = {"prompt": as_messages(row["prompt"], "user")}
            if has_answer:
                out["answer"] = str(row["answer"])
            return out

        columns = ("prompt", "answer") if has_answer else ("prompt",)
        return self._finish(
            {name: self.convert(t, ("prompt",), to_prompt, columns) for name, t in raw.items()}
        )
