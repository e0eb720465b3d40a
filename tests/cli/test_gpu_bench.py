"""bench/gpu/run.sh, the one prepared GPU call (issue 38), cannot rot before a GPU comes: its dry run goes
through the same code on CPU (every row, both implementations, the estimate, the GPU tier's pytest; each
process forked from the call once its imports are done, bench/throughput.py's ``preload``) and writes what the
GPU call would; the goals are judged as the issue states them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import TIMEOUT, child_env

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("gpu-out")
    env = child_env({"OUT": str(out), "PYTHON": sys.executable, "COMMIT": "abc123"})
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", "bench/gpu/run.sh", "--dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    return out, proc


def test_the_dry_run_measures_every_row_and_writes_the_call_s_files(dry_run) -> None:
    out, proc = dry_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"results.json", "results.md", "gpu_tests.txt", "gpu_tests.xml"} <= set(files)
    doc = json.loads((out / "results.json").read_text())
    meta = doc["meta"]
    assert meta["dry_run"] and meta["commit"] == "abc123" and meta["versions"]["trl"] != "not installed"
    rows = {r["variant"]: r for r in doc["rows"]}
    assert list(rows) == ["sft_full", "sft_lora", "dpo", "zero3", "fsdp"]
    for name in ("sft_full", "sft_lora", "dpo", "zero3"):
        h = rows[name]["hydratune"]
        assert h["tokens/s"] > 0 and h["peak memory (GiB)"] > 0, h
        assert h["estimate (GiB)"] > 0 and isinstance(h["estimate error (%)"], float), h  # the estimate ran
    for name in ("sft_full", "sft_lora", "dpo"):
        trl = rows[name]["trl"]
        assert trl["tokens/s"] > 0 and trl["trl args"]["gradient_checkpointing"] is False, trl
        assert trl["trl args"].get("packing", False) is (name != "dpo")
        assert "verdict" in rows[name] and rows[name]["h/trl"] > 0
    assert "trl" not in rows["zero3"] and rows["zero3"]["vs sft_full"] > 0
    assert "strategy=zero3" in rows["zero3"]["hydratune"]["command"]
    assert "FSDP needs GPUs" in rows["fsdp"]["hydratune"]["error"]  # on CPU it is refused, as it should be
    table = (out / "results.md").read_text()
    assert "Dry run on CPU" in table and "| sft_full |" in table and "| fsdp |" in table
    assert "skipped" in doc["tests"] and "needs a CUDA GPU" in (out / "gpu_tests.txt").read_text()  # -rs


def test_without_a_gpu_the_real_call_says_so() -> None:
    env = child_env({"PYTHON": sys.executable, "OUT": os.devnull + "-unused"})
    proc = subprocess.run(["bash", "bench/gpu/run.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and "--dry-run" in proc.stderr


def result(tps: float | None, peak: float = 10.0, **more) -> dict:
    return {"tokens/s": tps, "peak memory (GiB)": peak, **more}


def test_the_goals_are_judged_as_the_issue_states_them() -> None:
    from gpu.run import judged

    rows = [
        {"variant": "sft_full", "goal": "g", "hydratune": result(131, 9.0), "trl": result(100, 10.0)},
        {"variant": "sft_lora", "goal": "g", "hydratune": result(119), "trl": result(100)},
        {
            "variant": "dpo",
            "goal": "g",
            "hydratune": result(126, **{"estimate error (%)": -16.0}),
            "trl": result(100),
        },
        {"variant": "zero3", "goal": "g", "hydratune": result(110, **{"estimate error (%)": 14.9})},
        {"variant": "fsdp", "goal": "g", "hydratune": {"error": "boom"}},
    ]
    judged(rows)
    verdicts = {r["variant"]: r["verdict"].split()[0] for r in rows}
    assert verdicts == {
        "sft_full": "met",
        "sft_lora": "MISSED",
        "dpo": "met",
        "zero3": "MISSED",
        "fsdp": "MISSED",
    }
    assert rows[2]["estimate within ±15 %"] is False and rows[3]["estimate within ±15 %"] is True
    rows[0]["hydratune"]["peak memory (GiB)"] = 10.5  # faster, but above TRL's peak memory
    judged(rows)
    assert rows[0]["verdict"].startswith("MISSED")
    rows[0]["hydratune"].update({"peak memory (GiB)": 9.0, "tokens/s": 129})  # less memory, 1.29 x: short
    judged(rows)
    assert rows[0]["verdict"].startswith("MISSED")
