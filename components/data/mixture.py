"""``data.mixture``: several sources, each read as its data option alone would, sampled by weight or row count
and shuffled together."""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import check_knobs
from hydratune.components.data.rows import LoadedData, LoadReport, Messages, add_count
from hydratune.components.data.tables import pick, with_json_turns
from hydratune.components.distributed.workers import Workers

if TYPE_CHECKING:
    from datasets import Dataset


#: the knobs a data.mixture entry may set for its own source (those its data option has); the others
#: (lengths, packing, the seed) are the mixture's, set as data.<knob>
PER_SOURCE = (
    *("path", "eval_path", "split", "subset", "columns", "eval_fraction", "eval_size", "max_samples"),
    *("on_error", "roles", "format", "system_prompt", "ignore_columns"),
)
EVAL_KNOBS = ("eval_path", "eval_fraction", "eval_size")
SHARES = ("weight", "rows")  # how much of a source goes in: a fraction of its train rows, or a count


@dataclass(frozen=True)
class MixtureEntry:
    """One source of ``data.mixture``: the data option with the entry's knobs (``data``), and how many of
    its train rows go in: ``weight`` (a fraction of them) or ``rows`` (exactly so many)."""

    index: int
    data: Any  # the data option (a Source) with the entry's knobs
    weight: float | None = None
    rows: int | None = None

    @property
    def key(self) -> str:
        return f"data.mixture[{self.index}]"

    def share(self) -> str:
        return f"weight {self.weight:g}" if self.weight is not None else f"rows={self.rows}"

    def take(self, available: int) -> int:
        """How many of ``available`` train rows this source gives (a weight: at least one)."""
        if self.weight is not None:
            return max(1, round(self.weight * available))
        if self.rows is not None and self.rows > available:
            raise ConfigError(
                f"rows={self.rows}, but {self.data.path} has {available} train rows",
                key=f"{self.key}.rows",
                hint=f"rows={available} or fewer, or a weight (a fraction of its rows), e.g. weight: 1.0",
            )
        return int(self.rows or 0)


def local(text: str, key: str) -> str:
    """``text`` with its ``data.<knob>`` names (of PER_SOURCE knobs) made mixture entry ``key``'s."""
    return re.sub(rf"\bdata\.({'|'.join(PER_SOURCE)})\b", lambda m: f"{key}.{m.group(1)}", text)


def in_entry(err: ConfigError, key: str) -> ConfigError:
    """``err`` raised for one mixture source, its knobs named as that entry's."""
    return ConfigError(
        local(str(err.args[0]), key),
        key=err.key and local(err.key, key),
        hint=err.hint and local(err.hint, key),
    )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _entry(data: Any, i: int, raw: Any, knobs: list[str]) -> MixtureEntry:
    """Entry ``i`` of data.mixture checked (its keys, share and path) and built as a data option."""
    key = f"data.mixture[{i}]"
    example = "data.mixture='[{path: a.jsonl, weight: 0.7}, {path: b.jsonl, rows: 500}]'"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"should be a mapping like {{path: a.jsonl, weight: 0.7}}, got {raw!r}", key=key)
    unknown = [k for k in raw if k not in (*knobs, *SHARES)]
    if unknown:
        raise ConfigError(
            f"unknown key '{unknown[0]}' in a mixture entry of {type(data).__name__}",
            key=f"{key}.{unknown[0]}",
            hint=f"an entry takes path, weight or rows, and its own {', '.join(knobs[1:])}; the other "
            f"knobs are the whole mixture's: data.{unknown[0]}=...",
        )
    if not raw.get("path"):
        raise ConfigError("no path", key=f"{key}.path", hint=f"each entry names its source, e.g. {example}")
    weight, rows = raw.get("weight"), raw.get("rows")
    if (weight is None) == (rows is None):
        raise ConfigError(
            "give weight (a fraction of this source's train rows) or rows (how many), one of the two",
            key=key,
            hint=example,
        )
    if weight is not None and not (_number(weight) and 0 < weight <= 1):
        raise ConfigError(f"must be in (0, 1], got {weight!r}", key=f"{key}.weight", hint=example)
    if rows is not None and not (isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1):
        raise ConfigError(f"must be a whole number >= 1, got {rows!r}", key=f"{key}.rows", hint=example)
    check_knobs(type(data), raw, key)  # the entry's own knobs, each within its declared range
    source = dataclasses.replace(data, mixture=[], **{k: v for k, v in raw.items() if k not in SHARES})
    try:
        source.validate()
    except ConfigError as err:
        raise in_entry(err, key) from None
    return MixtureEntry(i, source, None if weight is None else float(weight), rows)


