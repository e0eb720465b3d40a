"""Interruption, exact resume, atomic checkpoints, bad data, bad configs, secrets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from components.config.errors import EXIT_INTERRUPTED, ConfigError
from components.runtime.checkpoint import COMPLETE, checkpoints_in, resolve_resume, verify
from components.runtime.resume import resolve

RUN = [
    "train.max_steps=60",
    "train.micro_batch_size=8",
    "train.log_every=1",
    "train.save_every=0",
    "train.eval_every=0",
    "train.eval_generations=0",
    "train.write_plots=false",
]


def start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    """The CLI in a subprocess, in a session of its own (a signal to its group reaches it and its workers
    only, like Ctrl-C in a terminal)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "recipes", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> str:
    """Wait for the CLI and return its stderr; on a timeout kill its whole process group (workers
    included) before failing, so a hung run leaves nothing behind."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


def wait_for_step(cwd: Path, step: int, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Block until some run under ``cwd`` has logged ``step`` (the process is mid-training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for metrics in cwd.glob("outputs/*/*/metrics.jsonl"):
            lines = metrics.read_text().splitlines()
            if any(json.loads(line).get("step", 0) >= step for line in lines if line.strip()):
                return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    finish(proc, timeout=0.1)
    raise AssertionError("training never reached the step")


def final_model(cwd: Path, exclude: set[Path] = frozenset()) -> tuple[Path, dict[str, torch.Tensor]]:
    (run,) = [
        p.parent.parent
        for p in cwd.glob("outputs/*/*/final/model.safetensors")
        if p.parent.parent not in exclude
    ]
    return run, load_file(run / "final" / "model.safetensors")


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_matches_uninterrupted(tmp_path: Path) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    reference = start(straight, *RUN)
    victim = start(interrupted, *RUN)
    wait_for_step(interrupted, 5, victim)
    victim.send_signal(signal.SIGTERM)
    err = finish(victim, timeout=120)
    assert victim.returncode == EXIT_INTERRUPTED, err[-2000:]
    assert "Resume with" in err
    (run,) = interrupted.glob("outputs/*/*")
    (checkpoint,) = checkpoints_in(run)
    assert verify(checkpoint) is None and 5 <= int(checkpoint.name.split("-")[1]) < 60
    assert not (run / "final").exists()
    assert "interrupted" in (run / "summary.md").read_text()

    advice = re.search(r"Resume with: hydratune (resume=\S+)", err)
    assert advice and advice.group(1) == f"resume={run}", err[-2000:]
    resumed = start(interrupted, advice.group(1))  # the printed advice alone: the run's own config
    err = finish(resumed, timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    assert f"continuing {run} with its own config" in err
    assert reference.wait(timeout=300) == 0
    _, expected = final_model(straight)
    again, got = final_model(interrupted)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    stopped_at = int(checkpoint.name.split("-")[1])
    covers = json.loads((again / "result.json").read_text())["run"]["train_loss covers"]
    assert covers.startswith(f"steps {stopped_at + 1} to 60 (resumed after step {stopped_at}"), covers


DDP2 = ["strategy=ddp", "launcher.nproc_per_node=2", "train.max_steps=30"]


def stopped_records(run: Path) -> list[dict]:
    """What each rank recorded when it stopped after the signal: both must name one step, one checkpoint."""
    return [json.loads((run / f".rank{rank}.stopped.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
def test_a_signal_to_the_launcher_stops_every_rank_and_resumes_exactly(tmp_path: Path) -> None:
    """Two DDP workers under the local launcher; SIGTERM to the launching process only (``kill``, ``docker
    stop``): it relays the signal, both ranks stop after the same step, one checkpoint, exit 75 like a
    single process; the printed advice resumes to the uninterrupted run's weights."""
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    victim = start(interrupted, *RUN, *DDP2)
    wait_for_step(interrupted, 5, victim)
    victim.send_signal(signal.SIGTERM)
    err = finish(victim, timeout=180)
    assert victim.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    (run,) = interrupted.glob("outputs/*/*")
    first, second = stopped_records(run)
    assert first == second and first["signum"] == signal.SIGTERM
    (checkpoint,) = checkpoints_in(run)
    assert verify(checkpoint) is None and str(checkpoint) == first["checkpoint"]
    assert 5 <= first["step"] < 30 and checkpoint.name == f"checkpoint-{first['step']}"
    assert "stopped by SIGTERM" in (run / "summary.md").read_text()

    advice = re.search(r"Resume with: hydratune (resume=\S+)", err)
    assert advice and advice.group(1) == f"resume={run}", err[-2000:]
    resumed = start(interrupted, advice.group(1))
    err = finish(resumed, timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    reference = start(straight, *RUN, *DDP2)
    err = finish(reference, timeout=300)
    assert reference.returncode == 0, err[-2000:]
    _, expected = final_model(straight)
    _, got = final_model(interrupted)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def own_processes(proc: subprocess.Popen[str], run: Path, who: str) -> None:
    """Send a signal the way ``who`` gets it: Ctrl-C (SIGINT to the whole process group), or SLURM /
    an operator signalling one worker (SIGUSR1 to rank 1 only)."""
    if who == "group":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        (pid_file,) = (run / ".workers").glob("*.1.pid")
        os.kill(int(pid_file.read_text()), signal.SIGUSR1)


@pytest.mark.slow
@pytest.mark.parametrize(("who", "signum"), [("group", signal.SIGINT), ("rank 1", signal.SIGUSR1)])
def test_a_signal_that_reaches_the_workers_stops_all_ranks_at_one_step(tmp_path: Path, who, signum) -> None:
    """Ctrl-C reaches the launcher and both workers at once (counted once, not as a second signal that
    kills); a signal to one worker only stops the other at the same step too (the ranks agree each step)."""
    proc = start(tmp_path, *RUN, *DDP2)
    wait_for_step(tmp_path, 5, proc)
    (run,) = tmp_path.glob("outputs/*/*")
    own_processes(proc, run, who)
    err = finish(proc, timeout=180)
    assert proc.returncode == EXIT_INTERRUPTED, err[-3000:]
    first, second = stopped_records(run)
    assert first == second and first["signum"] == signum
    (checkpoint,) = checkpoints_in(run)
    assert verify(checkpoint) is None and checkpoint.name == f"checkpoint-{first['step']}"


@pytest.mark.slow
def test_workers_of_a_killed_launcher_checkpoint_and_stop(tmp_path: Path) -> None:
    """SIGKILL (or the OOM killer) on the launching process: torch's spawn sends its workers SIGINT, so
    they stop together at a checkpoint; none is left running on its own."""
    proc = start(tmp_path, *RUN, *DDP2, "train.max_steps=100000")
    wait_for_step(tmp_path, 2, proc)
    (run,) = tmp_path.glob("outputs/*/*")
    pids = [int(p.read_text()) for p in (run / ".workers").glob("*.pid")]
    assert len(pids) == 2
    proc.kill()
    proc.communicate()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.2)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "workers outlived their launcher"
    first, second = stopped_records(run)
    assert first == second and first["signum"] == signal.SIGINT
    (checkpoint,) = checkpoints_in(run)
    assert verify(checkpoint) is None and checkpoint.name == f"checkpoint-{first['step']}"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"  # a zombie has exited


