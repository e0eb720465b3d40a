"""Run dirs written by an earlier hydratune still replay and resume.

``tests/fixtures/runs_ede340f/`` holds run dirs that commit ede340f (before components/ was cut into
packages) wrote; its README gives the commands. Their configs name ``_target_`` paths and keys as that code
saved them, so these tests fail when a move or a rename breaks saved run dirs:

- the SFT and PPO runs resume from a mid-run checkpoint with today's code and end with the weights the old
  code reached without stopping (SFT: the Trainer's checkpoints; PPO: hydratune's own loop checkpoints);
- the SFT run replays (``hydratune replay``) with the losses the old code logged;
- every fixture's saved config composes, instantiates and passes the pre-load checks as ``replay`` composes
  it (the inference recipes pointed at the fixture SFT run, whose path the old run dir held).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs_ede340f"
#: fixtures whose model comes from the SFT fixture run (model.from_run held an absolute path)
FROM_RUN = ("generate", "best_of_n", "eval")


def succeeds(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def copied(tmp_path: Path, name: str) -> Path:
    """A fixture run dir copied out of the repository (runs write next to it)."""
    dest = tmp_path / "old" / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


def new_run_dir(stdout: str) -> Path:
    return Path(next(line for line in stdout.splitlines() if line.startswith("run dir: "))[9:])


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def weights(path: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(str(path))


def assert_same_weights(got: Path, want: Path) -> None:
    import torch

    a, b = weights(got), weights(want)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


def test_an_earlier_sft_run_resumes_to_the_weights_it_reached(hydratune, tmp_path: Path) -> None:
    """Steps 4-6 from the old checkpoint-3 end at the weights the old run reached after step 6."""
    old = copied(tmp_path, "sft")
    out = succeeds(hydratune(f"resume={old / 'checkpoints' / 'checkpoint-3'}", cwd=tmp_path))
    new = new_run_dir(out.stdout)
    assert "steps 4 to 6" in json.loads((new / "result.json").read_text())["run"]["train_loss covers"]
    assert_same_weights(new / "final" / "model.safetensors", old / "final" / "model.safetensors")


def test_an_earlier_ppo_run_resumes_to_the_weights_it_reached(hydratune, tmp_path: Path) -> None:
    """Iterations 3-4 from the old loop checkpoint-2 end at the old run's policy and value head."""
    old = copied(tmp_path, "ppo")
    out = succeeds(hydratune(f"resume={old / 'checkpoints' / 'checkpoint-2'}", cwd=tmp_path))
    new = new_run_dir(out.stdout)
    steps = [json.loads(line)["step"] for line in (new / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 4]
    for name in ("model.safetensors", "value.safetensors"):
        assert_same_weights(new / "final" / name, old / "final" / name)


def test_an_earlier_run_replays_with_the_losses_it_logged(hydratune, tmp_path: Path) -> None:
    old = copied(tmp_path, "sft")
    out = succeeds(hydratune("replay", str(old), "train.save_every=0", cwd=tmp_path))
    got, want = losses(new_run_dir(out.stdout)), losses(old)
    assert set(got) == set(want) and got == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_every_earlier_config_composes_and_passes_the_checks(name: str, tmp_path: Path, monkeypatch) -> None:
    """As ``hydratune replay <dir>`` composes it: the saved config alone, no current conf/ defaults, through
    the CLI's guard on every composition (which reads the old ``components.*`` / ``recipes.*`` targets as
    ``hydratune.*``: components/config/legacy.py)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import hydratune.components.model
    from hydratune.components.config.registry import recipe_name
    from hydratune.components.config.trust import grants, guarded_compositions
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(hydratune.components.model.CausalLM, "build", no_loading)
    overrides = [f"model.from_run={copied(tmp_path, 'sft')}"] if name in FROM_RUN else []
    GlobalHydra.instance().clear()
    try:
        with (
            guarded_compositions(grants([])),
            initialize_config_dir(str(FIXTURES / name / ".hydra"), version_base=None),
        ):
            cfg = compose(config_name="config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()
    comps = Components.from_config(cfg)
    # the summary of that time recorded the class name (SFT, BestOfN); today's identity is the option name
    saved_recipe = json.loads((FIXTURES / name / "result.json").read_text())["run"]["recipe"]
    assert recipe_name(saved_recipe) == comps.recipe.name == recipe_name(cfg.recipe._target_)
    assert cfg.recipe._target_.startswith("hydratune.recipes.")  # saved as recipes.*: read as today's
    check_before_load(cfg, comps, "cpu")
