"""Data components: local files or hub datasets, normalised to one canonical shape per recipe family.

- ``ChatDataset`` (SFT): ``messages`` (a list of ``{"role", "content"}`` turns) plus ``answer`` (the content
  of the last assistant turn), or ``text`` alone (language modelling). ShareGPT ``conversations``
  (``{"from", "value"}`` turns), alpaca and prompt/completion rows become the same turns (these two also
  carry ``completion_turns``: how many last turns are the completion, for ``completion_only_loss``).
- ``PreferenceDataset`` (reward, DPO): ``prompt``/``chosen``/``rejected`` as message lists, from explicit
  pairs, from two conversations that share their leading turns (UltraFeedback) or from Anthropic HH
  transcripts; the shared turns become the prompt, so no token is in both the prompt and a response.
- ``UnpairedPreferenceDataset`` (KTO): ``prompt``/``completion`` as message lists and a boolean ``label``.
- ``PromptDataset`` (PPO, GRPO): ``prompt`` as a message list, plus ``answer`` when the file has one.

All of them share one loader (``read_sources``), one column mapping (``Source.read``) and one seeded
train/eval split (``Source.load_splits``). Rows are converted one by one, so an error names the file, the
line (JSON lines) or row, and the column. ``on_error=skip`` drops bad rows instead and counts them
(``stats``, shown in the run's summary, with ``info``: the format used and where the eval rows came from).
When the first rows all fail the same way, the error says the format or mapping does not fit the file.
Every column is accounted for: ``info`` lists the columns read and those ignored, and a column that marks
another task (``TASK_COLUMNS``) stops the load unless the option reads it or ``ignore_columns`` names it.

A component is its config: ``load()`` returns the splits as :class:`LoadedData`, which carries that load's
report (the counts and how the data was read); nothing is kept on the component.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import logging
import math
import os
import random
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from components.config.errors import ConfigError
from components.config.ranges import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, SEED, Range, check_knobs, knob
from components.config.registry import component
from components.datareader import (
    BUILDERS,
    COMPRESSIONS,
    PROBE_ROWS,
    RowError,
    Table,
    data_suffix,
    file_type,
    read_arrow,
    read_hub,
    read_json,
    read_table,
    row_error,
)
from components.distributed.workers import SHARD_ROWS, Workers, open_shards, ranges

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from datasets import Dataset

# files a hub dataset or a save_to_disk folder carries beside its data (never read as rows)
METADATA_FILES = {"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json", "config.json"}
# Suffixes that mark a path as a file (so it must exist) even without ./ or / in front of it.
FILE_SUFFIXES = {
    *BUILDERS,
    *(".txt", ".tsv", ".md", ".yaml", ".yml", ".xml", ".html", ".feather", ".orc", ".avro"),
    *(".xls", ".xlsx", ".pkl", ".pickle", ".npy", ".npz", *COMPRESSIONS, ".zip", ".tar"),
}
SPLIT_KEYWORDS = {  # the hub's split names in file and folder names (datasets.data_files.SPLIT_KEYWORDS)
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
SEP = "-._ 0-9"  # what may stand beside a split keyword in a name (datasets.data_files.NON_WORDS_CHARS)
SHARDED = re.compile(r"^data/(\w+(?:\.\w+)*)-\d{5}-of-\d{5}[^/]*\.[^/]*$")  # data/<split>-00000-of-00002.*
EVAL_SPLITS = ("validation", "test")  # the eval set of a folder split by name, in order of preference
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # name or org/name
FORMATS = ("auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text")
SIGNATURES = {  # the columns that identify each format (alpaca's ``input`` and ``system`` are optional)
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}
# every column each format reads (``system`` becomes the leading system turn; ``tools`` go with messages)
FORMAT_COLUMNS = {
    "messages": ("messages", "system", "tools"),
    "sharegpt": ("conversations", "system", "tools"),
    "alpaca": ("instruction", "input", "output", "system"),
    "prompt_completion": ("prompt", "completion", "system"),
    "text": ("text",),
}
# the formats whose rows are a prompt and its completion: their rows also carry ``completion_turns`` (how many
# of the last turns are the completion), which recipe.completion_only_loss trains alone
COMPLETION_FORMATS = ("alpaca", "prompt_completion")
ROLES = ("system", "user", "assistant", "tool")
# ShareGPT's and LLaMA-Factory's role names (a function_call turn is the assistant's tool call, its
# observation a tool turn); data.roles adds or overrides names
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "observation": "tool", "function_call": "assistant"}
TURN_KEYS = (("role", "content"), ("from", "value"))  # OpenAI-style and ShareGPT-style turns
TOOL_TURN_KEYS = ("tool_call_id", "name")  # kept on tool turns (which call each result answers)
#: per-turn training flags, in the shapes fine-tuning data carries them: OpenAI's fine-tuning format (and
#: ShareGPT files) ``"weight": 0 | 1``, Axolotl's ``"training"`` (or ``"train"``) ``true | false``. Chat
#: data honours them on assistant turns (a flagged-off turn is kept as context, its tokens untrained: the
#: turn is stored with ``"train": false``); LLaMA-Factory's files carry none
TRAIN_FLAG_KEYS = ("weight", "training", "train")
#: an assistant turn's reasoning (DeepSeek-R1 / Qwen3 ``reasoning_content``; also ``reasoning``,
#: ``thinking``): stored as ``reasoning_content``, the key chat templates render (data.keep_reasoning)
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
PREFERENCE_FORMATS = ("auto", "explicit", "implicit", "hh")
PREFERENCE_SIGNATURES = {
    "explicit": "prompt + chosen + rejected (responses: text or assistant messages)",
    "implicit": "chosen + rejected message lists that start with the same turns (the prompt)",
    "hh": "chosen + rejected transcripts as '\\n\\nHuman: ... \\n\\nAssistant: ...' text",
}
CHAT_TOOLS_COLUMN = "tools"  # chat data: the tool schemas (JSON) rendered with the conversation
HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):[ \t]?")
# Columns that mark rows for another task: (what the rows are, what to do instead). A run whose data option
# does not read one stops before the model loads, unless data.ignore_columns names it (``task_columns``).
TASK_COLUMNS = {
    "label": (
        "unpaired preference feedback (KTO: a completion and whether it is good), which would train every "
        "completion, the label=false ones too",
        "use recipe=kto",
    ),
    "tools": (
        "tool definitions, which only chat messages (a messages or conversations column) take along",
        "put the tools beside a messages column",
    ),
    "chosen": ("preference pairs", "use recipe=dpo or recipe=reward"),
    "rejected": ("preference pairs", "use recipe=dpo or recipe=reward"),
    **dict.fromkeys(
        ("score", "scores", "rating", "ratings"),
        (
            "scored or rated responses (reward / ranking data), whose scores nothing would read",
            "pair the better and worse responses as chosen/rejected for recipe=reward or recipe=dpo",
        ),
    ),
}
#: the eval rows held out of data.path when neither data.eval_path, data.eval_size nor data.eval_fraction is
#: set: this share of the rows, at most DEFAULT_EVAL_ROWS (so that evaluating them cannot dominate a run)
DEFAULT_EVAL_FRACTION = 0.05
DEFAULT_EVAL_ROWS = 1000
PACKING_STRATEGIES = ("bfd", "bfd_split", "wrapped")
ON_ERROR = ("raise", "skip")
ON_OVERLONG = ("truncate", "drop", "error")
Messages = list[dict[str, Any]]
Row = dict[str, Any]
Pair = tuple[Messages, "str | None"]  # (the prompt turns, the reference answer or None)


@dataclass
class LoadReport:
    """What one load did, for the run's summary: rows dropped by reason (``stats``), how the data was read
    (``info``: the format, where the eval rows came from), and the first skipped row's error."""

    stats: dict[str, int] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    first_skip: str | None = None
    used: dict[str, None] = field(default_factory=dict)  # the columns read, as the files name them
    ignored: dict[str, None] = field(default_factory=dict)  # the columns not read, and why
    mixture: dict[str, int] = field(default_factory=dict)  # data.mixture[i] -> the train rows it gave
    # rows the conversion flagged (``CHAT_FLAGS``: a leading system turn, tool calls...), summed over the
    # files: what the later checks look for, so they read the rows only when there is something to find
    flags: dict[str, int] = field(default_factory=dict)
    # message keys not used (``parse_turn``'s ``TURN_NOTES``) -> the rows that have them
    keys: dict[str, int] = field(default_factory=dict)

    def account_keys(self, keys: Mapping[str, int]) -> None:
        """Add the rows naming each message key not used; ``info`` lists them ("none" when none)."""
        for key, n in keys.items():
            self.keys[key] = self.keys.get(key, 0) + n
        shown = ", ".join(f"{k} ({n:,} rows)" for k, n in self.keys.items())
        self.info["message keys ignored"] = shown or "none"

    def account(self, used: list[str], ignored: list[str]) -> None:
        """Add one file's used and ignored columns; ``info`` lists them all (the summary, ``mode=plan``)."""
        self.used.update(dict.fromkeys(used))
        self.ignored.update(dict.fromkeys(ignored))
        self.info["columns used"] = ", ".join(self.used) or "none"
        self.info["columns ignored"] = ", ".join(self.ignored) or "none"


