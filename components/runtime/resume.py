"""Which checkpoint ``resume=`` continues from, decided before any model loads.

An earlier run is continued only when its saved config (``<run>/.hydra/config.yaml``) equals this run's
in every key but the run-management ones (:data:`MANAGEMENT`): length and cadence of training, trackers,
names. ``resume=true`` takes the latest such run (in a Hydra multirun: the same point — same overrides —
of the latest earlier sweep); ``resume=<run dir or checkpoint dir>`` must match too. The chosen
checkpoint's pickled files are then checked (components/config/trust.py) and the checkpoint dir is pinned into
``cfg.resume``, so the recipe (and every launched worker) loads exactly that one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write

from hydratune.components.config.errors import ConfigError
from hydratune.components.data import fingerprint
from hydratune.components.launcher import PLACEMENT
from hydratune.components.runtime.checkpoint import checkpoints_in, manifest, resolve_resume, verify

log = logging.getLogger("hydratune")

#: keys (and whole nodes) a resumed run may change: they manage the run, not what is trained
MANAGEMENT: tuple[str, ...] = (
    "resume",
    "run_name",
    "mode",
    "plan",
    "objective",
    "merge",  # only adds final/merged
    "estimate",
    "tracker",
    "trust_checkpoints",
    "trust_targets",
    "resume_allow_data_change",
    "train.max_steps",
    "train.epochs",
    "train.log_every",
    "train.eval_every",
    "train.save_every",
    "train.keep_last",
    "train.eval_generations",
    "train.max_new_tokens",
    "train.write_plots",
    "train.num_workers",
    "data.cache",  # where and how the data is prepared, not what it is (fingerprint.NOT_DATA)
    "data.cache_dir",
    "data.num_proc",
    "hydra",  # run/sweep dirs and the like (overrides only: the task config has no hydra node)
    *PLACEMENT,  # where the job runs: each node's own launcher.node_rank, a new master address, ...
    # launcher=slurm's job script: where and how long the job runs, not what it trains
    *(f"launcher.{k}" for k in ("gpus_per_node", "cpus_per_task", "mem", "time", "partition", "account")),
    *(f"launcher.{k}" for k in ("qos", "job_name", "signal", "signal_delay_s", "requeue", "sbatch_args")),
    "launcher.setup",
)
ABSENT = "<absent>"
OTHER_POINT = "another sweep point"
#: what a run leaves in its run dir once it trained (Hydra's .hydra/ alone is not a run: every node of a
#: multi-node job writes it into the one pinned run dir)
RUN_OUTPUTS = ("checkpoints", "final", "metrics.jsonl", "result.json", "summary.md")
NO_RESUME = (False, None, "false", "False")
LATEST = (True, "true", "True", "latest")
SHOWN = 3  # differing keys named per passed-over run


@dataclass(frozen=True)
class Difference:
    """One key whose value differs between an earlier run's config (``old``) and this one's (``new``)."""

    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key}: {self.old!r} → {self.new!r}"


def is_management(key: str) -> bool:
    """``key`` is (under) one of :data:`MANAGEMENT`."""
    return any(key == m or key.startswith(m + ".") for m in MANAGEMENT)


def flatten(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, leaf value)`` pairs of a nested dict; lists are leaves."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from flatten(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def plain(cfg: DictConfig) -> dict[str, Any]:
    """``cfg`` as plain containers, interpolations resolved now (unresolved where one cannot be)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except Exception:  # e.g. a resolver of a package not installed here: compare the text
        return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]


def differences(old: DictConfig, new: DictConfig) -> list[Difference]:
    """Keys outside :data:`MANAGEMENT` whose values differ, in ``new``'s key order."""
    a, b = dict(flatten(plain(old))), dict(flatten(plain(new)))
    keys = list(b) + [k for k in a if k not in b]
    return [
        Difference(k, a.get(k, ABSENT), b.get(k, ABSENT))
        for k in keys
        if not is_management(k) and a.get(k, ABSENT) != b.get(k, ABSENT)
    ]


def saved_config(run: Path) -> DictConfig | None:
    """The config Hydra saved in ``run`` (None for a dir without one, or with one that cannot be read: a
    damaged run dir among many is passed over, not a traceback)."""
    return _saved(run / ".hydra" / "config.yaml")  # type: ignore[return-value]


