"""The ``hydratune`` command as a user meets it: errors are fast, named, and end without a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hydratune.components.memory.spec import strategy_shapes
from tests.integration.test_rewards import USER_REWARDS
from tests.support.cli import child_env, fresh

REPO = Path(__file__).resolve().parents[2]


def dead_url() -> str:
    """A local URL nothing listens on (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/score"


# ---- the command line ---------------------------------------------------------------------------
def hydratune_estimate(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``hydratune estimate`` in a new interpreter (nothing heavy to import: the time is the command's)."""
    begin = time.perf_counter()
    proc = fresh("estimate", *args, cwd=REPO, env={"COLUMNS": "160"}, timeout=60)
    return proc, time.perf_counter() - begin


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["optimizer.lrr=1"], ("lrr", "[optimizer.lrr]")),  # Hydra's composition errors: exit 2 too
        (["data.path=/nonexistent.jsonl"], ("/nonexistent.jsonl", "[data.path]")),
        (["model=nope"], ("llama3_8b",)),
        (["train.micro_batch_size=big"], ("micro_batch_size",)),
        (["hydra.run.dir=/dev/null/run"], ("[hydra.run.dir]",)),  # not a writable directory
        (["-m", "hydra.sweep.dir=/dev/null/sweep", "optimizer.lr=1e-3,2e-3"], ("[hydra.sweep.dir]",)),
        (["hydra.run.dir=/proc/hydratune/run"], ("[hydra.run.dir]",)),  # root passes os.access there
        (["peft=lorra"], ("one of: bitfit, dora", "[peft]")),
        (["train.max_steps=abc"], ("[train.max_steps]",)),
        (["trian.seed=1"], ("[trian]",)),
    ],
    ids=lambda value: value[-1] if isinstance(value, tuple) else None,
)
def test_bad_input_fails_fast_with_a_named_error(
    tmp_path: Path, args: list[str], needles: tuple[str, ...]
) -> None:
    start = time.monotonic()
    proc = fresh(*args, cwd=tmp_path, timeout=120)  # start-up included: errors come before heavy imports
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr[-2000:]
    for needle in needles:  # one launch for all the names its error must give
        assert needle in proc.stderr + proc.stdout, needle
    assert elapsed < 10, f"took {elapsed:.1f}s"
    last = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()][-1]
    assert "Traceback" not in last and not last.startswith("  File ")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("final"))


