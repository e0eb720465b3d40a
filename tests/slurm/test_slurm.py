"""SLURM: the pieces on their own (any machine), then real jobs on a one-node cluster (the ``slurm`` tier).

The tier needs a cluster that answers ``sinfo``, with accounting: ``sudo scripts/slurm_cluster.sh up`` starts
one on Debian (CI's ``.ci/run`` does); without one its tests skip, saying why. Its jobs share the work:

- a 2-point sweep of 1-task jobs through hydra-submitit-launcher; point 1 is ``scancel``-ed mid-run, so the
  same sweep shows a point that lands its run dir (equal, bit for bit, to a local 1-process run) and a
  cancelled one that ends the sweep promptly, marked in ``hydratune report``;
- the cancelled point continued as the printed advice says (``hydratune resume=<its run dir>`` writes a job
  script), pre-empted with USR2 on the way: the script's job requeues itself and ends equal to point 0;
- a 2-task DDP job through submitit, pre-empted with USR2 (what submitit asks SLURM to send): every rank
  checkpoints the same step, submitit requeues, the job continues in its run dir, no step logged twice, and
  it ends equal to a local 2-process run;
- the job script ``hydratune launcher=slurm`` writes for 2 tasks, submitted by hand: equal to that run too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from tests.support.cli import start

REPO = Path(__file__).resolve().parents[2]
NAME = f"hydratune-test-{os.getpid()}"  # every job of this module carries it (scancel'ed at the end)
QUICK = [
    "train.max_steps=40",
    "train.save_every=100",  # no periodic checkpoint: the only ones are the signals'
    "train.eval_every=0",
    "train.eval_generations=0",
    "train.log_every=1",
    "train.write_plots=false",
    "train.micro_batch_size=8",
]
DDP = ["strategy=ddp"]  # 2 ranks x micro-batch 8
SUBMITIT = ["launcher=slurm", "hydra/launcher=submitit_slurm", f"hydra.launcher.name={NAME}"]
SCRIPT = ["launcher=slurm", "launcher.gpus_per_node=0", f"launcher.job_name={NAME}"]


class FakeJob:
    """submitit's Job as the sweep's wait uses it: an id, tasks, result files under ``folder``."""

    def __init__(self, folder: Path, job_id: str, tasks: int = 1) -> None:
        from submitit.core.utils import JobPaths

        self.job_id, self.num_tasks, self.folder = job_id, tasks, folder
        self.paths = JobPaths(folder, job_id=job_id, task_id=0)

    def task(self, t: int) -> SimpleNamespace:
        from submitit.core.utils import JobPaths

        return SimpleNamespace(paths=JobPaths(self.folder, job_id=self.job_id, task_id=t))


def bounded_wait(*args: object, **kwargs: object) -> list:
    """``slurm_sweep.wait`` in a thread: a wait that never ends fails the test after 30 s."""
    import threading

    from hydratune.components.distributed import slurm_sweep

    returned: list = []
    worker = threading.Thread(target=lambda: returned.append(slurm_sweep.wait(*args, **kwargs)), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert returned, "the wait did not end"
    return returned[0]


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, squeue: str, sacct: str = "exit 1") -> None:
    """``squeue`` and ``sacct`` on PATH as small shell scripts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("squeue", squeue), ("sacct", sacct)):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_a_point_that_ends_without_a_result_is_marked_without_accounting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No accounting (sacct fails), the controller forgot the job: the point is marked failed after the
    grace, never waited for without end; ``hydratune report`` shows it even though it never started."""
    from hydratune.components.commands.report import job_row
    from hydratune.components.distributed import slurm_sweep

    fake_slurm(
        tmp_path, monkeypatch, squeue='echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1'
    )
    monkeypatch.setattr(slurm_sweep, "GRACE_S", 0.3)
    monkeypatch.setattr(slurm_sweep, "UNREACHABLE_S", 3)
    point = slurm_sweep.Point(3, ["optimizer.lr=1e-3"], FakeJob(tmp_path / "submitit", "77_3"))
    run_dir = tmp_path / "sweep" / "3"
    (ret,) = bounded_wait([point], lambda p: run_dir, tmp_path / "sweep", poll=(0.1, 0.1))
    with pytest.raises(slurm_sweep.PointsFailed, match=r"point 3, SLURM job 77_3 \[ENDED"):
        _ = ret.return_value
    row = job_row(run_dir, tmp_path / "sweep")
    assert (
        row["status"] == "ended"
        and "accounting is off" in row["error"]
        and row["overrides"] == "optimizer.lr=1e-3"
    )


def test_the_wait_ends_when_the_controller_stops_answering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hydratune.components.distributed import slurm_sweep

    fake_slurm(tmp_path, monkeypatch, squeue="echo 'Unable to contact slurm controller' >&2; exit 1")
    monkeypatch.setattr(slurm_sweep, "UNREACHABLE_S", 0.5)
    point = slurm_sweep.Point(0, [], FakeJob(tmp_path / "submitit", "78"))
    (ret,) = bounded_wait([point], lambda p: None, tmp_path, poll=(0.1, 0.1))
    with pytest.raises(slurm_sweep.PointsFailed, match="did not answer squeue for 0 s"):
        _ = ret.return_value


def test_running_and_requeued_jobs_are_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue's states, array tasks one per line: a running point and a requeued one (PENDING again) are
    not over; the wait returns once their result files are there."""
    from hydra.core.utils import JobReturn, JobStatus
    from submitit.core.utils import cloudpickle_dump

    from hydratune.components.distributed import slurm_sweep

    fake_slurm(tmp_path, monkeypatch, squeue="echo '80_0|RUNNING'; echo '80_1|PENDING'")
    assert slurm_sweep.queue_states(["80_0", "80_1"]) == {"80_0": "RUNNING", "80_1": "PENDING"}
    points = [slurm_sweep.Point(i, [], FakeJob(tmp_path, f"80_{i}")) for i in (0, 1)]
    calls = []

    def states(ids: list[str]) -> dict[str, str]:
        calls.append(ids)
        if len(calls) == 3:  # both finish
            for p in points:
                done = JobReturn(overrides=[], status=JobStatus.COMPLETED, _return_value=p.number)
                cloudpickle_dump(("success", done), p.job.task(0).paths.result_pickle)
        return {"80_0": "RUNNING", "80_1": "PENDING"}

    monkeypatch.setattr(slurm_sweep, "queue_states", states)
    monkeypatch.setattr(slurm_sweep, "GRACE_S", 0)  # a point taken for over would fail at once
    returns = bounded_wait(points, lambda p: None, tmp_path, poll=(0.05, 0.05))
    assert [r.return_value for r in returns] == [0, 1] and len(calls) == 3


