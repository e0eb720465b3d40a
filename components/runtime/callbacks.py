"""Trainer callbacks shared by the recipes: the run dir's metrics stream, and progress: a rich bar on a
terminal, plain lines where stdout is a file (SLURM jobs, pipes)."""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

from hydratune.components.config.errors import Diverged
from hydratune.components.runtime.rundir import RunDir

# Keys worth a column on the progress bar, in order.
PROGRESS_KEYS = ("loss", "eval_loss", "learning_rate", "train_tokens_per_second")


class MetricsCallback(TrainerCallback):
    """Append every logged record to ``metrics.jsonl`` (rank 0), with step, epoch and wall time."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.start = time.time()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, "time": round(time.time() - self.start, 3)}
        record.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str))})
        self.run_dir.append_metrics(record)


class NonFiniteLossGuard(TrainerCallback):
    """Stop with ``Diverged`` when a logged training loss is nan/inf (on every rank, before the save that
    would follow the log): the check rides on the log step's own sync instead of one per step."""

    def __init__(self) -> None:
        self.last_finite: int | None = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        import math

        loss = (logs or {}).get("loss")
        if not isinstance(loss, (int, float)):
            return
        if math.isfinite(loss):
            self.last_finite = state.global_step
            return
        raise Diverged(state.global_step, loss, self.last_finite, args.learning_rate, args.max_grad_norm)


class LayoutCheck(TrainerCallback):
    """When training begins (the engine is built by then: DeepSpeed's AutoTP has split the layers, Ulysses has
    made its groups): the strategy reads back what was built (:meth:`ModelSplit.verify_built`) and refuses a
    mismatch before the first step; each rank records what it holds in ``layout``, which the run writes
    into ``.rank<r>.layout.json``."""

    def __init__(self, strategy: Any, mesh: Any, layout: dict[str, Any]) -> None:
        self.strategy, self.mesh, self.layout = strategy, mesh, layout

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.layout.update(self.strategy.verify_built(model, self.mesh))


class ResumeSplitRows(TrainerCallback):
    """Resuming under DeepSpeed Ulysses: the Trainer runs with ``ignore_data_skip`` (its skip would crash on
    Ulysses' data loader) and this puts the loader where the interrupted run was instead, in the epoch and
    after the micro-batches the Trainer itself would have skipped (``fast_forward_ulysses``)."""

    def on_train_begin(
        self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any
    ) -> None:
        import math

        from hydratune.components.distributed.model_parallel import fast_forward_ulysses

        if not state.global_step or train_dataloader is None:
            return
        accumulation = args.gradient_accumulation_steps
        per_epoch = max(math.ceil(len(train_dataloader) / accumulation), 1)  # the Trainer's own count
        epoch, done = divmod(state.global_step, per_epoch)
        fast_forward_ulysses(train_dataloader, epoch, done * accumulation)


class RichProgressCallback(TrainerCallback):
    """A rich progress bar (rank 0) with loss, learning rate, tokens/s and ETA; replaces tqdm."""

    def __init__(self, description: str = "training") -> None:
        self.description = description
        self.progress: Any = None
        self.task: Any = None
        self.latest: dict[str, float] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeRemainingColumn(),
            transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            self.description, total=state.max_steps, completed=state.global_step, stats=""
        )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if self.progress is None or not logs:
            return
        self.latest.update({k: logs[k] for k in PROGRESS_KEYS if isinstance(logs.get(k), (int, float))})
        parts = []
        for key, label, fmt in (
            ("loss", "loss", "{:.4f}"),
            ("eval_loss", "eval", "{:.4f}"),
            ("learning_rate", "lr", "{:.2e}"),
            ("train_tokens_per_second", "tok/s", "{:,.0f}"),
        ):
            if key in self.latest:
                parts.append(f"{label} {fmt.format(self.latest[key])}")
        self.progress.update(self.task, stats="  ".join(parts))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)
            self.progress.stop()
            self.progress = None


