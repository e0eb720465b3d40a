"""A reward server that fails mid-run, through the ``hydratune`` command: the exit code (76), the one line
that names the server and the resume command, no traceback, and the resume that finishes the run (the
server: tests/integration/test_rewards.py's, a real local HTTP server in a thread)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_rewards import GRPO, serving

server = pytest.fixture(serving)


def test_grpo_checkpoints_when_the_server_fails_mid_run_and_resumes(hydratune, server, tmp_path) -> None:
    """The issue's probe: NaN, a wrong count, a timeout after the retries ended mid-run in a
    RewardServerError traceback, exit 1. Now: step 2's answer is malformed, the run checkpoints step 1 and
    exits 76 with the resume command (no traceback); resumed once the server answers, it finishes."""
    server.bad, server.good = "malformed", 1
    run = tmp_path / "outputs" / "day" / "grpo"
    args = [*GRPO, "train.max_steps=2", "recipe.reward_funcs=[]", f"recipe.reward_url={server.url}"]
    proc = hydratune(*args, f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 76 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("hydratune: "))
    assert line.startswith(f"hydratune: {server.url} answered no JSON"), line
    assert f"checkpoint: {run}/checkpoints/checkpoint-1. Resume with: hydratune resume={run}" in line
    assert "resume=" in (run / "summary.md").read_text()
    server.bad = None
    resumed = hydratune(f"resume={run}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    done = Path(resumed.stdout.split("run dir: ")[-1].strip())
    assert (done / "final").is_dir() and "resumed from" in (done / "summary.md").read_text()
