"""Interruption, exact resume, atomic checkpoints, bad data, bad configs, secrets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.config.errors import EXIT_INTERRUPTED
from components.runtime.checkpoint import checkpoints_in, verify
from tests.support.cli import finish, start, wait_for_step

RUN = [
    "train.max_steps=60",
    "train.micro_batch_size=8",
    "train.log_every=1",
    "train.save_every=0",
    "train.eval_every=0",
    "train.eval_generations=0",
    "train.write_plots=false",
]


def final_model(cwd: Path, exclude: set[Path] = frozenset()) -> tuple[Path, dict[str, torch.Tensor]]:
    (run,) = [
        p.parent.parent
        for p in cwd.glob("outputs/*/*/final/model.safetensors")
        if p.parent.parent not in exclude
    ]
    return run, load_file(run / "final" / "model.safetensors")


DDP2 = ["strategy=ddp", "launcher.nproc_per_node=2", "train.max_steps=30"]


def stopped_records(run: Path) -> list[dict]:
    """What each rank recorded when it stopped after the signal: both must name one step, one checkpoint."""
    return [json.loads((run / f".rank{rank}.stopped.json").read_text()) for rank in (0, 1)]


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