class LoadedData(Mapping[str, "Dataset"]):
    """The train/eval splits of one ``load()`` (``data["train"]``, ``data["eval"]``) and its report."""

    def __init__(self, splits: dict[str, Dataset], report: LoadReport) -> None:
        self.splits, self.report = dict(splits), report

    def __getitem__(self, name: str) -> Dataset:
        return self.splits[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.splits)

    def __len__(self) -> int:
        return len(self.splits)

    @property
    def stats(self) -> dict[str, int]:
        """Rows dropped, by reason."""
        return self.report.stats

    @property
    def info(self) -> dict[str, str]:
        """How the data was read: the format used, where the eval rows came from."""
        return self.report.info


_SCRATCH: list[tempfile.TemporaryDirectory[str]] = []


def scratch_workers() -> Workers:
    """Workers for a load outside a run (tests, a notebook): one process, no progress, the Arrow shards in
    a dir of their own under a temporary dir removed when the process exits."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.TemporaryDirectory(prefix="hydratune-data-"))
    return Workers(Path(tempfile.mkdtemp(dir=_SCRATCH[0].name)), num_proc=1, show_progress=False)


# ---------------------------------------------------------------------------------------------- paths


def looks_local(path: str) -> bool:
    """A filesystem path rather than a hub dataset id (``name`` or ``org/name``)."""
    return (
        path.startswith(("/", ".", "~"))
        or os.path.exists(os.path.expanduser(path))
        or Path(path).suffix.lower() in FILE_SUFFIXES
        or not HUB_ID.match(path)
    )


READ_TYPES = f"{', '.join(BUILDERS)} (the text ones also {'/'.join(COMPRESSIONS)} compressed)"


def unread_reason(path: Path) -> str | None:
    """Why a file is not read as rows, or None when it is."""
    if path.name in METADATA_FILES:
        return "metadata, not rows"
    kind = file_type(path)
    if kind is None:
        return "not a data file type"
    if kind[1] == "zstd" and importlib.util.find_spec("zstandard") is None:
        return "zstd-compressed, and the zstandard package is not installed"
    return None


@dataclass(frozen=True)
class Part:
    """One unit of rows: a file, a save_to_disk folder, or one split of a save_to_disk DatasetDict."""

    path: Path
    split: str | None = None  # the DatasetDict split (save_to_disk folders only)
    reader: Any = field(default=None, compare=False)  # a LLaMA-Factory entry (components/llamafactory.py)

    def name(self, root: Path) -> str:
        if self.split is not None:
            return f"the '{self.split}' split (save_to_disk)"
        return "the save_to_disk Dataset" if self.path == root else self.path.relative_to(root).as_posix()


@dataclass
class Layout:
    """What a local data path is read as: the parts for train and for eval (a folder's validation/test
    split), and every file not read with why."""

    root: Path
    train: list[Part]
    eval: list[Part] = field(default_factory=list)
    eval_split: str | None = None
    ignored: dict[str, str] = field(default_factory=dict)  # relative path -> why it is not read
    rule: str = ""  # how the splits were told apart ("" when the names carry none)

    def info(self, role: str = "train") -> dict[str, str]:
        """The summary's lines for a folder read as ``role`` (``train``, or ``eval`` for data.eval_path):
        what is read for train and eval, and what is not and why."""
        if self.root.is_file():
            return {}

        def listing(parts: list[Part]) -> str:
            names = [p.name(self.root) for p in parts]
            shown = names if len(names) <= 6 else [*names[:3], "...", *names[-2:]]
            return (f"{len(names)} files: " if len(names) > 1 else "") + ", ".join(shown)

        out = {f"{role} files": listing(self.train) + (f" (splits from {self.rule})" if self.rule else "")}
        if self.eval:
            out["eval files"] = listing(self.eval)
        if self.ignored:
            where = "files not read" + ("" if role == "train" else f" ({role})")
            out[where] = "; ".join(f"{f} ({why})" for f, why in self.ignored.items())
        return out


def _names_split(name: str, split: str) -> bool:
    return any(re.fullmatch(rf"(.*[{SEP}])?{kw}([{SEP}].*)?", name) for kw in SPLIT_KEYWORDS[split])


def _split_of(names: list[str]) -> str | None:
    """The first hub split (train, validation, test) any of ``names`` carries."""
    return next((s for s in SPLIT_KEYWORDS if any(_names_split(n, s) for n in names)), None)


def split_files(files: list[str]) -> tuple[dict[str, list[str]], dict[str, str], str]:
    """Files (relative paths, ``/``-separated) by split as the hub assigns them (``datasets.data_files``):
    the ``data/<split>-NNNNN-of-NNNNN`` shards, else split names in folder names, else in file names, else
    all ``train``. Returns (split -> files, file -> why it is in no split, how the splits were found)."""
    sharded = {f: m.group(1) for f in files if (m := SHARDED.match(f))}
    if sharded:
        by, rule = sharded, "the hub's data/<split>-NNNNN-of-NNNNN shards"
        why = "not a data/<split>-NNNNN-of-NNNNN shard like the other files"
    else:
        by, rule = {f: _split_of(f.split("/")[:-1]) for f in files}, "folder names"
        why = "no split (train, validation, test) in its folder names"
        if not any(by.values()):
            by, rule = {f: _split_of([f.rsplit("/", 1)[-1]]) for f in files}, "file names"
            why = "no split (train, validation, test) in its name"
        if not any(by.values()):
            return {"train": files}, {}, ""
    splits: dict[str, list[str]] = {}
    for f in files:
        if by.get(f):
            splits.setdefault(str(by[f]), []).append(f)
    known = list(SPLIT_KEYWORDS)  # the hub's order: train, validation, test, then the others by name
    ordered = sorted(splits, key=lambda s: (known.index(s) if s in known else len(known), s))
    return {s: splits[s] for s in ordered}, {f: why for f in files if not by.get(f)}, rule


def _eval_only(root: Path, splits: dict[str, list[Part]], rule: str, key: str) -> Layout:
    """A folder given as data.eval_path: its validation (else test) split, or every file when no name
    marks a split (in ``Layout.train``: the parts to read)."""
    if not rule:
        return Layout(root, splits["train"])
    held = next((s for s in EVAL_SPLITS if s in splits), None)
    if held is None:
        raise ConfigError(
            f"{root} has no validation or test split (splits from {rule}: {', '.join(splits)})",
            key=key,
            hint="point data.eval_path at the eval file itself",
        )
    ignored = {
        part.name(root): f"the {name} split: data.eval_path reads its {held} split"
        for name, parts in splits.items()
        if name != held
        for part in parts
    }
    return Layout(root, splits[held], eval_split=held, ignored=ignored, rule=rule)


def _choose(
    root: Path, splits: dict[str, list[Part]], rule: str, split: str | None, key: str, separate_eval: bool
) -> Layout:
    """Train on ``split``; the folder's validation (else test) split, or for ``train_x`` its
    ``validation_x``/``test_x``, is the eval set unless data.eval_path is given; other splits are named.
    ``split=None``: the folder is data.eval_path (``_eval_only``)."""
    if split is None:
        return _eval_only(root, splits, rule, key)
    if not rule and split != "train":
        raise ConfigError(
            f"data.split={split}, but no name in {root} marks a split (every file is read as one set)",
            key="data.split",
            hint="data.split=train, or name the files by split (train.jsonl, test.jsonl or data/<split>-*)",
        )
    if split not in splits:
        raise ConfigError(
            f"{root} has no '{split}' split (splits from {rule}: {', '.join(splits)})",
            key="data.split",
            hint=f"data.split={next(iter(splits))} (or one of: {', '.join(splits)})",
        )
    wanted = [split.replace("train", s) for s in EVAL_SPLITS if "train" in split] + list(EVAL_SPLITS)
    held = next((s for s in wanted if s in splits and s != split), None)
    if separate_eval:
        why = "data.eval_path is the eval set"
    else:
        why = f"eval reads the {held} split" if held else "neither data.split nor a validation/test split"
    ignored: dict[str, str] = {}
    for name, parts in splits.items():
        if name == split or (name == held and not separate_eval):
            continue
        for part in parts:
            ignored[part.name(root)] = f"the {name} split: {why}"
    evals = [] if separate_eval or held is None else splits[held]
    return Layout(root, splits[split], evals, None if not evals else held, ignored, rule)


def _disk_layout(root: Path, split: str | None, key: str, separate_eval: bool) -> Layout:
    """A ``save_to_disk`` folder: a ``DatasetDict`` (``dataset_dict.json`` lists its splits) or a
    ``Dataset``."""
    index = root / "dataset_dict.json"
    if not index.is_file():
        return _choose(root, {"train": [Part(root)]}, "", split, key, separate_eval)
    try:
        names = json.loads(index.read_text(encoding="utf-8"))["splits"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(
            f"{index} is not a save_to_disk index (no 'splits' list)",
            key=key,
            hint="point at a folder written by Dataset.save_to_disk or DatasetDict.save_to_disk",
        ) from None
    splits = {str(s): [Part(root, str(s))] for s in names}
    return _choose(root, splits, "its dataset_dict.json", split, key, separate_eval)


def is_disk_folder(path: Path) -> bool:
    """A folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def local_layout(
    path: Path, split: str | None = "train", key: str = "data.path", separate_eval: bool = False
) -> Layout:
    """How a local file or folder is read (no ``datasets`` import): a file alone; a save_to_disk folder;
    else its data files (recursively, hidden ones skipped) split by their names as the hub does, training
    on ``split`` and evaluating on the validation/test split (unless ``separate_eval``: data.eval_path;
    ``split=None`` lays out data.eval_path itself). Files not read are named in ``ignored``; a data file
    that cannot be read refuses the run."""
    if path.is_file():
        why = unread_reason(path)
        if why:
            what = f"unsupported file type '{path.suffix}'" if why == "not a data file type" else why
            raise ConfigError(
                f"{what} for {path}",
                key=key,
                hint=f"use a file of one of {READ_TYPES}, a directory of them, a save_to_disk folder or a "
                "hub dataset name",
            )
        return Layout(path, [Part(path)])
    if is_disk_folder(path):
        return _disk_layout(path, split, key, separate_eval)
    files, ignored = [], {}
    for file in sorted(path.rglob("*")):
        rel = file.relative_to(path).as_posix()
        if not file.is_file() or any(p.startswith(".") for p in rel.split("/")):
            continue
        why = unread_reason(file)
        if why and "zstandard" in why:
            raise ConfigError(
                f"{file} is {why}", key=key, hint="pip install zstandard, or decompress it (zstd -d)"
            )
        if why:
            ignored[rel] = why
        else:
            files.append(rel)
    texts = [f for f in files if data_suffix(Path(f)) == ".txt"]
    if texts and len(texts) < len(files):  # notes, licences beside the data: a corpus folder is all .txt
        ignored |= dict.fromkeys(texts, "plain text beside other data files (a corpus folder is all .txt)")
        files = [f for f in files if f not in texts]
    if not files:
        raise ConfigError(f"no data files ({READ_TYPES}) in directory {path}", key=key)
    splits, unsplit, rule = split_files(files)
    parts = {name: [Part(path / f) for f in names] for name, names in splits.items()}
    layout = _choose(path, parts, rule, split, key, separate_eval)
    layout.ignored = dict(sorted((ignored | unsplit | layout.ignored).items()))
    return layout


