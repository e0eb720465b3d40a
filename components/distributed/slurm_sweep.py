"""The submitting side of ``hydratune -m launcher=slurm hydra/launcher=submitit_slurm``: submit the sweep's
points as one SLURM job array (as hydra-submitit-launcher does), then wait for every point until it ends,
whatever ends it, and say which points failed and why.

hydra-submitit-launcher itself waits point by point through submitit, whose only source of a job's state
is ``sacct``: without SLURM accounting a job that ends without writing its result (cancelled, killed,
``scancel``-ed, pre-empted without requeue) is never seen to end and the sweep waits forever; with
accounting the first failed point raises and the points after it are not waited for. Here every point is
polled together: its result files first, then its state from the controller (``squeue --states=all``, which
keeps a finished job for ``MinJobAge``, 300 s by default: no accounting needed), then ``sacct``. A point that
ended without a result is failed after a short grace for a slow shared filesystem. A controller that does not
answer for :data:`UNREACHABLE_S` ends the wait with that reason. A requeued job (pre-emption) is still in the
queue and is waited for. Each failed point gets ``slurm_job.json`` in its run dir (``hydratune report``
shows its state and reason; a point whose job never started gets its run dir for that), and the sweep ends
with :class:`PointsFailed` naming them all.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("hydratune")

POINT_FILE = "slurm_job.json"  # in a failed point's run dir: its job, SLURM state and reason
#: states of a job that is not over (a requeued one comes back as PENDING)
ACTIVE = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SUSPENDED",
    "SIGNALING",
    "STAGE_OUT",
    "RESV_DEL_HOLD",
    "STOPPED",
    "PREEMPTED",
}
GRACE_S = 15.0  # a job over without its result files: wait this long for them (a shared filesystem's lag)
UNREACHABLE_S = 600.0  # squeue failing this long ends the wait
POLL_S = (2.0, 30.0)  # poll every 2 s at first, then ever less often, at most every 30 s


@dataclass(frozen=True)
class FailedPoint:
    """A sweep point whose job ended without a result, or with an error."""

    number: int
    job_id: str
    state: str
    reason: str
    run_dir: Path | None

    def __str__(self) -> str:
        where = f" ({self.run_dir})" if self.run_dir else ""
        return f"point {self.number}, SLURM job {self.job_id} [{self.state}]{where}: {self.reason}"


class PointsFailed(RuntimeError):
    """Raised by the sweep (through the first failed point's JobReturn) when points failed: lists them all."""

    def __init__(self, failed: list[FailedPoint], sweep_dir: Path) -> None:
        self.failed = failed
        listed = "\n  ".join(map(str, failed))
        report = f"`hydratune report {sweep_dir}` lists every point"
        super().__init__(f"{len(failed)} sweep point(s) failed:\n  {listed}\n{report}")


def check_submitit_values(node: Any, prefix: str = "hydra.launcher") -> None:
    """What submitit writes into each point's sbatch script (``#SBATCH --<key>=<value>`` lines, ``setup``
    lines, srun's arguments): every text one line, account / partition / qos SLURM names. submitit quotes
    the values, but a newline in a ``#SBATCH`` comment line still starts a command of its own."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    from hydratune.components.config.scriptvalues import check_one_line, check_slurm_name

    plain = OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node
    items = plain.items() if isinstance(plain, dict) else enumerate(plain) if isinstance(plain, list) else []
    for key, value in items:
        path = f"{prefix}.{key}" if isinstance(plain, dict) else f"{prefix}[{key}]"
        if isinstance(value, (dict, list)):
            check_submitit_values(value, path)
        elif isinstance(value, str):
            check_one_line(value, path)
            if key in ("partition", "account", "qos"):
                check_slurm_name(value, path, listed=key == "partition")


@contextmanager
def secrets_through_the_environment(configs: list[Any]) -> Iterator[None]:
    """While the sweep's jobs are pickled into the sweep dir (submitit's ``.submitit/``): every secret
    ``hydra.job.env_set`` entry (``env_copy`` of ``WANDB_API_KEY``, ``+hydra.job.env_set.HF_TOKEN=…``; see
    components/config/trust.py ``is_secret``) is taken out of ``configs`` (its value and the override that
    set it) and put into this process's environment, which ``sbatch`` hands every job (SLURM's default
    ``--export=ALL``): the job's processes have it without Hydra setting it. Put back afterwards."""
    from omegaconf import open_dict, read_write

    from hydratune.components.config.trust import is_secret

    kept: list[tuple[Any, dict[str, Any], list[str]]] = []
    for cfg in configs:
        env_set = dict(cfg.hydra.job.env_set or {})
        secret = {k: str(v) for k, v in env_set.items() if is_secret(str(k), str(v))}
        overrides = list(cfg.hydra.overrides.hydra)
        if not secret:
            continue
        os.environ.update(secret)
        setting = tuple(f"hydra.job.env_set.{k}=" for k in secret)
        with read_write(cfg), open_dict(cfg):
            for name in secret:
                del cfg.hydra.job.env_set[name]
            cfg.hydra.overrides.hydra = [o for o in overrides if not o.lstrip("+~").startswith(setting)]
        kept.append((cfg, env_set, overrides))
    try:
        yield
    finally:
        for cfg, env_set, overrides in kept:
            with read_write(cfg), open_dict(cfg):
                cfg.hydra.job.env_set = env_set
                cfg.hydra.overrides.hydra = overrides


