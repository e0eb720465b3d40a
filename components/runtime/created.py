"""What this run created on disk, so that cleaning up after an early stop removes only that.

The run-dir check (components/runtime/hydra_dirs.py ``RunDirCheck``) calls :func:`remember` for the run dir
(or the sweep dir) before anything creates it: the highest folder that did not exist yet, and the entries the
dir already held (a pinned ``hydra.run.dir`` may be a folder the user made). :func:`remove_unused` then
removes the entries this run added (when every one of them is start-up clutter), the folders it created, and
never anything that was there before: not a pinned run dir's parent, not a mount point, not a user's empty
folder.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Made:
    """A dir this run writes into: ``top`` the highest folder this run created for it (None: it existed),
    ``before`` the names it held before this run."""

    path: Path
    top: Path | None
    before: frozenset[str]


#: every dir :func:`remember` was called for in this process (the run dir, a sweep dir)
MADE: list[Made] = []


def remember(path: Path) -> Made:
    """Record ``path`` before this run creates or writes it."""
    path = Path(os.path.abspath(path))
    top = None
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            break
        top = folder
    before = frozenset(os.listdir(path)) if path.is_dir() else frozenset()
    made = Made(path, top, before)
    MADE.append(made)
    return made


def record_of(path: Path) -> Made | None:
    """What this run created at ``path``: its own record, or one derived from a recorded dir above it (a
    sweep point's dir under the sweep dir); None when this process recorded nothing there."""
    path = Path(os.path.abspath(path))
    for made in reversed(MADE):
        if made.path == path:
            return made
        if made.path in path.parents:
            first = made.path / path.relative_to(made.path).parts[0]
            if made.top is None and first.name in made.before:
                return None  # under an entry that was there before this run: not ours
            return Made(path, made.top or first, frozenset())
    return None


def remove_unused(path: Path, unused: Callable[[Path], bool]) -> bool:
    """Remove what this run added at ``path`` when ``unused`` says so of every entry it added: the dir and
    the folders above it up to the highest one this run created (those left empty), or, in a dir that
    existed before, only the added entries. Nothing recorded at ``path``: nothing removed. True when
    something was."""
    made = record_of(path)
    path = Path(os.path.abspath(path))
    if made is None or not path.is_dir():
        return False
    added = [p for p in path.iterdir() if p.name not in made.before]
    if not all(unused(p) for p in added):
        return False
    if made.top is None:
        for entry in added:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        return bool(added)
    shutil.rmtree(path, ignore_errors=True)
    for folder in path.parents:
        if not (made.top == folder or made.top in folder.parents):
            break
        try:
            folder.rmdir()  # only when empty: another run may have written there meanwhile
        except OSError:
            break
    return True
