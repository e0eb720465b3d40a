"""Probes of what hydratune writes for a shell to run (components/config/scriptvalues.py): the SLURM job
script, DeepSpeed's environment file and pdsh command line, the run and sweep dirs a run creates and cleans
up, and the configs Hydra saves there. Each probe plants what would create a marker file if a shell ran it,
and asserts the marker never appears, the exit is 2 without a traceback, and the error names the key."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from hydratune.components.config.errors import ConfigError
from tests.unit.test_trust_probes import FAKE_KEY, cli, refused, write_yaml

SLURM_PLAN = ["launcher=slurm", "launcher.gpus_per_node=0", "mode=plan"]


def newline(marker: Path) -> str:
    """A value whose second line is a command (quoted for Hydra's override parser)."""
    return f"'x\ntouch {marker}'"


# ---- the SLURM job script -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key",
    [
        "launcher.account",
        "launcher.partition",
        "launcher.qos",
        "launcher.job_name",
        "launcher.sbatch_args[0]",
        "launcher.setup[0]",
        "hydra.run.dir",
    ],
)
def test_a_newline_in_any_value_of_the_job_script_is_refused_before_anything(
    key: str, tmp_path, capsys, monkeypatch
) -> None:
    """The issue's probe: a newline put a command on its own line of the script (and made sbatch drop every
    #SBATCH line after it). Refused before load, mode=plan too, and nothing is left behind."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "marker"
    listed = key.endswith("[0]")  # a list knob: the value is its one entry
    override = f"{key[:-3]}=[{newline(marker)}]" if listed else f"{key}={newline(marker)}"
    err = refused(capsys, *SLURM_PLAN, override)
    assert f"[{key}]" in err and "control character" in err, err
    assert not marker.exists() and not list(tmp_path.iterdir())  # no run dir, no script


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("launcher.account='ml;touch x'", "launcher.account"),
        ("launcher.partition='gpu debug'", "launcher.partition"),
        ("launcher.qos='$(id)'", "launcher.qos"),
        ("launcher.sbatch_args=[exclusive]", "launcher.sbatch_args[0]"),
    ],
)
def test_names_are_matched_against_what_slurm_accepts(compose_cfg, override: str, key: str) -> None:
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("launcher=slurm", override)
    with pytest.raises(ConfigError) as info:
        check_before_load(cfg, Components.from_config(cfg))
    assert info.value.key == key, str(info.value)
    good = compose_cfg("launcher=slurm", "launcher.partition='gpu,gpu-long'", "launcher.account=ml_team-1.x")
    Components.from_config(good).launcher.validate()


def stub_bin(tmp_path: Path) -> Path:
    """``scontrol`` and ``srun`` stubs: srun records its arguments, one per line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    (bin_dir / "srun").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {shlex.quote(str(tmp_path / "argv"))}\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    return bin_dir


def test_odd_but_legal_values_are_quoted_everywhere_comments_included(
    compose_cfg, tmp_path, monkeypatch
) -> None:
    """Quotes, ``$(…)``, backquotes and spaces in the job name, the run dir (in the comment lines too), the
    working dir and PYTHONPATH: ``bash -n`` passes, and the script run with srun and scontrol stubbed hands
    srun the run dir intact and runs nothing else."""
    from hydratune.components.distributed.slurm import sbatch_script
    from hydratune.components.runtime.run import Components

    odd = 'it\'s $(touch M) `touch M` "x"'  # M: a marker file, in whatever dir the script runs
    run_dir = tmp_path / f"run {odd}"
    cwd = tmp_path / f"cwd {odd}"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PYTHONPATH", f"/lib/{odd}")
    comps = Components.from_config(compose_cfg("launcher=slurm", "launcher.gpus_per_node=0"))
    script = sbatch_script(
        comps.launcher, run_dir, "hydratune.recipes.worker", f"job {odd}", python="/bin/true"
    )
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    comments = [line for line in script.splitlines() if line.startswith("# ") and "run dir" in line]
    assert comments and all(shlex.quote(str(run_dir.resolve())) in line for line in comments[:1])
    env = {**os.environ, "PATH": f"{stub_bin(tmp_path)}:{os.environ['PATH']}", "SLURM_JOB_ID": "7"}
    env["SLURM_JOB_NODELIST"] = "node1"
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[-4:] == ["/bin/true", "-m", "hydratune.recipes.worker", str(run_dir.resolve())]
    assert not [p for p in tmp_path.rglob("M")]


