"""Probes of the trust boundary (components/config/trust.py): a file the user did not write on the
command line (a shared experiment, a ``--config-dir``, a shared run dir) never runs code and never gets a
secret into the run dir. Each probe plants code that would create a marker file if it ran, and asserts the
marker never appears, the exit is 2 without a traceback, and the error names the file, key and switch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.conftest import CONF, REPO, save_like_hydra

TINY = REPO / "components" / "assets" / "tiny"
FAKE_KEY = "hydratune-fake-wandb-key-0123456789"


def cli(*args: str) -> None:
    """The hydratune command, in this process."""
    from hydra.core.global_hydra import GlobalHydra

    from hydratune.recipes.cli import main

    GlobalHydra.instance().clear()
    main(list(args))


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run the command, assert exit 2 without a traceback; its stderr as one line."""
    with pytest.raises(SystemExit) as code:
        cli(*args)
    err = capsys.readouterr().err
    assert code.value.code == 2, err
    assert "Traceback" not in err
    return " ".join(err.split())


def write_yaml(path: Path, node: dict[str, Any], package_global: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# @package _global_\n" if package_global else ""
    path.write_text(header + OmegaConf.to_yaml(OmegaConf.create(node)))
    return path


def touch(marker: Path) -> dict[str, Any]:
    """A node that creates ``marker`` if Hydra builds it (a callable Hydra's own blocklist lets through)."""
    return {"_target_": "pathlib.Path.touch", "_args_": [str(marker)]}


def evil_model(tmp_path: Path, marker: Path) -> Path:
    """The tiny model dir with custom code (``auto_map``) that creates ``marker`` when imported."""
    model = tmp_path / "evil_model"
    shutil.copytree(TINY, model)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (model / "config.json").write_text(json.dumps(config))
    (model / "configuration_evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from transformers import LlamaConfig\n\n\nclass EvilConfig(LlamaConfig):\n    pass\n"
    )
    return model


# ---- Hydra's own node --------------------------------------------------------------------------------
def test_a_callback_pulled_in_by_an_experiments_defaults_list_is_never_built(tmp_path, capsys) -> None:
    marker = tmp_path / "marker"
    shared = tmp_path / "shared"
    write_yaml(shared / "experiment" / "exp.yaml", {"defaults": ["/extra", "_self_"]})
    extra = write_yaml(shared / "extra.yaml", {"hydra": {"callbacks": {"evil": touch(marker)}}})
    err = refused(capsys, "--config-dir", str(shared), "+experiment=exp", "mode=plan")
    assert str(extra) in err and "hydra.callbacks.evil._target_" in err and "trust_targets=true" in err
    assert not marker.exists()


def test_a_logging_factory_in_an_experiment_is_never_called(tmp_path, capsys) -> None:
    marker = tmp_path / "marker"
    handler = {"()": "pathlib.Path.touch", "self": str(marker)}
    exp = write_yaml(
        tmp_path / "experiment" / "exp.yaml", {"hydra": {"job_logging": {"handlers": {"x": handler}}}}
    )
    err = refused(capsys, "--config-dir", str(tmp_path), "+experiment=exp", "mode=plan")
    assert str(exp) in err and "hydra.job_logging.handlers.x.()" in err and "trust_targets=true" in err
    assert not marker.exists()


def test_env_set_in_an_experiment_never_reaches_the_processes_a_run_starts(
    tmp_path, capsys, monkeypatch
) -> None:
    """PYTHONPATH to a dir holding sitecustomize.py: every Python the run starts (the launcher's workers,
    here one child process started from inside the job) would import it."""
    import hydratune.recipes.cli

    marker = tmp_path / "marker"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    exp = write_yaml(
        tmp_path / "experiment" / "exp.yaml", {"hydra": {"job": {"env_set": {"PYTHONPATH": str(site)}}}}
    )
    monkeypatch.setattr(
        hydratune.recipes.cli, "execute", lambda cfg: subprocess.run([sys.executable, "-c", "pass"])
    )
    err = refused(capsys, "--config-dir", str(tmp_path), "+experiment=exp", "mode=plan")
    assert str(exp) in err and "hydra.job.env_set.PYTHONPATH" in err
    assert not marker.exists()


def test_env_copy_in_an_experiment_never_writes_a_secret_to_hydra_yaml(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.chdir(tmp_path)
    write_yaml(tmp_path / "experiment" / "exp.yaml", {"hydra": {"job": {"env_copy": ["WANDB_API_KEY"]}}})
    err = refused(capsys, "--config-dir", str(tmp_path), "+experiment=exp", "mode=plan", "hydra.run.dir=run")
    assert str(tmp_path / "experiment" / "exp.yaml") in err and "hydra.job.env_copy[0]" in err
    assert FAKE_KEY not in err
    assert not any(FAKE_KEY.encode() in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


# ---- trust switches set by a file ----------------------------------------------------------------------
def test_trust_targets_set_by_a_file_an_experiment_pulls_in_grants_nothing(tmp_path, capsys) -> None:
    marker = tmp_path / "marker"
    write_yaml(tmp_path / "experiment" / "exp.yaml", {"defaults": ["/extra", "_self_"]})
    extra = write_yaml(tmp_path / "extra.yaml", {"trust_targets": True, "tracker": {"evil": touch(marker)}})
    err = refused(capsys, "--config-dir", str(tmp_path), "+experiment=exp", "mode=plan")
    assert str(extra) in err and "[trust_targets]" in err and "pass trust_targets=true" in err
    assert not marker.exists()


def test_trust_remote_code_set_by_an_experiment_is_refused(tmp_path, capsys) -> None:
    marker = tmp_path / "marker"
    model = evil_model(tmp_path, marker)
    node = {"model": {"name_or_path": str(model), "trust_remote_code": True}}
    exp = write_yaml(tmp_path / "experiment" / "exp.yaml", node)
    err = refused(capsys, "--config-dir", str(tmp_path), "+experiment=exp", "mode=plan")
    assert str(exp) in err and "[model.trust_remote_code]" in err and "model.trust_remote_code=true" in err
    assert not marker.exists()


def shared_run(tmp_path: Path, compose_cfg: Any, model: Path, *, adapter: bool = True) -> Path:
    """A run dir someone shared: an adapter run whose saved model node loads ``model`` with its code."""
    run = tmp_path / "outputs" / "day" / "shared"
    cfg = compose_cfg("peft=lora")
    cfg.model.name_or_path = str(model)
    cfg.model.init = "pretrained"
    cfg.model.trust_remote_code = True
    save_like_hydra(run, cfg, [])
    shutil.copytree(TINY, run / "final", ignore=shutil.ignore_patterns("config.json"))  # the tokenizer
    (run / "final" / "adapter_config.json").write_text("{}")
    return run


def test_a_shared_run_dirs_model_node_runs_no_code_in_generate(compose_cfg, tmp_path, capsys) -> None:
    marker = tmp_path / "marker"
    run = shared_run(tmp_path, compose_cfg, evil_model(tmp_path, marker))
    err = refused(capsys, "recipe=generate", f"model.from_run={run}", "mode=plan")
    assert str(run / ".hydra" / "config.yaml") in err and "model.trust_remote_code=true" in err
    assert not marker.exists()


def test_export_of_a_shared_run_dir_runs_no_code(compose_cfg, tmp_path, capsys) -> None:
    marker = tmp_path / "marker"
    run = shared_run(tmp_path, compose_cfg, evil_model(tmp_path, marker))
    err = refused(capsys, "export", str(run), f"out={tmp_path / 'out'}")
    assert str(run / ".hydra" / "config.yaml") in err and "model.trust_remote_code=true" in err
    assert not marker.exists()
    # a target nested in the saved model node (instantiate builds it recursively)
    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    cfg.model.trust_remote_code = False
    cfg.model.architecture = touch(marker)
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    err = refused(capsys, "export", str(run), f"out={tmp_path / 'out'}")
    assert "model.architecture._target_" in err and not marker.exists()


# ---- replay of a shared run dir ------------------------------------------------------------------------
def test_replay_of_a_run_dir_whose_config_gained_a_defaults_entry(compose_cfg, tmp_path, capsys) -> None:
    marker = tmp_path / "marker"
    run = tmp_path / "outputs" / "day" / "shared"
    save_like_hydra(run, compose_cfg(), [])
    saved = OmegaConf.load(run / ".hydra" / "config.yaml")
    saved.defaults = ["extra", "_self_"]
    OmegaConf.save(saved, run / ".hydra" / "config.yaml")
    extra = write_yaml(run / ".hydra" / "extra.yaml", {"hydra": {"callbacks": {"evil": touch(marker)}}})
    err = refused(capsys, "replay", str(run), "mode=plan")
    assert str(extra) in err and "hydra.callbacks.evil._target_" in err
    assert not marker.exists()


def test_replay_of_a_run_dir_with_trust_remote_code(compose_cfg, tmp_path, capsys) -> None:
    marker = tmp_path / "marker"
    run = tmp_path / "outputs" / "day" / "shared"
    cfg = compose_cfg(f"model.name_or_path={evil_model(tmp_path, marker)}", "model.trust_remote_code=true")
    save_like_hydra(run, cfg, [])
    err = refused(capsys, "replay", str(run), "mode=plan")
    assert str(run / ".hydra" / "config.yaml") in err and "[model.trust_remote_code]" in err
    assert not marker.exists()


# ---- reward functions -----------------------------------------------------------------------------------
def test_a_reward_built_from_a_partial_of_torch_hub_load_is_refused(tmp_path, capsys) -> None:
    """``functools.partial(torch.hub.load, <dir>, <entry>, source="local")`` as the reward: the first call
    would import the dir's hubconf.py."""
    marker = tmp_path / "marker"
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "hubconf.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n\ndef m(*a, **k): ...\n"
    )
    reward = {"_target_": "torch.hub.load", "_partial_": True, "_args_": [str(hub), "m"], "source": "local"}
    exp = write_yaml(tmp_path / "experiment" / "exp.yaml", {"recipe": {"reward": reward}})
    err = refused(capsys, "--config-dir", str(tmp_path), "recipe=ppo", "+experiment=exp", "mode=plan")
    assert (
        str(exp) in err and "recipe.reward._target_=torch.hub.load" in err and "(prompts, completions" in err
    )
    assert not marker.exists()


def test_only_plain_reward_functions_pass() -> None:
    from hydratune.components.config.trust import reward_refusal

    assert reward_refusal("hydratune.components.rewards.exact_match") is None
    assert reward_refusal("tests.support.rewards.brevity") is None
    assert "not a plain Python function" in (reward_refusal("functools.partial") or "")
    assert "not a plain Python function" in (reward_refusal("os.system") or "")
    assert "(repo_or_dir, model" in (reward_refusal("torch.hub.load") or "")
    assert reward_refusal("tests.support.rewards.by_keyword") is None  # (completions, answer, **_)
    assert "takes (answer, completion)" in (reward_refusal("tests.support.rewards.misnamed") or "")


def test_a_reward_that_cannot_be_called_names_its_parameters_and_the_command_line(capsys) -> None:
    """A reward typed on the command line whose parameters are wrong is refused naming them and the
    command line (not a schema file), with the signature as the fix (not trust_targets)."""
    err = refused(capsys, "recipe=grpo", "recipe.reward_funcs=[tests.support.rewards.misnamed]", "mode=plan")
    assert "the command line (recipe.reward_funcs=[tests.support.rewards.misnamed])" in err
    assert "takes (answer, completion)" in err and "schema" not in err
    assert "fix: name the completions parameter: def f(prompts, completions, **columns)" in err
    assert "trust_targets" not in err


# ---- the boundary itself ------------------------------------------------------------------------------
def test_the_command_line_grants_what_a_file_cannot(tmp_path, capsys) -> None:
    """The switch the error names works (the payload was real): only typed on the command line."""
    marker = tmp_path / "marker"
    model = {"name_or_path": str(evil_model(tmp_path, marker)), "trust_remote_code": True}
    node = {"model": {**model, "init": "random"}}  # a dir without weights: random init, asked for
    write_yaml(tmp_path / "experiment" / "exp.yaml", node)
    with pytest.raises(BaseException):  # noqa: B017 — the planted config class is no real model: any failure
        cli("--config-dir", str(tmp_path), "+experiment=exp", "mode=plan", "model.trust_remote_code=true")
    assert marker.exists()


def test_hydratunes_own_configs_pass_the_boundary(compose_cfg) -> None:
    """Every shipped experiment, composed with Hydra's node (callbacks, sweepers, logging), needs no grant."""
    from hydra import compose

    from hydratune.components.config.trust import Grants, check_composed

    for experiment in sorted((CONF / "experiment").glob("*.yaml")):
        cfg = compose(
            config_name="config", overrides=[f"+experiment={experiment.stem}"], return_hydra_config=True
        )
        check_composed(cfg, Grants())


# ---- secrets ----------------------------------------------------------------------------------------------
#: variable names and whether they hold a secret: one detector (config/trust.py's secret_name) for the
#: ``${oc.env:…}`` resolver, the environment a run dir records and DeepSpeed's hostfile launcher
SECRET_NAMES = {
    "HF_TOKEN": True,
    "HUGGING_FACE_HUB_TOKEN": True,
    "WANDB_API_KEY": True,
    "AWS_SECRET_ACCESS_KEY": True,
    "AWS_SESSION_TOKEN": True,
    "MY_PASSWORD": True,
    "DB_PASS": True,  # a word of its own ("PASS": hostfile.py said no)
    "DB_PASSWD": True,
    "GITHUB_PAT": True,  # a personal access token
    "OPENAI_APIKEY": True,  # a word that ends with KEY (hostfile.py said no)
    "GH_AUTHTOKEN": True,
    "MLFLOW_TRACKING_PASSWORD": True,
    "GOOGLE_APPLICATION_CREDENTIALS": True,
    "NCCL_AUTH": True,
    "comet-api-key": True,  # any case, any separator
    "TOKENIZERS_PARALLELISM": False,
    "HF_HUB_OFFLINE": False,
    "NCCL_SOCKET_IFNAME": False,
    "OMP_NUM_THREADS": False,
    "PATH": False,  # not PAT
    "WANDB_PROJECT": False,
    "PASSAGE_COUNT": False,
    "KEYBOARD": False,
}


@pytest.mark.parametrize(("name", "secret"), SECRET_NAMES.items(), ids=list(SECRET_NAMES))
def test_one_secret_detector_for_the_resolver_and_the_hostfile(name: str, secret: bool, monkeypatch) -> None:
    from hydratune.components.config import resolvers
    from hydratune.components.config.trust import is_secret, secret_name
    from hydratune.components.distributed.hostfile import shown

    value = f"value-of-{name}"  # no other variable holds it
    assert secret_name(name) is secret
    assert is_secret(name, value) is secret  # the ${oc.env:...} resolver's question
    assert (f"{name} (secret)" in shown({name: value})) is secret  # the hostfile launcher's log line
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(resolvers, "_warn_redacted", lambda message: None)
    assert (resolvers.env(name) == "<redacted>") is secret


def test_no_module_keeps_a_secret_detector_of_its_own() -> None:
    """distributed/hostfile.py had its own word list (no PASS, whole words only): one detector now."""
    import ast

    root = Path(__file__).resolve().parents[2]
    for path in (root / "components").rglob("*.py"):
        if path == root / "components" / "config" / "trust.py":
            continue
        tree = ast.parse(path.read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        names |= {
            t.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        assert not names & {"is_secret", "secret_name", "SECRET_WORDS"}, path


def test_a_secret_read_by_a_shared_file_never_reaches_the_run_dir(tmp_path, capsys, monkeypatch) -> None:
    """One tiny training run from an experiment that reads the key into run_name (summary.md,
    training_args.bin) and a tracker tag, the command line copying it into the run's environment
    (``hydra.job.env_copy``: Hydra wrote it into .hydra/hydra.yaml) and setting a token (an override Hydra
    records there too): no file of the run dir holds either."""
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("ALIAS", FAKE_KEY)  # a secret's value under another name
    node = {"run_name": "${oc.env:WANDB_API_KEY}", "data": {"system_prompt": "${oc.env:ALIAS}"}}
    write_yaml(tmp_path / "experiment" / "exp.yaml", node)
    run = tmp_path / "run"
    args = ["train.max_steps=2", "train.save_every=2", "train.eval_generations=0", "train.write_plots=false"]
    env = ["hydra.job.env_copy=[WANDB_API_KEY]", f"+hydra.job.env_set.HF_TOKEN={FAKE_KEY}"]
    cli("--config-dir", str(tmp_path), "+experiment=exp", *args, *env, f"hydra.run.dir={run}")
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.name == "training_args.bin" for p in files) and (run / "summary.md").is_file()
    leaked = [str(p.relative_to(run)) for p in files if FAKE_KEY.encode() in p.read_bytes()]
    assert not leaked
    assert "<redacted>" in (run / "summary.md").read_text()
    saved = (run / ".hydra" / "hydra.yaml").read_text()
    assert "WANDB_API_KEY: <redacted>" in saved and "HF_TOKEN: <redacted>" in saved
    assert "+hydra.job.env_set.HF_TOKEN=<redacted>" in saved  # the command line's overrides
