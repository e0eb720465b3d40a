"""``resume=`` continues the right run (configs compared key by key, multirun points kept apart), decided
before any model loads; checkpoints and config ``_target_``s are checked before anything opens or builds
them (components/runtime/resume.py, components/config/trust.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf, open_dict

from hydratune.components.config.errors import ConfigError
from hydratune.components.runtime.checkpoint import checkpoints_in, mark_complete
from hydratune.components.runtime.resume import point, resolve
from tests.conftest import save_like_hydra
from tests.support.cli import in_process
from tests.support.runs import fake_run


def resuming(compose_cfg: Callable[..., DictConfig], *overrides: str, resume: Any = True) -> DictConfig:
    cfg = compose_cfg(*overrides)
    cfg.resume = resume
    return cfg


def test_resume_true_picks_the_latest_run_with_this_config(compose_cfg, tmp_path, caplog) -> None:
    day = tmp_path / "outputs" / "day"
    low = fake_run(day / "low", compose_cfg("optimizer.lr=1e-3", "train.max_steps=4"), age=20)
    high = fake_run(day / "high", compose_cfg("optimizer.lr=2e-3"), age=10)  # newer
    caplog.set_level(logging.INFO, "hydratune")
    # another length of training and cadence (run management) still continues the run
    cfg = resuming(compose_cfg, "optimizer.lr=1e-3", "train.max_steps=8", "train.save_every=4")
    assert resolve(cfg, day / "new") == str(low)
    assert "passing over" in caplog.text and "optimizer.lr: 0.002 → 0.001" in caplog.text
    assert resolve(resuming(compose_cfg, "optimizer.lr=2e-3"), day / "new") == str(high)


def test_a_lora_run_is_never_continued_by_a_full_fine_tune(
    compose_cfg, tmp_path, monkeypatch, capsys
) -> None:
    """Through the CLI: exit 2, one paragraph naming the key and the differing group, no model loaded."""
    from hydratune.components.model import CausalLM

    monkeypatch.setattr(CausalLM, "build", lambda *a, **k: pytest.fail("a model was loaded"))
    day = tmp_path / "outputs" / "day"
    fake_run(day / "lora", compose_cfg("peft=lora"))
    with pytest.raises(SystemExit) as code:
        in_process("resume=true", f"hydra.run.dir={day / 'full'}")
    err = capsys.readouterr().err
    assert code.value.code == 2, err
    assert "[resume]" in err and "peft._target_" in err and "LoRA" in err
    assert "Traceback" not in err


def test_each_multirun_point_resumes_its_own_point(compose_cfg, tmp_path, monkeypatch) -> None:
    """Two sweeps through the CLI (the recipe stubbed to note what it resumes and write a checkpoint):
    each point of the second continues the same point (same lr) of the first, whichever ran last — and
    never a point of its own sweep, though points differing in train.max_steps only have the same config."""
    from hydratune.recipes.sft import SFT

    first = tmp_path / "multirun" / "day" / "t1"
    for num, lr in enumerate(("1e-3", "2e-3")):
        overrides = [f"optimizer.lr={lr}", "train.max_steps=4"]
        fake_run(first / str(num), compose_cfg(*overrides), overrides, age=10 * num)  # point 0 newest
    resumed: dict[str, Any] = {}

    def train(self: SFT, ctx: Any) -> None:
        resumed[ctx.run_dir.path.name] = ctx.cfg.resume
        checkpoint = ctx.run_dir.checkpoints / "checkpoint-2"  # as training would: now the newest run
        checkpoint.mkdir(parents=True)
        mark_complete(checkpoint, 2)

    monkeypatch.setattr(SFT, "run", train)
    second = tmp_path / "multirun" / "day" / "t2"
    in_process(
        "-m", "optimizer.lr=1e-3,2e-3", "train.max_steps=6,8", "resume=true", f"hydra.sweep.dir={second}"
    )
    own = {lr: str(first / lr / "checkpoints" / "checkpoint-2") for lr in ("0", "1")}
    assert resumed == {"0": own["0"], "1": own["0"], "2": own["1"], "3": own["1"]}


def test_points_that_differ_only_in_run_management_keep_their_job_number(compose_cfg, tmp_path) -> None:
    """A sweep over train.max_steps: every point has the same config; each continues its own number. A
    newer sweep's point with the same config but other overrides (the default lr, given) is another point."""
    sweep = tmp_path / "multirun" / "day"
    for num, steps in enumerate((4, 8)):
        fake_run(
            sweep / "t1" / str(num), compose_cfg(f"train.max_steps={steps}"), [f"train.max_steps={steps}"]
        )
    fake_run(sweep / "t0" / "0", compose_cfg("optimizer.lr=1e-3"), ["optimizer.lr=1e-3"], age=-10)
    for num in ("0", "1"):
        got = resolve(resuming(compose_cfg), sweep / "t2" / num, sweep_point=point(["resume=true"]))
        assert got == str(sweep / "t1" / num / "checkpoints" / "checkpoint-2")


