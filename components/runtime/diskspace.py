"""Room on disk for checkpoints and the final model: checked before the model loads and before each save,
and a write that runs out anyway (``ENOSPC``, ``EDQUOT``, ``EFBIG`` under ``ulimit -f``) reported as
:class:`DiskFull`, a named error (exit 2) saying which whole checkpoint is left to resume from.

The expected sizes: before load, from the architecture numbers (``memory/spec.py``: no weights); at a save,
the last whole checkpoint's size on disk, else the model's parameters (+ Adam's two moments for a
checkpoint). The per-file limit (``RLIMIT_FSIZE``) is compared with the largest file a save writes.
"""

from __future__ import annotations

import errno
import re
import resource
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError

#: errno -> what it means for a save
DISK_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "a file would exceed the per-file size limit (ulimit -f)",
}
HINT = "free space there (or raise `ulimit -f`), or pass hydra.run.dir=<a disk with room>"


class DiskFull(ConfigError):
    """A save that cannot fit: the CLI prints it and exits 2, like every ConfigError."""

    def __init__(self, message: str, run_dir: Path | None = None) -> None:
        resume = last_checkpoint(run_dir) if run_dir else None
        if resume:
            message += f"; the last whole checkpoint is {resume} (resume={run_dir} continues from it)"
        super().__init__(message, key="hydra.run.dir", hint=HINT)


def last_checkpoint(run_dir: Path) -> Path | None:
    from hydratune.components.runtime.checkpoint import checkpoints_in

    found = checkpoints_in(run_dir) if (run_dir / "checkpoints").is_dir() else []
    return found[-1] if found else None


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def file_size_limit() -> int | None:
    """The per-file size limit of this process in bytes (``ulimit -f``); None: unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def ensure_room(directory: Path, total: int, largest: int, what: str, run_dir: Path | None = None) -> None:
    """Refuse a save of ``total`` bytes (its largest file: ``largest``) into ``directory`` that cannot fit."""
    free, limit = free_bytes(directory), file_size_limit()
    if total > free:
        raise DiskFull(
            f"{what} needs about {_mb(total)} and {directory} has {_mb(free)} free", run_dir or None
        )
    if limit is not None and largest > limit:
        raise DiskFull(
            f"{what} writes a file of about {_mb(largest)} and the per-file size limit (ulimit -f) is "
            f"{_mb(limit)}",
            run_dir or None,
        )


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


# ---- before load ------------------------------------------------------------------------------------


def planned_bytes(cfg: Any, comps: Any) -> tuple[int, int]:
    """(bytes on disk at the run's fullest, the largest file) from the architecture numbers: one whole
    checkpoint (weights + Adam's moments of the trainable parameters) next to the final model."""
    from hydratune.components.memory.arch import param_counts
    from hydratune.components.memory.spec import spec_from_config
    from hydratune.components.memory.states import optimizer_bytes

    # the groups the spec asks (built from their nodes otherwise) as the run already built them
    built = {group: getattr(comps, group) for group in ("peft", "optimizer", "quantization", "strategy")}
    spec = spec_from_config({**{key: cfg.get(key) for key in cfg}, **built})
    total_params = param_counts(spec.arch).total
    saved = total_params * spec.weight_bytes if spec.full_finetune else spec.trainable * 4
    moments = int(spec.trainable * optimizer_bytes(comps.optimizer.memory_kind, 4))
    final = saved * (2 if cfg.merge else 1)
    checkpoint = saved + moments if cfg.train.save_every > 0 else 0
    return final + checkpoint, max(saved, moments)


def check_room_before_load(cfg: Any, comps: Any, run_dir: Path) -> None:
    """The run dir's disk can hold a checkpoint and the final model (training recipes; before load)."""
    if comps.recipe.inference_only:
        return
    try:
        total, largest = planned_bytes(cfg, comps)
    except ConfigError:  # no architecture numbers offline: the check before each save still runs
        return
    ensure_room(run_dir, total, largest, "this run's checkpoint and final model")


# ---- before each save -------------------------------------------------------------------------------


def saved_bytes(model: Any) -> tuple[int, int]:
    """(bytes a save of ``model`` writes, of which trainable): the adapter alone for a PEFT model."""
    params = list(model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    whole = sum(p.numel() * p.element_size() for p in params)
    return (trainable if hasattr(model, "peft_config") else whole), trainable


def ensure_room_for_checkpoint(model: Any, checkpoints: Path, run_dir: Path) -> None:
    """Before a checkpoint: the last whole one's size on disk, else the weights and Adam's moments."""
    last = last_checkpoint(run_dir)
    if last is not None:
        files = [f.stat().st_size for f in last.rglob("*") if f.is_file()]
        total, largest = sum(files), max(files, default=0)
    else:
        weights, trainable = saved_bytes(model)
        total, largest = weights + 2 * trainable, max(weights, 2 * trainable)
    ensure_room(checkpoints, total, largest, "the next checkpoint", run_dir)


def ensure_room_for_final(model: Any, final: Path, merge: bool = False) -> None:
    """Before ``final/``: the model's saved weights (twice with ``merge``)."""
    weights, _ = saved_bytes(model)
    ensure_room(final.parent, weights * (2 if merge else 1), weights, "the final model", final.parent)


# ---- a write that runs out anyway -------------------------------------------------------------------


#: how libraries that do not raise OSError report one: safetensors' Rust I/O error carries the errno, torch's
#: zip writer (``torch.save``) only says a write came out short
OS_ERROR_TEXT = re.compile(r"os error (\d+)")
TORCH_WRITER = "inline_container.cc"


def disk_errno(err: BaseException) -> int | None:
    """The disk-space errno ``err`` reports (directly or in its text), else None."""
    if isinstance(err, OSError):
        return err.errno if err.errno in DISK_ERRORS else None
    found = OS_ERROR_TEXT.search(str(err))
    if found and int(found.group(1)) in DISK_ERRORS:
        return int(found.group(1))
    if isinstance(err, RuntimeError) and TORCH_WRITER in str(err):
        return errno.ENOSPC if file_size_limit() is None else errno.EFBIG
    return None


def as_disk_full(err: BaseException, run_dir: Path | None) -> DiskFull | None:
    """``err`` as a DiskFull when it reports a disk-space errno, else None."""
    code = disk_errno(err)
    if code is None:
        return None
    filename = getattr(err, "filename", None)
    where = f" writing {filename}" if filename else ""
    return DiskFull(f"{DISK_ERRORS[code]}{where}", run_dir)


@contextmanager
def disk_errors(run_dir: Path | None) -> Iterator[None]:
    """Turn a disk-space error raised inside into :class:`DiskFull` (others pass unchanged)."""
    try:
        yield
    except Exception as err:
        full = as_disk_full(err, run_dir)
        if full is None:
            raise
        raise full from err


def planned_run_dir() -> Path:
    """The run dir of this Hydra job (created by Hydra before the job), else the working directory."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()
