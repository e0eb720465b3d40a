"""A checkpoint that hides a pickle payload (ZeRO-2's optimizer states) is refused naming the file before
anything unpickles it; only trust_checkpoints=true lets it run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from components.runtime.checkpoint import checkpoints_in, mark_complete


# ---- trust ------------------------------------------------------------------------------------------
class Payload:
    """Unpickling this runs a shell command (here: creates a marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


def test_a_planted_pickle_in_a_zero2_checkpoint_never_runs(hydratune, tmp_path) -> None:
    """ZeRO-2 on CPU: an untampered checkpoint resumes; one whose optimizer states hide a payload is refused
    naming the file, the payload never runs — and it is live: trust_checkpoints=true lets DeepSpeed run it."""
    import torch

    common = ["strategy=zero2", "train.eval_every=0", "train.eval_generations=0", "train.write_plots=false"]
    run = tmp_path / "run"
    done = hydratune(*common, "train.max_steps=2", "train.save_every=1", f"hydra.run.dir={run}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    clean, tampered = checkpoints_in(run)
    resumed = hydratune(
        *common, "train.max_steps=3", f"resume={clean}", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (tmp_path / "r" / "final").is_dir()

    (states,) = tampered.glob("global_step*/*optim_states.pt")
    state = torch.load(states, weights_only=False)  # our own file, just written
    state["extra"] = Payload(tmp_path / "marker")
    torch.save(state, states)
    mark_complete(tampered, 2)  # sizes updated, as an attacker would
    refused = hydratune(
        *common, "train.max_steps=3", f"resume={tampered}", f"hydra.run.dir={tmp_path / 'x'}", cwd=tmp_path
    )
    assert refused.returncode == 2 and "trust_checkpoints" in refused.stderr and states.name in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "marker").exists()

    trusted = [*common, "train.max_steps=3", f"resume={tampered}", "trust_checkpoints=true"]
    hydratune(*trusted, f"hydra.run.dir={tmp_path / 'y'}", cwd=tmp_path)
    assert (tmp_path / "marker").exists()  # the payload was real