@pytest.mark.slow
def test_ctrl_c_checkpoints_like_sigterm(tmp_path: Path) -> None:
    """SIGINT on one process (SIGUSR1 goes the same way: to one worker in the test above)."""
    signum = signal.SIGINT
    proc = start(tmp_path, *RUN)
    wait_for_step(tmp_path, 5, proc)
    proc.send_signal(signum)
    err = finish(proc, timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED, err[-2000:]
    (run,) = tmp_path.glob("outputs/*/*")
    (checkpoint,) = checkpoints_in(run)
    assert verify(checkpoint) is None and not (run / "final").exists()
    name = signal.Signals(signum).name
    assert f"stopped by {name} at step {checkpoint.name.split('-')[1]}" in (run / "summary.md").read_text()
    assert f"Resume with: hydratune resume={run}" in err


def test_second_signal_exits_at_once() -> None:
    code = (
        "import os, signal\n"
        "from components.distributed.interrupt import GracefulInterrupt\n"
        "g = GracefulInterrupt().install()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "assert g.requested\n"
        "print('first: graceful', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('second: survived', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "first: graceful" in proc.stdout and "survived" not in proc.stdout
    assert proc.returncode == -signal.SIGTERM
    assert "send SIGTERM again to stop at once" in proc.stderr


def test_a_relayed_signal_and_the_same_signal_itself_count_once() -> None:
    """Ctrl-C or SLURM reach a worker directly and through the launcher's relay, in either order: one
    graceful stop, not the 'second signal' that kills; a later signal still kills."""
    code = (
        "import os, signal\n"
        "from components.distributed.interrupt import GracefulInterrupt\n"
        "g = GracefulInterrupt().install()\n"
        "g.relayed(signal.SIGINT)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "assert g.requested and g.signum == signal.SIGINT\n"
        "print('one stop', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "print('second: survived', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "one stop" in proc.stdout, proc.stderr[-2000:]
    assert "survived" not in proc.stdout and proc.returncode == -signal.SIGINT


def test_a_signal_handled_during_the_agreement_waits_for_the_next_step(monkeypatch) -> None:
    """A signal handled while this rank waits in the per-step all-reduce (the handler runs when the call
    returns) was not in the flag it sent: this step's answer is the all-reduced flag, so this rank does not
    stop alone while the others train on (the hang of a rank signalled on its own); the next step all stop."""
    import torch.distributed as dist

    from components.distributed.interrupt import GracefulInterrupt

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


SECRETS = {
    "HF_TOKEN": "hf_SeCrEt0123456789abcdef",
    "WANDB_API_KEY": "wandbSeCrEt0123456789abcdef0123456789",
    "OPENAI_API_KEY": "sk-SeCrEt0123456789abcdef",
}


def test_no_secret_from_the_environment_reaches_the_run_dir(tmp_path: Path) -> None:
    env = {**os.environ, **SECRETS, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    args = [*RUN, "train.max_steps=4", "train.save_every=2", "tracker=[tensorboard,wandb,mlflow]"]
    proc = subprocess.run(
        [sys.executable, "-m", "recipes", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in files) and any("tfevents" in p.name for p in files)
    assert any(p.suffix == ".wandb" for p in files) and any("mlruns" in p.parts for p in files)
    for path in files:
        blob = path.read_bytes()
        for name, secret in SECRETS.items():
            assert secret.encode() not in blob, f"{name} leaked into {path}"


def test_our_code_never_unpickles_unsafely() -> None:
    """Weights are safetensors; any torch.load in hydratune itself must pass weights_only=True."""
    root = Path(__file__).resolve().parent.parent
    for path in [*root.glob("components/**/*.py"), *root.glob("recipes/**/*.py")]:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{path}:{number}"
