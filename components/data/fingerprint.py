"""What a run trains on, as a fingerprint: the sha256 of every local data file (``data.path``,
``data.eval_path``; a folder: each of its data files; with ``data.images=true``, every image file the rows
may name) and of the data config. Written into the run dir
before training (``data_fingerprint.json``), copied into every checkpoint's completion marker, and
compared on resume, so a run never continues silently on data edited since it was interrupted."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.files import CHUNK, file_sha256

log = logging.getLogger("hydratune")

#: the switch that accepts resuming on changed data
ALLOW = "resume_allow_data_change"
#: in the run dir: what the run trains on (copied into every checkpoint's completion marker)
DATA_FINGERPRINT = "data_fingerprint.json"


#: data knobs that change how the data is prepared, not what it is (left out of the fingerprint)
NOT_DATA = ("cache", "cache_dir", "num_proc")


def fingerprint(cfg: DictConfig) -> dict[str, Any]:
    """``{"config": sha256 of the data node, "files": {path: sha256}}``; a hub dataset: named only. A
    stream (``data.streaming``, possibly larger than a disk's worth of reading per run): each file's size
    and the sha256 of its first and last MiB."""
    node = OmegaConf.to_container(cfg.data, resolve=True)
    assert isinstance(node, dict)
    return fingerprint_node(node, FileHashes.for_data(node))


def fingerprint_node(node: dict[str, Any], hashes: FileHashes | None = None) -> dict[str, Any]:
    """:func:`fingerprint` of a data node (a dict); ``hashes``: where file hashes are remembered."""
    from hydratune.components.data.layout import looks_local

    hashes = hashes or FileHashes(None)
    files: dict[str, str] = {}
    given_paths = [node.get(key) for key in ("path", "eval_path")]
    given_paths += [entry.get(k) for entry in node.get("mixture") or [] for k in ("path", "eval_path")]
    for given in given_paths:
        if not given or given == "???":
            continue
        path = Path(str(given)).expanduser()
        if not (looks_local(str(given)) and path.exists()):
            files[str(given)] = "hub dataset (not hashed)"
            continue
        for file in files_under(path):
            files[str(file.resolve())] = ends_sha256(file) if node.get("streaming") else hashes.sha256(file)
    if node.get("images"):  # an image edited in place changes what the run trains on (images.py)
        files.update(image_files(given_paths, hashes))
    kept = {k: v for k, v in node.items() if k not in NOT_DATA}
    config = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()
    return {"config": config, "files": files}


def image_files(given_paths: list[Any], hashes: FileHashes) -> dict[str, str]:
    """The sha256 of every image file the local data files of ``given_paths`` may name
    (``images.referenced_files``: relative to each data file's folder or to a data.path folder)."""
    from hydratune.components.data.images import referenced_files
    from hydratune.components.data.layout import looks_local

    data_files, roots = [], []
    for given in given_paths:
        path = Path(str(given)).expanduser()
        if given and given != "???" and looks_local(str(given)) and path.exists():
            data_files += files_under(path)
            roots += [path] if path.is_dir() else []
    found = referenced_files(data_files, roots, hashes.root, hashes.sha256)
    return {str(p): hashes.sha256(p) if p.is_file() else "missing" for p in found}


def ends_sha256(path: Path) -> str:
    """A big file's quick fingerprint: its size and the sha256 of its first and last MiB."""
    size, digest = path.stat().st_size, hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(CHUNK))
        f.seek(max(0, size - CHUNK))
        digest.update(f.read(CHUNK))
    return f"{size} bytes, ends {digest.hexdigest()}"


class FileHashes:
    """The sha256 of data files, remembered under ``root`` (one small JSON file per path) with the file's
    size, mtime, ctime and inode: a file none of those changed for is not read again (any write changes
    its ctime, which no tool sets back). ``root=None``: every file hashed."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    @classmethod
    def for_data(cls, node: Any) -> FileHashes:
        """The index of the data cache a data node uses (none with ``data.cache=false``)."""
        return cls(cache_root(node) / "hashes" if node.get("cache", True) else None)

    def sha256(self, path: Path) -> str:
        stat = path.stat()
        stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]
        if self.root is None:
            return file_sha256(path)
        name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
        record = self.root / f"{name}.json"
        try:
            known = json.loads(record.read_text())
            if known["stamp"] == stamp and known["path"] == str(path.resolve()):
                return str(known["sha256"])
        except (OSError, ValueError, KeyError):
            pass
        digest = file_sha256(path)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            staged = record.with_suffix(f".{os.getpid()}.tmp")
            staged.write_text(json.dumps({"path": str(path.resolve()), "stamp": stamp, "sha256": digest}))
            staged.replace(record)
        except OSError as err:  # a read-only cache still hashes
            log.debug("could not remember the hash of %s: %s", path, err)
        return digest


def cache_root(data: Any) -> Path:
    """The prepared-data cache dir (components/data/prepared_cache.py) of a data component or node:
    ``data.cache_dir``, ``$HYDRATUNE_DATA_CACHE``, or ``$HYDRATUNE_CACHE/data`` (default
    ``~/.cache/hydratune/data``); the file hashes are remembered there too. A relative dir is the working
    dir's (made absolute here: the entries' files are named relative to it)."""
    from hydratune.components.modeling.gguf import cache_home

    given = data.get("cache_dir") if isinstance(data, dict) else getattr(data, "cache_dir", None)
    given = given or os.environ.get("HYDRATUNE_DATA_CACHE")
    root = Path(str(given)).expanduser() if given else cache_home() / "data"
    return Path(os.path.abspath(root))


def files_under(path: Path) -> list[Path]:
    """``path`` itself, or every file under the folder (hidden ones skipped): whatever of it a run reads."""
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


def write(cfg: DictConfig, run_dir: Path) -> None:
    """``data_fingerprint.json`` in ``run_dir``, for the checkpoints this run will write."""
    (run_dir / DATA_FINGERPRINT).write_text(json.dumps(fingerprint(cfg), indent=1))


def changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints: the data files whose bytes changed, appeared or went, and
    the data config."""
    a, b = old.get("files", {}), new.get("files", {})
    problems = [f"{p} changed" for p in sorted(a) if p in b and a[p] != b[p]]
    problems += [f"{p} is new" for p in sorted(b) if p not in a]
    problems += [f"{p} is gone" for p in sorted(a) if p not in b]
    if old.get("config") != new.get("config"):
        problems.append("the data config changed")
    return problems


def check(checkpoint: Path, recorded: dict[str, Any] | None, cfg: DictConfig) -> None:
    """Refuse to resume ``checkpoint`` (``recorded``: the fingerprint its completion marker holds) on other
    data than it was trained on (unless :data:`ALLOW`)."""
    if recorded is None:
        log.warning(
            "checkpoint %s records no data fingerprint (older hydratune): data not compared", checkpoint
        )
        return
    problems = changed(recorded, fingerprint(cfg))
    if not problems:
        return
    if cfg.get(ALLOW, False):
        log.warning("resuming %s on changed data (%s=true): %s", checkpoint, ALLOW, "; ".join(problems))
        return
    raise ConfigError(
        f"the data differs from what {checkpoint} was trained on: {'; '.join(problems)}",
        key="data.path",
        hint=f"restore the data it was trained on, or pass {ALLOW}=true to continue on the new data",
    )