def progress_line(
    label: str,
    step: int,
    total: int,
    elapsed: float,
    steps_done: int,
    values: dict[str, float | None],
) -> str:
    """One plain progress line: ``sft step 10/100  loss 1.2345  lr 1.00e-03  tok/s 1,234  eta 0:01:23``.
    ``steps_done``: steps taken in ``elapsed`` seconds (a resumed run starts past 0); None values are left
    out."""
    import datetime

    formats = {"loss": "{:.4f}", "eval_loss": "{:.4f}", "lr": "{:.2e}", "tok/s": "{:,.0f}"}
    parts = [f"{label} step {step}/{total}"]
    for name, value in values.items():
        if value is not None:
            parts.append(f"{name} {formats.get(name, '{:.4g}').format(value)}")
    if steps_done > 0:
        eta = elapsed / steps_done * max(total - step, 0)
        parts.append(f"eta {datetime.timedelta(seconds=round(eta))}")
    return "  ".join(parts)


class PlainProgressCallback(TrainerCallback):
    """Progress without a terminal (rank 0): a line per log step (every ``train.log_every`` steps) with
    step/total, loss, learning rate, tokens/s and ETA, flushed so a redirected log shows it at once."""

    def __init__(self, description: str = "training") -> None:
        self.description = description
        self.start = time.time()
        self.first_step = 0
        self.first_tokens = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start, self.first_step = time.time(), state.global_step
        self.first_tokens = getattr(state, "num_input_tokens_seen", 0) or 0

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        if not state.is_world_process_zero or not ("loss" in logs or "eval_loss" in logs):
            return
        elapsed = time.time() - self.start
        tokens = (getattr(state, "num_input_tokens_seen", 0) or 0) - self.first_tokens
        values = {
            "loss": logs.get("loss"),
            "eval_loss": logs.get("eval_loss"),
            "lr": logs.get("learning_rate"),
            "tok/s": tokens / elapsed if tokens > 0 and elapsed > 0 else None,
        }
        done = state.global_step - self.first_step
        print(
            progress_line(self.description, state.global_step, state.max_steps, elapsed, done, values),
            flush=True,
        )


def progress_callback(description: str) -> TrainerCallback:
    """The rich bar on a terminal, plain lines otherwise."""
    import sys

    tty = sys.stdout.isatty()
    return RichProgressCallback(description) if tty else PlainProgressCallback(description)


def process_age() -> float:
    """Seconds since this process started (the command, imports included)."""
    import psutil

    return time.time() - psutil.Process().create_time()


class FirstStepTimer(TrainerCallback):
    """Records how long the command took to reach its first optimizer step (start-up latency)."""

    def __init__(self) -> None:
        self.seconds: float | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.seconds is None:
            self.seconds = round(process_age(), 2)


class ToolMetrics(TrainerCallback):
    """Adds GRPO's tool calls and faults since the last log (``tools.ToolStats``) to each logged step (before
    MetricsCallback), summed over the ranks (``accelerator``: every rank logs the same steps)."""

    def __init__(self, stats: Any, accelerator: Any = None) -> None:
        self.stats, self.accelerator = stats, accelerator

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any
    ) -> None:
        if logs is not None and "loss" in logs:
            logs.update(self.summed(self.stats.drain()))

    def summed(self, counts: dict[str, float]) -> dict[str, float]:
        if self.accelerator is None or self.accelerator.num_processes == 1:
            return counts
        import torch

        keys = sorted(counts)
        local = torch.tensor([counts[k] for k in keys], dtype=torch.float64, device=self.accelerator.device)
        return dict(zip(keys, self.accelerator.reduce(local, reduction="sum").tolist(), strict=True))


class AtTrainEnd(TrainerCallback):
    """Calls ``action()`` once training ends, before the final model is saved (GRPO: the reward adapter
    taken off the policy it shares a base with)."""

    def __init__(self, action: Any) -> None:
        self.action = action

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.action()