def test_cfg_job_prints_the_composed_config(hydratune, tmp_path: Path) -> None:
    proc = hydratune("--cfg", "job", "peft=lora", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "_target_: hydratune.components.peft.LoRA" in proc.stdout
    assert "micro_batch_size" in proc.stdout


def test_help_lists_usage_and_every_group_but_no_schemas(capsys) -> None:
    from hydratune.components.commands.catalog import catalog
    from hydratune.recipes.cli import main

    main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("hydratune:") and "hydratune estimate" in out and "--hydra-help" in out
    for group, options in catalog().items():
        assert f"  {group}: {', '.join(options)}" in out
    assert "schema/" not in out  # the structured-config schemas are not options


def test_plan_mode_checks_without_training(hydratune, tmp_path: Path) -> None:
    proc = hydratune("mode=plan", "peft=lora", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "checks passed" in proc.stdout
    assert not any((tmp_path / "outputs").rglob("final"))


def test_plan_mode_refuses_an_optimizing_sweep_without_a_traceback(hydratune, tmp_path: Path) -> None:
    """Optuna needs each trial's objective and plan mode returns none: a named error, not a traceback."""
    proc = hydratune("-m", "+experiment=tiny_optuna_sweep", "mode=plan", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "[mode]" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    single = hydratune("+experiment=tiny_optuna_sweep", "mode=plan", cwd=tmp_path)  # the hint's way out
    assert single.returncode == 0 and "checks passed" in single.stdout, single.stderr[-2000:]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("summary.md"))


def test_multirun_writes_one_run_dir_per_point(hydratune, tmp_path: Path) -> None:
    proc = hydratune(
        "-m",
        "peft=none,lora",
        "train.max_steps=3",
        "train.eval_generations=2",
        "data.max_samples=64",
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dirs = run_dirs(tmp_path / "multirun")
    assert len(dirs) == 2
    assert (dirs[0] / "final" / "model.safetensors").is_file()
    assert (dirs[1] / "final" / "adapter_model.safetensors").is_file()


def test_replay_reproduces_the_losses(hydratune, tmp_path: Path) -> None:
    args = [
        "train.max_steps=6",
        "train.log_every=1",
        "train.eval_generations=0",
        "data.max_samples=96",
        "train.micro_batch_size=8",
    ]
    first = hydratune(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    (original,) = run_dirs(tmp_path / "outputs")
    assert (original / ".hydra" / "config.yaml").is_file() and (
        original / ".hydra" / "overrides.yaml"
    ).is_file()
    again = hydratune("replay", str(original), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    replayed = [d for d in run_dirs(tmp_path / "outputs") if d != original]
    assert len(replayed) == 1

    def losses(run: Path) -> list[float]:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    assert len(losses(original)) == 6
    assert losses(replayed[0]) == losses(original)


def test_the_cli_does_not_import_the_heavy_libraries_up_front(tmp_path: Path) -> None:
    """Config errors must come back in well under a second or two: nothing heavy is imported to compose."""
    probe = (
        "import sys, hydratune.recipes.cli; hydratune.recipes.register_all();"
        "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'trl', 'peft') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_an_error_before_load_leaves_no_run_dir(hydratune, tmp_path: Path) -> None:
    """Failed when the data was read (after Hydra made the run dir, before any model): nothing stays."""
    one_row = tmp_path / "one.jsonl"
    one_row.write_text(
        json.dumps({"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]})
        + "\n"
    )
    proc = hydratune("data=jsonl_messages", f"data.path={one_row}", cwd=tmp_path)
    assert proc.returncode == 2 and "[data.eval_fraction]" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "outputs").exists(), list((tmp_path / "outputs").rglob("*"))


def test_ctrl_c_during_start_up_exits_130_quietly(tmp_path: Path) -> None:

    # a fresh process, the SIGINT landing exactly while hydratune checks the composed run before load (the
    # run dir exists, nothing is built): polling for the run dir from outside raced a short run's end
    ctrl_c = "check_before_load"
    code = (
        # Ctrl-C as a terminal delivers it (a suite started in the background inherits SIGINT ignored)
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from tests.support.cli import signal_on; "
        f"signal_on('hydratune.components.runtime.checks.{ctrl_c}', signal.SIGINT); "
        "from hydratune.recipes.cli import main; main(sys.argv[1:])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "train.max_steps=2"],
        cwd=tmp_path,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip() and "Warning" not in line]
    assert lines == ["hydratune: interrupted (Ctrl-C)"], err[-2000:]
    assert not (tmp_path / "outputs").exists()


def test_cli_estimate_llama3_8b_lora_on_24gb() -> None:
    proc, seconds = hydratune_estimate(
        "model=llama3_8b", "peft=lora", "precision=bf16", "estimate.gpu_memory=24GB"
    )
    assert proc.returncode in (0, 1), proc.stderr
    assert "Memory per GPU" in proc.stdout and "zero3_offload" in proc.stdout
    assert ("FITS" in proc.stdout) or ("DOES NOT FIT" in proc.stdout)
    assert seconds <= 10, seconds


def test_cli_estimate_llama3_70b_auto_names_the_choice() -> None:
    proc, seconds = hydratune_estimate(
        "model=llama3_70b", "strategy=auto", "estimate.num_gpus=8", "estimate.gpu_memory=80GB"
    )
    assert proc.returncode == 0, proc.stderr
    assert "chose strategy=zero3" in proc.stdout and "first rung that fits" in proc.stdout
    assert seconds <= 10, seconds


def test_estimate_table_is_not_cut_when_piped() -> None:
    """Captured stdout (not a TTY) and no COLUMNS: rich would assume 80 columns and cut `zero2_…`."""
    env = {k: v for k, v in child_env().items() if k != "COLUMNS"}
    proc = subprocess.run(
        [sys.executable, "-m", "hydratune", "estimate", "model=llama3_8b", "estimate.gpu_memory=80GB"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert proc.returncode in (0, 1), proc.stderr
    for name in strategy_shapes(1):  # every option that applies to one GPU
        assert f" {name} " in proc.stdout, name
    assert "…" not in proc.stdout


def test_importing_components_peft_is_cheap() -> None:
    code = (
        "import sys, hydratune.components.peft; "
        "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["+lr=1e-5"], "did you mean optimizer.lr"),
        (["--config-dir", "mine", "optimizer=bad"], "optimizer/bad.yaml, line 4"),
        (["--config-dir", "mine", "+experiment=bad"], "malformed YAML in mine/experiment/bad.yaml, line 4"),
        (  # checked before strategy=auto's estimate reads it ("nothing fits" before)
            ["strategy=auto", "estimate.gpu_memory=80GB", "estimate.safety_margin=nan"],
            "[estimate.safety_margin] must be",
        ),
    ],
    ids=["plus-lr", "yaml-option", "yaml-experiment", "auto-nan"],
)
def test_cli_probe_is_refused_before_load(hydratune, tmp_path: Path, args: list[str], needle: str) -> None:
    """Through a real Hydra job: the job's own config groups (``+lr`` is none of them), a malformed option
    file Hydra itself reads, an experiment file hydratune reads before Hydra."""
    bad = "# @package _global_\noptimizer:\n  lr: [1\n  x: 2\n"
    for group in ("experiment", "optimizer"):
        (tmp_path / "mine" / group).mkdir(parents=True)
        (tmp_path / "mine" / group / "bad.yaml").write_text(bad)
    proc = hydratune(*args, "mode=plan", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_cli_file_size_limit_is_refused_before_load(hydratune, tmp_path: Path) -> None:
    """``ulimit -f 1024`` (1 MiB): the tiny model's checkpoint has larger files; refused in mode=plan."""
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))"  # ulimit -f 1024
    proc = hydratune("mode=plan", cwd=tmp_path, prelude=limit)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "per-file size limit (ulimit -f)" in proc.stderr and "Traceback" not in proc.stderr


def test_report_lists_a_refused_sweep_point(hydratune, tmp_path: Path) -> None:
    """A basic sweep goes on past a refused point, exits 2, and the report has a row saying why."""
    from hydratune.components.commands.report import write_report

    proc = hydratune("-m", "train.max_steps=0,3", "mode=plan", cwd=tmp_path)
    assert proc.returncode == 2 and "1 sweep point(s) refused" in proc.stderr, proc.stderr[-2000:]
    assert "checks passed" in proc.stdout  # the second point was planned
    (sweep,) = tmp_path.glob("multirun/*/*")
    markdown, rows = write_report(sweep)
    assert [r["status"] for r in rows] == ["refused"]  # the planned point wrote nothing (mode=plan)
    assert "[train.max_steps] must be" in rows[0]["error"] and "points failed" in markdown


def test_a_misspelt_reward_beside_the_experiment_file_and_a_dead_url_exit_2_in_plan(
    hydratune, tmp_path
) -> None:
    experiments = tmp_path / "myconf" / "experiment"
    experiments.mkdir(parents=True)
    (experiments / "exp_rewards_b.py").write_text(USER_REWARDS)
    (experiments / "typo.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /recipe: grpo\n"
        "recipe:\n  reward_funcs: [exp_rewards_b.corect]\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config_dir = ["--config-dir", str(tmp_path / "myconf")]
    # (test_a_reward_module_in_the_working_directory_resolves_before_load runs the good name; "did you
    # mean correct" here says the module was imported from beside the experiment file)
    typo = hydratune(*config_dir, "+experiment=typo", "mode=plan", cwd=elsewhere)
    dead = hydratune(
        "recipe=ppo", f"recipe.reward_url={dead_url()}", "recipe.reward_retries=0", "mode=plan", cwd=tmp_path
    )
    for proc, key, words in [
        (typo, "recipe.reward_funcs[0]", "did you mean correct"),
        (dead, "recipe.reward_url", "does not answer"),
    ]:
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"[{key}]" in proc.stderr and words in proc.stderr and "Traceback" not in proc.stderr


def test_two_processes_started_together_get_different_run_dirs(compose_cfg) -> None:
    """The run dir ends in a per-process tag, so runs started in the same second never share a dir."""
    import subprocess
    import sys

    from hydra import compose

    from hydratune.components.config.resolvers import run_tag

    cfg = compose(config_name="config", return_hydra_config=True)
    assert cfg.hydra.run.dir.endswith(f"_sft_{run_tag()}")
    probe = "from hydratune.components.config.resolvers import run_tag; print(run_tag())"
    tags = {
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout for _ in range(3)
    }
    assert len(tags) == 3, tags
