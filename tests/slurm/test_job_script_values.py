"""The generated job script's quoting, read by the real ``sbatch`` (the ``slurm`` tier: a cluster that
answers, ``sudo scripts/slurm_cluster.sh up``): a job name and a run dir with quotes, ``$(…)`` and spaces
reach SLURM as they were given, and nothing in them runs. The job is submitted held and cancelled: it never
starts, so this costs a second."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.slurm.test_slurm import cluster_problem

ODD = 'it\'s a "test" $(touch M) `touch M`'  # M: a marker, in whatever dir something would run it


def test_sbatch_reads_the_quoted_values_as_given(compose_cfg, tmp_path: Path, monkeypatch) -> None:
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)
    from components.distributed.slurm import sbatch_script
    from components.runtime.run import Components

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / f"run {ODD}"
    run_dir.mkdir()
    name = f"hydratune-test-{os.getpid()} {ODD}"
    comps = Components.from_config(compose_cfg("launcher=slurm", "launcher.gpus_per_node=0"))
    script = run_dir / "slurm.sbatch"
    script.write_text(sbatch_script(comps.launcher, run_dir, "recipes.worker", name))
    submitted = subprocess.run(
        ["sbatch", "--hold", "--parsable", str(script)], capture_output=True, text=True, check=False
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        shown = subprocess.run(
            ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True
        ).stdout
    finally:
        subprocess.run(["scancel", job], check=False)
    assert f"JobName={name} " in shown, shown
    assert f"StdOut={run_dir.resolve()}/slurm-{job}.out" in shown, shown
    assert not list(tmp_path.rglob("M"))
