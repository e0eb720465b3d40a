"""Tracker component: where metrics go besides the run dir's own ``metrics.jsonl``.

Trackers are handed to the HF/TRL trainers as ``report_to`` names (accelerate's integrations) or as
callbacks; W&B, MLflow, Aim and Comet plug in the same way.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.registry import component


@dataclass
class Tracker:
    """Base: no tracker."""

    def report_to(self) -> list[str]:
        return []

    def setup(self, run_dir: Path, run_name: str) -> None:
        """Prepare environment / directories before the trainer is built (rank 0 only)."""

    def callbacks(self, run_dir: Path, run_name: str) -> list[Any]:
        return []


@component("tracker")
@dataclass
class NoTracker(Tracker):
    """Only the run dir's metrics.jsonl / summary / plots."""


@component("tracker")
@dataclass
class TensorBoard(Tracker):
    """TensorBoard event files under ``<run dir>/<subdir>`` (needs the ``tensorboard`` package)."""

    subdir: str = "tensorboard"

    def report_to(self) -> list[str]:
        return ["tensorboard"]

    def setup(self, run_dir: Path, run_name: str) -> None:
        # transformers 5 removed TrainingArguments.logging_dir; its TensorBoard callback reads this variable.
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(run_dir / self.subdir)


@component("tracker")
@dataclass
class JsonlTracker(Tracker):
    """Append every logged record, tagged with the run, to one JSONL file: point several runs'
    ``tracker.path`` at one file to follow them together (``tail -f``, log shippers)."""

    path: str = "tracker.jsonl"  # relative paths are inside the run dir

    def callbacks(self, run_dir: Path, run_name: str) -> list[Any]:
        from transformers import TrainerCallback

        path = Path(self.path) if Path(self.path).is_absolute() else run_dir / self.path
        path.parent.mkdir(parents=True, exist_ok=True)

        class _Append(TrainerCallback):
            def on_log(
                self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any
            ) -> None:
                if state.is_world_process_zero and logs:
                    record = {"run": run_name, "run_dir": str(run_dir), "step": state.global_step, **logs}
                    with path.open("a") as f:
                        f.write(json.dumps(record) + "\n")

        return [_Append()]
