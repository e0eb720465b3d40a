"""Tracker components: where metrics go besides the run dir's own ``metrics.jsonl``.

Several trackers can run at once: each option lives at ``tracker.<name>`` in the config, so
``tracker=[tensorboard,wandb]`` selects both. They reach the HF/TRL trainers as ``report_to`` names
(the trainers' own integrations) or as callbacks; recipes that own their loop (PPO) log through the
:class:`TrackerRun` that :meth:`Tracker.start` returns (``Session.log_metrics``). A tracker component is its
config: what a run opens (a W&B run, a TensorBoard writer) lives in that ``TrackerRun``, held by the
run's Session. Secrets (API keys) stay in the environment: no tracker writes them to the config, the run
dir or its params.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.registry import component


@dataclass
class RunInfo:
    """What trackers are told about a run."""

    run_dir: Path
    name: str
    tags: list[str] = field(default_factory=list)  # the overrides, e.g. ["peft=lora", "optimizer.lr=1e-3"]
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config


class TrackerRun:
    """A tracker's side of one run (rank 0), from :meth:`Tracker.start`: what it opened, and how to log
    into it and close it."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at ``step`` directly, for recipes that own their loop (PPO). Trainer-based
        recipes reach the tracker through ``report_to`` or its callbacks instead."""

    def finish(self) -> None:
        """After training (also after an interruption): flush and close."""


@dataclass
class Runs(TrackerRun):
    """Several trackers' runs as one."""

    runs: list[TrackerRun]

    def log(self, metrics: dict[str, float], step: int) -> None:
        for run in self.runs:
            run.log(metrics, step)

    def finish(self) -> None:
        for run in self.runs:
            run.finish()


@dataclass(frozen=True)
class Tracker:
    """Base: the hooks a tracker may use."""

    def validate(self) -> None:
        """Cheap checks (an optional package is installed) before anything loads."""

    def report_to(self) -> list[str]:
        return []

    def start(self, run: RunInfo) -> TrackerRun:
        """Before the trainer is built, on rank 0 only: set the tracker up for ``run``."""
        return TrackerRun()

    def callbacks(self, run: RunInfo) -> list[Any]:
        return []


def _require(package: str, tracker: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"tracker {tracker} needs the '{package}' package",
            key=f"tracker.{tracker}",
            hint=f"pip install '{extra}'",
        )


@dataclass
class _LazyRun(TrackerRun):
    """A run opened at its first ``log`` (``open()``), written with ``write(handle, metrics, step)`` and
    closed with ``close(handle)``: the trainers' own integrations log everywhere else."""

    open: Any
    write: Any
    close: Any
    handle: Any = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.handle is None:
            self.handle = self.open()
        self.write(self.handle, metrics, step)

    def finish(self) -> None:
        if self.handle is not None:
            self.close(self.handle)
            self.handle = None


@component("tracker")
@dataclass(frozen=True)
class TensorBoard(Tracker):
    """TensorBoard event files under ``<run dir>/<subdir>`` (``tensorboard --logdir outputs``)."""

    subdir: str = "tensorboard"

    def validate(self) -> None:
        _require("tensorboard", "tensorboard", "hydratune[tensorboard]")

    def report_to(self) -> list[str]:
        return ["tensorboard"]

    def start(self, run: RunInfo) -> TrackerRun:
        # transformers 5 removed TrainingArguments.logging_dir; its TensorBoard callback reads this variable.
        logdir = str(run.run_dir / self.subdir)
        os.environ["TENSORBOARD_LOGGING_DIR"] = logdir

        def writer() -> Any:
            from torch.utils.tensorboard import SummaryWriter

            return SummaryWriter(logdir)

        def write(writer: Any, metrics: dict[str, float], step: int) -> None:
            for key, value in metrics.items():
                writer.add_scalar(key, value, global_step=step)

        return _LazyRun(writer, write, lambda writer: writer.close())


