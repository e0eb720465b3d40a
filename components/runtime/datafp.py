"""What a run trains on, as a fingerprint: the sha256 of every local data file (``data.path``,
``data.eval_path``; a folder: each of its data files) and of the data config. Written into the run dir
before training (``data_fingerprint.json``), copied into every checkpoint's completion marker, and
compared on resume, so a run never continues silently on data edited since it was interrupted."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from components.config.errors import ConfigError
from components.runtime.checkpoint import CHUNK, DATA_FINGERPRINT, file_sha256, manifest

log = logging.getLogger("hydratune")

#: the switch that accepts resuming on changed data
ALLOW = "resume_allow_data_change"


def fingerprint(cfg: DictConfig) -> dict[str, Any]:
    """``{"config": sha256 of the data node, "files": {path: sha256}}``; a hub dataset: named only. A
    stream (``data.streaming``, possibly larger than a disk's worth of reading per run): each file's size
    and the sha256 of its first and last MiB."""
    from components.data import looks_local

    node = OmegaConf.to_container(cfg.data, resolve=True)
    files: dict[str, str] = {}
    given_paths = [cfg.data.get(key) for key in ("path", "eval_path")]
    given_paths += [entry.get(k) for entry in cfg.data.get("mixture") or [] for k in ("path", "eval_path")]
    for given in given_paths:
        if not given or given == "???":
            continue
        path = Path(str(given)).expanduser()
        if not (looks_local(str(given)) and path.exists()):
            files[str(given)] = "hub dataset (not hashed)"
            continue
        for file in files_under(path):
            files[str(file.resolve())] = ends_sha256(file) if cfg.data.get("streaming") else file_sha256(file)
    config = hashlib.sha256(json.dumps(node, sort_keys=True, default=str).encode()).hexdigest()
    return {"config": config, "files": files}


def ends_sha256(path: Path) -> str:
    """A big file's quick fingerprint: its size and the sha256 of its first and last MiB."""
    size, digest = path.stat().st_size, hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(CHUNK))
        f.seek(max(0, size - CHUNK))
        digest.update(f.read(CHUNK))
    return f"{size} bytes, ends {digest.hexdigest()}"


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


def check(checkpoint: Path, cfg: DictConfig) -> None:
    """Refuse to resume ``checkpoint`` on other data than it was trained on (unless :data:`ALLOW`)."""
    recorded = (manifest(checkpoint) or {}).get("data")
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