def entry_layout(root: Path, entry: Any) -> Layout:
    """A LLaMA-Factory dataset dir read as its ``dataset_info.json`` entry says (``components/llamafactory``):
    the entry's file (or its folder's data files), each part carrying the entry; the dir's other data files
    named as not read (its folders are not searched)."""
    if entry.file.is_dir():
        parts = [dataclasses.replace(p, reader=entry) for p in local_layout(entry.file, "train").train]
    else:
        parts = [Part(entry.file, reader=entry)]
    read = {p.path.resolve() for p in parts}
    others = [
        f.relative_to(root).as_posix()
        for f in sorted(root.iterdir())  # the dir's own files: the other entries' (not a run dir inside)
        if f.is_file() and f.name != "dataset_info.json" and f.resolve() not in read and not unread_reason(f)
    ]
    why = f"not the file of the dataset_info.json entry '{entry.name}'"
    ignored = {f: why for f in others} if len(others) <= 6 else {f"{len(others)} other data files": why}
    return Layout(root, parts, ignored=ignored)


def check_path(path: str, key: str, split: str | None = "train", separate_eval: bool = False) -> None:
    """A local path must exist and be (or hold) files of a supported type, laid out so that ``split`` can
    be read (``local_layout``); a hub id is left to ``load``."""
    if not path or path == "???":
        raise ConfigError("no dataset given", key=key, hint=f"set {key}=<file, directory or hub dataset>")
    if not looks_local(path):
        return
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(
            f"data file not found: {path}",
            key=key,
            hint="check the path (relative paths are relative to the directory you launch from)",
        )
    local_layout(p, split, key, separate_eval)


# -------------------------------------------------------------------------------------------- reading


def _count(stats: dict[str, int], key: str, n: int = 1) -> None:
    stats[key] = stats.get(key, 0) + n


def read_part(
    part: Part, *, key: str, limit: int | None, skip: bool, stats: dict[str, int], workers: Workers
) -> Table:
    """The rows of one file, save_to_disk folder or save_to_disk split, at most ``limit``."""
    suffix = data_suffix(part.path)
    if part.path.is_dir() or suffix == ".arrow":
        return read_arrow(part.path, part.split, key=key, limit=limit)
    if BUILDERS[suffix] == "json":
        return read_json(part.path, key=key, skip=skip, stats=stats, workers=workers, limit=limit)
    if BUILDERS[suffix] == "text":
        from components.textcorpus import read_text

        # a LLaMA-Factory entry's .txt: one row per line, as LLaMA-Factory reads it
        return read_text(part.path, key=key, workers=workers, limit=limit, by_line=part.reader is not None)
    return read_table(part.path, key=key, workers=workers, limit=limit)


def read_sources(
    path: str,
    *,
    key: str,
    workers: Workers,
    split: str = "train",
    subset: str | None = None,
    limit: int | None = None,
    skip: bool = False,
    stats: dict[str, int] | None = None,
    parts: list[Part] | None = None,
) -> list[Table]:
    """The rows of a local file, a directory (one table per file; ``parts``, else the ``split`` files of
    its ``local_layout``), a save_to_disk folder or a hub dataset; at most ``limit`` rows in all. No rows
    at all is an error naming the path."""
    stats = {} if stats is None else stats
    if parts is None:
        check_path(path, key, split)
    tables: list[Table] = []
    if looks_local(path):
        left = limit
        for part in parts if parts is not None else local_layout(Path(path).expanduser(), split, key).train:
            if left is not None and left <= 0:
                break
            table = read_part(part, key=key, limit=left, skip=skip, stats=stats, workers=workers)
            tables.append(table)
            left = None if left is None else left - table.rows
    else:
        tables.append(read_hub(path, split=split, subset=subset, key=key, limit=limit))
    if not any(t.rows for t in tables):
        raise ConfigError(
            f"{path} holds no rows" + (" that could be read" if stats.get("skipped rows") else ""),
            key=key,
            hint="check the file (or data.split for a hub dataset)",
        )
    return [t for t in tables if t.rows]


# ------------------------------------------------------------------------------------ row conversion


def text_of(row: Row, column: str, *, required: bool = True) -> str:
    """The text in ``column``: numbers become strings; missing or blank is a ``RowError`` if ``required``."""
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):  # csv/parquet blanks are NaN
        value = ""
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise RowError(f"column '{column}' should hold text, got {type(value).__name__}")
    if required and not value.strip():
        raise RowError(f"no value in column '{column}'")
    return value


def role_names(roles: dict[str, str] | None = None) -> dict[str, str]:
    """Every role name a turn may carry -> the canonical role: ours, ShareGPT's, then ``data.roles``."""
    return {r: r for r in ROLES} | ROLE_ALIASES | dict(roles or {})


