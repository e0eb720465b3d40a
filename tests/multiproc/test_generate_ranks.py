"""recipe=generate on two processes equals one process (the same generations, in input order), with one
summary that counts every rank's tokens once."""

from __future__ import annotations

import re

from tests.conftest import GENERATE
from tests.support.cells import FORK
from tests.support.runs import read_jsonl


def test_generate_on_two_processes_equals_one_process(sft_runs, greedy_one_process, tmp_path, warm) -> None:
    """(Forked from the tier's warm server, its workers forked from it: how they start is not the point.)"""
    proc = warm(
        *GENERATE,
        f"model.from_run={sft_runs['full']}",
        "launcher.nproc_per_node=2",
        FORK,
        "hydra.run.dir=out",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = read_jsonl(tmp_path / "out" / "generations.jsonl")
    assert two == greedy_one_process
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| processes | 2 |" in summary and "| prompts | 64 |" in summary
    rows = [line.split("|")[1].strip() for line in summary.splitlines() if line.startswith("|")]
    rows = [row for row in rows if row not in ("", "---")]  # the key | value tables' header lines
    assert len(rows) == len(set(rows)), f"a row is shown twice: {sorted(rows)}"  # each thing once
    assert "None" not in summary and "global batch" not in summary  # nothing unmeasured or meaningless
    rate = float(re.search(r"\| tokens/s \(all processes\) \| ([\d.]+) \|", summary)[1])
    tokens = int(re.search(r"\| tokens generated \| (\d+) \|", summary)[1])
    assert rate > 0 and tokens == sum(r["tokens"] for r in two)
    assert not list((tmp_path / "out").glob(".generations*")), "per-rank shards left behind"
