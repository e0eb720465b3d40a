"""A run is never written over, a checkpoint is resumed only when its bytes are the ones written and its
data is the data it was trained on, and a signal at any moment leaves either a whole result or nothing.

One short SFT run (3 steps, a checkpoint each) is shared: its final save is hit by a SIGTERM; then its
checkpoints are damaged, its data edited and its dir reused (components/runtime/checkpoint.py and resume.py,
components/data/fingerprint.py, components/runtime/hydra_dirs.py)."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.runtime.checkpoint import checkpoints_in, mark_complete, resolve_resume
from hydratune.components.runtime.resume import resolve
from tests.conftest import REPO, save_like_hydra
from tests.support.cli import Warm, in_process

STEPS = [
    "train.max_steps=3",
    "train.save_every=1",
    "train.keep_last=3",
    "train.eval_every=0",
    "train.eval_generations=0",
    "train.write_plots=false",
]


def signalled(hydratune: Warm, cwd: Path, hook: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The command, sending itself SIGTERM when ``hook`` (``module.attr``) is called."""
    return hydratune(
        *args, cwd=cwd, prelude=f"from tests.support.cli import sigterm_on; sigterm_on({hook!r})"
    )


@pytest.fixture(scope="module")
def shared(
    hydratune: Warm, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """(run dir, its data file, the finished process): SFT on a copy of the demo data, SIGTERM while
    final/ is written."""
    root = tmp_path_factory.mktemp("safety")
    data = root / "train.jsonl"
    shutil.copy(REPO / "components" / "assets" / "demo" / "sft_train.jsonl", data)
    run = root / "outputs" / "day" / "first"
    proc = signalled(
        hydratune,
        root,
        "hydratune.components.runtime.session.save_final",
        *STEPS,
        f"data.path={data}",
        f"hydra.run.dir={run}",
    )
    return run, data, proc


def copy_of(run: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "outputs" / "day" / run.name
    shutil.copytree(run, dest)
    return dest


def test_a_signal_during_the_final_save_finishes_it(shared) -> None:
    run, _, proc = shared
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SIGTERM after the last training step" in proc.stderr
    assert (run / "final" / "model.safetensors").is_file()
    assert "SIGTERM after the last training step" in (run / "summary.md").read_text()
    assert [p.name for p in checkpoints_in(run)] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]


def flip(path: Path) -> None:
    """Other bytes, same size (bit rot, a bad copy)."""
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_damaged_checkpoint_is_skipped_for_the_previous_whole_one(shared, tmp_path, caplog) -> None:
    run = copy_of(shared[0], tmp_path)
    first, second, third = checkpoints_in(run)
    caplog.set_level(logging.WARNING, "hydratune")
    flip(third / "model.safetensors")
    assert resolve_resume(str(run)) == str(second)
    assert resolve_resume(str(third)) == str(second)
    assert "model.safetensors" in caplog.text and str(third) in caplog.text
    (second / "optimizer.pt").write_bytes(os.urandom((second / "optimizer.pt").stat().st_size))
    (first / "rng_state.pth").write_bytes(b"\0" * (first / "rng_state.pth").stat().st_size)
    with pytest.raises(ConfigError, match="nothing to resume") as info:
        resolve_resume(str(run))
    assert info.value.key == "resume"
    assert "optimizer.pt" in caplog.text and "rng_state.pth" in caplog.text
    # a checkpoint written before checksums (sizes only in its marker) still resumes, with a note
    marker = json.loads((first / "hydratune_complete.json").read_text())
    legacy = {k: v for k, v in marker.items() if k not in ("sha256", "data")}
    (first / "hydratune_complete.json").write_text(json.dumps(legacy))
    caplog.clear()
    assert resolve_resume(str(run)) == str(first)
    assert "predates checksums" in caplog.text


def test_resuming_on_edited_data_is_refused_naming_the_file(shared, tmp_path, compose_cfg) -> None:
    run, data = copy_of(shared[0], tmp_path), tmp_path / "train.jsonl"
    shutil.copy(shared[1], data)
    cfg = compose_cfg(*STEPS, f"data.path={shared[1]}", f"resume={run}")
    assert resolve(cfg, tmp_path / "new") == str(run / "checkpoints" / "checkpoint-3")
    lines = shared[1].read_text().splitlines(keepends=True)
    try:
        shared[1].write_text("".join(lines[:-1]))  # one row fewer
        with pytest.raises(ConfigError) as info:
            resolve(cfg, tmp_path / "new")
        assert str(shared[1]) in str(info.value) and "resume_allow_data_change=true" in info.value.hint
        cfg.resume_allow_data_change = True
        assert resolve(cfg, tmp_path / "new") == str(run / "checkpoints" / "checkpoint-3")
    finally:
        shared[1].write_text("".join(lines))


def test_mode_plan_runs_the_resume_checks(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as code:
        in_process("mode=plan", f"resume={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'plan'}")
    assert code.value.code == 2 and "nothing to resume from" in capsys.readouterr().err


def test_a_run_dir_holding_a_run_is_only_resumed(shared, tmp_path, monkeypatch, capsys) -> None:
    """Same pinned hydra.run.dir twice: refused before Hydra writes a file there; resume= that dir is the
    way to continue in it, and trains no step past train.max_steps (the checkpoint is of the last step)."""
    from hydratune.recipes.sft import SFT

    run = copy_of(shared[0], tmp_path)
    saved = (run / ".hydra" / "config.yaml").read_text()
    ran: list[Any] = []
    monkeypatch.setattr(SFT, "run", lambda self, ctx: ran.append(ctx.cfg.resume))
    with pytest.raises(SystemExit) as code:
        in_process(*STEPS, f"data.path={shared[1]}", f"hydra.run.dir={run}")
    err = capsys.readouterr().err
    assert code.value.code == 2 and not ran, err
    assert "[hydra.run.dir]" in err and str(run) in err and f"resume={run}" in err
    assert (run / ".hydra" / "config.yaml").read_text() == saved
    in_process(f"resume={run}", f"hydra.run.dir={run}")
    assert ran == [str(run / "checkpoints" / "checkpoint-3")]
    in_process("resume=true", f"hydra.run.dir={run}")  # the run the pinned dir holds: continued in place
    assert ran[-1] == str(run / "checkpoints" / "checkpoint-3") and len(ran) == 2


def test_a_quoted_resume_path_with_spaces_is_that_runs_config(shared, tmp_path, monkeypatch) -> None:
    """``resume="<dir with spaces and é>"`` in Hydra's quotes: the run's own config, not the defaults."""
    from hydratune.recipes.sft import SFT

    run = copy_of(shared[0], tmp_path / "a run é")
    ran: list[Any] = []
    monkeypatch.setattr(SFT, "run", lambda self, ctx: ran.append((ctx.cfg.resume, ctx.cfg.train.max_steps)))
    in_process(f'resume="{run}"', f"hydra.run.dir={tmp_path / 'next'}")
    assert ran == [(str(run / "checkpoints" / "checkpoint-3"), 3)]


def test_resuming_from_the_last_steps_checkpoint_trains_no_step(shared, run_recipe) -> None:
    run = shared[0]
    ctx, _ = run_recipe(*STEPS, f"data.path={shared[1]}", f"resume={run}", name="again")
    steps = [r["step"] for r in ctx.run_dir.read_metrics()]
    assert max(steps) == 3, steps
    assert (
        "nothing left to train"
        in json.loads((ctx.run_dir.path / "result.json").read_text())["run"]["train_loss covers"]
    )


def test_a_group_option_on_top_of_resume_is_one_error(shared, capsys) -> None:
    with pytest.raises(SystemExit) as code:
        in_process(f"resume={shared[0]}", "peft=lora")
    err = capsys.readouterr().err
    assert code.value.code == 2 and "[peft]" in err and "Traceback" not in err


def stamped(run: Path, cfg: Any, recorded: float, mtime: float) -> Path:
    """A run dir with one checkpoint whose marker records ``recorded``, the dir's mtime ``mtime``."""
    save_like_hydra(run, cfg, [])
    checkpoint = run / "checkpoints" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    mark_complete(checkpoint, 2)
    marker = checkpoint / "hydratune_complete.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "time": recorded}))
    os.utime(run, (mtime, mtime))
    return checkpoint


def test_latest_is_the_run_recorded_last_not_the_dir_touched_last(compose_cfg, tmp_path, monkeypatch) -> None:
    """resume=true and ${latest_run:sft}: exporting (or anything else writing into) an older run dir
    does not make it the latest."""
    from hydratune.components.config.resolvers import latest_run

    day = tmp_path / "outputs" / "day"
    cfg = compose_cfg()
    older = stamped(day / "older", cfg, recorded=1_700_000_000, mtime=1_700_000_900)  # exported later
    newer = stamped(day / "newer", cfg, recorded=1_700_000_500, mtime=1_700_000_500)
    damaged = stamped(day / "damaged", cfg, recorded=1_700_000_700, mtime=1_700_000_700)
    (damaged.parent.parent / ".hydra" / "config.yaml").write_text("optimizer: [lr: \n")  # not YAML
    cfg.resume = True
    assert resolve(cfg, day / "next") == str(newer)  # the damaged record is passed over, not a traceback
    shutil.rmtree(damaged.parent.parent)
    for run, finished, mtime in (
        (older, "2023-11-14T22:13:20+00:00", 900),
        (newer, "2023-11-14T22:21:40+00:00", 500),
    ):
        result = run.parent.parent / "result.json"
        result.write_text(json.dumps({"run": {"recipe": "sft", "finished at": finished}}))
        (run.parent.parent / "final").mkdir()
        for path in (result, run.parent.parent):  # the older run's dir and file written last (exported)
            os.utime(path, (1_700_000_000 + mtime, 1_700_000_000 + mtime))
    monkeypatch.chdir(tmp_path)
    assert latest_run("sft") == str(newer.parent.parent.relative_to(tmp_path))


def test_a_resumed_launch_clears_the_stale_markers(tmp_path) -> None:
    """A run stopped by a relayed signal left its markers; the launch that resumes into the same run dir
    removes them first (else its workers would stop after one step, every time)."""
    from hydratune.components.distributed.interrupt import RELAY_FILE
    from hydratune.components.launcher import RANK_DONE, RANK_STOPPED, clear_markers

    (tmp_path / RELAY_FILE).write_text("SIGTERM")
    for name in (RANK_DONE, RANK_STOPPED):
        (tmp_path / name.format(rank=0)).write_text("{}")
    clear_markers(tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_killed_sweep_resumes_every_point_from_its_own_run(compose_cfg, tmp_path, monkeypatch) -> None:
    """SIGKILL during point 1 of three: -m ... resume=true continues points 0 and 1 from their own
    checkpoints and starts point 2, which never ran, afresh (instead of refusing the whole sweep)."""
    from hydratune.recipes.sft import SFT
    from tests.support.runs import fake_run

    killed = tmp_path / "multirun" / "day" / "t1"
    lrs = ("1e-3", "2e-3", "3e-3")
    for num, lr in enumerate(lrs[:2]):
        fake_run(killed / str(num), compose_cfg(f"optimizer.lr={lr}"), [f"optimizer.lr={lr}"], age=10 - num)
    resumed: dict[str, Any] = {}
    monkeypatch.setattr(SFT, "run", lambda self, ctx: resumed.update({ctx.run_dir.path.name: ctx.cfg.resume}))
    in_process(
        "-m",
        f"optimizer.lr={','.join(lrs)}",
        "resume=true",
        f"hydra.sweep.dir={tmp_path / 'multirun' / 'day' / 't2'}",
    )
    own = {n: str(killed / n / "checkpoints" / "checkpoint-2") for n in ("0", "1")}
    assert resumed == {"0": own["0"], "1": own["1"], "2": False}


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("write", "no space left on the device writing"),  # torch.save of checkpoint-2 runs out
        ("room", "the next checkpoint needs about"),  # the check before checkpoint-2 sees no room
        ("final", "the final model needs about"),  # the check before final/ sees no room
    ],
)
def test_disk_full_during_a_tiny_run(
    compose_cfg, monkeypatch, tmp_path: Path, fault: str, message: str
) -> None:
    """A real tiny run through ``run_recipe``: checkpoint-1 is written, then the disk runs out (a write
    raising ENOSPC, or no room left before the next save); DiskFull names checkpoint-1 to resume from."""
    import torch

    from hydratune.components.runtime import diskspace
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components, run_recipe

    cfg = compose_cfg(
        "train.max_steps=2", f"train.save_every={2 if fault == 'final' else 1}", "train.eval_every=0",
        "train.eval_generations=0", "train.write_plots=false", "data.max_samples=32",
    )  # fmt: skip
    comps = Components.from_config(cfg)
    device = check_before_load(cfg, comps)
    run_dir = tmp_path / "run"
    first = run_dir / "checkpoints" / ("checkpoint-2" if fault == "final" else "checkpoint-1")
    real_save, real_free = torch.save, diskspace.free_bytes

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if fault == "write" and first.is_dir():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    full = fault != "write"
    monkeypatch.setattr(
        diskspace, "free_bytes", lambda path: 0 if full and first.is_dir() else real_free(path)
    )
    with pytest.raises(diskspace.DiskFull) as info:
        run_recipe(cfg, run_dir, comps=comps, device=device)
    assert message in str(info.value), str(info.value)
    assert f"last whole checkpoint is {first}" in str(info.value)
    assert not (run_dir / "final").exists()