def _content_text(value: Any, i: int, column: str) -> str:
    """A turn's content as text: a string (numbers become strings, null ""), or OpenAI content parts
    (``[{"type": "text", "text": ...}, ...]``, plain strings allowed) joined without separator. A non-text
    part (image, audio, file) is a ``RowError``: a text model cannot train on it."""
    if not isinstance(value, list):
        return text_of({"content": value}, "content", required=False)
    texts = []
    for j, part in enumerate(value):
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type", "text") if isinstance(part, dict) else type(part).__name__
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RowError(
                f"message {i} in column '{column}' has a '{kind}' content part (part {j}): only text parts "
                "can be trained",
                key="data.path",
                hint="drop the non-text parts (images, audio, files) from the data, or set "
                "data.on_error=skip to drop such rows and count them",
            )
        texts.append(part["text"])
    return "".join(texts)


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    """One tool call in OpenAI's shape ``{"id"?, "type": "function", "function": {"name", "arguments"}}``,
    from that shape or a bare ``{"name", "arguments"}``; JSON-text arguments become an object (what chat
    templates render with ``tojson``)."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RowError(f"{where} needs a function name ({{'function': {{'name', 'arguments'}}}})")
    arguments = function.get("arguments", function.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise RowError(f"{where}: arguments are not valid JSON ({err.msg})") from None
    out: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if call.get("id") is not None:
        out = {"id": str(call["id"]), **out}
    return out


def parse_tool_calls(value: Any, i: int, column: str) -> list[dict[str, Any]]:
    """A turn's ``tool_calls`` (a list, one call, or a JSON string of either) in OpenAI's shape."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowError(
                f"message {i} in column '{column}': tool calls are not valid JSON ({err.msg})"
            ) from None
    calls = value if isinstance(value, list) else [value]
    return [
        _tool_call(call, f"message {i} in column '{column}', tool call {j}") for j, call in enumerate(calls)
    ]


def _sharegpt_call(text: str) -> list[dict[str, Any]] | None:
    """A ShareGPT ``function_call`` turn's value as tool calls when it is JSON ``{"name", "arguments"}`` (or
    a list of them); None for other text (kept as the assistant's text)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    calls = value if isinstance(value, list) else [value]
    functions = [c.get("function", c) if isinstance(c, dict) else None for c in calls]
    named = all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in functions)
    return value if calls and named else None


#: what ``parse_turn`` left out of the row being converted (message keys not used, reasoning dropped), one
#: entry per key; ``convert_range`` clears it before each row and counts the rows that name each key
TURN_NOTES: list[str] = []


def _train_flag(message: dict[str, Any], role: str, i: int, column: str) -> bool | None:
    """The turn's training flag (``TRAIN_FLAG_KEYS``): False for a turn not to train, True to train it, None
    without one. A value other than 0/1 (true/false), two flags, or a flag that asks a non-assistant turn to
    be trained is a ``RowError``."""
    found = [k for k in TRAIN_FLAG_KEYS if k in message and message[k] is not None]
    if not found:
        return None
    where = f"message {i} in column '{column}'"
    if len(found) > 1:
        raise RowError(f"{where} has two training flags ({', '.join(found)}): give one")
    key, value = found[0], message[found[0]]
    if value not in (0, 1) or isinstance(value, str):
        allowed = "0 or 1" if key == "weight" else "true or false"
        raise RowError(
            f"{where}: '{key}' should be {allowed} (whether the turn is trained), got {value!r}",
            key="data.path",
            hint=f"write '{key}' as {allowed}, or set data.on_error=skip to drop such rows and count them",
        )
    if value and role != "assistant":
        raise RowError(
            f"{where} is a {role} turn with {key}={value!r}: only assistant turns are trained (the flags say "
            "which assistant turns are not)",
            key="data.path",
            hint=f"drop '{key}' from the {role} turns",
        )
    return bool(value)


def _reasoning(message: dict[str, Any], i: int, column: str) -> tuple[str, str] | None:
    """(the key, the text) of an assistant turn's reasoning (``REASONING_KEYS``), None without one."""
    for key in REASONING_KEYS:
        value = message.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise RowError(
                f"message {i} in column '{column}': '{key}' should be text, got {type(value).__name__}"
            )
        return key, value
    return None


def parse_turn(
    message: Any,
    i: int,
    column: str,
    names: dict[str, str],
    *,
    flags: bool = False,
    reasoning: bool | None = None,
) -> dict[str, Any]:
    """One ``{"role", "content"}`` or ShareGPT ``{"from", "value"}`` turn as ``{"role", "content"}`` (content
    text), plus what tool calling needs: an assistant turn's ``tool_calls`` (OpenAI's shape; also from a
    legacy ``function_call`` key or a ShareGPT ``function_call`` turn), a tool turn's ``tool_call_id`` and
    ``name``. ``flags``: a per-turn training flag (``TRAIN_FLAG_KEYS``) that turns an assistant turn off
    becomes ``"train": False``. ``reasoning``: an assistant turn's reasoning (``REASONING_KEYS``) is kept as
    ``reasoning_content`` (True) or dropped and counted (False); None: not read. Every other key of the
    message is noted in ``TURN_NOTES`` (the summary counts the rows)."""
    keys = next(
        (
            k
            for k in TURN_KEYS
            if isinstance(message, dict) and k[0] in message and (k[1] in message or "tool_calls" in message)
        ),
        None,
    )
    if keys is None:
        found = ", ".join(map(str, message)) if isinstance(message, dict) else type(message).__name__
        raise RowError(
            f"message {i} in column '{column}' needs 'role' and 'content' (or ShareGPT's 'from' and "
            f"'value'); found: {found}",
            key="data.format",
        )
    name = message[keys[0]]
    if not isinstance(name, str) or name not in names:
        known = ", ".join(dict.fromkeys([*ROLES, *names]))
        raise RowError(
            f"message {i} in column '{column}' has role '{name}' (known: {known})",
            key="data.roles",
            hint=f"map your role names with data.roles='{{{name}: <user|assistant|system|tool>}}', "
            "e.g. data.roles='{bot: assistant, me: user}'",
        )
    turn: dict[str, Any] = {"role": names[name], "content": _content_text(message.get(keys[1]), i, column)}
    calls = message.get("tool_calls") or message.get("function_call")
    if name == "function_call" and turn["role"] == "assistant" and not calls:
        calls = _sharegpt_call(turn["content"])
        turn["content"] = "" if calls else turn["content"]
    if calls:
        if turn["role"] != "assistant":
            raise RowError(f"message {i} in column '{column}' is a {turn['role']} turn with tool calls")
        turn["tool_calls"] = parse_tool_calls(calls, i, column)
    used = {*keys, "tool_calls", "function_call"}
    if turn["role"] == "tool":
        turn |= {k: str(message[k]) for k in TOOL_TURN_KEYS if message.get(k) is not None}
        used.update(TOOL_TURN_KEYS)
    if flags:
        used.update(TRAIN_FLAG_KEYS)
        if _train_flag(message, turn["role"], i, column) is False and turn["role"] == "assistant":
            turn["train"] = False
    if reasoning is not None and turn["role"] == "assistant":
        used.update(REASONING_KEYS)
        found = _reasoning(message, i, column)
        if found and reasoning:
            turn["reasoning_content"] = found[1]
        elif found:
            TURN_NOTES.append(f"{found[0]} (data.keep_reasoning=false)")
    TURN_NOTES.extend(str(k) for k in message if k not in used)
    return turn


def parse_messages(value: Any, column: str, roles: dict[str, str] | None = None, **options: Any) -> Messages:
    """A list of ``{"role", "content"}`` (or ShareGPT ``{"from", "value"}``) turns (a JSON string of one is
    parsed), reduced to ``role`` and ``content`` (text) and the tool-calling keys (``parse_turn``, with its
    ``options``: training flags, reasoning), roles mapped to ours (``role_names``)."""
    if isinstance(value, str) and value.lstrip().startswith("["):  # e.g. a csv cell holding JSON
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowError(f"column '{column}' holds malformed JSON ({err.msg})") from None
    if value is None:
        raise RowError(f"no value in column '{column}'")
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else type(value).__name__
        raise RowError(
            f"column '{column}' should be a non-empty list of {{role, content}} messages, got {got}"
        )
    names = role_names(roles)
    return [parse_turn(message, i, column, names, **options) for i, message in enumerate(value)]