def _saved(path: Path) -> Any:
    """``path`` read with OmegaConf, or None when it is missing or not readable YAML of a config."""
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    from hydratune.components.config.legacy import load_saved

    if not path.is_file():
        return None
    try:
        return load_saved(path)  # targets of a run dir saved before the namespace read as today's
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as err:
        log.warning("cannot read %s (%s): passed over", path, type(err).__name__)
        return None


def point(overrides: list[str]) -> list[str]:
    """A sweep point's identity: its overrides minus the run-management ones, parsed (``1e-3`` is
    ``0.001``, as Hydra writes a sweep's values) and sorted."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return sorted(f"{o.get_key_element()}={o.value()!r}" for o in parsed if not is_management(o.key_or_group))


def saved_point(run: Path) -> list[str] | None:
    saved = _saved(run / ".hydra" / "overrides.yaml")
    if not isinstance(saved, ListConfig):
        return None
    from hydra.errors import OverrideParseException

    try:
        return point([str(o) for o in saved])
    except OverrideParseException:  # an override Hydra's grammar cannot read: not a point of this sweep
        return None


def candidates(root: Path, exclude: Path) -> list[Path]:
    """Run dirs under ``root`` (but not under ``exclude``) with a checkpoint, newest first: by the time
    their newest checkpoint recorded (a dir's mtime changes whenever anything writes into it)."""
    runs = {ckpt.parent.parent for ckpt in root.glob("**/checkpoints/checkpoint-*")}
    runs = {r for r in runs if not r.resolve().is_relative_to(exclude.resolve())}
    return sorted((r for r in runs if checkpoints_in(r)), key=saved_at, reverse=True)


def saved_at(run: Path) -> float:
    """When ``run``'s newest checkpoint was written, as its completion marker recorded it."""
    newest = checkpoints_in(run)[-1]
    recorded = (manifest(newest) or {}).get("time")
    return float(recorded) if isinstance(recorded, (int, float)) else newest.stat().st_mtime


def why_not(run: Path, cfg: DictConfig, sweep_point: list[str] | None) -> list[Difference] | str:
    """Why ``run`` cannot be continued by this run ([] = it can): differing keys, or a sentence."""
    saved = saved_config(run)
    if saved is None:
        return "no readable saved config (.hydra/config.yaml)"
    if sweep_point is not None and saved_point(run) != sweep_point:
        return f"{OTHER_POINT} ({' '.join(saved_point(run) or []) or 'no overrides'})"
    return differences(saved, cfg)


def describe(reason: list[Difference] | str) -> str:
    if isinstance(reason, str):
        return reason
    more = f" (+{len(reason) - SHOWN} more)" if len(reason) > SHOWN else ""
    return "; ".join(map(str, reason[:SHOWN])) + more


def latest_matching(cfg: DictConfig, run_dir: Path, sweep_point: list[str] | None) -> Path | None:
    """``resume=true``: the newest earlier run this one can continue; every one passed over is logged.
    None: a sweep point no earlier sweep got to (a sweep killed before it): it starts afresh."""
    # run dirs are <outputs>/<date>/<time…>, sweep points <multirun>/<date>/<time…>/<n>
    sweep = sweep_point is not None
    root = run_dir.parent.parent.parent if sweep else run_dir.parent.parent
    exclude = run_dir.parent if sweep else run_dir  # never a point of this same sweep
    passed: list[tuple[Path, list[Difference] | str]] = []
    for run in candidates(root, exclude):
        reason = why_not(run, cfg, sweep_point)
        if not reason:
            run = same_job(run, run_dir, cfg, sweep_point) if sweep else run
            log.info("resume=true: continuing %s (its config matches)", run)
            return run
        log.info("resume=true: passing over %s: %s", run, describe(reason))
        passed.append((run, reason))
    if sweep and passed and all(isinstance(r, str) and r.startswith(OTHER_POINT) for _, r in passed):
        log.warning(
            "resume=true: no earlier sweep ran this point (%s): it starts afresh", " ".join(sweep_point)
        )
        return None
    raise no_match(root, passed)


def same_job(run: Path, run_dir: Path, cfg: DictConfig, sweep_point: list[str] | None) -> Path:
    """In ``run``'s sweep, the point with this job's number when it matches too: points that differ in
    run-management keys only (a sweep over ``train.max_steps``) share config and overrides."""
    twin = run.parent / run_dir.name
    matches = twin != run and bool(checkpoints_in(twin)) and not why_not(twin, cfg, sweep_point)
    return twin if matches else run


def no_match(root: Path, passed: list[tuple[Path, list[Difference] | str]]) -> ConfigError:
    """The error for ``resume=true`` with nothing to continue, naming the closest candidate's keys."""
    if not passed:
        return ConfigError(
            f"resume=true but no earlier run under {root} has a complete checkpoint",
            key="resume",
            hint="set train.save_every>0 so runs write checkpoints, or pass resume=<run dir>",
        )
    compared = [(run, r) for run, r in passed if not isinstance(r, str)]
    run, reason = min(compared, key=lambda p: len(p[1])) if compared else passed[0]
    return ConfigError(
        f"resume=true: none of the {len(passed)} earlier run(s) with a checkpoint under {root} was "
        f"trained with this config; the closest, {run}, differs in {describe(reason)}",
        key="resume",
        hint=f"to continue it: {fix(reason) if isinstance(reason, list) else 'its overrides'}; "
        "or drop resume to start afresh",
    )


def check_explicit(checkpoint: Path, cfg: DictConfig) -> None:
    """``resume=<dir>``: that run's config must match this one outside :data:`MANAGEMENT`."""
    run = checkpoint.parent.parent
    saved = saved_config(run)
    if saved is None and (run / ".hydra" / "config.yaml").exists():
        raise ConfigError(
            f"{run / '.hydra' / 'config.yaml'} cannot be read: the run to continue cannot be compared",
            key="resume",
            hint="restore that file from a copy of the run, or start afresh without resume",
        )
    if saved is None:
        log.warning("resume: %s has no saved config (.hydra/config.yaml): it cannot be compared", run)
        return
    diff = differences(saved, cfg)
    if diff:
        raise ConfigError(
            f"{run} was trained with a different config: {describe(diff)}",
            key="resume",
            hint=f"resume with that run's values ({fix(diff)}), or drop resume to start afresh",
        )


def fix(diff: list[Difference]) -> str:
    """The overrides that give back an earlier run's values (a changed class: its group's option)."""
    groups = sorted({d.key.rsplit(".", 1)[0] for d in diff if d.key.endswith("._target_")})
    values = [f"{d.key}={d.old}" for d in diff if d.old != ABSENT and d.key.rsplit(".", 1)[0] not in groups]
    return ", ".join([*(f"the same {g} option" for g in groups), *values[:SHOWN]]) or "its config"


def resolve(cfg: DictConfig, run_dir: Path, sweep_point: list[str] | None = None) -> str | None:
    """The checkpoint dir ``cfg.resume`` names for a run in ``run_dir``, checked; None = no resume.

    ``sweep_point``: this job's :func:`point` inside a Hydra multirun (None for a single run)."""
    from hydratune.components.config.trust import check_checkpoint

    resume = cfg.resume
    if resume in (False, None, "false", "False"):
        return None
    if resume in (True, "true", "True", "latest"):
        run = latest_matching(cfg, run_dir, sweep_point)
        if run is None:
            return None
        checkpoint = resolve_resume(str(run))
    else:
        checkpoint = resolve_resume(resume)  # a bad path fails here
        assert checkpoint is not None
        check_explicit(Path(checkpoint), cfg)
    assert checkpoint is not None
    check_data(Path(checkpoint), cfg)
    if cfg.data.get("streaming"):  # every rank's stream position, written by as many ranks
        from hydratune.components.data.stream_prepare import check_positions, planned_world

        check_positions(Path(checkpoint), planned_world(cfg))
    check_checkpoint(Path(checkpoint), trusted=bool(cfg.get("trust_checkpoints", False)))
    log.info("resuming from %s", checkpoint)
    return checkpoint


def hydra_sweep_point() -> list[str] | None:
    """This job's :func:`point` when it runs inside a Hydra multirun, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return point(list(HydraConfig.get().overrides.task))


def pin(cfg: DictConfig, run_dir: Path, sweep_point: list[str] | None = None) -> DictConfig:
    """``cfg`` with ``resume`` resolved to the checkpoint dir to load (or false): what recipes read. A run
    that will write checkpoints records its data fingerprint first (they carry it)."""
    checkpoint = resolve(cfg, run_dir, sweep_point)
    first_node = int(cfg.launcher.get("node_rank", 0) or 0) == 0  # a multi-node job writes it once
    if cfg.train.get("save_every", 0) and int(os.environ.get("RANK", 0)) == 0 and first_node:
        fingerprint.write(cfg, run_dir)
    with read_write(cfg), open_dict(cfg):
        cfg.resume = checkpoint or False
    return cfg


def pinned(cfg: DictConfig) -> str | None:
    """The checkpoint :func:`pin` chose (None = no resume); a recipe calls this right before loading it."""
    resume = cfg.resume
    if resume in (False, None, "false", "False"):
        return None
    path = Path(str(resume))
    if resume in (True, "true", "True", "latest") or verify(path) is not None:
        raise ConfigError(
            f"resume={resume} was not resolved to a whole checkpoint before the model loaded",
            key="resume",
            hint="run through the hydratune command (it resolves resume before loading anything)",
        )
    return str(path)


def holds_a_run(run_dir: Path) -> bool:
    """``run_dir`` holds what a run that trained leaves behind (:data:`RUN_OUTPUTS`)."""
    return any((run_dir / name).exists() for name in RUN_OUTPUTS)


def check_run_dir(run_dir: Path, resume: Any, key: str = "hydra.run.dir") -> None:
    """Never write over a run: a run dir that holds one is used only to continue it (``resume=`` that dir
    or one of its checkpoints). Checked before Hydra writes its ``.hydra/`` files into the dir."""
    if not holds_a_run(run_dir):
        return
    run_dir = run_dir.resolve()
    if resume not in NO_RESUME and resume not in LATEST:
        target = Path(str(resume)).expanduser().resolve()
        if target == run_dir or run_dir in target.parents:
            return
    raise ConfigError(
        f"{run_dir} holds a run already ({', '.join(n for n in RUN_OUTPUTS if (run_dir / n).exists())}): "
        "a new run there would write over its files",
        key=key,
        hint=f"continue that run with resume={run_dir}, or choose another {key}",
    )


def loss_span(first: int, last: int, resume: str | None) -> str:
    """Which optimizer steps a run's ``train_loss`` averages: a resumed run's covers only the steps it ran
    itself (the earlier ones are in the run it continued)."""
    span = f"steps {first} to {last}" if last >= first else "no step (nothing left to train)"
    if resume:
        span += f" (resumed after step {first - 1} from {resume}; steps 1 to {first - 1} are in that run)"
    return span


def continue_in_place(cfg: DictConfig, run_dir: Path) -> DictConfig:
    """A job started again in its own run dir (a SLURM job requeued after its pre-emption signal, or its job
    script submitted again): ``cfg`` continuing from the run dir's newest whole checkpoint, if it has one
    (this run wrote it, with this config). Records of ``metrics.jsonl`` past that checkpoint's step are
    dropped first (rank 0): the run logs those steps again, and a step is never in the file twice."""
    from hydratune.components.config.trust import check_checkpoint

    if not checkpoints_in(run_dir):
        return cfg
    checkpoint = resolve_resume(str(run_dir))
    assert checkpoint is not None
    check_data(Path(checkpoint), cfg)
    check_checkpoint(Path(checkpoint), trusted=bool(cfg.get("trust_checkpoints", False)))
    if int(os.environ.get("RANK", 0)) == 0:
        drop_metrics_after(run_dir / "metrics.jsonl", int(Path(checkpoint).name.rsplit("-", 1)[1]))
    log.info("continuing this run in %s from %s", run_dir, checkpoint)
    with read_write(cfg), open_dict(cfg):
        cfg.resume = checkpoint
    return cfg


def drop_metrics_after(metrics: Path, step: int) -> None:
    """Keep the records of ``metrics`` up to ``step`` (written atomically; a note names what was dropped)."""
    import json

    if not metrics.is_file():
        return
    lines = [line for line in metrics.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if int(json.loads(line).get("step", 0)) <= step]
    if len(kept) == len(lines):
        return
    tmp = metrics.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(metrics)
    log.warning(
        "%s: dropped %d record(s) logged after step %d (trained again now)",
        metrics,
        len(lines) - len(kept),
        step,
    )


def check_data(checkpoint: Path, cfg: DictConfig) -> None:
    """Refuse to resume ``checkpoint`` on other data than its completion marker records."""
    fingerprint.check(checkpoint, (manifest(checkpoint) or {}).get("data"), cfg)
