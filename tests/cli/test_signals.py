"""Signals to a real hydratune process: SIGTERM and Ctrl-C checkpoint and the printed resume command
continues exactly; a second signal exits at once; a relayed signal counts once; SIGTERM before the first
step leaves no run dir; a stream stopped by SIGTERM resumes on the same rows; SIGTERM then SLURM's
pre-emption signal is one pre-emption; SIGTERM during PPO's final save finishes it; no secret from the
environment reaches the run dir."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from hydratune.components.config.errors import EXIT_INTERRUPTED
from hydratune.components.data.feed import TRACE
from hydratune.components.data.stream_prepare import POSITION_FILE
from hydratune.components.runtime.checkpoint import checkpoints_in, verify
from tests.integration.test_resume_safety import STEPS, signalled
from tests.integration.test_streaming import RUN as STREAMED
from tests.integration.test_streaming import chat, same_weights, write_jsonl
from tests.multiproc.test_reliability import RUN, final_model
from tests.support.cli import finish, in_process, start, wait_for_step
from tests.support.rl import FAST_PPO

SECRETS = {
    "HF_TOKEN": "hf_SeCrEt0123456789abcdef",
    "WANDB_API_KEY": "wandbSeCrEt0123456789abcdef0123456789",
    "OPENAI_API_KEY": "sk-SeCrEt0123456789abcdef",
}


def traced(folder: Path, rank: int = 0) -> list[Any]:
    return [json.loads(line) for line in (folder / f"rank{rank}.jsonl").read_text().splitlines()]


def test_sigterm_checkpoints_and_resume_matches_uninterrupted(hydratune, tmp_path: Path) -> None:
    """The signalled run is a new interpreter; the uninterrupted reference beside it and the resumed run are
    forked from the warm server (no signal reaches them)."""
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    reference = hydratune.start(*RUN, cwd=straight)
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
    reference_err = reference.communicate(timeout=300)[1]  # the server's one command, before the next
    assert reference.returncode == 0, reference_err[-2000:]
    resumed = hydratune(advice.group(1), cwd=interrupted)  # the printed advice alone: the run's own config
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"continuing {run} with its own config" in resumed.stderr
    _, expected = final_model(straight)
    again, got = final_model(interrupted)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    stopped_at = int(checkpoint.name.split("-")[1])
    covers = json.loads((again / "result.json").read_text())["run"]["train_loss covers"]
    assert covers.startswith(f"steps {stopped_at + 1} to 60 (resumed after step {stopped_at}"), covers


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
        "from hydratune.components.distributed.interrupt import GracefulInterrupt\n"
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
        "from hydratune.components.distributed.interrupt import GracefulInterrupt\n"
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


def test_no_secret_from_the_environment_reaches_the_run_dir(hydratune, tmp_path: Path) -> None:
    """The secrets in the command's environment (forked from the warm server: start-up is not the point)."""
    args = [*RUN, "train.max_steps=4", "train.save_every=2", "tracker=[tensorboard,wandb,mlflow]"]
    there = f"import os\nassert all(os.environ[k] == v for k, v in {SECRETS!r}.items())"  # the run has them
    env = {**SECRETS, "WANDB_MODE": "offline"}
    proc = hydratune(*args, cwd=tmp_path, env=env, prelude=there, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in files) and any("tfevents" in p.name for p in files)
    assert any(p.suffix == ".wandb" for p in files) and any("mlruns" in p.parts for p in files)
    for path in files:
        blob = path.read_bytes()
        for name, secret in SECRETS.items():
            assert secret.encode() not in blob, f"{name} leaked into {path}"


