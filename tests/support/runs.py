"""Run dirs: made without training (a saved config, a checkpoint), given a CLI run's files, read back."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hydratune.components.runtime.checkpoint import mark_complete
from tests.conftest import save_like_hydra


def fake_run(run: Path, cfg: DictConfig, overrides: Sequence[str] = (), age: float = 0.0) -> Path:
    """A run dir as training leaves it, minus the weights: saved config, one whole checkpoint."""
    save_like_hydra(run, cfg, list(overrides))
    checkpoint = run / "checkpoints" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    mark_complete(checkpoint, 2)
    stamp = 1_700_000_000 - age  # older runs: earlier mtimes
    os.utime(run, (stamp, stamp))
    return checkpoint


def as_cli_run(ctx, overrides: list[str]) -> Path:
    """Give an in-process run the ``.hydra/`` files a CLI run has (its config and overrides)."""
    hydra_dir = ctx.run_dir.path / ".hydra"
    hydra_dir.mkdir(exist_ok=True)
    OmegaConf.save(ctx.cfg, hydra_dir / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), hydra_dir / "overrides.yaml")
    return ctx.run_dir.path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_base_untouched(ctx) -> None:
    """A LoRA run left its base weights as they were built: the same seed builds them again, equal to the
    trained model's base layers (the adapter's ``lora_`` weights aside)."""
    import torch

    ctx.seed_everything()
    base = ctx.components.model.build().state_dict()
    trained = {
        k.replace(".base_layer", ""): v
        for k, v in ctx.model.get_base_model().state_dict().items()
        if "lora_" not in k
    }
    assert trained.keys() == base.keys()
    assert all(torch.equal(trained[k], v) for k, v in base.items())


def first_and_last(values: list[float], count: int, window: int = 20) -> tuple[float, float]:
    """The means of the first and last ``window`` of ``count`` logged values (a learning curve's ends)."""
    assert len(values) == count, values
    return sum(values[:window]) / window, sum(values[-window:]) / window


def sigterm_on_call(monkeypatch: Any, owner: Any, name: str, at: int) -> Callable[..., Any]:
    """Patch ``owner.name`` so that its ``at``-th call first sends this process SIGTERM (the driver then
    checkpoints after the step and stops), and return the original, for a test to put back before resuming."""
    original, calls = getattr(owner, name), []

    def then_sigterm(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, then_sigterm)
    return original
