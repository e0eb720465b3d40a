"""Interruption and exact resume across ranks, and trust in a ZeRO-2 checkpoint: signals to the launcher, to
the workers, a killed launcher; a planted pickle in a sharded optimizer state.

The runs that need no signal are the support matrix's cells (tests/multiproc/test_cells.py launches each
once per session): the uninterrupted DDP run the signal-to-the-launcher test must end like is the sft-ddp
cell (the victim runs its overrides); the planted pickle goes into a copy of the sft-zero2 cell's last
checkpoint, whose clean resume is the cell's own resumed launch. The signalled runs' workers start the
default way (spawn): how the ranks start and stop is what these tests check. Their launchers are forked from
the tier's warm server (``Warm.start``: a process of its own, its own group, its imports done), but the
killed one, a new interpreter: the server would kill the workers it left, which must stop on their own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from hydratune.components.commands.matrix import Cell
from hydratune.components.config.errors import EXIT_INTERRUPTED
from hydratune.components.runtime.checkpoint import checkpoints_in, mark_complete, verify
from tests.support.cells import FORK, command
from tests.support.cli import WarmProcess, finish, start, wait_for_step

#: a one-process run's overrides (tests/cli/test_signals.py's too)
RUN = [
    "train.max_steps=60",
    "train.micro_batch_size=8",
    "train.log_every=1",
    "train.save_every=0",
    "train.eval_every=0",
    "train.eval_generations=0",
    "train.write_plots=false",
]
DDP, ZERO2 = Cell("sft", "ddp", "none", "none", "fp32"), Cell("sft", "zero2", "none", "none", "fp32")


def ddp(cwd: Path) -> list[str]:
    """The sft-ddp cell's overrides (2 ranks, 30 steps), its data cache in ``cwd``."""
    return command(DDP, cwd)


def max_steps(overrides: list[str]) -> int:
    return int(next(o for o in reversed(overrides) if o.startswith("train.max_steps=")).split("=")[1])


class Payload:
    """Unpickling this runs a shell command (here: creates a marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


def final_model(cwd: Path, exclude: set[Path] = frozenset()) -> tuple[Path, dict[str, torch.Tensor]]:
    (run,) = [
        p.parent.parent
        for p in cwd.glob("outputs/*/*/final/model.safetensors")
        if p.parent.parent not in exclude
    ]
    return run, load_file(run / "final" / "model.safetensors")


def stopped_records(run: Path) -> list[dict]:
    """What each rank recorded when it stopped after the signal: both must name one step, one checkpoint."""
    return [json.loads((run / f".rank{rank}.stopped.json").read_text()) for rank in (0, 1)]


def test_a_signal_to_the_launcher_stops_every_rank_and_resumes_exactly(tmp_path: Path, cells, warm) -> None:
    """Two DDP workers under the local launcher; SIGTERM to the launching process only (``kill``, ``docker
    stop``): it relays the signal, both ranks stop after the same step, one checkpoint, exit 75 like a
    single process; the printed advice resumes to the uninterrupted run's weights (the sft-ddp cell's, the
    same overrides), bit for bit."""
    victim = warm.start(*ddp(tmp_path), cwd=tmp_path)
    wait_for_step(tmp_path, 5, victim)
    victim.send_signal(signal.SIGTERM)
    err = finish(victim, timeout=180)
    assert victim.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    (run,) = tmp_path.glob("outputs/*/*")
    first, second = stopped_records(run)
    assert first == second and first["signum"] == signal.SIGTERM
    (checkpoint,) = checkpoints_in(run)
    assert verify(checkpoint) is None and str(checkpoint) == first["checkpoint"]
    assert 5 <= first["step"] < max_steps(ddp(tmp_path)) and checkpoint.name == f"checkpoint-{first['step']}"
    assert "stopped by SIGTERM" in (run / "summary.md").read_text()

    advice = re.search(r"Resume with: hydratune (resume=\S+)", err)
    assert advice and advice.group(1) == f"resume={run}", err[-2000:]
    resumed = warm(advice.group(1), cwd=tmp_path)  # as printed; its workers start the default way
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    expected = load_file(cells[DDP].run / "final" / "model.safetensors")
    _, got = final_model(tmp_path)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def own_processes(proc: WarmProcess, run: Path, who: str) -> None:
    """Send a signal the way ``who`` gets it: Ctrl-C (SIGINT to the whole process group), or SLURM /
    an operator signalling one worker (SIGUSR1 to rank 1 only)."""
    if who == "group":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        (pid_file,) = (run / ".workers").glob("*.1.pid")
        os.kill(int(pid_file.read_text()), signal.SIGUSR1)


@pytest.mark.parametrize(("who", "signum"), [("group", signal.SIGINT), ("rank 1", signal.SIGUSR1)])
def test_a_signal_that_reaches_the_workers_stops_all_ranks_at_one_step(
    tmp_path: Path, warm, who, signum
) -> None:
    """Ctrl-C reaches the launcher and both workers at once (counted once, not as a second signal that
    kills); a signal to one worker only stops the other at the same step too (the ranks agree each step)."""
    proc = warm.start(*ddp(tmp_path), cwd=tmp_path)
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
    proc = start(tmp_path, *ddp(tmp_path), "train.max_steps=100000")
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


def test_a_planted_pickle_in_a_zero2_checkpoint_never_runs(tmp_path: Path, cells, warm) -> None:
    """ZeRO-2 on 2 CPU ranks: an untampered checkpoint resumes (the sft-zero2 cell's resumed launch, from
    its checkpoint-3); one whose optimizer states hide a payload (a copy of its checkpoint-6) is refused
    naming the file, the payload never runs — and it is live: trust_checkpoints=true lets DeepSpeed run
    it."""
    cell = cells[ZERO2]
    assert (cell.resumed / "final").is_dir()  # the clean checkpoint resumed, to the end
    run = tmp_path / "run"
    shutil.copytree(cell.run, run)
    tampered = checkpoints_in(run)[-1]
    states = sorted(tampered.glob("global_step*/*optim_states.pt"))[0]  # rank 0's
    state = torch.load(states, weights_only=False)  # our own file, just written
    state["extra"] = Payload(tmp_path / "marker")
    torch.save(state, states)
    mark_complete(tampered, int(tampered.name.split("-")[1]))  # sizes updated, as an attacker would
    again = [*cell.args, f"train.max_steps={max_steps(cell.args) + 1}", f"resume={tampered}", FORK]
    refused = warm(*again, f"hydra.run.dir={tmp_path / 'x'}", cwd=tmp_path)
    assert refused.returncode == 2 and "trust_checkpoints" in refused.stderr and states.name in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "marker").exists()

    warm(*again, "trust_checkpoints=true", f"hydra.run.dir={tmp_path / 'y'}", cwd=tmp_path)
    assert (tmp_path / "marker").exists()  # the payload was real