def test_sigterm_before_the_first_step_leaves_no_run_dir(hydratune, tmp_path) -> None:
    run = tmp_path / "outputs" / "day" / "early"
    proc = signalled(
        hydratune,
        tmp_path,
        "hydratune.components.runtime.session.Session:build_model",
        *STEPS,
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert "SIGTERM before training started" in proc.stderr
    assert not run.exists() and not (tmp_path / "outputs").exists()


#: a prelude (tests/support/cli.py): the command sends itself SIGTERM when the feed hands out micro-batch 7
SIGTERM_AT_BATCH_7 = """
import os, signal
from hydratune.components.data import feed
real, at = feed.Feed.collate, 7
def collate(self, collator):
    inner, calls = real(self, collator), []
    def hooked(examples):
        calls.append(1)
        if len(calls) == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return inner(examples)
    return hooked
feed.Feed.collate = collate
"""


def test_a_stream_stopped_by_sigterm_resumes_on_the_same_rows_to_the_same_weights(
    hydratune, tmp_path, monkeypatch
) -> None:
    """SIGTERM while the 7th micro-batch is handed out (step 4 of 8, inside the first pass, mid-window):
    the run checkpoints step 4 with its stream position and exits 75; resumed, it trains on exactly the
    rows the uninterrupted run trains on in steps 5-8 (its trace), and ends with the same weights.

    All three runs use this process's torch threads (the forked command is told to): bit-equality holds
    at one thread count, since MKL's matmul sums in a thread-dependent order for some shapes (the chunked
    loss's ``[n, vocab] @ [vocab, hidden]`` with 5-11 trained positions at 2 threads; docs/speed.md)."""
    path = write_jsonl(tmp_path / "rows.jsonl", [chat(i) for i in range(40)])
    common = [*STREAMED, f"data.path={path}", f"data.eval_path={path}"]
    stopped, straight = tmp_path / "stopped", tmp_path / "straight"
    for name in ("t_stopped", "t_resumed", "t_straight"):
        (tmp_path / name).mkdir()
    env = {TRACE: str(tmp_path / "t_stopped")}
    threads = f"import torch; torch.set_num_threads({torch.get_num_threads()})\n"
    proc = hydratune(
        *common, f"hydra.run.dir={stopped}", cwd=tmp_path, env=env, prelude=threads + SIGTERM_AT_BATCH_7
    )
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr[-3000:]
    assert "SIGTERM" in proc.stderr and f"resume={stopped}" in proc.stderr
    checkpoint = stopped / "checkpoints" / "checkpoint-4"
    position = json.loads((checkpoint / POSITION_FILE.format(rank=0)).read_text())
    assert position["trained"] == 32 and position["next"] == 32 % 24  # mid-window

    monkeypatch.setenv(TRACE, str(tmp_path / "t_resumed"))
    in_process(f"resume={stopped}", f"hydra.run.dir={tmp_path / 'resumed'}")
    monkeypatch.setenv(TRACE, str(tmp_path / "t_straight"))
    in_process(*common, f"hydra.run.dir={straight}")

    reference = traced(tmp_path / "t_straight")
    assert len(reference) == 64 and {r["epoch"] for r in reference} == {0, 1}  # a pass and a half
    assert traced(tmp_path / "t_stopped") == reference[:32]
    assert traced(tmp_path / "t_resumed") == reference[32:]
    runs = (stopped, tmp_path / "resumed", straight)
    ran_with = {json.loads((d / "result.json").read_text())["run"]["cpu threads"] for d in runs}
    assert len(ran_with) == 1, ran_with  # else the weights may differ in the last bits
    same_weights(straight, tmp_path / "resumed")
    result = json.loads((tmp_path / "resumed" / "result.json").read_text())
    assert result["data"]["streamed (per rank)"].startswith("rank 0: 64 rows trained")
    assert result["cost"]["end-of-run eval rows"] == 40 and result["cost"]["end-of-run eval (s)"] >= 0
    assert "end-of-run eval (s)" in (tmp_path / "resumed" / "summary.md").read_text()


def test_sigterm_then_the_preemption_signal_is_one_preemption() -> None:
    """What SLURM sends a job it pre-empts (and submitit's own test of it): TERM, then the pre-emption
    signal. That is one stop, now a pre-emption (the job is requeued after the checkpoint), not a second
    signal that kills (in a process of its own: a kill would take the test runner with it)."""
    code = (
        "import os, signal\n"
        "from hydratune.components.distributed.interrupt import GracefulInterrupt\n"
        "stop = GracefulInterrupt(frozenset({signal.SIGUSR2})).install()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "print(signal.Signals(stop.signum).name, stop.preempted)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["SIGUSR2", "True"]


def test_a_signal_during_ppos_final_save_finishes_it(hydratune, tmp_path: Path) -> None:
    """The issue's probe: PPO sent SIGTERM while writing final/ exited 143 "before training started,
    nothing to resume", its iterations run and lost. Now, as the trainer recipes do: final/ (the value head
    included) and the summary are finished, the late signal is noted, exit 0."""
    run = tmp_path / "run"
    args = [*FAST_PPO, "recipe.num_iterations=1", "recipe.rollout_batch_size=8", "recipe.mini_batch_size=8"]
    proc = signalled(
        hydratune,
        tmp_path,
        "hydratune.components.runtime.session.save_final",
        *args,
        "train.micro_batch_size=8",
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SIGTERM after the last training step" in proc.stderr and "nothing to resume" not in proc.stderr
    assert (run / "final" / "model.safetensors").is_file() and (run / "final" / "value.safetensors").is_file()
    assert "SIGTERM after the last training step" in (run / "summary.md").read_text()
