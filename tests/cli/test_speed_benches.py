"""bench/precision_cpu.py (the measurement behind precision=auto's CPU threshold) runs, so it never rots: one
small shape, fp32 and bf16 alternated, in its own process."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.data import REPO


def test_the_precision_bench_times_fp32_and_bf16() -> None:
    script = REPO / "bench" / "precision_cpu.py"
    out = subprocess.run(
        [sys.executable, str(script), "--only", "h32x2", "--reps", "2", "--batch", "2", "--seq", "16"],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    row = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    assert row["shape"] == "h32x2" and row["fp32 s"] > 0 and row["bf16 s"] > 0, row
    assert row["bf16 / fp32"] > 0 and row["bf16 / fp32 (CPU time)"] > 0
    assert "| h32x2 |" in out.stdout  # the markdown table docs/benchmarks.md quotes