def launch(launcher: Any, job_overrides: Any, initial_job_idx: int) -> list[Any]:
    """hydra-submitit-launcher's ``launch``: the same submission, then :func:`wait` for every point."""
    import submitit
    from hydra.core.singleton import Singleton
    from hydra.core.utils import filter_overrides
    from omegaconf import OmegaConf

    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    params = dict(launcher.params)
    init = {"folder": params.pop("submitit_folder")}
    if "max_num_timeout" in params:
        init["slurm_max_num_timeout"] = params.pop("max_num_timeout")
    executor = submitit.AutoExecutor(cluster="slurm", **init)
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in shared else f"slurm_{k}": v for k, v in params.items()})
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if "mode" in launcher.config.hydra.sweep:
        sweep_dir.chmod(int(str(launcher.config.hydra.sweep.mode), 8))
    log.info(f"Submitit 'slurm' sweep output dir : {sweep_dir}")
    numbers = range(initial_job_idx, initial_job_idx + len(job_overrides))
    for number, overrides in zip(numbers, job_overrides, strict=True):
        log.info(f"\t#{number} : {' '.join(filter_overrides(overrides))}")
    from hydra.core.hydra_config import HydraConfig

    pickled = [launcher.config, *([HydraConfig.instance().cfg] if HydraConfig.initialized() else [])]
    with secrets_through_the_environment(pickled):  # the job files in the sweep dir hold no secret
        args = [
            (list(o), "hydra.sweep.dir", n, f"job_id_for_{n}", Singleton.get_state())
            for n, o in zip(numbers, job_overrides, strict=True)
        ]
        jobs = executor.map_array(launcher, *zip(*args, strict=True))
    log.info(f"SLURM job(s) {', '.join(j.job_id for j in jobs)}: waiting for them (squeue shows them)")
    points = [Point(n, list(o), job) for n, o, job in zip(numbers, job_overrides, jobs, strict=True)]
    return wait(points, lambda p: point_dir(launcher, p), sweep_dir)


@dataclass
class Point:
    """One submitted sweep point."""

    number: int
    overrides: list[str]
    job: Any  # submitit's Job (one sub-job per task)
    gone_at: float | None = None  # when the controller first reported it over without all its results
    results_at: float | None = None  # when its result files were first all there

    def tasks(self) -> list[Any]:
        return [self.job.task(t) for t in range(self.job.num_tasks)]

    def has_results(self) -> bool:
        return all(t.paths.result_pickle.exists() for t in self.tasks())


def wait(
    points: list[Point], run_dir_of: Any, sweep_dir: Path, poll: tuple[float, float] = POLL_S
) -> list[Any]:
    """Wait until every point ended: its JobReturn (rank 0's), or a FAILED one for a failed point."""
    from hydra.core.utils import JobStatus

    returns: dict[int, Any] = {}
    failed: list[FailedPoint] = []
    pending = list(points)
    start = last_answer = time.monotonic()
    while pending:
        states = queue_states([p.job.job_id for p in pending])
        now = time.monotonic()
        if states is not None:
            last_answer = now
        elif now - last_answer > UNREACHABLE_S:
            reason = f"the SLURM controller did not answer squeue for {UNREACHABLE_S:.0f} s: stopped waiting"
            for p in pending:
                returns[p.number] = failed_return(p, "UNKNOWN", reason, run_dir_of, failed)
            break
        for p in list(pending):
            outcome = finished(p, states, now)
            if outcome is None:
                continue
            pending.remove(p)
            state, reason, ret = outcome
            if reason is None:
                returns[p.number] = ret
            else:
                returns[p.number] = failed_return(p, state, reason, run_dir_of, failed, ret)
        if pending:
            time.sleep(min(poll[1], max(poll[0], (time.monotonic() - start) / 10)))
    for r in returns.values():
        if r.status == JobStatus.FAILED:
            r.return_value = PointsFailed(failed, sweep_dir)  # whichever the sweeper raises names them all
    return [returns[p.number] for p in points]