@component("tracker")
@dataclass(frozen=True)
class WandB(Tracker):
    """Weights & Biases. ``mode: offline`` (or ``WANDB_MODE=offline``) works with no network; the API key
    comes from ``WANDB_API_KEY`` / ``wandb login`` only."""

    project: str = "hydratune"
    entity: str | None = None
    group: str | None = None
    mode: str | None = None  # online | offline | disabled; null = WANDB_MODE or wandb's default
    log_model: bool = False

    def validate(self) -> None:
        _require("wandb", "wandb", "hydratune[wandb]")
        if self.mode not in (None, "online", "offline", "disabled"):
            raise ConfigError(
                f"unknown mode '{self.mode}'", key="tracker.wandb.mode", hint="online/offline/disabled"
            )
        mode = self.mode or os.environ.get("WANDB_MODE") or "online"
        if mode not in ("offline", "disabled", "dryrun") and not wandb_api_key_found():
            raise ConfigError(
                "W&B runs online by default, and no API key was found (WANDB_API_KEY, ~/.netrc from "
                "`wandb login`): it would stop at a login prompt or fail after the model loads",
                key="tracker.wandb.mode",
                hint="tracker.wandb.mode=offline (sync later with `wandb sync`), or `wandb login` / "
                "export WANDB_API_KEY",
            )

    def report_to(self) -> list[str]:
        return ["wandb"]

    def start(self, run: RunInfo) -> TrackerRun:
        import wandb

        os.environ["WANDB_LOG_MODEL"] = "end" if self.log_model else "false"
        # wandb's own "non-essential output" off (its version, the history and summary panels, the log dir:
        # ~30 lines a run; the run's URL or offline dir still shows); WANDB_QUIET=false brings them back
        os.environ.setdefault("WANDB_QUIET", "true")
        opened = wandb.init(
            project=self.project,
            entity=self.entity,
            group=self.group,
            name=run.name,
            tags=[t[:64] for t in run.tags],  # W&B caps tag length
            config=run.config,
            dir=str(run.run_dir),
            mode=self.mode,
            reinit="finish_previous",
        )  # the trainer's WandbCallback logs into this run
        return _LazyRun(
            lambda: opened, lambda r, metrics, step: r.log(metrics, step=step), lambda r: r.finish(), opened
        )


