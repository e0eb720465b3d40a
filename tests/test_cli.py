"""The ``hydratune`` command as a user meets it: errors are fast, named, and end without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def hydratune(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recipes", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["optimizer.lrr=1"], "lrr"),
        (["data.path=/nonexistent.jsonl"], "/nonexistent.jsonl"),
        (["model=nope"], "llama3_8b"),
        (["train.micro_batch_size=big"], "micro_batch_size"),
        (["hydra.run.dir=/dev/null/run"], "[hydra.run.dir]"),  # not a writable directory
        (["-m", "hydra.sweep.dir=/dev/null/sweep", "optimizer.lr=1e-3,2e-3"], "[hydra.sweep.dir]"),
        (["data.path=/nonexistent.jsonl"], "[data.path]"),
        (["hydra.run.dir=/proc/hydratune/run"], "[hydra.run.dir]"),  # root passes os.access there
        (["optimizer.lrr=1"], "[optimizer.lrr]"),  # Hydra's composition errors: exit 2 too
        (["peft=lorra"], "one of: bitfit, dora"),
        (["peft=lorra"], "[peft]"),
        (["train.max_steps=abc"], "[train.max_steps]"),
        (["trian.seed=1"], "[trian]"),
    ],
)
def test_bad_input_fails_fast_with_a_named_error(tmp_path: Path, args: list[str], needle: str) -> None:
    start = time.monotonic()
    proc = hydratune(*args, cwd=tmp_path)
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr + proc.stdout
    assert elapsed < 10, f"took {elapsed:.1f}s"
    last = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()][-1]
    assert "Traceback" not in last and not last.startswith("  File ")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("final"))


def test_cfg_job_prints_the_composed_config(tmp_path: Path) -> None:
    proc = hydratune("--cfg", "job", "peft=lora", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "_target_: components.peft.LoRA" in proc.stdout
    assert "micro_batch_size" in proc.stdout


def test_help_lists_usage_and_every_group_but_no_schemas(capsys) -> None:
    from components.commands.catalog import catalog
    from recipes.cli import main

    main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("hydratune:") and "hydratune estimate" in out and "--hydra-help" in out
    for group, options in catalog().items():
        assert f"  {group}: {', '.join(options)}" in out
    assert "schema/" not in out  # the structured-config schemas are not options


def test_plan_mode_checks_without_training(tmp_path: Path) -> None:
    proc = hydratune("mode=plan", "peft=lora", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "checks passed" in proc.stdout
    assert not any((tmp_path / "outputs").rglob("final"))


def test_plan_mode_refuses_an_optimizing_sweep_without_a_traceback(tmp_path: Path) -> None:
    """Optuna needs each trial's objective and plan mode returns none: a named error, not a traceback."""
    proc = hydratune("-m", "+experiment=tiny_optuna_sweep", "mode=plan", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "[mode]" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    single = hydratune("+experiment=tiny_optuna_sweep", "mode=plan", cwd=tmp_path)  # the hint's way out
    assert single.returncode == 0 and "checks passed" in single.stdout, single.stderr[-2000:]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("summary.md"))


def test_multirun_writes_one_run_dir_per_point(tmp_path: Path) -> None:
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


def test_replay_reproduces_the_losses(tmp_path: Path) -> None:
    args = [
        "train.max_steps=6",
        "train.log_every=1",
        "train.eval_generations=0",
        "data.max_samples=96",
        "train.micro_batch_size=8",
    ]
    first = hydratune(*args, cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    (original,) = run_dirs(tmp_path / "outputs")
    assert (original / ".hydra" / "config.yaml").is_file() and (
        original / ".hydra" / "overrides.yaml"
    ).is_file()
    again = hydratune("replay", str(original), cwd=tmp_path, timeout=300)
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
        "import sys, recipes.cli; recipes.register_all();"
        "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'trl', 'peft') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_an_error_before_load_leaves_no_run_dir(tmp_path: Path) -> None:
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
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "recipes", "train.max_steps=2"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list((tmp_path / "outputs").glob("*/*/.hydra")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the run dir exists: Hydra composed, hydratune is checking and building
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip() and "Warning" not in line]
    assert lines == ["hydratune: interrupted (Ctrl-C)"], err[-2000:]
    assert not (tmp_path / "outputs").exists()
