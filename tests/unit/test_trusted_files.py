"""Files read back and trusted (components/config/files.py): a record naming a file outside its folder
(absolute, ``..``, through a link) or a file whose bytes changed is never trusted — checkpoints' completion
markers and DeepSpeed's ``latest`` included. (The prepared-data cache: tests/integration/test_datacache.py;
GGUF conversions: tests/real/test_real_model.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hydratune.components.config.files import inside, mismatch
from hydratune.components.runtime.checkpoint import COMPLETE, mark_complete, verify


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    folder = tmp_path / "run" / "checkpoints" / "checkpoint-2"
    (folder / "global_step2").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "latest").write_text("global_step2")  # DeepSpeed's marker: the tag it loads
    (folder / "global_step2" / "state.pt").write_bytes(b"state")
    mark_complete(folder, 2)
    return folder


def test_a_whole_checkpoint_passes(checkpoint: Path) -> None:
    assert verify(checkpoint) is None and verify(checkpoint, content=True) is None


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/hostname", "global_step2/../../outside.bin"])
def test_a_marker_naming_a_file_outside_the_checkpoint_is_not_followed(checkpoint: Path, name: str) -> None:
    outside = checkpoint.parent / "outside.bin"
    outside.write_bytes(b"planted")
    record = json.loads((checkpoint / COMPLETE).read_text())
    record["files"][name] = outside.stat().st_size
    (checkpoint / COMPLETE).write_text(json.dumps(record))
    assert "not a plain relative name" in verify(checkpoint)


def test_a_linked_or_edited_file_is_not_trusted(checkpoint: Path, tmp_path: Path) -> None:
    latest = checkpoint / "latest"
    latest.write_text("global_stepX")  # same size, other tag: DeepSpeed would load another dir
    assert verify(checkpoint) is None  # sizes alone cannot see it
    assert "does not match the sha256" in verify(checkpoint, content=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("global_step2")
    latest.unlink()
    latest.symlink_to(elsewhere)
    assert "symbolic link" in verify(checkpoint)


def test_a_linked_folder_is_not_entered(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "a").write_bytes(b"x")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ValueError, match="symbolic link"):
        inside(tmp_path / "link", "a")
    assert inside(real, "a") == real / "a"
    assert "missing" in mismatch(real, {"b": "0" * 64})