def wandb_api_key_found() -> bool:
    """An API key in ``WANDB_API_KEY`` or in the netrc file that ``wandb login`` writes."""
    import netrc
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_reachable(uri: str, key: str, timeout: float = 2.0) -> None:
    """An http(s) server URI must accept a connection within ``timeout`` seconds (clients would retry for
    minutes); other schemes (file:, databricks, ...) are left to the client."""
    import socket
    from urllib.parse import urlparse

    parts = urlparse(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as err:
        raise ConfigError(
            f"cannot reach {uri} ({err.__class__.__name__}: {err}) within {timeout:g} s",
            key=key,
            hint="start the server or fix the URI, or drop it (null logs to a file store in the run dir)",
        ) from None


@component("tracker")
@dataclass(frozen=True)
class MLflow(Tracker):
    """MLflow: a local file store in the run dir by default, or any ``tracking_uri``."""

    tracking_uri: str | None = None  # null = file:<run dir>/mlruns
    experiment: str = "hydratune"

    def validate(self) -> None:
        _require("mlflow", "mlflow", "hydratune[mlflow]")
        if self.tracking_uri:
            check_reachable(self.tracking_uri, "tracker.mlflow.tracking_uri")

    def report_to(self) -> list[str]:
        return ["mlflow"]

    def uri(self, run_dir: Path) -> str:
        return self.tracking_uri or (run_dir / "mlruns").resolve().as_uri()

    def start(self, run: RunInfo) -> TrackerRun:
        os.environ["MLFLOW_TRACKING_URI"] = self.uri(run.run_dir)
        if self.tracking_uri is None:  # MLflow 3 keeps the file store behind an opt-in
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        os.environ["MLFLOW_EXPERIMENT_NAME"] = self.experiment
        os.environ["MLFLOW_FLATTEN_PARAMS"] = "TRUE"
        import mlflow

        # Our own run, so that the trainer's callback logs into it and does not end it at train end
        # (the final evaluation would otherwise land in a second, anonymous run).
        mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
        mlflow.set_experiment(self.experiment)
        opened = mlflow.start_run(run_name=run.name, tags={"hydratune.overrides": " ".join(run.tags)[:5000]})

        def end(_: Any) -> None:
            if mlflow.active_run() is not None:
                mlflow.end_run()

        return _LazyRun(
            lambda: opened, lambda _, metrics, step: mlflow.log_metrics(metrics, step=step), end, opened
        )


@component("tracker")
@dataclass(frozen=True)
class Aim(Tracker):
    """Aim (needs the ``aim`` package): a repo in the run dir by default."""

    repo: str | None = None  # null = <run dir>
    experiment: str = "hydratune"

    def validate(self) -> None:
        _require("aim", "aim", "aim")

    def callbacks(self, run: RunInfo) -> list[Any]:
        from aim.hugging_face import AimCallback

        return [AimCallback(repo=self.repo or str(run.run_dir), experiment=self.experiment)]

    def start(self, run: RunInfo) -> TrackerRun:
        repo = self.repo or str(run.run_dir)

        def opened() -> Any:
            import aim

            return aim.Run(repo=repo, experiment=self.experiment)

        def write(aim_run: Any, metrics: dict[str, float], step: int) -> None:
            for key, value in metrics.items():
                aim_run.track(value, name=key, step=step)

        return _LazyRun(opened, write, lambda aim_run: aim_run.close())


@component("tracker")
@dataclass(frozen=True)
class Comet(Tracker):
    """Comet (needs ``comet_ml``; the API key from ``COMET_API_KEY``)."""

    project: str = "hydratune"
    mode: str = "online"  # online | offline

    def validate(self) -> None:
        _require("comet_ml", "comet", "comet_ml")

    def report_to(self) -> list[str]:
        return ["comet_ml"]

    def start(self, run: RunInfo) -> TrackerRun:
        os.environ["COMET_PROJECT_NAME"] = self.project
        os.environ["COMET_MODE"] = self.mode
        if self.mode == "offline":
            os.environ["COMET_OFFLINE_DIRECTORY"] = str(run.run_dir / "comet")

        def opened() -> Any:
            import comet_ml

            return comet_ml.start(project_name=self.project, online=self.mode == "online")

        return _LazyRun(opened, lambda e, metrics, step: e.log_metrics(metrics, step=step), lambda e: e.end())


@component("tracker")
@dataclass(frozen=True)
class JsonlTracker(Tracker):
    """Append every logged record, tagged with the run, to one JSONL file: point several runs'
    ``tracker.jsonl.path`` at one file to follow them together (``tail -f``, log shippers)."""

    path: str = "tracker.jsonl"  # relative paths are inside the run dir

    def file(self, run: RunInfo) -> Path:
        path = Path(self.path) if Path(self.path).is_absolute() else run.run_dir / self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def callbacks(self, run: RunInfo) -> list[Any]:
        from transformers import TrainerCallback

        path = self.file(run)

        class _Append(TrainerCallback):
            def on_log(
                self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any
            ) -> None:
                if state.is_world_process_zero and logs:
                    _append(path, run, state.global_step, logs)

        return [_Append()]

    def start(self, run: RunInfo) -> TrackerRun:
        path = self.file(run)
        return _LazyRun(
            lambda: path, lambda path, metrics, step: _append(path, run, step, metrics), lambda _: None
        )


def _append(path: Path, run: RunInfo, step: int, logs: dict[str, Any]) -> None:
    """One JSONL record: the run, the step, the logged values."""
    record = {"run": run.name, "run_dir": str(run.run_dir), "step": step, **logs}
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


@dataclass(frozen=True)
class Trackers(Tracker):
    """The selected trackers as one (``tracker=[tensorboard,wandb]``); none selected = run dir only."""

    members: dict[str, Tracker] = field(default_factory=dict)

    @classmethod
    def of(cls, node: Any) -> Trackers:
        """From the instantiated ``tracker`` node: a dict of trackers (or one tracker)."""
        if isinstance(node, Tracker):
            return cls({type(node).__name__.lower(): node})
        return cls(dict(node or {}))

    def validate(self) -> None:
        for member in self.members.values():
            member.validate()

    def report_to(self) -> list[str]:
        return [name for m in self.members.values() for name in m.report_to()]

    def start(self, run: RunInfo) -> TrackerRun:
        return Runs([member.start(run) for member in self.members.values()])

    def callbacks(self, run: RunInfo) -> list[Any]:
        return [cb for m in self.members.values() for cb in m.callbacks(run)]
