"""Data components: local files or hub datasets, normalised to one canonical shape per recipe family.

- ``ChatDataset`` (SFT): ``messages`` (OpenAI-style turns) or ``text`` (language modelling); alpaca and
  prompt/completion rows become user/assistant turns.
- ``PreferenceDataset`` (reward, DPO): ``prompt``/``chosen``/``rejected`` as message lists.
- ``PromptDataset`` (PPO, GRPO): ``prompt`` as a message list, plus ``answer`` when present.

Errors name the file, the line or row, and the column.
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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a bad line is reported with its number."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {err.start})",
            key="data.path",
            hint="re-encode the file as UTF-8",
        ) from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}:{number}: malformed JSON ({err.msg})", key="data.path") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: expected a JSON object per line", key="data.path")
        rows.append(row)
    return rows


def load_table(path: str, *, split: str = "train", subset: str | None = None) -> Dataset:
    """One table from a local file / directory or a hub dataset."""
    import datasets

    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".jsonl":
        rows = read_jsonl(p)
        table = datasets.Dataset.from_list(rows) if rows else None
    else:
        try:
            if looks_local(path):
                files = (
                    [str(p)] if p.is_file() else sorted(str(f) for f in p.iterdir() if f.suffix in BUILDERS)
                )
                if not files:
                    raise ConfigError(f"no {', '.join(BUILDERS)} files in {path}", key="data.path")
                table = datasets.load_dataset(
                    BUILDERS[Path(files[0]).suffix], data_files=files, split="train"
                )
            else:
                table = datasets.load_dataset(path, subset, split=split)
        except ConfigError:
            raise
        except (OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(
                f"cannot load dataset '{path}': {reason}",
                key="data.path",
                hint="hub datasets need network access; point data.path at a local jsonl/parquet/csv file",
            ) from None
    if table is None or len(table) == 0:
        raise ConfigError(f"{path} holds no rows", key="data.path")
    return table


@dataclass
class Source:
    """Where rows come from and how train/eval are split (shared by every data component)."""

    path: str = "???"
    eval_path: str | None = None
    split: str = "train"
    subset: str | None = None
    columns: dict[str, str] = field(default_factory=dict)  # canonical name -> the file's column name
    eval_fraction: float = 0.05
    eval_size: int = 0  # rows held out for eval; 0 = use eval_fraction
    max_samples: int | None = None  # use only the first N rows of data.path (before the eval split)
    seed: int = 42

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

    def load_raw(self) -> DatasetDict:
        """Train and eval tables with the canonical column names (``columns`` applied)."""
        from datasets import DatasetDict

        train = self._renamed(load_table(self.path, split=self.split, subset=self.subset), self.path)
        if self.max_samples:
            train = train.select(range(min(self.max_samples, len(train))))
        if self.eval_path:
            evals = self._renamed(
                load_table(self.eval_path, split=self.split, subset=self.subset), self.eval_path
            )
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

    def _renamed(self, table: Dataset, path: str) -> Dataset:
        mapping = {theirs: ours for ours, theirs in self.columns.items() if theirs != ours}
        missing = [c for c in mapping if c not in table.column_names]
        if missing:
            raise ConfigError(
                f"{path} has no column {missing[0]!r} (columns: {', '.join(table.column_names)})",
                key="data.columns",
            )
        return table.rename_columns(mapping) if mapping else table

    @staticmethod
    def require(table: Dataset, needed: tuple[str, ...], path: str, key: str = "data.columns") -> None:
        for column in needed:
            if column not in table.column_names:
                raise ConfigError(
                    f"{path} is missing the column '{column}' (columns: {', '.join(table.column_names)})",
                    key=key,
                    hint=f"map yours with data.columns='{{{column}: <your column>}}'",
                )


def as_messages(value: Any, role: str) -> Messages:
    """A string becomes one message of ``role``; a message list is kept as is."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return [{"role": m["role"], "content": m["content"]} for m in value]


@component("data")
@dataclass
class ChatDataset(Source):
    """SFT data: chat ``messages``, alpaca, prompt/completion or raw ``text``."""

    format: str = "auto"
    system_prompt: str | None = None
    max_length: int = 1024
    packing: bool = False
    packing_strategy: str = "bfd"  # bfd (best-fit, boundary-safe) | wrapped

    def validate(self) -> None:
        super().validate()
        if self.format not in FORMATS:
            raise ConfigError(f"unknown format '{self.format}'", key="data.format", hint=f"one of {FORMATS}")
        if self.packing_strategy not in ("bfd", "wrapped"):
            raise ConfigError("must be bfd or wrapped", key="data.packing_strategy")
        if self.max_length < 1:
            raise ConfigError(f"must be >= 1, got {self.max_length}", key="data.max_length")

    def detect(self, columns: list[str], path: str) -> str:
        if self.format != "auto":
            return self.format
        signatures = {
            "messages": ("messages",),
            "alpaca": ("instruction", "output"),
            "prompt_completion": ("prompt", "completion"),
            "text": ("text",),
        }
        for name, needed in signatures.items():
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
        from datasets import DatasetDict

        raw = self.load_raw()
        fmt = self.detect(raw["train"].column_names, self.path)
        self._loaded = DatasetDict({name: self._normalise(table, fmt) for name, table in raw.items()})
        return self._loaded

    def _normalise(self, table: Dataset, fmt: str) -> Dataset:
        needed = {
            "messages": ("messages",),
            "alpaca": ("instruction", "output"),
            "prompt_completion": ("prompt", "completion"),
            "text": ("text",),
        }[fmt]
        self.require(table, needed, self.path)
        if fmt == "text":
            return table.select_columns(["text"])

        def convert(row: dict[str, Any], index: int) -> dict[str, Any]:
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
            if not answers or not str(answers[-1]).strip():
                raise ConfigError(
                    f"{self.path}: row {index} has no non-empty assistant turn", key="data.path"
                )
            return {"messages": messages, "answer": str(answers[-1])}

        return table.map(convert, with_indices=True, remove_columns=table.column_names)

    def prompts(self, split: str = "eval") -> list[tuple[Messages, str]]:
        """(conversation up to the last assistant turn, that turn's content) for generation-based eval."""
        data = getattr(self, "_loaded", None) or self.load()
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
        from datasets import DatasetDict

        raw = self.load_raw()

        def convert(row: dict[str, Any]) -> dict[str, Any]:
            return {
                "prompt": as_messages(row["prompt"], "user"),
                "chosen": as_messages(row["chosen"], "assistant"),
                "rejected": as_messages(row["rejected"], "assistant"),
            }

        out = {}
        for name, table in raw.items():
            self.require(table, ("prompt", "chosen", "rejected"), self.path)
            out[name] = table.map(convert, remove_columns=table.column_names)
        return DatasetDict(out)


@component("data")
@dataclass
class PromptDataset(Source):
    """Prompts for on-policy RL (PPO, GRPO): ``prompt`` messages and, when given, the reference ``answer``."""

    max_prompt_length: int = 256

    def load(self) -> DatasetDict:
        from datasets import DatasetDict

        raw = self.load_raw()

        def convert(row: dict[str, Any]) -> dict[str, Any]:
            out = {"prompt": as_messages(row["prompt"], "user")}
            if "answer" in row:
                out["answer"] = str(row["answer"])
            return out

        out = {}
        for name, table in raw.items():
            self.require(table, ("prompt",), self.path)
            out[name] = table.map(convert, remove_columns=table.column_names)
        return DatasetDict(out)
