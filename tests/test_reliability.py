"""Interruption, exact resume, atomic checkpoints, bad data, bad configs, secrets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from components.checkpoint import COMPLETE, checkpoints_in, resolve_resume, verify
from components.errors import EXIT_INTERRUPTED, ConfigError
from components.resume import resolve

RUN = [
    "train.max_steps=60",
    "train.micro_batch_size=8",
    "train.log_every=1",
    "train.save_every=0",
    "train.eval_every=0",
    "train.eval_generations=0",
    "train.write_plots=false",
]


def start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "recipes", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_step(cwd: Path, step: int, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Block until some run under ``cwd`` has logged ``step`` (the process is mid-training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for metrics in cwd.glob("outputs/*/*/metrics.jsonl"):
            lines = metrics.read_text().splitlines()
            if any(json.loads(line).get("step", 0) >= step for line in lines if line.strip()):
                return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    raise AssertionError("training never reached the step")


def final_model(cwd: Path, exclude: set[Path] = frozenset()) -> tuple[Path, dict[str, torch.Tensor]]:
    (run,) = [
        p.parent.parent
        for p in cwd.glob("outputs/*/*/final/model.safetensors")
        if p.parent.parent not in exclude
    ]
    return run, load_file(run / "final" / "model.safetensors")


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_matches_uninterrupted(tmp_path: Path) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    reference = start(straight, *RUN)
    victim = start(interrupted, *RUN)
    wait_for_step(interrupted, 5, victim)
    victim.send_signal(signal.SIGTERM)
    _, err = victim.communicate(timeout=120)
    assert victim.returncode == EXIT_INTERRUPTED, err[-2000:]
    assert "Resume with" in err
    (run,) = interrupted.glob("outputs/*/*")
    (checkpoint,) = checkpoints_in(run)
    assert verify(checkpoint) is None and 5 <= int(checkpoint.name.split("-")[1]) < 60
    assert not (run / "final").exists()
    assert "interrupted" in (run / "summary.md").read_text()

    advice = re.search(r"Resume with: hydratune (resume=\S+)", err)
    assert advice and advice.group(1) == f"resume={run}", err[-2000:]
    resumed = start(interrupted, advice.group(1))  # the printed advice alone: the run's own config
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    assert f"continuing {run} with its own config" in err
    assert reference.wait(timeout=300) == 0
    _, expected = final_model(straight)
    _, got = final_model(interrupted)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def test_second_signal_exits_at_once() -> None:
    code = (
        "import os, signal\n"
        "from components.interrupt import GracefulInterrupt\n"
        "g = GracefulInterrupt().install()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "assert g.requested\n"
        "print('first: graceful', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('second: survived', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "first: graceful" in proc.stdout and "survived" not in proc.stdout
    assert proc.returncode == -signal.SIGTERM
    assert "send SIGTERM again to stop at once" in proc.stderr


def test_checkpoints_are_atomic_and_damaged_ones_are_skipped(run_recipe, monkeypatch) -> None:
    steps = ["train.max_steps=6", "train.save_every=2", "train.keep_last=2", "train.eval_generations=0"]
    ctx, _ = run_recipe(*steps, "train.micro_batch_size=8", name="full")
    run = ctx.run_dir.path
    good = checkpoints_in(run)
    assert [p.name for p in good] == ["checkpoint-4", "checkpoint-6"]
    assert all((p / COMPLETE).is_file() for p in good)
    assert not (run / "checkpoints" / ".staging").exists()

    weights = good[-1] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated on purpose
    assert "bytes" in verify(good[-1])
    assert resolve_resume(str(run)) == str(good[0])
    assert resolve_resume(str(good[-1])) == str(good[0])

    resumed, _ = run_recipe(*steps, "train.micro_batch_size=8", f"resume={run}", name="resumed")
    assert str(good[0]) in (resumed.run_dir.path / "summary.md").read_text()
    a, b = (
        load_file(run / "final" / "model.safetensors"),
        load_file(resumed.run_dir.final / "model.safetensors"),
    )
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)


def test_a_save_that_crashes_leaves_the_previous_checkpoint_whole(run_recipe, tmp_path, monkeypatch) -> None:
    from transformers import Trainer

    real = Trainer._save_rng_state
    calls = {"n": 0}

    def crash_on_second_save(self, output_dir):  # dies half-way through writing checkpoint-4
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        return real(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", crash_on_second_save)
    with pytest.raises(OSError, match="disk full"):
        run_recipe("train.max_steps=6", "train.save_every=2", "train.keep_last=1", "train.eval_generations=0")
    run = tmp_path / "outputs" / "day" / "run"
    assert [p.name for p in checkpoints_in(run)] == ["checkpoint-2"]  # keep_last=1 kept the only whole one
    assert not (run / "checkpoints" / "checkpoint-4").exists()
    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    cfg.resume = True
    assert resolve(cfg, tmp_path / "outputs" / "day" / "next") == str(run / "checkpoints" / "checkpoint-2")


def test_resume_of_a_path_without_checkpoints_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_resume(str(tmp_path))
    assert info.value.key == "resume"


SECRETS = {
    "HF_TOKEN": "hf_SeCrEt0123456789abcdef",
    "WANDB_API_KEY": "wandbSeCrEt0123456789abcdef0123456789",
    "OPENAI_API_KEY": "sk-SeCrEt0123456789abcdef",
}


def test_no_secret_from_the_environment_reaches_the_run_dir(tmp_path: Path) -> None:
    env = {**os.environ, **SECRETS, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    args = [*RUN, "train.max_steps=4", "train.save_every=2", "tracker=[tensorboard,wandb,mlflow]"]
    proc = subprocess.run(
        [sys.executable, "-m", "recipes", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in files) and any("tfevents" in p.name for p in files)
    assert any(p.suffix == ".wandb" for p in files) and any("mlruns" in p.parts for p in files)
    for path in files:
        blob = path.read_bytes()
        for name, secret in SECRETS.items():
            assert secret.encode() not in blob, f"{name} leaked into {path}"


def test_our_code_never_unpickles_unsafely() -> None:
    """Weights are safetensors; any torch.load in hydratune itself must pass weights_only=True."""
    root = Path(__file__).resolve().parent.parent
    for path in [*root.glob("components/**/*.py"), *root.glob("recipes/**/*.py")]:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{path}:{number}"
