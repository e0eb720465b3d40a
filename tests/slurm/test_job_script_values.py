"""The generated job script's quoting, read by the real ``sbatch`` (the ``slurm`` tier: a cluster that
answers, ``sudo scripts/slurm_cluster.sh up``): a job name and a run dir with quotes, ``$(…)`` and spaces
reach SLURM as they were given, and nothing in them runs. The job is submitted held and cancelled: it never
starts, so this costs a second. And a 1-point sweep through hydra-submitit-launcher leaves no secret in
its sweep dir, submitit's pickled job files included."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.slurm.test_slurm import cluster_problem, queue

ODD = 'it\'s a "test" $(touch M) `touch M`'  # M: a marker, in whatever dir something would run it


def test_sbatch_reads_the_quoted_values_as_given(compose_cfg, tmp_path: Path, monkeypatch) -> None:
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)
    from hydratune.components.distributed.slurm import sbatch_script
    from hydratune.components.runtime.run import Components

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / f"run {ODD}"
    run_dir.mkdir()
    name = f"hydratune-test-{os.getpid()} {ODD}"
    comps = Components.from_config(compose_cfg("launcher=slurm", "launcher.gpus_per_node=0"))
    script = run_dir / "slurm.sbatch"
    script.write_text(sbatch_script(comps.launcher, run_dir, "hydratune.recipes.worker", name))
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


def test_a_submitit_sweeps_job_files_hold_no_secret(tmp_path: Path) -> None:
    """``hydra.job.env_copy=[WANDB_API_KEY]`` and ``+hydra.job.env_set.HF_TOKEN=…`` through
    hydra-submitit-launcher: submitit pickles each job (its config, Hydra's state) and its result into the
    sweep dir; none of its files holds either value, and the job still has both variables."""
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)
    from tests.support.cli import fresh

    key, token = "hydratune-fake-wandb-key-0123456789", "hf_fake_token_0123456789"
    sweep = tmp_path / "sweep"
    name = f"hydratune-test-{os.getpid()}"
    try:
        proc = fresh(
            "-m", "launcher=slurm", "hydra/launcher=submitit_slurm", f"hydra.launcher.name={name}",
            "hydra.job.env_copy=[WANDB_API_KEY]", f"+hydra.job.env_set.HF_TOKEN={token}",
            "train.max_steps=2", "train.eval_generations=0", "train.eval_every=0", "train.save_every=0",
            "train.write_plots=false", f"hydra.sweep.dir={sweep}",
            cwd=tmp_path, env={"WANDB_API_KEY": key}, timeout=300,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the 1-point sweep did not end in 300 s; the queue:\n{queue()}") from None
    finally:  # a job left in the queue would hold the node for the tests after this one
        subprocess.run(["scancel", "--name", name], check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = [p for p in sweep.rglob("*") if p.is_file()]
    assert any(p.suffix == ".pkl" for p in files) and (sweep / "0" / "final").is_dir()
    assert not [p for p in files if key.encode() in p.read_bytes() or token.encode() in p.read_bytes()]
    environment = json.loads((sweep / "0" / "versions.json").read_text())["environment"]
    assert environment["WANDB_API_KEY"] == environment["HF_TOKEN"] == "<set>"  # the job had both
