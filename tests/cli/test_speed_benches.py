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


def test_the_thread_bench_times_each_wait_setting_beside_a_neighbour() -> None:
    """bench/threads_cpu.py (the measurement behind the thread policy): two wait settings, one round of 3
    timed steps, a busy neighbour beside them; each child ran under its own setting and the table names
    both."""
    script = REPO / "bench" / "threads_cpu.py"
    out = subprocess.run(
        [sys.executable, str(script), "--rounds", "1", "--only", "tiny", "--settings", "PASSIVE,SPIN1k",
         "--neighbours", "1", "--steps", "3"],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["setting"] for r in rows] == ["PASSIVE", "SPIN1k"] and all(r["step s"] > 0 for r in rows)
    assert "1 busy neighbour process(es)" in out.stdout and "| SPIN1k ÷ PASSIVE |" in out.stdout


def test_the_step_profiler_records_the_asked_steps_of_a_hydratune_run(tmp_path) -> None:
    """bench/profile_steps.py (where a step's time goes, docs/benchmarks.md): the tiny SFT job under it, steps
    2-3 recorded; the table names the operators of a forward + backward and the run itself finishes."""
    out = tmp_path / "sft"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "profile_steps.py"), "--out", str(out), "--steps", "2-3", "--",
         "-m", "hydratune", "train.max_steps=4", "train.eval_generations=0", "train.eval_every=0",
         "train.save_every=0", "train.write_plots=false", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (out.parent / "sft.txt").read_text()
    assert "from the start of training_step call 2 to the end of call 3" in table, table[:800]
    assert "aten::mm" in table
    assert "Backward" in table  # the backward ran in the recorded steps (ChunkedLogProbFunctionBackward)
    assert (tmp_path / "run" / "result.json").is_file()
