"""The loop of the Trainer recipes (SFT, reward, DPO, KTO, ORPO, SimPO, GRPO): a transformers / TRL Trainer
runs the steps (its data order, accumulation, logging, and its own ``_save_checkpoint``: atomic, checksummed),
and the driver (``runtime/driver.py`` ``drive``) decides after each step through :class:`DriverStep`'s control
flags: the Trainer's own save and eval strategies are off (``RunContext.training_args``), so
``train.save_every``, ``train.eval_every`` and the stop agreement are the driver's alone. Around the steps:
the live check of the strategy, the probes (extra datasets scored before and after training) and the
end-of-run evaluation, measured for the summary. A fresh run that trains few of its weights (an adapter)
scores its "before" probe at the end, with those weights' initial values put back: not on the start-up path.
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

from hydratune.components.runtime.driver import AfterStep, Final

#: the "before" probe runs at the end, on the initial trainable weights kept aside, when these are at most
#: this share of the model's weights (an adapter; full fine-tuning would keep a second copy of the model)
DEFER_SHARE = 0.5
#: the probe's numbers that count training so far (transformers', TRL's), 0 before training
AT_START = ("epoch", "num_input_tokens_seen", "num_tokens")


class DriverStep(TrainerCallback):
    """After each optimizer step, the driver's decision as the Trainer's control flags: a checkpoint, an
    evaluation, the stop. Added last, after the Trainer's own flow callback."""

    def __init__(self, after_step: AfterStep) -> None:
        self.after_step = after_step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        decision = self.after_step(state.global_step)
        control.should_save = decision.save
        control.should_evaluate = decision.evaluate
        if decision.stop:
            control.should_training_stop = True