def parse_tools(value: Any) -> str | None:
    """A ``tools`` cell (a list of JSON schemas, one schema, or a JSON string of either) as JSON text of a
    list (what TRL and ``apply_chat_template(tools=...)`` read); None when blank."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value in ("", []):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowError(f"column 'tools' holds malformed JSON ({err.msg})") from None
    tools = [value] if isinstance(value, dict) else value
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RowError(f"column 'tools' should be a list of JSON schemas, got {type(value).__name__}")
    return json.dumps(tools, ensure_ascii=False) if tools else None


def turn_text(message: dict[str, Any]) -> str:
    """What an assistant turn says: its content, else its tool calls as JSON."""
    if message["content"].strip() or not message.get("tool_calls"):
        return message["content"]
    return json.dumps([c["function"] for c in message["tool_calls"]], ensure_ascii=False)


def json_turns(value: Any) -> list[Any] | None:
    """``value`` as a list of turns if it is one, or a string holding one as JSON (a csv cell); else None."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, list) and value and all(isinstance(m, dict) for m in value) else None


def as_messages(
    value: Any, role: str, column: str, roles: dict[str, str] | None = None, **options: Any
) -> Messages:
    """Text becomes one message of ``role`` (it must not be blank); a message list (or a JSON string of one)
    is checked (``parse_turn``'s ``options``)."""
    if isinstance(value, str) and json_turns(value) is None:
        return [{"role": role, "content": text_of({column: value}, column)}]
    return parse_messages(value, column, roles, **options)


def hh_messages(value: Any, column: str) -> Messages:
    """An Anthropic HH transcript (``"\\n\\nHuman: ... \\n\\nAssistant: ..."``) as user/assistant turns."""
    parts = HH_TURN.split(text_of({column: value}, column).strip())
    if len(parts) < 3 or parts[0].strip():
        raise RowError(
            f"column '{column}' is not a '\\n\\nHuman: ... \\n\\nAssistant: ...' transcript "
            f"(it starts {parts[0][:40]!r})",
            key="data.format",
        )
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return [
        {"role": "user" if who == "Human" else "assistant", "content": text.strip()} for who, text in pairs
    ]


def split_shared(chosen: Messages, rejected: Messages) -> Row:
    """Two conversations that start with the same turns as ``prompt`` (those turns, up to the last one
    before the replies) and the two replies, each ending with an assistant turn."""
    k = 0
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1
    while k and chosen[k - 1]["role"] == "assistant":  # the prompt ends where a reply starts
        k -= 1
    if k == 0:
        raise RowError(
            "'chosen' and 'rejected' do not start with the same turns, so there is no prompt to split off "
            f"(their first turns: {chosen[0]['role']} / {rejected[0]['role']})",
            key="data.format",
        )
    out: Row = {"prompt": chosen[:k]}  # identical conversations: counted by the load (``identical_pair``)
    for name, reply in (("chosen", chosen[k:]), ("rejected", rejected[k:])):
        user = next((j for j, m in enumerate(reply) if m["role"] == "user"), None)
        if user is not None:
            raise RowError(
                f"'chosen' and 'rejected' differ before their last user turn ('{name}' turn {k + user} is a "
                "user turn after the shared prompt)"
            )
        if not reply or reply[-1]["role"] != "assistant" or not reply[-1]["content"].strip():
            last = "missing" if not reply else f"a '{reply[-1]['role']}' turn"
            last = "an empty assistant turn" if reply and reply[-1]["role"] == "assistant" else last
            raise RowError(
                f"the last turn of '{name}' should be an assistant reply with content; it is {last}"
            )
        out[name] = reply
    return out


def last_answer(messages: Messages) -> int:
    """Index of the last assistant turn with content (or tool calls); a ``RowError`` if there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant" and turn_text(messages[i]).strip():
            return i
    raise RowError("no assistant turn with content (nothing to train on)")


# ------------------------------------------------------------------------------------- shared source


#: the shortest data.max_length that holds a chat-formatted prompt and an answer
MIN_MAX_LENGTH = 16
#: data.max_length's range (examples cut to a handful of tokens keep no answer token: nothing would train)
MAX_LENGTH = Range(MIN_MAX_LENGTH)
MAX_LENGTH_HINT = "tokens: room for a prompt and its answer, e.g. 1024 (mode=plan shows the longest)"


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
        {c: List(turn) if c in MESSAGE_COLUMNS else Value(SCALAR_TYPES.get(c, "string")) for c in columns}
    )


def plain_turns(rows: list[Row], columns: tuple[str, ...]) -> bool:
    """Whether every turn of every message list in ``rows`` is exactly ``{role, content}``."""
    lists = [c for c in columns if c in MESSAGE_COLUMNS]
    return all(turn.keys() == PLAIN_TURN for row in rows for c in lists for turn in row[c])


def empty_rows(columns: tuple[str, ...]) -> Dataset:
    from datasets import Dataset

    return Dataset.from_dict({c: [] for c in columns}, features=row_features(columns))


def with_json_turns(tables: list[Dataset]) -> list[Dataset]:
    """``tables`` with the same types: where any stores its turns as JSON, the others cast to it."""
    json_features = next((t.features for t in tables if _json_turns(t)), None)
    if json_features is None:
        return tables
    return [t if _json_turns(t) else t.cast(json_features) for t in tables]


def _json_turns(table: Dataset) -> bool:
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


def convert_range(
    table: Table,
    span: tuple[int, int],
    fn: Callable[[Row], Row],
    columns: tuple[str, ...],
    path: Path,
    key: str,
    skip: bool,
    flags: Mapping[str, Callable[[Row], bool]],
    tick: Callable[[int], None],
) -> Converted:
    """Rows ``span`` of ``table`` through ``fn`` into Arrow shards (``path``, a batch at a time). A
    ``RowError`` names the file and line/row (``skip``: the row is dropped and counted)."""
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
            converted = fn(row)
        except RowError as err:
            where = table.where(index, line)
            if not skip:
                raise row_error(where, err, key) from None
            out.skipped += 1
            out.first_skip = out.first_skip or f"{where}: {err}"
            continue
        for key in dict.fromkeys(TURN_NOTES):
            out.keys[key] = out.keys.get(key, 0) + 1
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


def prepared(table: Table, fn: Callable[[Row], Row]) -> Callable[[Row], Row]:
    """``fn`` after the table's own row conversion (``Table.prepare``), when it has one."""
    return fn if table.prepare is None else functools.partial(_then, table.prepare, fn)


def _then(first: Callable[[Row], Row], then: Callable[[Row], Row], row: Row) -> Row:
    return then(first(row))


def note_unanswered(converted: Converted, key: str, report: LoadReport) -> None:
    """Count the conversations whose last turn is not the assistant's (that turn is not trained) and name
    the first, in the load's report (the summary and ``mode=plan`` show it)."""
    n = converted.flags.get("unanswered", 0)
    if n:
        name = f"conversations ending after the last assistant turn ({key})"
        first = converted.firsts["unanswered"]
        report.info[name] = f"{n} (the turns after it are not trained; the first: {first})"


