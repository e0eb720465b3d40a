"""Where the rows are: a local path's files, splits and parts (what is read and what is not, and why), a hub
id, a ``save_to_disk`` folder; and reading them (``read_sources``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.file_bytes import BUILDERS, COMPRESSIONS, data_suffix, file_type
from hydratune.components.data.json_files import read_json
from hydratune.components.data.readers import Table, read_arrow, read_hub, read_table
from hydratune.components.data.rows import (
    EVAL_SPLITS,
    FILE_SUFFIXES,
    HUB_ID,
    METADATA_FILES,
    SEP,
    SHARDED,
    SPLIT_KEYWORDS,
)
from hydratune.components.distributed.workers import Workers

if TYPE_CHECKING:
    pass


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
    reader: Any = field(default=None, compare=False)  # a LLaMA-Factory entry (data/llamafactory.py)

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


def read_part(
    part: Part,
    *,
    key: str,
    limit: int | None,
    skip: bool,
    stats: dict[str, int],
    workers: Workers,
    text_unit: str = "paragraph",
) -> Table:
    """The rows of one file, save_to_disk folder or save_to_disk split, at most ``limit`` (a ``.txt``'s
    documents cut by ``text_unit``: components/data/textcorpus.py)."""
    suffix = data_suffix(part.path)
    if part.path.is_dir() or suffix == ".arrow":
        return read_arrow(part.path, part.split, key=key, limit=limit)
    if BUILDERS[suffix] == "json":
        return read_json(part.path, key=key, skip=skip, stats=stats, workers=workers, limit=limit)
    if BUILDERS[suffix] == "text":
        from hydratune.components.data.textcorpus import read_text

        # a LLaMA-Factory entry's .txt: one row per line, as LLaMA-Factory reads it
        return read_text(
            part.path, key=key, workers=workers, limit=limit, unit=text_unit, lf=part.reader is not None
        )
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
    text_unit: str = "paragraph",
) -> list[Table]:
    """The rows of a local file, a directory (one table per file; ``parts``, else the ``split`` files of
    its ``local_layout``), a save_to_disk folder or a hub dataset; at most ``limit`` rows in all (a
    ``.txt``'s documents cut by ``text_unit``). No rows at all is an error naming the path."""
    stats = {} if stats is None else stats
    if parts is None:
        check_path(path, key, split)
    tables: list[Table] = []
    if looks_local(path):
        left = limit
        for part in parts if parts is not None else local_layout(Path(path).expanduser(), split, key).train:
            if left is not None and left <= 0:
                break
            table = read_part(
                part, key=key, limit=left, skip=skip, stats=stats, workers=workers, text_unit=text_unit
            )
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