def finished(p: Point, states: dict[str, str] | None, now: float) -> tuple[str, str | None, Any] | None:
    """None while ``p`` runs; else (SLURM state, why it failed or None, rank 0's JobReturn or None)."""
    state = (states or {}).get(p.job.job_id, "UNKNOWN" if states is None else "")
    if p.has_results():
        outcome = results(p, state or "COMPLETED")
        p.results_at = p.results_at or now
        if outcome[1] is not None and state in ACTIVE and now - p.results_at < GRACE_S:
            return None  # a failure: wait for the job's final state (CANCELLED, FAILED, ...) to name it
        return outcome
    if states is None or state in ACTIVE:
        p.gone_at = None
        return None
    p.gone_at = p.gone_at or now
    if now - p.gone_at < GRACE_S:
        return None
    state = state or sacct_state(p.job.job_id) or "ENDED (no record: SLURM accounting is off)"
    return state, f"the job ended without a result{log_tail(p)}", None


def results(p: Point, state: str) -> tuple[str, str | None, Any]:
    """Every task's outcome: rank 0's JobReturn, and the first error of any task."""
    from hydra.core.utils import JobStatus
    from submitit.core.utils import pickle_load

    first = None
    for rank, task in enumerate(p.tasks()):
        try:
            outcome, value = pickle_load(task.paths.result_pickle)
        except Exception as err:  # e.g. an exception type that cannot be unpickled here
            return state, f"rank {rank}: its result could not be read ({err}){log_tail(p)}", first
        if outcome != "success":  # an exception outside the Hydra job: its traceback
            return state, f"rank {rank}: {last_line(str(value))}", first
        if rank == 0:
            first = value
        if value.status == JobStatus.FAILED:
            return state, f"rank {rank}: {value._return_value}", first
    return state, None, first


def failed_return(
    p: Point, state: str, reason: str, run_dir_of: Any, failed: list[FailedPoint], ret: Any = None
) -> Any:
    """A FAILED JobReturn for ``p`` (recorded in ``failed``); its run dir gets :data:`POINT_FILE` (and, if
    the job never started, the ``.hydra/overrides.yaml`` that makes ``hydratune report`` list it)."""
    from hydra.core.utils import JobReturn, JobStatus

    run_dir = run_dir_of(p)
    if run_dir is not None and any(run_dir.glob("checkpoints/checkpoint-*")):
        reason += f"; continue it with: hydratune resume={run_dir}"
    point = FailedPoint(p.number, p.job.job_id, state, reason, run_dir)
    failed.append(point)
    log.error("%s", point)
    if run_dir is not None:
        mark(run_dir, point, p.overrides)
    ret = ret or JobReturn(overrides=p.overrides, working_dir=str(run_dir) if run_dir else None)
    ret.status = JobStatus.FAILED
    return ret


def mark(run_dir: Path, point: FailedPoint, overrides: list[str]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"job": point.job_id, "state": point.state, "reason": point.reason}
    (run_dir / POINT_FILE).write_text(json.dumps(record, indent=1) + "\n")
    listed = run_dir / ".hydra" / "overrides.yaml"
    if not listed.is_file():
        from omegaconf import OmegaConf

        listed.parent.mkdir(exist_ok=True)
        OmegaConf.save(OmegaConf.create(overrides), listed)


def point_dir(launcher: Any, p: Point) -> Path | None:
    """The run dir Hydra gives sweep point ``p`` (the sweep dir + its subdir)."""
    from omegaconf import open_dict

    try:
        cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, p.overrides)
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = p.number
        return (Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)).resolve()
    except Exception as err:  # a point whose config does not compose: no run dir to mark
        log.warning("no run dir for sweep point %d: %s", p.number, err)
        return None


def queue_states(job_ids: list[str]) -> dict[str, str] | None:
    """{job id: state} of these jobs (array tasks as ``<array>_<task>``) that the controller still knows,
    finished ones included; None when squeue fails."""
    arrays = sorted({j.split("_")[0] for j in job_ids})
    command = [
        "squeue",
        "--noheader",
        "--array",
        "--states=all",
        "--format=%i|%T",
        "--jobs",
        ",".join(arrays),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode and "Invalid job id" in done.stderr:
        return {}  # every one of them is gone from the controller's memory
    if done.returncode:
        return None
    rows = (line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)
    return {job.strip(): state.strip() for job, state in rows}


def sacct_state(job_id: str) -> str | None:
    """The job's final state from SLURM accounting (None without accounting)."""
    command = ["sacct", "--noheader", "--parsable2", "--format=State", "--jobs", job_id]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.split() if done.returncode == 0 else []
    return lines[0] if lines else None


def log_tail(p: Point) -> str:
    """'; its log ends: ...' from rank 0's stderr (submitit's log file), or ''."""
    path = p.tasks()[0].paths.stderr
    lines = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    return f"; its log ({path}) ends: {lines[-1].strip()}" if lines else ""


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text
