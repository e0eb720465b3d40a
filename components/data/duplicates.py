"""Exact duplicate rows (``data.dedup``): counted, kept out of the eval split's reach, or dropped.

Two rows are duplicates when their converted rows (what trains: the messages, the pair, the text, the
images' bytes) are equal, whatever their ignored columns say. ``data.dedup``:

- ``split`` (the default): duplicates stay in train, but a row and its copies are always on one side of the
  held-out train/eval split (a held-out eval row is never a copy of a train row); an eval set read apart
  (data.eval_path, a folder's validation split) is the user's: its copies of train rows are named;
- ``drop``: every copy after a row's first is dropped from train and counted, and an eval set's copies of
  train rows dropped from it and counted;
- ``count``: counted and named only (held-out eval rows may copy train rows: eval then measures
  memorisation, and the summary says how many do).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hydratune.components.data.rows import LoadReport, add_count
from hydratune.components.data.tables import pick

if TYPE_CHECKING:
    from datasets import Dataset

DEDUP = ("split", "drop", "count")
#: the summary's names for what data.dedup found (``LoadReport.info``) and dropped (``LoadReport.stats``)
DUPLICATES = "duplicate rows"
DROPPED = "dropped (exact duplicates)"
EVAL_COPIES = "dropped from eval (copies of train rows)"
NO_EVAL = "eval rows held out"
BATCH = 4096


def digests(table: Dataset) -> list[bytes]:
    """A 16-byte digest of each row of ``table`` (its stored columns, in order)."""
    out: list[bytes] = []
    for batch in table.with_format("arrow").iter(batch_size=BATCH):
        out += [hashlib.blake2b(repr(row).encode(), digest_size=16).digest() for row in batch.to_pylist()]
    return out


def first_copies(keys: Sequence[bytes]) -> list[int]:
    """The index of the first row of each distinct key, in order."""
    seen: set[bytes] = set()
    kept = []
    for i, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            kept.append(i)
    return kept


def dedup_train(train: Dataset, mode: str, report: LoadReport) -> tuple[Dataset, list[bytes]]:
    """``train`` with its duplicates counted (``info``) and, ``mode=drop``, dropped (``stats``); and the
    digests of the rows returned."""
    keys = digests(train)
    copies = len(keys) - len(set(keys))
    if not copies:
        return train, keys
    groups = sum(1 for n in Counter(keys).values() if n > 1)
    what = {
        "split": "kept in train; a row and its copies never on both sides of a held-out train/eval split",
        "drop": "dropped: the first of each kept",
        "count": "counted only: eval rows may be copies of train rows",
    }[mode]
    report.info[DUPLICATES] = (
        f"{copies:,} of {len(keys):,} rows of data.path are exact copies of another row ({groups:,} rows "
        f"repeated; data.dedup={mode}: {what})"
    )
    if mode != "drop":
        return train, keys
    kept = first_copies(keys)
    add_count(report.stats, DROPPED, copies)
    return pick(train, kept), [keys[i] for i in kept]


def held_out(keys: Sequence[bytes], order: Sequence[int], n: int, mode: str) -> tuple[list[int], list[int]]:
    """(train, eval) row indices: ``n`` eval rows taken in ``order`` (a seeded permutation), as before;
    except (``mode`` not ``count``) that a row's copies go where it goes: a row whose copies would not fit
    in the eval rows left stays in train with them, and when no row fits at all, the first (in ``order``)
    that leaves train a row is held out with its copies (more than ``n``). Every row a copy of one: no
    eval row (``no_eval`` says why)."""
    if mode == "count" or len(set(keys)) == len(keys) or not n:
        return list(order[n:]), list(order[:n])
    sizes = Counter(keys)
    chosen: set[bytes] = set()
    taken = 0
    for i in order:
        key = keys[i]
        if taken < n and key not in chosen and taken + sizes[key] <= n:
            chosen.add(key)
            taken += sizes[key]
    if not chosen:  # the first row (in order) that leaves train a row; none when every row is one
        chosen = {key for key in (keys[i] for i in order) if sizes[key] < len(keys)}
        chosen = {next(keys[i] for i in order if keys[i] in chosen)} if chosen else set()
    return [i for i in order if keys[i] not in chosen], [i for i in order if keys[i] in chosen]


def no_eval(rows: int, mode: str) -> str:
    """Why a held-out split of ``rows`` copies of one row holds out nothing (the summary's ``NO_EVAL``)."""
    return (
        f"none: every one of the {rows:,} rows of data.path is the same row, and data.dedup={mode} holds out "
        "no copy of a train row (data.dedup=count holds copies out anyway; or data.eval_path=<eval file>)"
    )


def separate_eval(train_keys: Sequence[bytes], evals: Dataset, mode: str, report: LoadReport) -> Dataset:
    """An eval set read apart (data.eval_path, a folder's validation split), which the user chose: its rows
    that copy a train row counted and named, and (``mode=drop``) dropped from it."""
    known = set(train_keys)
    keys = digests(evals)
    copies = [i for i, key in enumerate(keys) if key in known]
    if not copies:
        return evals
    if mode != "drop":
        report.info["eval rows that copy a train row"] = (
            f"{len(copies):,} of {len(keys):,} (data.dedup={mode}: an eval file's rows are kept; eval "
            "measures memorisation there; data.dedup=drop drops them)"
        )
        return evals
    add_count(report.stats, EVAL_COPIES, len(copies))
    dropped = set(copies)
    return pick(evals, [i for i in range(len(keys)) if i not in dropped])


def split_note(train_keys: Sequence[bytes], eval_keys: Any) -> int:
    """How many eval rows copy a train row (for ``count``'s note on a held-out split)."""
    known = set(train_keys)
    return sum(1 for key in eval_keys if key in known)
