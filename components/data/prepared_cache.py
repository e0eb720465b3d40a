"""The prepared-data cache: what a run makes of its data before the model loads (the rows read and
converted, the chat template fitted, the length policy applied, SFT's tokens) is written once as Arrow
files and memory-mapped by every later run, rank and sweep point whose data settings agree.

Where: ``data.cache_dir``, else ``$HYDRATUNE_DATA_CACHE``, else ``$HYDRATUNE_CACHE/data`` (by default
``~/.cache/hydratune/data``); ``data.cache=false`` prepares into a temporary dir instead (every run and
rank then prepares its own). ``hydratune cache ls`` lists the entries, ``hydratune cache clear`` frees them.

The key (:func:`key_parts`) holds everything that changes the result: the sha256 of every data file (with
data.images, of every image file the rows may name too) (size, mtime, ctime and inode only decide whether a
file is hashed again: ``fingerprint.FileHashes``) or a hub
split's own fingerprint, every data knob but those that only say how to prepare (``fingerprint.NOT_DATA``) or
only a stream reads (``STREAM_ONLY``: ``data.streaming`` is never cached), the data
component, the tokenizer (its whole vocabulary, merges, normalizer, special tokens) and chat template, what
the recipe makes of the rows (SFT: masking, ``max_length``, packing), the bytes of hydratune's data code
and the versions of the libraries it prepares with. Editing one row, the template or any of those gives a
new key; an entry is never written over.

One preparation per key: a process takes the key's lock (``flock``: across the ranks of a job, the nodes
sharing the cache dir, the points of a sweep), prepares into ``.staging/`` and renames the finished entry
into place (its ``meta.json`` last), so a killed preparation leaves nothing that is read; the others wait
for the lock and memory-map the entry. Each process prints whether it prepared or reused the entry.

An entry is trusted only when it is what was written (checked on every open): ``meta.json`` of this key,
its parts hashing to that key, and every Arrow and index file a plain file inside the entry (no link, no
absolute or ``..`` name) with the sha256 recorded when it was written (components/config/files.py). An
entry edited, truncated, swapped with another's files or pointing elsewhere is prepared again (in a cache
that cannot be written: refused, naming the damage), never served; a full disk is the named exit 2.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydratune.components.config.files import file_lock, inside, mismatch, sha256s
from hydratune.components.data.fingerprint import FileHashes, cache_root, fingerprint_node
from hydratune.components.distributed.workers import SHARD_ROWS, Workers, open_shards
from hydratune.components.launcher import alive

log = logging.getLogger("hydratune")

ENTRY_FORMAT = 2  # 2: every file of an entry recorded by sha256 (1: by size)
META = "meta.json"
KEY = re.compile(r"[0-9a-f]{32}")  # an entry's name
STAGING = ".staging"
#: what _open says of a key with no entry
ABSENT = "absent"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
TEMPORARY = ".tmp"
#: the code that shapes a prepared entry (its bytes are in the key): every module of the data wing and the
#: text helpers it renders and tokenizes with
DATA_CODE = ("components/data/*.py", "components/text/chat_template.py", "components/text/sft_tokens.py")
LIBRARIES = ("datasets", "pyarrow", "transformers", "tokenizers", "trl", "jinja2")
#: the knobs of data.streaming only (a stream is never cached): not in the key of what a loaded run prepares
STREAM_ONLY = ("streaming", "stream_window", "stream_shuffle")
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------- the key


def key_parts(data: Any, tokenizer: Any, tokens: dict[str, Any] | None) -> dict[str, Any]:
    """Everything the prepared data depends on (see the module's docstring)."""
    import dataclasses
    from importlib.metadata import PackageNotFoundError, version

    from hydratune.components.data.layout import looks_local

    node = {k: v for k, v in dataclasses.asdict(data).items() if k not in STREAM_ONLY}
    libraries = {}
    for name in LIBRARIES:
        try:
            libraries[name] = version(name)
        except PackageNotFoundError:
            libraries[name] = None
    hub = [p for p in _paths(node) if not looks_local(p)]
    return {
        "entry format": ENTRY_FORMAT,
        "code": code_fingerprint(),
        "libraries": libraries,
        "component": type(data).__name__,
        "data": fingerprint_node(node, FileHashes(cache_root(data) / "hashes")),  # images too (data.images)
        "hub": {name: hub_fingerprint(name, data) for name in hub},
        "tokenizer": tokenizer_fingerprint(tokenizer) if tokenizer is not None else None,
        "tokens": tokens,
    }


def key_of(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _paths(node: dict[str, Any]) -> list[str]:
    given = [node.get("path"), node.get("eval_path")]
    given += [e.get(k) for e in node.get("mixture") or [] for k in ("path", "eval_path")]
    return [str(p) for p in given if p and p != "???"]


def code_fingerprint() -> str:
    """The sha256 of hydratune's data code (``DATA_CODE``)."""
    digest = hashlib.sha256()
    for pattern in DATA_CODE:
        for path in sorted(REPO.glob(pattern)):
            digest.update(path.relative_to(REPO).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """The sha256 of a tokenizer: its whole definition (a fast tokenizer's ``tokenizer.json``: vocabulary,
    merges, normalizer, pre-tokenizer, post-processor, added tokens; else its saved files), its special
    tokens, padding side and chat template."""
    import tempfile

    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode())
    else:
        with tempfile.TemporaryDirectory() as folder:
            tokenizer.save_pretrained(folder)
            for path in sorted(Path(folder).rglob("*")):
                if path.is_file() and path.name != "chat_template.jinja":
                    digest.update(path.name.encode() + path.read_bytes())
    special = {k: str(v) for k, v in tokenizer.special_tokens_map.items()}
    extra = {"class": type(tokenizer).__name__, "special": special, "side": tokenizer.padding_side}
    extra["template"] = tokenizer.chat_template
    digest.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def hub_fingerprint(name: str, data: Any) -> str:
    """A hub split's own fingerprint (``datasets``' hash of its files and revision), or ``unreadable`` when
    it cannot be loaded (the load then names the problem)."""
    import datasets

    try:
        split = getattr(data, "split", "train")
        return str(datasets.load_dataset(name, getattr(data, "subset", None), split=split)._fingerprint)
    except Exception:  # the preparation itself reports it
        return "unreadable"


# -------------------------------------------------------------------------------------------- entries


@dataclass
class Prepared:
    """What a preparation made: datasets by name (``rows/train``, ``rows/eval``, ``tokens/train``...) and
    JSON-able facts about them (the load's report, the template given to a tokenizer without one...)."""

    datasets: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """A prepared entry and how this process got it."""

    prepared: Prepared
    status: str  # "prepared", "reused", "off"
    key: str | None = None
    path: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    waited: float = 0.0

    def note(self) -> str:
        """The summary's line: the key, whether this run prepared it, where it is."""
        if self.status == "off":
            return "off (data.cache=false): prepared for this run only"
        made = self.meta.get("made", {})
        how = f"prepared in {made.get('seconds', 0):.1f} s on {made.get('host')} (pid {made.get('pid')})"
        if self.status == "prepared":
            return f"miss: prepared {self.key} ({how[len('prepared ') :]}) into {self.path}"
        waited = f", waited {self.waited:.1f} s for it" if self.waited >= 0.05 else ""
        return f"hit: reused {self.key} ({how}{waited}) from {self.path}"


def who() -> str:
    rank = os.environ.get("RANK")
    return f"rank {rank}" if rank is not None and int(os.environ.get("WORLD_SIZE", 1)) > 1 else "this run"


def announce(text: str) -> None:
    """One line every process prints (ranks included: who prepared, who reused)."""
    print(f"data: {who()}: {text}", flush=True)


def prepare(
    data: Any,
    parts: dict[str, Any] | None,
    build: Callable[[Workers], Prepared],
    num_proc: int,
) -> Outcome:
    """The entry of ``parts`` (the key's inputs): reused when it exists and is whole, else built by
    ``build`` under the key's lock and committed. ``parts=None`` (``data.cache=false``): built into a
    temporary dir, removed when the process exits."""
    root = cache_root(data)
    if parts is None:
        workers = Workers(_temporary(root), num_proc)
        return Outcome(build(workers), "off")
    key = key_of(parts)
    entry = root / key
    found = _open(entry, key)
    if not isinstance(found, str):
        announce(f"reusing the prepared data {key} ({entry})")
        return Outcome(found[0], "reused", key, entry, found[1])
    lock = root / f"{key}.lock"
    with _named_errors(root, damaged=found if found != ABSENT else None):
        root.mkdir(parents=True, exist_ok=True)
        lock.touch()
    start = time.monotonic()

    def waiting() -> None:
        holder = lock.read_text(errors="replace").strip() or "another process"
        announce(f"waiting for {holder} to prepare the data {key}")

    with file_lock(lock, on_wait=waiting):
        waited = time.monotonic() - start
        found = _open(entry, key)
        if not isinstance(found, str):
            announce(f"reusing the prepared data {key} (prepared by another process; waited {waited:.1f} s)")
            return Outcome(found[0], "reused", key, entry, found[1], waited)
        with _named_errors(root, damaged=found if found != ABSENT else None):
            lock.write_text(f"{who()} on {socket.gethostname()} (pid {os.getpid()})")
            if found != ABSENT:  # an entry that is not what was written: never served
                announce(f"the prepared data {key} is damaged ({found}); preparing it again")
                _remove(entry)
            announce(f"preparing the data {key} into {entry}")
            meta = _build(root, entry, key, parts, build, num_proc)
    found = _open(entry, key)
    if isinstance(found, str):
        raise RuntimeError(f"the data cache entry {entry} just written cannot be read back: {found}")
    return Outcome(found[0], "prepared", key, entry, meta)


def _build(
    root: Path,
    entry: Path,
    key: str,
    parts: dict[str, Any],
    build: Callable[[Workers], Prepared],
    num_proc: int,
) -> dict[str, Any]:
    """Prepare into ``.staging/<key>.<host>.<pid>``, keep what the datasets are, write ``meta.json`` last,
    sync, rename into place. Stale staging dirs of this key (a killed preparation) are removed first."""
    staging_root = root / STAGING
    staging_root.mkdir(parents=True, exist_ok=True)
    for stale in staging_root.glob(f"{key}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = staging_root / f"{key}.{socket.gethostname()}.{os.getpid()}"
    staging.mkdir()
    start = time.monotonic()
    try:
        prepared = build(Workers(staging / "work", num_proc))
        splits = {name: _persist(dataset, staging, name) for name, dataset in prepared.datasets.items()}
        kept = {f for spec in splits.values() for f in [*spec["files"], spec.get("indices")] if f}
        for path in sorted(staging.rglob("*"), reverse=True):  # intermediate files: not part of the entry
            relative = path.relative_to(staging).as_posix()
            if path.is_file() and relative not in kept:
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        meta = {
            "format": ENTRY_FORMAT,
            "key": key,
            "parts": parts,
            "splits": splits,
            "facts": prepared.facts,
            "made": {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "by": who(),
                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "seconds": round(time.monotonic() - start, 2),
                "bytes": sum((staging / f).stat().st_size for f in kept),
            },
        }
        _write_synced(staging / META, json.dumps(meta, indent=1, default=str).encode())
        for name in kept:
            _sync(staging / name)
        _sync(staging)
        staging.rename(entry)
        _sync(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return meta


def _remove(entry: Path) -> None:
    """Remove a damaged entry (a link in its place: the link only, never what it points at)."""
    if entry.is_symlink() or entry.is_file():
        entry.unlink()
    else:
        shutil.rmtree(entry)


@contextmanager
def _named_errors(root: Path, damaged: str | None = None) -> Iterator[None]:
    """A cache dir that cannot be written, or a full disk, as a ConfigError naming ``data.cache_dir``
    (and ``damaged``: why the entry there could not be used)."""
    from hydratune.components.config.errors import ConfigError

    why = f"its entry for this data is damaged ({damaged}) and " if damaged else ""
    try:
        yield
    except OSError as err:
        if err.errno in DISK_FULL:
            raise ConfigError(
                f"the disk of the data cache {root} is full ({err.strerror}); nothing was left half-written",
                key="data.cache_dir",
                hint="free it (hydratune cache clear), or point data.cache_dir at a disk with room",
            ) from None
        if err.errno in (errno.EACCES, errno.EROFS, errno.ENOTDIR, errno.EPERM, errno.EBUSY):
            raise ConfigError(
                f"{why}cannot write the data cache {root}: {err.strerror}",
                key="data.cache_dir",
                hint="point data.cache_dir (or $HYDRATUNE_DATA_CACHE) at a writable dir, or data.cache=false",
            ) from None
        raise


def _persist(dataset: Any, staging: Path, name: str) -> dict[str, Any]:
    """How the entry stores ``dataset``: its Arrow files in order, when it is exactly the files it was
    written as in ``staging`` (plus its index mapping, saved with numpy), else a contiguous copy."""
    import numpy as np

    spec: dict[str, Any] = {"rows": len(dataset), "features": dataset.features.to_dict(), "indices": None}
    files = _files_of(dataset.data, staging)
    if files is None:
        files = [_copy(dataset, staging / f"{name.replace('/', '-')}.arrow")]
    elif dataset._indices is not None:
        spec["indices"] = f"{name.replace('/', '-')}.indices.npy"
        np.save(staging / spec["indices"], dataset._indices.column(0).to_numpy())
    spec["files"] = [Path(f).relative_to(staging).as_posix() for f in files if f]
    named = [*spec["files"], *([spec["indices"]] if spec["indices"] else [])]
    spec["sha256"] = dict(zip(named, sha256s([staging / f for f in named]), strict=True))
    return spec


def _files_of(table: Any, staging: Path) -> list[str] | None:
    """The files of ``staging`` a ``datasets`` table is, in order (each whole, its columns unchanged), or
    None (an in-memory table, a slice, changed columns...)."""
    from datasets.table import ConcatenationTable, MemoryMappedTable

    blocks = table.blocks if isinstance(table, ConcatenationTable) else [[table]]
    files = []
    for row in blocks:
        if len(row) != 1 or not isinstance(row[0], MemoryMappedTable):
            return None
        block = row[0]
        path = Path(block.path).resolve()
        if staging.resolve() not in path.parents:
            return None
        whole = MemoryMappedTable.from_file(str(path))
        same = block.schema.remove_metadata().equals(whole.schema.remove_metadata())
        if block.num_rows != whole.num_rows or not same:
            return None
        files.append(str(path))
    return files


def _copy(dataset: Any, path: Path) -> str | None:
    """``dataset`` (through its index mapping) written to ``path`` a batch at a time; None when empty."""
    from datasets.arrow_writer import ArrowWriter

    if not len(dataset):
        return None
    writer = ArrowWriter(features=dataset.features, path=str(path))
    for batch in dataset.with_format("arrow").iter(batch_size=SHARD_ROWS):
        writer.write_table(batch)
    writer.finalize()
    writer.close()
    return str(path)


def _open(entry: Path, key: str) -> tuple[Prepared, dict[str, Any]] | str:
    """The entry's datasets memory-mapped and its meta when it is what was written, else why not
    (:data:`ABSENT` when there is none): the entry a plain dir, ``meta.json`` (written last) of this key
    (its parts give the key) and format, and every file of every split a plain file inside the entry with
    the sha256 it was written with (read once per open: components/config/files.py)."""
    if not entry.exists() and not entry.is_symlink():
        return ABSENT
    try:
        if entry.is_symlink():
            return f"{entry} is a symbolic link"
        meta = json.loads(inside(entry, META).read_text())
        if meta.get("format") != ENTRY_FORMAT:
            return f"written by another hydratune (entry format {meta.get('format')}, not {ENTRY_FORMAT})"
        if meta.get("key") != key or key_of(meta["parts"]) != key:
            return f"{META} is not this key's"
        for spec in meta["splits"].values():
            named = [*spec["files"], *([spec["indices"]] if spec.get("indices") else [])]
            if sorted(named) != sorted(spec["sha256"]):
                return f"{META} lists files without their sha256"
            problem = mismatch(entry, spec["sha256"])
            if problem is not None:
                return problem
        datasets = {name: _load(entry, name, spec) for name, spec in meta["splits"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # pyarrow's are among them
        return f"unreadable: {type(err).__name__}: {err}"
    return Prepared(datasets, meta.get("facts", {})), meta


def _load(entry: Path, name: str, spec: dict[str, Any]) -> Any:
    """One split of the entry, memory-mapped (its fingerprint: the entry's key and the split's name)."""
    import numpy as np
    from datasets import Dataset, Features

    features = Features.from_dict(spec["features"])
    if not spec["files"]:
        return Dataset.from_dict({c: [] for c in features}, features=features)
    fingerprint = hashlib.sha256(f"{entry.name}/{name}".encode()).hexdigest()[:16]
    table = open_shards([entry / f for f in spec["files"]], fingerprint)
    if spec.get("indices"):
        # int64: a selection of a selection (a pick of rows, then the eval split) saves uint64 indices
        indices = np.load(entry / spec["indices"]).astype(np.int64, copy=False)
        table = table.select(indices, keep_in_memory=True, new_fingerprint=f"{fingerprint[:12]}sel")
    return table


def _write_synced(path: Path, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())


def _sync(path: Path) -> None:
    """fsync a file or directory (the entry is whole on disk before it is renamed into place)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a filesystem that cannot sync a directory
        pass
    finally:
        os.close(fd)


_TEMPORARY: list[Path] = []


def _temporary(root: Path) -> Path:
    """A dir for ``data.cache=false``'s Arrow files, under ``<cache dir>/.tmp`` (removed at exit)."""
    import atexit
    import tempfile

    base = root / TEMPORARY
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}@{socket.gethostname()}.", dir=base))
    if not _TEMPORARY:
        atexit.register(lambda: [shutil.rmtree(p, ignore_errors=True) for p in _TEMPORARY])
    _TEMPORARY.append(path)
    return path


# ------------------------------------------------------------------------------------ ls and clear


def entries(root: Path) -> list[dict[str, Any]]:
    """Every entry under ``root`` with its meta (``None`` for one that is not whole), newest first."""
    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.is_dir() or not KEY.fullmatch(path.name):
            continue
        try:
            meta = json.loads((path / META).read_text())
        except (OSError, ValueError):
            meta = None
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        found.append({"key": path.name, "path": path, "meta": meta, "bytes": size})
    return sorted(found, key=lambda e: (e["meta"] or {}).get("made", {}).get("at", ""), reverse=True)


def clear(root: Path, keys: list[str] | None = None) -> list[str]:
    """Remove the entries ``keys`` (all: None) that no process is preparing, the stale staging and
    temporary dirs, and the remembered file hashes (all only); returns the removed keys."""
    removed = []
    for item in entries(root):
        if keys is not None and item["key"] not in keys:
            continue
        with _try_lock(root / f"{item['key']}.lock") as free:
            if not free:
                print(f"skipped {item['key']}: a process is preparing it", file=sys.stderr)
                continue
            shutil.rmtree(item["path"], ignore_errors=True)
            (root / f"{item['key']}.lock").unlink(missing_ok=True)
            removed.append(item["key"])
    if keys is None:
        _clear_leftovers(root)
    return removed


def _clear_leftovers(root: Path) -> None:
    """What killed runs left: staging dirs of keys no process is preparing, temporary dirs of processes
    of this host that are gone; and the remembered file hashes."""
    for staging in (root / STAGING).glob("*") if (root / STAGING).is_dir() else []:
        with _try_lock(root / f"{staging.name.split('.')[0]}.lock") as free:
            if free:
                shutil.rmtree(staging, ignore_errors=True)
    host = socket.gethostname()
    for temporary in (root / TEMPORARY).glob(f"*@{host}.*") if (root / TEMPORARY).is_dir() else []:
        if not alive(int(temporary.name.split("@")[0])):
            shutil.rmtree(temporary, ignore_errors=True)
    shutil.rmtree(root / "hashes", ignore_errors=True)
    for lock in root.glob("*.lock") if root.is_dir() else []:
        if not (root / lock.stem).exists():
            with _try_lock(lock) as free:
                if free:
                    lock.unlink(missing_ok=True)


class _try_lock:
    """Take ``path``'s flock if no process holds it: ``with _try_lock(p) as free``."""

    def __init__(self, path: Path) -> None:
        self.path, self.fd = path, -1

    def __enter__(self) -> bool:
        import fcntl

        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
