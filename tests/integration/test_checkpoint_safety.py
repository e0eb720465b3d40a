"""Checkpoints in one process: written atomically (a damaged one is skipped, a save that crashes leaves the
previous one whole), a resume path without checkpoints named, no unsafe unpickling, and the per-step stop
agreement of a signal."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from hydratune.components.config.errors import ConfigError
from hydratune.components.runtime.checkpoint import COMPLETE, checkpoints_in, resolve_resume, verify
from hydratune.components.runtime.resume import resolve


def test_a_signal_handled_during_the_agreement_waits_for_the_next_step(monkeypatch) -> None:
    """A signal handled while this rank waits in the per-step all-reduce (the handler runs when the call
    returns) was not in the flag it sent: this step's answer is the all-reduced flag, so this rank does not
    stop alone while the others train on (the hang of a rank signalled on its own); the next step all stop."""
    import torch.distributed as dist

    from hydratune.components.distributed.interrupt import GracefulInterrupt

    g = GracefulInterrupt()
    sent: list[int] = []

    def all_reduce(flag, op=None):  # the other rank sent 0; the signal arrives during the wait
        sent.append(int(flag.item()))
        if g.signum is None:
            g.signum = int(signal.SIGUSR1)

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    assert g.agreed() is False  # what the other rank also concludes from the all-reduced 0
    assert g.requested  # remembered for the next step
    assert g.agreed() is True and sent == [0, int(signal.SIGUSR1)]


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


def test_our_code_never_unpickles_unsafely() -> None:
    """Weights are safetensors; any torch.load in hydratune itself must pass weights_only=True."""
    root = Path(__file__).resolve().parents[2]
    for path in [*root.glob("components/**/*.py"), *root.glob("recipes/**/*.py")]:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{path}:{number}"