# --- real jobs on a one-node cluster ----------------------------------------------------------------------
START_LOCK = Path("/run/hydratune-slurm-up.pid")  # scripts/slurm_cluster.sh up, while it runs
STATUS = Path(os.environ.get("HYDRATUNE_SLURM_STATUS", "/tmp/hydratune-slurm-status"))


def cluster_problem() -> str | None:
    """Why the tier cannot run here (None: it can). Waits for a start in progress (CI starts the cluster
    in the background while it installs)."""
    if shutil.which("sinfo") is None:
        reason = STATUS.read_text().strip() if STATUS.is_file() else "SLURM is not installed"
        return f"no SLURM cluster ({reason}); start one: sudo scripts/slurm_cluster.sh up (Debian, root)"
    deadline = time.monotonic() + 600
    while starting() and time.monotonic() < deadline:
        time.sleep(1)
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401
    except ImportError:
        return "hydra-submitit-launcher is not installed (pip install -e '.[dev]')"
    answers = subprocess.run(
        ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30, check=False
    )
    if answers.returncode or not re.search(r"idle|mix|alloc", answers.stdout):
        last = f"; its last start failed: {STATUS.read_text().strip()}" if STATUS.is_file() else ""
        why = (answers.stderr or answers.stdout).strip() or "no node up"
        start = "start it: sudo scripts/slurm_cluster.sh up"
        return f"the SLURM cluster does not answer (sinfo: {why}){last}; {start}"
    accounting = subprocess.run(
        ["sacctmgr", "-n", "list", "cluster"], capture_output=True, timeout=30, check=False
    )
    if accounting.returncode:
        return "SLURM accounting (slurmdbd) does not answer; scripts/slurm_cluster.sh up starts it"
    return None


def starting() -> bool:
    """``scripts/slurm_cluster.sh up`` is still at work."""
    try:
        return Path(f"/proc/{int(START_LOCK.read_text())}").is_dir()
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)
    yield
    ours = subprocess.run(
        ["squeue", "-h", "--name", NAME, "-o", "%i"], capture_output=True, text=True, check=False
    )
    for job in ours.stdout.split():  # only this module's jobs
        subprocess.run(["scancel", job], check=False)