def test_resume_true_without_an_earlier_run_names_the_key(compose_cfg, tmp_path) -> None:
    with pytest.raises(ConfigError, match="no earlier run") as info:
        resolve(resuming(compose_cfg), tmp_path / "outputs" / "day" / "new")
    assert info.value.key == "resume"


def test_a_bad_resume_path_fails_before_load(compose_cfg, tmp_path, monkeypatch, capsys) -> None:
    from hydratune.components.model import CausalLM

    monkeypatch.setattr(CausalLM, "build", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as code:
        in_process(f"resume={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'outputs' / 'day' / 'new'}")
    assert code.value.code == 2
    assert "nothing to resume from" in capsys.readouterr().err


def test_an_explicit_run_of_another_config_names_the_keys(compose_cfg, tmp_path) -> None:
    checkpoint = fake_run(tmp_path / "outputs" / "day" / "old", compose_cfg("optimizer.lr=1e-3", "peft=lora"))
    for resume in (checkpoint.parent.parent, checkpoint):
        cfg = resuming(compose_cfg, "optimizer.lr=2e-3", "peft=lora", resume=str(resume))
        with pytest.raises(ConfigError) as info:
            resolve(cfg, tmp_path / "outputs" / "day" / "new")
        assert info.value.key == "resume"
        assert "optimizer.lr: 0.001 → 0.002" in str(info.value)
        assert "optimizer.lr=0.001" in info.value.hint
    cfg = resuming(compose_cfg, "optimizer.lr=1e-3", "peft=lora", "train.max_steps=9", resume=str(checkpoint))
    assert resolve(cfg, tmp_path / "outputs" / "day" / "new") == str(checkpoint)


def test_resume_true_continues_the_matching_trained_run(run_recipe) -> None:
    """End to end on the tiny model: the older run with this lr is continued, not the newer other one."""
    steps = ["train.max_steps=2", "train.save_every=1", "train.eval_every=0", "train.micro_batch_size=8"]
    first, _ = run_recipe(*steps, "optimizer.lr=1e-3", name="a")
    run_recipe(*steps, "optimizer.lr=2e-3", name="b")
    resumed, _ = run_recipe(*steps[1:], "train.max_steps=3", "optimizer.lr=1e-3", "resume=true", name="c")
    assert resumed.cfg.resume == str(checkpoints_in(first.run_dir.path)[-1])
    assert resumed.cfg.resume in (resumed.run_dir.path / "summary.md").read_text()  # the summary names it
    assert [r["step"] for r in resumed.run_dir.read_metrics() if "loss" in r] == [3]


def test_a_config_target_outside_hydratune_is_never_built(compose_cfg, tmp_path) -> None:
    from hydratune.components.runtime.run import Components

    marker = tmp_path / "marker"
    cfg = compose_cfg()
    with open_dict(cfg):
        cfg.tracker["evil"] = {"_target_": "os.system", "_args_": [f"touch {marker}"]}
    with pytest.raises(ConfigError) as info:
        Components.from_config(cfg)
    assert info.value.key == "tracker.evil._target_" and "trust_targets" in info.value.hint
    assert not marker.exists()
    # a reward function the recipe names is the user's own code: built (as a partial, not called)
    Components.from_config(compose_cfg("recipe=ppo", "recipe.reward._target_=tests.support.rewards.brevity"))
    with pytest.raises(ConfigError, match="partial"):
        Components.from_config(
            compose_cfg("recipe=ppo", "recipe.reward._target_=os.system", "recipe.reward._partial_=false")
        )


def test_replay_of_a_run_dir_with_a_foreign_target_runs_nothing(compose_cfg, tmp_path, capsys) -> None:
    """Hydra builds ``hydra.callbacks`` before hydratune's code runs: replay checks the file first."""
    marker = tmp_path / "marker"
    run = tmp_path / "outputs" / "day" / "shared"
    save_like_hydra(run, compose_cfg(), [])
    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    cfg.hydra = {"callbacks": {"evil": {"_target_": "os.system", "_args_": [f"touch {marker}"]}}}
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    with pytest.raises(SystemExit) as code:
        in_process("replay", str(run), "mode=plan")
    assert code.value.code == 2 and "hydra.callbacks.evil._target_" in capsys.readouterr().err
    assert not marker.exists()


def test_an_experiment_file_cannot_have_hydra_build_a_foreign_callback(tmp_path, capsys) -> None:
    marker = tmp_path / "marker"
    (tmp_path / "experiment").mkdir()
    evil = {"hydra": {"callbacks": {"evil": {"_target_": "os.system", "_args_": [f"touch {marker}"]}}}}
    text = "# @package _global_\n" + OmegaConf.to_yaml(OmegaConf.create(evil))
    (tmp_path / "experiment" / "shared.yaml").write_text(text)
    with pytest.raises(SystemExit) as code:
        in_process("--config-dir", str(tmp_path), "+experiment=shared", "mode=plan")
    assert code.value.code == 2 and "hydra.callbacks.evil._target_" in capsys.readouterr().err
    assert not marker.exists()
