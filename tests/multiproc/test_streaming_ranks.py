"""``data.streaming=true`` on two ranks: each trains on its own rows, disjoint, together covering the data."""

from __future__ import annotations

import json
from pathlib import Path

from hydratune.components.data.feed import TRACE
from tests.integration.test_streaming import RUN, chat, write_jsonl
from tests.support.cells import FORK
from tests.support.runs import read_jsonl


def test_two_ranks_train_on_disjoint_rows(tmp_path: Path, warm) -> None:
    """DDP on 2 CPU ranks, streaming one file: each rank trains on its own rows (row i to rank i % 2), none
    on the other's; both end with the same weights; the summary counts each rank's rows."""
    path = write_jsonl(tmp_path / "rows.jsonl", [chat(i) for i in range(40)])
    run, trace = tmp_path / "ddp", tmp_path / "trace"
    trace.mkdir()
    args = [
        *RUN,
        "train.save_every=0",
        "strategy=ddp",
        "launcher.nproc_per_node=2",
        FORK,  # forked from the warm server, its workers forked from it: how they start is not the point
        f"data.path={path}",
        f"data.eval_path={path}",
    ]
    proc = warm(*args, "train.max_steps=4", f"hydra.run.dir={run}", cwd=tmp_path, env={TRACE: str(trace)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [read_jsonl(trace / f"rank{rank}.jsonl") for rank in (0, 1)]  # the feed's trace
    assert len(rows[0]) == len(rows[1]) == 32
    keys = [{(r["epoch"], r["index"]) for r in ranked} for ranked in rows]
    assert not keys[0] & keys[1]
    assert all((index - 1) % 2 == rank for rank in (0, 1) for _, index in keys[rank])
    weights = [json.loads((run / f".rank{r}.weights.json").read_text())["sha256"] for r in (0, 1)]
    assert weights[0] == weights[1]
    result = json.loads((run / "result.json").read_text())
    assert result["run"]["live strategy"] == "MULTI_CPU, 2 process(es)"
    per_rank = result["data"]["streamed (per rank)"]
    assert "rank 0: 32 rows trained" in per_rank and "rank 1: 32 rows trained" in per_rank
    assert result["data"]["stream split across ranks"].startswith("2 ranks: rows dealt in turn")