def cli(cwd: Path, *args: str) -> subprocess.Popen[str]:
    """The CLI in a subprocess of its own session (its jobs inherit this environment through sbatch)."""
    cwd.mkdir(parents=True, exist_ok=True)
    return start(cwd, *args)


def finish(proc: subprocess.Popen[str], timeout: float = 400) -> tuple[int, str]:
    """(exit code, stdout + stderr); on a timeout the process group is killed and the test fails."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out:\n{(out + err)[-3000:]}") from None
    return proc.returncode, out + err


def steps(run_dir: Path) -> list[int]:
    """The steps with a training loss in ``metrics.jsonl``."""
    if not (run_dir / "metrics.jsonl").is_file():
        return []
    return [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if "loss" in r]


def wait_for(
    what: str, ready: object, timeout: float = 300, proc: subprocess.Popen[str] | None = None
) -> None:
    """Poll ``ready()`` (5 times a second) until it is true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"ended before {what}:\n{finish(proc)[1][-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; the queue:\n{queue()}")


def queue() -> str:
    """Every job in the cluster's queue (a job of another test run holding the node shows here)."""
    shown = subprocess.run(
        ["squeue", "-o", "%i %j %T %M %C %R"], capture_output=True, text=True, timeout=30, check=False
    )
    return shown.stdout + shown.stderr


def job_of(pattern: str) -> str:
    """The id of this module's job (or array task) whose id matches ``pattern``."""
    jobs = subprocess.run(
        ["squeue", "-h", "-r", "--name", NAME, "-o", "%i"], capture_output=True, text=True
    ).stdout
    (job,) = [j for j in jobs.split() if re.fullmatch(pattern, j)]
    return job


def job_over(job: str) -> bool:
    return not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip()


def final(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "final" / "model.safetensors")


def assert_same_weights(got: Path, expected: Path) -> None:
    a, b = final(got), final(expected)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs: {got} vs {expected}"


def summary(run_dir: Path) -> str:
    return (run_dir / "summary.md").read_text()


def only(paths: Iterator[Path]) -> Path:
    (path,) = list(paths)
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slurm")


def here(cwd: Path, *args: str) -> None:
    """The CLI in this process, run from ``cwd`` (the libraries are imported once for the session, not in
    one more process)."""
    from hydratune.recipes.cli import main

    cwd.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = "1"
    before = Path.cwd()
    os.chdir(cwd)
    try:
        main(list(args))
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def local1(work: Path) -> Path:
    """The oracle of a 1-task job: the same training in this process."""
    here(work, *QUICK, "hydra.run.dir=local1")
    return work / "local1"


@pytest.fixture(scope="module")
def local2(work: Path) -> Path:
    """The oracle of a 2-task job: the same training on 2 local processes."""
    here(work, *QUICK, *DDP, "launcher.nproc_per_node=2", "hydra.run.dir=local2")
    return work / "local2"


@pytest.fixture(scope="module")
def sweep(cluster: None, work: Path) -> SimpleNamespace:
    """Two 1-task points of the same training (``run_name`` only names them); point 1 is cancelled once it
    trained 5 steps."""
    cwd = work / "sweep"
    proc = cli(cwd, "-m", *SUBMITIT, *QUICK, "run_name=a,b")
    point1 = lambda: next(cwd.glob("multirun/*/*/1"), None)  # noqa: E731
    wait_for("point 1 at step 5", lambda: point1() and max(steps(point1()), default=0) >= 5, proc=proc)
    job = job_of(r"\d+_1")
    subprocess.run(["scancel", job], check=True)
    cancelled = time.monotonic()
    code, out = finish(proc)
    return SimpleNamespace(
        code=code, out=out, dir=point1().parent, job=job, took=time.monotonic() - cancelled, cwd=cwd
    )