def mixture_entries(data: Any) -> list[MixtureEntry]:
    """data.mixture's entries, each checked before load: its keys, its weight or rows, its path and its
    knobs (as the data option checks its own). data.path and data.eval_path must be unset: each source
    names its own."""
    for name in ("path", "eval_path"):
        value = getattr(data, name)
        if value and value != "???":
            raise ConfigError(
                f"data.mixture names the sources, and data.{name}={value} is set too",
                key=f"data.{name}",
                hint=f"data.{name}='' (or a data option without one, e.g. data=jsonl_messages), and give "
                f"each source its own {name} in data.mixture",
            )
    knobs = [k for k in PER_SOURCE if k in {f.name for f in dataclasses.fields(data)}]
    return [_entry(data, i, raw, knobs) for i, raw in enumerate(data.mixture)]


def _mixed(tables: list[Dataset], rng: random.Random) -> Dataset:
    """The rows of ``tables`` together, shuffled with ``rng`` (an index mapping on the memory-mapped
    tables: the order a shuffled list of the rows would have)."""
    from datasets import concatenate_datasets

    order = list(range(sum(len(t) for t in tables)))
    rng.shuffle(order)
    return pick(concatenate_datasets(with_json_turns(tables)), order) if order else pick(tables[0], [])


def load_mixture(data: Any, workers: Workers) -> LoadedData:
    """Each source of data.mixture loaded as its data option alone would (its format, columns and eval
    split), its train rows sampled (``weight`` or ``rows``, seeded with data.seed), then all together and
    shuffled; eval is every source's eval rows. The report gives each source's rows (``mixture``, and a
    line in ``info``) and sums the rows dropped."""
    report, rng = LoadReport(), random.Random(data.seed)
    trains: list[Dataset] = []
    evals: list[Dataset] = []
    for entry in mixture_entries(data):
        try:
            loaded = entry.data.load(workers)
            taken = entry.take(len(loaded["train"]))
        except ConfigError as err:
            raise in_entry(err, entry.key) from None
        ours, first = _kind(loaded["train"]), _kind(trains[0]) if trains else None
        if first is not None and ours != first:
            raise ConfigError(
                f"{entry.data.path} gives rows of {', '.join(ours)}, data.mixture[0] of {', '.join(first)}: "
                "a mixture's sources must give the same kind of rows",
                key=f"{entry.key}.format",
                hint="mix conversations with conversations (not raw text); prompts all with an answer column "
                "or all without",
            )
        picked = sorted(rng.sample(range(len(loaded["train"])), taken))
        trains.append(pick(loaded["train"], picked))
        evals.append(loaded["eval"])
        report.mixture[entry.key] = taken
        for reason, n in loaded.stats.items():
            add_count(report.stats, reason, n)
        report.first_skip = report.first_skip or loaded.report.first_skip
        how = local("; ".join(f"{k}: {v}" for k, v in loaded.info.items()), entry.key)
        report.info[f"{entry.key} {entry.data.path}"] = (
            f"{taken} of {len(loaded['train'])} train rows ({entry.share()}), {len(loaded['eval'])} eval "
            f"rows; {how}"
        )
    report.info["eval rows from"] = f"each source's own (seed {data.seed}), all of them"
    if any("completion_turns" in t.column_names for t in trains):
        trains, evals = [_whole_completion(t) for t in trains], [_whole_completion(e) for e in evals]
    return data._finish({"train": _mixed(trains, rng), "eval": _mixed(evals, rng)}, report)


def _kind(rows: Dataset) -> list[str]:
    """The columns that make a source's rows of one kind (``completion_turns`` is not one: see below)."""
    return [c for c in rows.column_names if c != "completion_turns"]


def _whole_completion(rows: Dataset) -> Dataset:
    """A conversation source mixed with prompt/completion ones: its rows get ``completion_turns`` = every
    turn after the first user turn (the prompt TRL needs is the system prompt and that turn), so every
    assistant turn stays trained, as it does unmixed."""
    from datasets import Features, Value

    if "completion_turns" in rows.column_names or "messages" not in rows.column_names:
        return rows
    return rows.map(
        lambda batch: {"completion_turns": [_after_first_user(m) for m in batch["messages"]]},
        batched=True,
        features=Features({**rows.features, "completion_turns": Value("int64")}),
    )


def _after_first_user(messages: Messages) -> int:
    """How many turns follow the first user turn (at least one turn is left as the prompt)."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "user"), 0)
    return len(messages) - first - 1
