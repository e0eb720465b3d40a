"""The summary's peak memory on CPU is the run's own process's, not the high-water mark it inherits."""

from __future__ import annotations

import subprocess
import sys

from tests.support.cli import child_env


def test_peak_memory_is_not_inherited_from_the_parent() -> None:
    # Linux keeps ru_maxrss across exec: a child of a parent that once held 1 GiB reported >= 1 GiB
    held = bytearray(2**30)
    held[:: 2**12] = b"\x01" * (2**30 // 2**12)  # touch every page: resident
    code = "from hydratune.components.runtime.run import peak_memory_gb; print(peak_memory_gb('cpu'))"
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True)
    del held
    assert out.returncode == 0, out.stderr
    assert 0 < float(out.stdout) < 0.75, out.stdout  # the child's own: a Python with torch imported