@dataclass(frozen=True)
class Source:
    """Where rows come from, how bad rows are handled and how train/eval are split (every data option)."""

    #: the canonical column names ``columns`` may map (each component sets its own)
    CANONICAL: ClassVar[tuple[str, ...]] = ()
    #: what the rows hold (a recipe declares the kinds it reads: ``Recipe.data_kinds``)
    kind: ClassVar[str] = ""

    path: str = "???"  # local jsonl/json/parquet/csv file, a directory of them, or a hub dataset name
    eval_path: str | None = None  # a separate eval set; else eval_size / eval_fraction rows are held out
    # the split to read: a hub dataset's, a save_to_disk DatasetDict's or a folder's split-named files
    split: str = "train"
    subset: str | None = None  # hub datasets: the config (subset) name; a LLaMA-Factory dir: the entry
    columns: dict[str, str] = field(default_factory=dict)  # canonical name -> the file's column name
    # the share of data.path's rows held out for eval; null (the default): 5%, at most 1,000 rows
    eval_fraction: float | None = knob(None, FRACTION)
    eval_size: int = knob(0, NON_NEGATIVE)  # rows held out for eval; 0 = use eval_fraction
    # use only the first N rows of data.path (before the eval split)
    max_samples: int | None = knob(None, AT_LEAST_ONE)
    seed: int = knob(42, SEED)
    on_error: str = "raise"  # raise | skip: drop malformed / incomplete rows and count them
    # your turns' role names -> system | user | assistant | tool, e.g. '{bot: assistant, me: user}'
    # (ShareGPT's human, gpt, observation and function_call are known already)
    roles: dict[str, str] = field(default_factory=dict)
    # your columns this run does not read, on purpose: a column that marks another task (label beside
    # prompt/completion, tools without messages, score/rating, chosen/rejected) stops the run otherwise
    ignore_columns: list[str] = field(default_factory=list)
    # several sources in one train set, each {path, weight (a fraction of its rows) or rows (a count), and
    # any of PER_SOURCE}, e.g. [{path: a.jsonl, weight: 0.7}, {path: b.json, rows: 500, format: alpaca}]
    mixture: list[dict[str, Any]] = field(default_factory=list)
    # the prepared data (rows, tokens) written once under cache_dir and memory-mapped by later runs, ranks
    # and sweep points (components/runtime/datacache.py); false: prepared again by every run and rank
    cache: bool = True
    # null: $HYDRATUNE_DATA_CACHE, else $HYDRATUNE_CACHE/data (~/.cache/hydratune/data)
    cache_dir: str | None = None
    # processes preparing the data (reading, masking, tokenizing); null: the cores this process may use
    num_proc: int | None = knob(None, AT_LEAST_ONE)
    # read data.path lazily, row by row while training (corpora larger than memory or disk): SFT only,
    # with train.max_steps; eval rows: data.eval_path, or the stream's own first rows; never cached
    # (data.cache has no effect). docs/data.md, "Streaming"
    streaming: bool = False

    def validate(self) -> None:
        """Cheap checks (no ``datasets`` import): paths, enums, column-mapping keys (the knobs' ranges:
        ``check_values``; a mixture entry's: here)."""
        from components import llamafactory

        if self.mixture:
            mixture_entries(self)  # each entry's path and knobs, checked as data.mixture[i].<knob>
        elif not llamafactory.check(self):  # a LLaMA-Factory dataset dir: its dataset_info.json entry
            check_path(self.path, "data.path", self.split, separate_eval=bool(self.eval_path))
        if self.eval_path:
            check_path(self.eval_path, "data.eval_path", None)
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"unknown '{self.on_error}'", key="data.on_error", hint=f"one of {ON_ERROR}")
        unknown = [c for c in self.columns if c not in self.CANONICAL]
        if unknown:
            raise ConfigError(
                f"unknown column name '{unknown[0]}' for {type(self).__name__}",
                key="data.columns",
                hint=f"map from the canonical names ({', '.join(self.CANONICAL)}) to your file's columns, "
                f"e.g. data.columns='{{{self.CANONICAL[0]}: my_column}}'",
            )
        mapped = next((c for c in self.ignore_columns if c in self.columns.values()), None)
        if mapped:
            raise ConfigError(
                f"'{mapped}' is both mapped (data.columns) and ignored",
                key="data.ignore_columns",
                hint=f"drop '{mapped}' from data.ignore_columns, or its mapping from data.columns",
            )
        bad = next(((k, v) for k, v in self.roles.items() if v not in ROLES), None)
        if bad:
            raise ConfigError(
                f"role '{bad[0]}' is mapped to '{bad[1]}'",
                key="data.roles",
                hint=f"map each of your role names to one of {', '.join(ROLES)}, "
                "e.g. data.roles='{bot: assistant, me: user}'",
            )

    def whole(self) -> Source:
        """This option reading every row of data.path in file order (no eval split held out): what the
        inference recipes generate from."""
        mixture = [{k: v for k, v in e.items() if k not in EVAL_KNOBS} for e in self.mixture]
        return dataclasses.replace(self, eval_fraction=0.0, eval_size=0, eval_path=None, mixture=mixture)

    def pairs(self, data: LoadedData, split: str, limit: int | None = None) -> list[Pair] | None:
        """(the prompt turns, the reference answer or None) per row of ``split`` (its first ``limit``),
        for generation; None when the rows hold no prompt to complete (raw text, preference pairs)."""
        return None

    def prompt_limit(self) -> tuple[int, str, str]:
        """(the longest prompt in tokens, the key that sets it, what happens to longer ones) for the
        prompts generated from."""
        raise NotImplementedError

    def enforce_length(self, data: LoadedData, tokenizer: Any, workers: Workers | None = None) -> LoadedData:
        """The length policy on loaded rows (here: none; the trainer truncates)."""
        return data

    def messages(self, value: Any, role: str, column: str) -> Messages:
        """``as_messages`` with this option's ``roles``."""
        return as_messages(value, role, column, self.roles, **self.turn_options())

    def turn_options(self) -> dict[str, Any]:
        """What ``parse_turn`` reads besides roles, content and tool calls (here: nothing more; chat data
        reads training flags and reasoning)."""
        return {}

    def formats_hint(self) -> str:
        """What this data option accepts (each component says), for errors about a whole file."""
        return (
            f"map your columns to {', '.join(self.CANONICAL)}, e.g. data.columns='{{{self.CANONICAL[0]}: q}}'"
        )

    def read(
        self,
        path: str,
        key: str,
        report: LoadReport,
        workers: Workers,
        limit: int | None = None,
        parts: list[Part] | None = None,
    ) -> list[Table]:
        """The rows of ``path`` (at most ``limit``; of ``parts`` when given: a local layout's), shaped
        (:meth:`shape`)."""
        tables = read_sources(
            path,
            key=key,
            workers=workers,
            split=self.split,
            subset=self.subset,
            limit=limit,
            skip=self.on_error == "skip",
            stats=report.stats,
            parts=parts,
        )
        from components.textcorpus import documents_note

        report.info.update(documents_note(tables))
        entry = next((p.reader for p in parts or [] if p.reader is not None), None)
        if entry is not None:  # a LLaMA-Factory dataset dir's entry
            from components.llamafactory import wrap

            tables = wrap(entry, tables, self.kind, report)
        return self.shape(tables, key, report)

    def shape(self, tables: list[Table], key: str, report: LoadReport) -> list[Table]:
        """``tables`` with ``ignore_columns`` dropped and ``columns`` applied (each mapped column renamed to
        its canonical name; a mapped column a file lacks is an error listing the columns it has), checked
        for columns of another task."""
        self.drop_ignored(tables, key, report)
        mapping = self.mapping()
        targets = set(mapping.values())
        for table in tables if mapping else []:
            present = table.columns
            missing = [theirs for theirs in mapping if theirs not in present]
            if missing:
                ours = mapping[missing[0]]
                raise ConfigError(
                    f"{table.source} has no column '{missing[0]}' (columns: {', '.join(present)})",
                    key="data.columns",
                    hint=f"map {ours} to one of those: data.columns='{{{ours}: <your column>}}'",
                )
            replaced = [c for c in present if c in targets]
            report.account([], [f"{c} (replaced by data.columns)" for c in replaced])
            table.apply_mapping(set(), mapping)
        for table in tables:
            self.task_columns(table)
        return tables

    def mapping(self) -> dict[str, str]:
        """``columns`` as the rows read need it: the file's column -> the canonical name."""
        return {theirs: ours for ours, theirs in self.columns.items() if theirs != ours}

    def drop_ignored(self, tables: list[Table], key: str, report: LoadReport) -> None:
        """Remove ``ignore_columns`` from every row (before the mapping and format detection). A name that
        no file of data.path has is an error (a typo would leave the column it meant in use)."""
        if not self.ignore_columns:
            return
        present = {c for table in tables for c in table.columns}
        missing = [c for c in self.ignore_columns if c not in present]
        if missing and key == "data.path":
            raise ConfigError(
                f"data.ignore_columns names '{missing[0]}', which {self.path} does not have "
                f"(columns: {', '.join(dict.fromkeys(c for t in tables for c in t.columns))})",
                key="data.ignore_columns",
                hint="name columns of the file, e.g. data.ignore_columns=[label]",
            )
        for table in tables:
            table.apply_mapping(set(self.ignore_columns), {})
        report.account([], [f"{c} (data.ignore_columns)" for c in self.ignore_columns if c in present])

    def reads_task_columns(self, columns: list[str]) -> set[str]:
        """The ``TASK_COLUMNS`` this option reads from a file with ``columns`` (here: its canonical ones)."""
        return set(self.CANONICAL)

    def task_columns(self, source: Table) -> None:
        """Stop on a column that marks the rows for another task and that this option would not read
        (``TASK_COLUMNS``; ``label`` only beside a ``completion``): the run would train as if it were not
        there. ``data.ignore_columns`` (dropped before this) says it is meant."""
        present = source.columns
        read = self.reads_task_columns(present)
        found = [
            c
            for c in present
            if c in TASK_COLUMNS and c not in read and (c != "label" or "completion" in present)
        ]
        if not found:
            return
        what, instead = TASK_COLUMNS[found[0]]
        names = [c for c in found if TASK_COLUMNS[c] == TASK_COLUMNS[found[0]]]
        quoted = ", ".join(f"'{c}'" for c in names)
        raise ConfigError(
            f"{source.source} has the column{'s' if len(names) > 1 else ''} {quoted}: {what}; "
            f"{type(self).__name__} ({self.kind} data) does not read {'them' if len(names) > 1 else 'it'} "
            f"(columns: {', '.join(present)})",
            key="data.ignore_columns",
            hint=f"{instead}, or data.ignore_columns=[{', '.join(names)}] to run without "
            + ("them" if len(names) > 1 else "it"),
        )

    def require(self, sources: list[Table], needed: tuple[str, ...], why: str) -> None:
        """Every file must have the ``needed`` columns (a row may still lack a value: that is a row error)."""
        for source in sources:
            present = source.columns
            missing = [c for c in needed if c not in present]
            if missing:
                raise ConfigError(
                    f"{source.source} is missing the column '{missing[0]}' {why} "
                    f"(columns: {', '.join(present)})",
                    key="data.columns",
                    hint=f"map yours with data.columns='{{{missing[0]}: <your column>}}'",
                )

    def convert(
        self,
        tables: list[Table],
        fn: Callable[[Row], Row],
        columns: tuple[str, ...],
        key: str,
        report: LoadReport,
        workers: Workers,
        used: tuple[str, ...] | None = None,
        flags: Mapping[str, Callable[[Row], bool]] | None = None,
    ) -> tuple[Dataset, Converted]:
        """Map every row with ``fn`` into a memory-mapped table of exactly ``columns``, written as Arrow
        shards by ``workers`` (in row order). A ``RowError`` names the file and line/row, or
        (``on_error=skip``) drops the row and counts it; when the first rows all fail alike, the error
        says the format or mapping does not fit (skipping would drop every row). ``used``: the canonical
        columns ``fn`` reads (default: ``CANONICAL``), for the report's used / ignored lists. ``flags``:
        tests on the converted rows, counted (returned, and summed in ``report.flags``)."""
        from datasets import concatenate_datasets

        for table in tables:
            if table.prepare is None:  # else the reader accounted for the file's columns
                self.account(table, used or self.CANONICAL, report)
        if self.on_error == "raise":
            self.check_first_rows(tables[0], prepared(tables[0], fn))
        skip = self.on_error == "skip"
        tasks = [
            functools.partial(
                convert_range, table, span, prepared(table, fn), columns, workers.file("rows"), key, skip,
                flags or {},
            )
            for table in tables
            for span in table.ranges(4 * workers.num_proc)
        ]  # fmt: skip
        more = f" (+{len(tables) - 1} files)" if len(tables) > 1 else ""
        label = f"converting {Path(tables[0].source).name}{more}"
        results = workers.run(tasks, label, sum(t.rows for t in tables))
        done = Converted()
        for result in results:
            done.merge(result)
        if done.skipped:
            _count(report.stats, "skipped rows", done.skipped)
        report.first_skip = report.first_skip or done.first_skip
        for name, n in done.flags.items():
            _count(report.flags, name, n)
        if any(c in MESSAGE_COLUMNS for c in columns):  # every message key is used or named
            report.account_keys(done.keys)
        if not done.paths:
            return empty_rows(columns), done
        shards = [open_shards([path]) for path in done.paths]
        if len({_json_turns(t) for t in shards}) == 1:
            return open_shards(done.paths), done
        return concatenate_datasets(with_json_turns(shards)), done

    def account(self, source: Table, used: tuple[str, ...], report: LoadReport) -> None:
        """Report which of ``source``'s columns are read (named as the file names them) and which not."""
        theirs = {ours: f"{mine} (as {ours})" for ours, mine in self.columns.items() if mine != ours}
        present = source.columns
        report.account(
            [theirs.get(c, c) for c in present if c in used], [c for c in present if c not in used]
        )

    def check_first_rows(self, source: Table, fn: Callable[[Row], Row]) -> None:
        """If the first ``PROBE_ROWS`` rows (all, if fewer) fail with the same error, the file does not fit
        the format or mapping: say so with the columns found, not "fix the row"."""
        errors: list[RowError] = []
        for row in source.head(PROBE_ROWS):
            try:
                fn(row)
                return
            except RowError as err:
                errors.append(err)
        if len({str(e) for e in errors}) != 1:
            return
        first, n = errors[0], len(errors)
        which = "the only row fails" if source.rows == 1 else f"the first {n} rows fail"
        which = f"all {n} rows fail" if 1 < n == source.rows else which
        raise ConfigError(
            f"{source.source}: {which} the same way, so the data format or the column mapping does not "
            f"fit this file: {first} (columns: {', '.join(source.columns)})",
            key=first.key or "data.columns",
            hint=first.hint or self.formats_hint(),
        )

    def load_splits(
        self, build: Callable[[list[Table], str, str], Dataset], report: LoadReport, workers: Workers
    ) -> LoadedData:
        """Train and eval tables; ``build(tables, path, key)`` normalises each file's rows. Without
        ``eval_path``, ``eval_size`` (or ``eval_fraction``) rows of data.path are held out, seeded.
        ``info["eval rows from"]`` says which. With ``mixture``: each source loaded so, then mixed."""
        from components.config.resolvers import is_demo_asset

        if self.mixture:
            return load_mixture(self, workers)
        layout = self.layout(self.path, self.split)
        parts = layout.train if layout else None
        train = build(
            self.read(self.path, "data.path", report, workers, self.max_samples, parts),
            self.path,
            "data.path",
        )
        if self.eval_path:
            apart = self.layout(self.eval_path, None)
            evals = build(
                self.read(
                    self.eval_path, "data.eval_path", report, workers, parts=apart.train if apart else None
                ),
                self.eval_path,
                "data.eval_path",
            )
            demo = is_demo_asset(self.eval_path)
            report.info["eval rows from"] = (
                "the demo eval file" if demo else f"data.eval_path={self.eval_path}"
            )
            report.info.update(apart.info("eval") if apart else {})
        elif layout and layout.eval:
            evals = build(
                self.read(self.path, "data.path", report, workers, parts=layout.eval), self.path, "data.path"
            )
            report.info["eval rows from"] = f"the {layout.eval_split} split of data.path"
        else:
            if self.eval_size:
                n = self.eval_size
                if n >= len(train):
                    raise ConfigError(
                        f"holding out {n} eval rows leaves no training rows ({self.path} has {len(train)})",
                        key="data.eval_size",
                        hint="hold out fewer rows, or give a separate data.eval_path",
                    )
            else:
                n = self.held_out(len(train))
            if n:  # as datasets' train_test_split(seed=, shuffle=True) picks them, as index mappings
                import numpy as np

                order = np.random.default_rng(self.seed).permutation(len(train))
                train, evals = pick(train, order[n:]), pick(train, order[:n])
            else:
                evals = pick(train, [])
            report.info["eval rows from"] = self.eval_share() if n else "none (data.eval_fraction=0)"
        report.info.update(layout.info() if layout else {})
        if layout and layout.ignored:
            log.warning("data: files not read in %s: %s", self.path, report.info["files not read"])
        return self._finish({"train": train, "eval": evals}, report)

    def held_out(self, rows: int) -> int:
        """How many of ``rows`` the eval split holds out (no eval_size, no eval file): ``eval_fraction`` of
        them, at least one and never the last one; unset, the default share capped at DEFAULT_EVAL_ROWS."""
        fraction = DEFAULT_EVAL_FRACTION if self.eval_fraction is None else self.eval_fraction
        if not fraction:
            return 0
        n = min(max(1, round(rows * fraction)), rows - 1)
        return min(n, DEFAULT_EVAL_ROWS) if self.eval_fraction is None else n

    def eval_share(self) -> str:
        """Where the held-out eval rows of data.path come from, for the summary."""
        if self.eval_size:
            return f"data.eval_size={self.eval_size} of data.path (seed {self.seed})"
        if self.eval_fraction is not None:
            return f"{self.eval_fraction * 100:g}% of data.path (seed {self.seed})"
        return (
            f"{DEFAULT_EVAL_FRACTION * 100:g}% of data.path, at most {DEFAULT_EVAL_ROWS:,} rows (seed "
            f"{self.seed}; the default: data.eval_fraction sets a share without a cap)"
        )

    def layout(self, path: str, split: str | None) -> Layout | None:
        """How local ``path`` is read (``local_layout``; ``split=None``: as data.eval_path); None for a hub
        dataset."""
        if not looks_local(path):
            return None
        key = "data.path" if split is not None else "data.eval_path"
        from components import llamafactory

        root = Path(path).expanduser()
        if split is not None and llamafactory.is_dir(root):  # a LLaMA-Factory dataset dir: its entry's file
            return entry_layout(root, llamafactory.entry(root, self.subset))
        return local_layout(root, split, key, separate_eval=bool(self.eval_path))

    def _finish(self, splits: dict[str, Dataset], report: LoadReport) -> LoadedData:
        if len(splits["train"]) == 0:
            first = report.first_skip
            raise ConfigError(
                f"no training rows left in {self.path} after filtering"
                + (f" (every row was skipped; the first: {first})" if first else ""),
                key="data.path",
                hint="see the skipped / dropped counts; fix the data or relax data.on_overlong",
            )
        return LoadedData(splits, report)


