"""The throughput harness (bench/throughput.py) end to end in its CPU mode, so it never rots: one tiny run of
hydratune, TRL and the raw loop, each in its own process."""

from __future__ import annotations

import sys

from tests.support.data import REPO

sys.path.insert(0, str(REPO / "bench"))

import throughput


def test_cpu_mode_runs_all_three_implementations(tmp_path):
    out = tmp_path / "benchmarks.md"
    argv = ["--cpu", "--only", "sft_full/packed", "--steps", "3", "--warmup", "1", "--out", str(out)]
    rows = throughput.main([*argv, "--work", str(tmp_path / "work")])
    assert len(rows) == 1
    row = rows[0]
    for impl in throughput.IMPLS:
        res = row[impl]
        assert "error" not in res, res.get("error")
        assert res["tokens/s"] > 0 and res["step time (s)"] > 0, (impl, res)
        assert res["peak memory (GiB)"] > 0, (impl, res)
        assert 0 < res["mfu"] < 1, (impl, res)
    assert row["h/trl"] > 0 and row["h/raw"] > 0
    text = out.read_text()
    assert "<!-- bench:cpu -->" in text and "hydratune÷TRL" in text and "hydratune÷raw" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| sft_full | packed |"))
    assert "—" not in line.split("|")[3:8]