def test_a_sweep_lands_its_points_and_a_cancelled_point_ends_it_marked(sweep, local1: Path) -> None:
    assert sweep.code == 1, sweep.out[-3000:]
    assert sweep.took < 60, f"the sweep ended {sweep.took:.0f} s after its point was cancelled"
    assert f"point 1, SLURM job {sweep.job} [CANCELLED" in sweep.out, sweep.out[-3000:]
    assert f"continue it with: hydratune resume={sweep.dir / '1'}" in sweep.out
    assert "Traceback" not in sweep.out
    point0, point1 = sweep.dir / "0", sweep.dir / "1"
    assert "| processes | 1 |" in summary(point0) and "| live strategy | NO, 1 process(es) |" in summary(
        point0
    )
    assert_same_weights(point0, local1)  # SLURM's task = a local process, bit for bit
    stopped = int(only((point1 / "checkpoints").glob("checkpoint-*")).name.split("-")[1])
    assert steps(point1) == list(range(1, stopped + 1)) and not (point1 / "final").exists()

    report = subprocess.run(
        [sys.executable, "-m", "hydratune", "report", str(sweep.dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    rows = {row.split("|")[1].strip(): row for row in report.stdout.splitlines() if row.startswith("| ")}
    assert "| ok |" in rows["0"] and "| interrupted |" in rows["1"]
    assert (
        f"SLURM job {sweep.job} CANCELLED" in rows["1"]
        and f"stopped by SIGTERM at step {stopped}" in rows["1"]
    )


def test_the_cancelled_point_continues_through_its_job_script_across_a_preemption(
    sweep, capsys: pytest.CaptureFixture
) -> None:
    """The advice ``hydratune resume=<point>`` writes a job script (the point's config has launcher=slurm);
    submitted and then pre-empted (USR2), it checkpoints, requeues itself, continues in its run dir and
    ends equal to the uncancelled point."""
    point0, point1 = sweep.dir / "0", sweep.dir / "1"
    stopped = max(steps(point1))
    here(sweep.cwd, f"resume={point1}", *SCRIPT[1:])
    script = Path(re.search(r"^    sbatch (\S+)$", capsys.readouterr().out, re.M).group(1))
    run_dir = script.parent
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    job_id = job.stdout.strip()
    wait_for("step +3 of the resumed run", lambda: max(steps(run_dir), default=0) >= stopped + 3)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    wait_for("the job's end", lambda: job_over(job_id), timeout=400)  # a requeued job is in the queue
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert "requeued job" in log and "(restart 1)" in log, log[-3000:]
    assert steps(run_dir) == list(range(stopped + 1, 41)), "a step was logged twice, or one is missing"
    assert_same_weights(run_dir, point0)


def test_a_two_task_job_preempted_requeues_and_resumes_bit_exactly(
    cluster: None, work: Path, local2: Path
) -> None:
    cwd = work / "preempted"
    proc = cli(cwd, "-m", *SUBMITIT, "hydra.launcher.tasks_per_node=2", *QUICK, *DDP)
    point = lambda: next(cwd.glob("multirun/*/*/0"), None)  # noqa: E731
    wait_for("step 5", lambda: point() and max(steps(point()), default=0) >= 5, proc=proc)
    job = job_of(r"\d+")
    subprocess.run(["scancel", "--signal=USR2", job], check=True)  # what SLURM sends before the time limit
    code, out = finish(proc)
    assert code == 0, out[-3000:]
    run_dir = point()
    logs = sorted(run_dir.parent.glob(f".submitit/{job}/{job}_*_log.err"))
    stops = [re.findall(r"stopped by SIGUSR2 at step (\d+)", log.read_text()) for log in logs]
    assert len(stops) == 2 and stops[0] == stops[1] and len(stops[0]) == 1, (
        stops
    )  # each rank, once, same step
    assert "requeued job" in logs[0].read_text()
    stopped = int(stops[0][0])
    assert (run_dir / "checkpoints" / f"checkpoint-{stopped}").is_dir()
    assert steps(run_dir) == list(range(1, 41)), "a step was logged twice, or one is missing"
    assert "| processes | 2 |" in summary(run_dir) and "MULTI_CPU, 2 process(es)" in summary(run_dir)
    assert_same_weights(run_dir, local2)


def test_the_job_script_runs_two_ranks_like_a_local_run(
    cluster: None, work: Path, local2: Path, capsys: pytest.CaptureFixture
) -> None:
    cwd = work / "script"
    here(cwd, *SCRIPT, "launcher.nproc_per_node=2", *QUICK, *DDP)
    script = only((cwd / "outputs").glob("*/*/slurm.sbatch"))
    assert f"    sbatch {script}" in capsys.readouterr().out
    text = script.read_text()
    assert "#SBATCH --ntasks-per-node=2" in text and "gpus-per-node" not in text
    job_id = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    job_id = job_id.stdout.strip()
    wait_for("the job's end", lambda: job_over(job_id), timeout=400)
    log = (script.parent / f"slurm-{job_id}.out").read_text()
    assert (script.parent / "final").is_dir(), log[-3000:]
    assert "| processes | 2 |" in summary(script.parent) and "MULTI_CPU, 2 process(es)" in summary(
        script.parent
    )
    assert_same_weights(script.parent, local2)