# ------------------------------------------------------------------------------------------- mixtures

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
    data: Source
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


def _entry(data: Source, i: int, raw: Any, knobs: list[str]) -> MixtureEntry:
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


def mixture_entries(data: Source) -> list[MixtureEntry]:
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


def load_mixture(data: Source, workers: Workers) -> LoadedData:
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
            _count(report.stats, reason, n)
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


# ------------------------------------------------------------------------------------------- SFT data


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
        "system",
        "tools",  # CHAT_TOOLS_COLUMN: the tool schemas a row's conversation may call
    )
    kind: ClassVar[str] = "chat"

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
        """``tools``, beside chat messages (``messages`` or ShareGPT ``conversations``)."""
        return {"tools"} if {"messages", "conversations"} & set(columns) else set()

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
    ) -> tuple[Callable[[Row], Row], tuple[str, ...], tuple[str, ...]]:
        """(row -> canonical row, its columns, the columns it reads) for rows of format ``fmt`` (``tables``
        must have its columns; ``tools``: the rows carry tool schemas)."""
        self.require(tables, SIGNATURES[fmt], f"needed by format={fmt}")
        used = FORMAT_COLUMNS[fmt]
        if fmt == "text":
            return text_row, ("text",), used
        columns = ("messages", "answer", *(("completion_turns",) if fmt in COMPLETION_FORMATS else ()))
        columns += (CHAT_TOOLS_COLUMN,) if tools else ()
        return functools.partial(self.to_chat, fmt=fmt, tools=tools), columns, used

    def to_chat(self, row: Row, fmt: str, *, tools: bool = False) -> Row:
        """One row of format ``fmt`` as ``{"messages": [...], "answer": str}``, plus ``completion_turns``
        (the number of last turns that are the completion) for prompt/completion formats and ``tools`` (JSON
        text of the row's tool schemas, or None) when the data has them. A ``system`` column, else
        ``system_prompt``, becomes a leading system turn unless the messages already start with one."""
        completion: Messages = []
        if fmt in ("messages", "sharegpt"):
            column = SIGNATURES[fmt][0]
            messages = parse_messages(row.get(column), column, self.roles, **self.turn_options())
        elif fmt == "alpaca":
            user = text_of(row, "instruction")
            extra = text_of(row, "input", required=False)
            completion = [{"role": "assistant", "content": text_of(row, "output")}]
            messages = [{"role": "user", "content": f"{user}\n\n{extra}" if extra.strip() else user}]
            messages += completion
        else:
            completion = self.messages(row.get("completion"), "assistant", "completion")
            messages = self.messages(row.get("prompt"), "user", "prompt") + completion
        system = text_of(row, "system", required=False) or self.system_prompt
        if system and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": system}, *messages]
        out: Row = {"messages": messages, "answer": turn_text(messages[last_answer(messages)])}
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
                _count(data.stats, "dropped (too long)", int(long.size))
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


