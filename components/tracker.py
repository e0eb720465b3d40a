"""Tracker components: where metrics go besides the run dir's own ``metrics.jsonl``.

Several trackers can run at once: each option lives at ``tracker.<name>`` in the config, so
``tracker=[tensorboard,wandb]`` selects both. They reach the HF/TRL trainers as ``report_to`` names
(the trainers' own integrations) or as callbacks; recipes that own their loop (PPO) call
:meth:`Tracker.log` instead (through ``Session.log_metrics``). Secrets (API keys) stay in the environment: no
tracker writes them to the config, the run dir or its params.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.errors import ConfigError
from components.registry import component


@dataclass
class RunInfo:
    """What trackers are told about a run."""

    run_dir: Path
    name: str
    tags: list[str] = field(default_factory=list)  # the overrides, e.g. ["peft=lora", "optimizer.lr=1e-3"]
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config


@dataclass
class Tracker:
    """Base: the hooks a tracker may use."""

    def validate(self) -> None:
        """Cheap checks (an optional package is installed) before anything loads."""

    def report_to(self) -> list[str]:
        return []

    def setup(self, run: RunInfo) -> None:
        """Before the trainer is built, on rank 0 only."""

    def callbacks(self, run: RunInfo) -> list[Any]:
        return []

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at ``step`` directly, for recipes that own their loop (PPO); rank 0 only,
        after :meth:`setup`. Trainer-based recipes reach the tracker through ``report_to`` instead."""

    def finish(self) -> None:
        """After training (also after an interruption): flush and close."""


def _require(package: str, tracker: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"tracker {tracker} needs the '{package}' package",
            key=f"tracker.{tracker}",
            hint=f"pip install '{extra}'",
        )


@component("tracker")
@dataclass
class TensorBoard(Tracker):
    """TensorBoard event files under ``<run dir>/<subdir>`` (``tensorboard --logdir outputs``)."""

    subdir: str = "tensorboard"

    def validate(self) -> None:
        _require("tensorboard", "tensorboard", "hydratune[tensorboard]")

    def report_to(self) -> list[str]:
        return ["tensorboard"]

    def setup(self, run: RunInfo) -> None:
        # transformers 5 removed TrainingArguments.logging_dir; its TensorBoard callback reads this variable.
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(run.run_dir / self.subdir)
        self._logdir = run.run_dir / self.subdir

    def log(self, metrics: dict[str, float], step: int) -> None:
        if getattr(self, "_writer", None) is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self._logdir))
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)

    def finish(self) -> None:
        writer = getattr(self, "_writer", None)
        if writer is not None:
            writer.close()
            self._writer = None


@component("tracker")
@dataclass
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

    def setup(self, run: RunInfo) -> None:
        import wandb

        os.environ["WANDB_LOG_MODEL"] = "end" if self.log_model else "false"
        self._run = wandb.init(
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

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def finish(self) -> None:
        run = getattr(self, "_run", None)
        if run is not None:
            run.finish()
            self._run = None


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
@dataclass
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

    def setup(self, run: RunInfo) -> None:
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
        mlflow.start_run(run_name=run.name, tags={"hydratune.overrides": " ".join(run.tags)[:5000]})

    def log(self, metrics: dict[str, float], step: int) -> None:
        import mlflow

        mlflow.log_metrics(metrics, step=step)

    def finish(self) -> None:
        import mlflow

        if mlflow.active_run() is not None:
            mlflow.end_run()


@component("tracker")
@dataclass
class Aim(Tracker):
    """Aim (needs the ``aim`` package): a repo in the run dir by default."""

    repo: str | None = None  # null = <run dir>
    experiment: str = "hydratune"

    def validate(self) -> None:
        _require("aim", "aim", "aim")

    def callbacks(self, run: RunInfo) -> list[Any]:
        from aim.hugging_face import AimCallback

        return [AimCallback(repo=self.repo or str(run.run_dir), experiment=self.experiment)]

    def setup(self, run: RunInfo) -> None:
        self._repo = self.repo or str(run.run_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if getattr(self, "_run", None) is None:
            import aim

            self._run = aim.Run(repo=self._repo, experiment=self.experiment)
        for key, value in metrics.items():
            self._run.track(value, name=key, step=step)

    def finish(self) -> None:
        run = getattr(self, "_run", None)
        if run is not None:
            run.close()
            self._run = None


@component("tracker")
@dataclass
class Comet(Tracker):
    """Comet (needs ``comet_ml``; the API key from ``COMET_API_KEY``)."""

    project: str = "hydratune"
    mode: str = "online"  # online | offline

    def validate(self) -> None:
        _require("comet_ml", "comet", "comet_ml")

    def report_to(self) -> list[str]:
        return ["comet_ml"]

    def setup(self, run: RunInfo) -> None:
        os.environ["COMET_PROJECT_NAME"] = self.project
        os.environ["COMET_MODE"] = self.mode
        if self.mode == "offline":
            os.environ["COMET_OFFLINE_DIRECTORY"] = str(run.run_dir / "comet")

    def log(self, metrics: dict[str, float], step: int) -> None:
        if getattr(self, "_experiment", None) is None:
            import comet_ml

            self._experiment = comet_ml.start(project_name=self.project, online=self.mode == "online")
        self._experiment.log_metrics(metrics, step=step)

    def finish(self) -> None:
        experiment = getattr(self, "_experiment", None)
        if experiment is not None:
            experiment.end()
            self._experiment = None


@component("tracker")
@dataclass
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

    def setup(self, run: RunInfo) -> None:
        self._run = run

    def log(self, metrics: dict[str, float], step: int) -> None:
        _append(self.file(self._run), self._run, step, metrics)


def _append(path: Path, run: RunInfo, step: int, logs: dict[str, Any]) -> None:
    """One JSONL record: the run, the step, the logged values."""
    record = {"run": run.name, "run_dir": str(run.run_dir), "step": step, **logs}
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


@dataclass
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

    def setup(self, run: RunInfo) -> None:
        for member in self.members.values():
            member.setup(run)

    def callbacks(self, run: RunInfo) -> list[Any]:
        return [cb for m in self.members.values() for cb in m.callbacks(run)]

    def log(self, metrics: dict[str, float], step: int) -> None:
        for member in self.members.values():
            member.log(metrics, step)

    def finish(self) -> None:
        for member in self.members.values():
            member.finish()