def test_plan_prints_the_job_script_and_writes_nothing(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cli(*SLURM_PLAN, "launcher.account=ml")
    out = capsys.readouterr().out
    assert "#SBATCH --account=ml" in out and "checks passed" in out
    assert not list(tmp_path.iterdir())  # the issue: plan left a run dir (its .hydra/ and log)


def test_job_script_commands_from_a_shared_file_are_refused(tmp_path, capsys, monkeypatch) -> None:
    """``launcher.setup`` (shell lines) and ``launcher.sbatch_args`` set by an experiment the user did not
    type: the trust boundary refuses them, naming the file and the switch; typed, they pass."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "marker"
    for key, value in (("setup", [f"touch {marker}"]), ("sbatch_args", ["--uid=0"])):
        exp = write_yaml(tmp_path / "shared" / "experiment" / f"{key}.yaml", {"launcher": {key: value}})
        args = ["--config-dir", str(tmp_path / "shared"), *SLURM_PLAN, f"+experiment={key}"]
        err = refused(capsys, *args)
        assert str(exp) in err and f"[launcher.{key}]" in err and f"launcher.{key}=[…] yourself" in err
    cli(*args, "launcher.sbatch_args=[--exclusive]")  # the user's own line: granted
    assert "#SBATCH --exclusive" in capsys.readouterr().out
    assert not marker.exists()


# ---- DeepSpeed: the hostfile, the environment file, pdsh's command line ------------------------------------
def test_deepspeed_hosts_env_lines_and_remote_words_are_checked(tmp_path, monkeypatch) -> None:
    """A host that is an ssh option, an environment line that would be a second command on every host
    (as DeepSpeed's runner writes it: ``export K="V";``), a run dir that pdsh's command line would split."""
    from deepspeed.launcher.multinode_runner import PDSHRunner

    from hydratune.components.distributed import hostfile

    marker = tmp_path / "marker"
    hosts = tmp_path / "hostfile"
    hosts.write_text(f"-oProxyCommand=touch${{IFS}}{marker} slots=1\n")
    with pytest.raises(ConfigError) as info:
        hostfile.read_hosts(str(hosts), None)
    assert info.value.key == "launcher.hostfile" and "not a host name" in str(info.value)
    forwarded = {"HF_A": "plain; with spaces", "HF_B": f"$(touch {marker})", "HF_C": "a\rb", "HF_\nX": "1"}
    lines, skipped = hostfile.env_lines(forwarded)
    assert lines == ["HF_A=plain; with spaces"] and set(skipped) == {"HF_B", "HF_C", "HF_\nX"}
    runner = PDSHRunner(type("Args", (), {"user_args": [], "user_script": "x"})(), "")
    for line in lines:
        runner.add_export(*line.split("=", 1))
    exports = "".join(f"export {k}={v}; " for k, v in runner.exports.items())
    done = subprocess.run(["bash", "-c", exports + 'printf %s "$HF_A"'], capture_output=True, text=True)
    assert done.stdout == "plain; with spaces" and not marker.exists()
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".deepspeed_env").write_text(f"NCCL_DEBUG=INFO\nX=`touch {marker}`\n")
    with pytest.raises(ConfigError, match=r"line 2: 'X=`touch"):
        hostfile.user_env_lines(tmp_path / ".deepspeed_env")
    with pytest.raises(ConfigError) as info:
        hostfile.check_remote_line(tmp_path / "run;id", "10.0.0.1")
    assert info.value.key == "hydra.run.dir"
    hostfile.check_remote_line(tmp_path / "run-1", "node-1.cluster")


# ---- run and sweep dirs: used ones refused, cleanup removes only what the run made -------------------------
@pytest.fixture
def refused_sweep(tmp_path, capsys, monkeypatch) -> tuple[Path, str]:
    """A plan sweep with a refused point (its run dir keeps the error), WANDB_API_KEY copied by the command
    line and HF_TOKEN set by it: (sweep dir, stderr)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    sweep = tmp_path / "sweep"
    secrets = ["hydra.job.env_copy=[WANDB_API_KEY]", f"+hydra.job.env_set.HF_TOKEN={FAKE_KEY}x"]
    err = refused(capsys, "-m", "optimizer.lr=-1,1e-3", "mode=plan", f"hydra.sweep.dir={sweep}", *secrets)
    return sweep, err


def test_a_used_sweep_dir_is_refused_and_a_plan_sweep_leaves_nothing_else(refused_sweep, capsys) -> None:
    sweep, first = refused_sweep
    assert "1 sweep point(s) refused" in first
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "multirun.yaml"]  # point 1 planned: removed
    before = {p: p.stat().st_mtime_ns for p in sweep.rglob("*")}
    err = refused(capsys, "-m", "optimizer.lr=1e-3", "mode=plan", f"hydra.sweep.dir={sweep}")
    assert "[hydra.sweep.dir]" in err and "holds a sweep already" in err and "another hydra.sweep.dir" in err
    assert {p: p.stat().st_mtime_ns for p in sweep.rglob("*")} == before  # nothing rewritten


def test_no_secret_in_clear_in_a_sweep_dir(refused_sweep) -> None:
    """``hydra.job.env_copy=[WANDB_API_KEY]`` wrote the key into .hydra/hydra.yaml (and multirun.yaml);
    an ``env_set`` override of a secret went into the overrides too."""
    sweep, err = refused_sweep
    files = [p for p in sweep.rglob("*") if p.is_file()]
    assert {"multirun.yaml", "hydra.yaml", "overrides.yaml", "refused.txt"} <= {p.name for p in files}
    assert not [p for p in files if FAKE_KEY.encode() in p.read_bytes()] and FAKE_KEY not in err
    hydra_yaml = (sweep / "0" / ".hydra" / "hydra.yaml").read_text()
    assert "WANDB_API_KEY: <redacted>" in hydra_yaml and "HF_TOKEN: <redacted>" in hydra_yaml
    assert "+hydra.job.env_set.HF_TOKEN=<redacted>" in hydra_yaml


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_cleanup_after_a_refusal_removes_only_what_the_run_created(tmp_path, capsys, monkeypatch) -> None:
    """The issue's probe: with the run dir pinned under an empty folder, the cleanup removed that folder
    (a mount point: EBUSY, a traceback). A pinned dir that existed keeps what it held."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "empty").mkdir(parents=True)
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("the user's")
    for run_dir in ("mine/empty/run", "kept", "new/a/b"):
        refused(capsys, "optimizer.lr=-1", f"hydra.run.dir={tmp_path / run_dir}")
    assert tree(tmp_path) == ["kept", "kept/notes.txt", "mine", "mine/empty"]


def test_what_a_run_created_is_told_apart_from_what_was_there(tmp_path) -> None:
    from hydratune.components.runtime import created

    (tmp_path / "there").mkdir()
    made = created.remember(tmp_path / "there" / "a" / "b")
    assert made.top == tmp_path / "there" / "a" and not made.before
    (tmp_path / "there" / "a").mkdir()
    sweep = created.remember(tmp_path / "there")  # existed: its entries then are not this run's
    assert sweep.top is None and sweep.before == {"a"}
    assert created.record_of(tmp_path / "there" / "a" / "c") is None  # under a folder that was there
    (tmp_path / "there" / "p").mkdir()
    assert created.record_of(tmp_path / "there" / "p").top == tmp_path / "there" / "p"  # a new point dir


def test_plan_adds_nothing_to_a_pinned_run_dir_that_existed(tmp_path, capsys, monkeypatch) -> None:
    """A pinned run dir that existed: plan adds nothing there (its .hydra/ and log are removed)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    (tmp_path / "pinned").mkdir()
    cli("mode=plan", f"hydra.run.dir={tmp_path / 'pinned'}", "hydra.job.env_copy=[WANDB_API_KEY]")
    assert "checks passed" in capsys.readouterr().out
    assert tree(tmp_path) == ["pinned"]


def test_a_newline_in_submitits_sbatch_values_is_refused_before_the_sweep(
    tmp_path, capsys, monkeypatch
) -> None:
    """hydra-submitit-launcher writes ``hydra.launcher.*`` into each point's sbatch script (quoted, but a
    newline in a ``#SBATCH`` comment line still starts a command): refused before the sweep dir exists."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "marker"
    submitit = ["-m", "launcher=slurm", "hydra/launcher=submitit_slurm", f"hydra.sweep.dir={tmp_path / 'sw'}"]
    for key in ("partition", "comment"):
        err = refused(capsys, *submitit, f"hydra.launcher.{key}={newline(marker)}")
        assert f"[hydra.launcher.{key}]" in err and "control character" in err, err
    err = refused(capsys, *submitit, "hydra.launcher.account='ml team'")
    assert "[hydra.launcher.account]" in err and "not a SLURM account name" in err
    assert not marker.exists() and not list(tmp_path.iterdir())