# ------------------------------------------------------------------------------------ reward / DPO data


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

    format: str = "auto"  # auto | explicit | implicit (shared leading turns) | hh (Human:/Assistant: text)
    max_length: int = knob(1024, MAX_LENGTH, hint=MAX_LENGTH_HINT)  # tokens of prompt + response

    def prompt_limit(self) -> tuple[int, str, str]:
        return self.max_length, "data.max_length", "truncate"

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

    def to_pair(self, row: Row, fmt: str) -> Row:
        """One row of format ``fmt`` as ``prompt``/``chosen``/``rejected`` message lists."""
        if fmt == "explicit":
            return {
                "prompt": self.messages(row.get("prompt"), "user", "prompt"),
                "chosen": self.messages(row.get("chosen"), "assistant", "chosen"),
                "rejected": self.messages(row.get("rejected"), "assistant", "rejected"),
            }
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
            table, done = self.convert(tables, pair, self.CANONICAL, key, report, workers, needed, flags)
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
    _count(report.stats, "dropped (identical chosen/rejected)", n)
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


# -------------------------------------------------------------------------------------- PPO/GRPO data


@component("data")
@dataclass(frozen=True)
class PromptDataset(Source):
    """Prompts for on-policy RL (PPO, GRPO): ``prompt`` messages and, when given, the reference ``answer``."""

    CANONICAL: ClassVar[tuple[str, ...]] = ("prompt", "answer")
    kind: ClassVar[str] = "prompts"

    max_prompt_length: int = knob(256, AT_LEAST_ONE)  # tokens, the chat template's generation prompt included
    # prompts longer than max_prompt_length: truncate (generation keeps their end: PPO, generate, best_of_n,
    # eval; GRPO cannot cut a prompt and refuses) | drop (counted) | error (names the first)
    on_overlong: str = "truncate"

    def validate(self) -> None:
        super().validate()
        if self.on_overlong not in ON_OVERLONG:
            raise ConfigError(
                f"unknown '{self.on_overlong}'", key="data.on_overlong", hint=f"one of {ON_OVERLONG}"
            )

    def prompt_limit(self) -> tuple[int, str, str]:
        return self.max_prompt_length, "data.max_prompt_length", self.on_overlong

    def enforce_length(self, data: LoadedData, tokenizer: Any, workers: Workers | None = None) -> LoadedData:
        """Measure every prompt (with the generation prompt) against ``max_prompt_length`` and apply
        ``on_overlong``; the longer ones are counted per split (``prompt_lengths``)."""
        from components.promptlength import enforce_prompt_length

        return self._finish(enforce_prompt_length(self, data, tokenizer), data.report)

    def pairs(self, data: LoadedData, split: str, limit: int | None = None) -> list[Pair] | None:
        """(the prompt turns, the ``answer`` column's text, or None without that column) per row (of the
        first ``limit``)."""
        table = first_rows(data[split], limit)
        answers = table["answer"] if "answer" in table.column_names else [None] * len(table)
        return list(zip(table["prompt"], answers, strict=True))

    def to_prompt(self, row: Row, answer: bool) -> Row:
        """One row as ``prompt`` messages, with its reference ``answer`` (text) when the data has them."""
        out: Row = {"prompt": self.messages(row.get("prompt"), "user", "prompt")}
        if answer:
            out["answer"] = text_of(row, "answer")  # a blank / NaN reference is no reference
        return out

    def load(self, workers: Workers | None = None) -> LoadedData:
        """Train/eval with ``prompt`` (messages) and, if data.path has the column, ``answer`` (text)."""
        workers = workers or scratch_workers()
        has_answer: bool | None = None  # decided on data.path, so both splits have the same columns
        report = LoadReport()

        def build(tables: list[Table], path: str, key: str) -> Dataset:
            nonlocal has_answer
            self.require(tables, ("prompt",), "of a prompt dataset")
            if has_answer is None:
                has_answer = all("answer" in t.columns for t in tables)
            columns = ("prompt", "answer") if has_answer else ("prompt",)
            to_prompt = functools.partial(self.to_prompt, answer=has_answer)
            return self.convert(tables, to_prompt, columns, key, report, workers)[0]

        return self.load_splits(build, report, workers)