class TrainerLoop:
    """A Trainer's loop (``session.trainer(...)`` built it), with ``probes``: datasets scored before and
    after training (the first training pairs of the preference recipes)."""

    def __init__(self, session: Any, trainer: Any, probes: dict[str, Any] | None = None) -> None:
        self.session, self.trainer, self.probes = session, trainer, probes or {}
        self.checkpoint: str | None = None
        self.initial: dict[str, Any] | None = None  # the trainable weights before training (a deferred probe)
        self.evaluates = trainer.eval_dataset is not None
        session.ctx.trainer = trainer

    @property
    def max_steps(self) -> int:
        return int(self.trainer.state.max_steps)

    def resume(self, checkpoint: str | None) -> int:
        """Every trainer takes the same optimizer; the live strategy is checked (accelerate falls back
        silently in several setups); a fresh run probes before training. The Trainer itself restores
        ``checkpoint`` as ``train()`` starts."""
        from transformers import PrinterCallback

        ctx, c, trainer = self.session.ctx, self.session.ctx.components, self.trainer
        trainer.remove_callback(PrinterCallback)
        trainer.optimizer_cls_and_kwargs = c.optimizer.cls_and_kwargs(ctx.device)
        c.strategy.verify(trainer.accelerator, ctx.plan.world_size)
        self.session.report["run"]["live strategy"] = c.strategy.live_description(trainer.accelerator)
        if checkpoint is None:
            self.initial = self.keep_initial()
            if self.initial is None:
                self.probe_before()
        self.checkpoint = checkpoint
        return checkpoint_step(checkpoint)

    def train(self, done: int, after_step: AfterStep) -> dict[str, Any]:
        from hydratune.components.runtime.resume import loss_span

        trainer, report = self.trainer, self.session.report
        trainer.add_callback(DriverStep(after_step))
        result = trainer.train(resume_from_checkpoint=self.checkpoint)
        first = getattr(trainer, "_initial_global_step", 0) + 1  # the steps this run's train_loss covers
        report["run"]["train_loss covers"] = loss_span(first, trainer.state.global_step, self.checkpoint)
        report.setdefault("data", {}).update(getattr(trainer, "stream_report", {}))
        return dict(result.metrics)

    def last_step(self) -> int:
        return int(self.trainer.state.global_step)

    def save(self, step: int) -> Any:
        return self.trainer._save_checkpoint(self.trainer.model, trial=None)

    def finish(self, metrics: dict[str, Any]) -> Final:
        """The end-of-run evaluation (measured), the full state dict where parameters are sharded (a
        collective call on every rank), what this rank held of a split model, the probes after training."""
        session, trainer = self.session, self.trainer
        strategy, agreed = session.ctx.components.strategy, session.interrupt.agreed()
        if self.evaluates and not agreed:
            started = time.perf_counter()
            metrics.update(trainer.evaluate())
            session.eval_cost = {
                "end-of-run eval (s)": round(time.perf_counter() - started, 1),
                "end-of-run eval rows": len(trainer.eval_dataset),
            }
        state_dict = strategy.gather_state_dict(trainer)  # collective: every rank takes part
        self.record_layout()
        if not agreed:
            self.probe("after")  # evaluate() is collective (ZeRO-3 gathers): every rank
        if self.initial is not None:
            self.probe_initial(skipped=agreed)
        gathered = {"model": state_dict} if state_dict is not None else {}
        return Final(trainer.model, gathered, generate_together=strategy.model_split.generates_together)

    # ---- around the steps ---------------------------------------------------------------------------------
    def probe(self, when: str) -> None:
        """Evaluate the trainer on the probe datasets and keep the metrics and seconds for the summary."""
        session = self.session
        for name, dataset in self.probes.items():
            started = time.perf_counter()
            metrics = self.trainer.evaluate(eval_dataset=dataset, metric_key_prefix="probe")
            session.probe_cost[f"{name} probe {when} (s)"] = round(time.perf_counter() - started, 1)
            kept = {
                k.removeprefix("probe_"): v
                for k, v in metrics.items()
                if not k.endswith(("runtime", "per_second"))
            }
            session.report.setdefault(f"{name} ({when})", {}).update(kept)

    def probe_before(self) -> None:
        """:meth:`probe` before training, except under DeepSpeed: an ``evaluate()`` before ``train()`` leaves
        the model wrapped in an inference engine that ``train()`` frees and does not rebuild (transformers
        5), so the first backward finds no engine."""
        if self.probes and getattr(self.trainer, "is_deepspeed_enabled", False):
            for name in self.probes:
                self.session.report[f"{name} (before)"] = {
                    "skipped": "DeepSpeed: no evaluation before train()"
                }
            return
        self.probe("before")

    def keep_initial(self) -> dict[str, Any] | None:
        """A copy of the trainable weights, for :meth:`probe_initial` at the end; None (probe now): no probes,
        DeepSpeed, several processes, a strategy that shards the parameters, or trainable weights over
        ``DEFER_SHARE`` of the model."""
        ctx = self.session.ctx
        if not self.probes or getattr(self.trainer, "is_deepspeed_enabled", False) or ctx.plan.world_size > 1:
            return None
        if ctx.components.strategy.shards_parameters:
            return None
        params = list(self.trainer.model.named_parameters())
        trained = [(n, p) for n, p in params if p.requires_grad]
        if sum(p.numel() for _, p in trained) > DEFER_SHARE * sum(p.numel() for _, p in params):
            return None
        for name in self.probes:  # the summary's order: before, after
            self.session.report[f"{name} (before)"] = {}
            self.session.probe_cost[f"{name} probe before (s)"] = None
        return {n: p.detach().clone() for n, p in trained}

    def probe_initial(self, skipped: bool) -> None:
        """The "before" probe, deferred: the trainable weights' initial values put back, the probe, the
        trained values restored (bit for bit); a stopped run skips it (its summary says so)."""
        import torch

        initial, self.initial = self.initial or {}, None
        if skipped:
            for name in self.probes:
                self.session.probe_cost.pop(f"{name} probe before (s)", None)
                self.session.report[f"{name} (before)"] = {
                    "skipped": "the run stopped: the initial weights are scored at the end of a run"
                }
            return
        params = dict(self.trainer.model.named_parameters())
        trained = {n: params[n].detach().clone() for n in initial}
        with torch.no_grad():
            try:
                for n, value in initial.items():
                    params[n].copy_(value)
                self.probe("before")
            finally:
                for n, value in trained.items():
                    params[n].copy_(value)
        for name in self.probes:
            report = self.session.report[f"{name} (before)"]
            for key in [k for k in report if k.endswith(AT_START)]:
                report[key] = 0  # the trainer's counters (epoch, tokens seen) as they were before training
            report["scored"] = f"after training, its {len(initial)} initial trainable tensors put back"

    def record_layout(self) -> None:
        """What this rank held of a split model (its shards, groups, token split) into
        ``.rank<r>.layout.json``, and rank 0's into the summary."""
        import os

        session = self.session
        split = getattr(self.trainer, "sequence_split", None)
        if split:
            session.layout["sequence split"] = split
        if not session.layout:
            return
        rank = int(os.environ.get("RANK", 0))
        session.ctx.run_dir.write_json(f".rank{rank}.layout.json", session.layout)
        if rank == 0:
            session.report["mesh (live, rank 0)"] = dict(session.layout)


def checkpoint_step(checkpoint: str | None) -> int:
    """The optimizer step a Trainer checkpoint holds (its ``trainer_state.json``); 0 for none."""
    if checkpoint is None:
        return 0
    import json
    from pathlib import Path

    state = Path(checkpoint) / "trainer_state.json"
    return int(json.loads(state.read_text()).get("global_step", 0)) if state.is_file() else 0


def train_on_pairs(
    ctx: Any, config_cls: Any, trainer_cls: Any, trainer_args: dict[str, Any]
) -> dict[str, Any]:
    """A reference-free preference trainer (ORPO, SimPO) through the shared lifecycle: load, build, train
    with ``trainer_args``, probe the first training pairs before and after."""
    from hydratune.components.runtime.session import Session

    session = Session.start(ctx)
    data = session.load_data()
    session.build_model()
    trainer = session.trainer(trainer_cls, config_cls(**ctx.training_args(**trainer_args)), data)
    return session.run(TrainerLoop(session, trainer, training_pairs(trainer, ctx.train.probe_pairs)))


def training_pairs(trainer: Any, pairs: int) -> dict[str, Any]:
    """Reward and the preference recipes: the first ``pairs`` (``train.probe_pairs``; 0: none) training
    pairs, scored before and after training (the ``probes`` of :class:`TrainerLoop`)."""
    rows = trainer.train_dataset
    if not pairs:
        return {}
    return {"training pairs": rows.select(range(min(pairs, len(rows))))}
