"""Files hydratune writes once and reads back later (prepared-data cache entries, checkpoints, GGUF
conversions): their sha256, a lock around writing them, and the check that what is read back is what was
written — the recorded digest of every file, each file a plain file inside its own folder (no symlink, no
absolute or ``..`` name), so a damaged, edited, swapped or planted file is never trusted.

What this guards against is damage and mix-ups (a truncated or edited file, two entries' files swapped,
a link to a file elsewhere); someone with write access to a folder can still rewrite a file *and* its
record: a shared cache is as trustworthy as the permissions of its folder.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath

CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256s(paths: list[Path]) -> list[str]:
    """:func:`file_sha256` of each path, files hashed in parallel threads (hashlib releases the GIL): a
    folder of many shards is hashed at the disk's speed rather than one core's (~0.35-1 GB/s)."""
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(8, len(paths), os.cpu_count() or 1))
    if workers == 1:
        return [file_sha256(p) for p in paths]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(file_sha256, paths))


def inside(folder: Path, name: str) -> Path:
    """``folder / name`` when ``name`` is a relative path with no ``..`` that reaches a plain file through
    no symbolic link (``folder`` itself included); else ValueError saying which rule it breaks."""
    relative = PurePosixPath(name)
    if not name or relative.is_absolute() or ".." in relative.parts or "\\" in name:
        raise ValueError(f"{name!r} is not a plain relative name inside {folder}")
    path = folder
    for part in ("", *relative.parts):
        path = path / part if part else path
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            raise ValueError(f"{name} is missing") from None
        if stat.S_ISLNK(mode):
            raise ValueError(f"{path} is a symbolic link (only plain files are trusted)")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{name} is not a plain file")
    return path


def mismatch(folder: Path, digests: dict[str, str]) -> str | None:
    """None when every file ``digests`` names is a plain file inside ``folder`` (:func:`inside`) with that
    sha256, else what is wrong with the first one that is not."""
    try:
        paths = [inside(folder, name) for name in digests]
    except ValueError as err:
        return str(err)
    for name, found in zip(digests, sha256s(paths), strict=True):
        if found != digests[name]:
            return f"{name} does not match the sha256 recorded when it was written (its bytes changed)"
    return None


class file_lock:
    """An exclusive ``flock`` on ``path`` (POSIX; a no-op where fcntl is missing). ``on_wait`` is called
    once when another process holds it (then this one waits)."""

    def __init__(self, path: Path, on_wait: Callable[[], None] | None = None) -> None:
        self.path, self.on_wait = path, on_wait
        self.fd: int | None = None

    def __enter__(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if self.on_wait is not None:
                self.on_wait()
            fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
