"""The lifecycle every trainer-based recipe shares, so recipes stay one screen long.

``Session.start`` seeds, builds tokenizer and model (quantization + PEFT applied) and prepares the run
dir; ``train_and_finish`` checks the live strategy, trains or resumes, evaluates, saves and reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from components.callbacks import MetricsCallback, RichProgressCallback
from components.checkpoint import resolve_resume, save_final
from components.evaluation import evaluate_generations
from components.masking import check_label_mask, label_mask_stats, stop_token_ids
from components.peft import trainable_summary
from components.run import RunContext, peak_memory_gb


@dataclass
class Session:
    ctx: RunContext
    tokenizer: Any
    model: Any
    report: dict[str, dict[str, Any]] = field(default_factory=dict)
    eval_prompts: list[tuple[list[dict[str, str]], str]] = field(default_factory=list)

    @classmethod
    def start(cls, ctx: RunContext, *, model: Any = None) -> Session:
        """Seed, write versions.json, set up trackers, build tokenizer and (unless given) the model."""
        import datasets
        from transformers.utils import logging as hf_logging

        datasets.disable_progress_bars()
        hf_logging.disable_progress_bar()
        c = ctx.components
        ctx.seed_everything()
        ctx.run_dir.write_versions({"device": ctx.device})
        c.tracker.setup(ctx.run_dir.path, ctx.run_name)
        tokenizer = c.model.build_tokenizer()
        if model is None:
            dtype = c.precision.resolve(ctx.device)
            model = c.model.build(**c.quantization.load_kwargs(dtype))
            model = c.peft.apply(model)
        # No KV cache while training: besides wasting memory, a cache makes transformers skip the
        # packed-sequence mask, so padding-free packed examples would attend across boundaries.
        model.config.use_cache = False
        ctx.model = model
        session = cls(ctx, tokenizer, model)
        session.report["run"] = {
            "recipe": type(c.recipe).__name__,
            "model": c.model.name_or_path,
            "peft": type(c.peft).__name__,
            "strategy": type(c.strategy).__name__,
            "precision": c.precision.resolve(ctx.device),
            "device": ctx.device,
            "trainable": trainable_summary(model),
            "run dir": str(ctx.run_dir.path),
            "overrides": " ".join(ctx.overrides()) or "(none)",
        }
        return session

    def callbacks(self) -> list[Any]:
        c = self.ctx.components
        return [
            MetricsCallback(self.ctx.run_dir),
            RichProgressCallback(f"{type(c.recipe).__name__.lower()}"),
            *c.tracker.callbacks(self.ctx.run_dir.path, self.ctx.run_name),
        ]

    def evaluate_generations(self, prompts: list[tuple[list[dict[str, str]], str]], when: str) -> None:
        """Exact-match accuracy of greedy answers to ``prompts``; kept for the summary."""
        if not prompts:
            return
        self.eval_prompts = prompts
        result = evaluate_generations(
            self.model, self.tokenizer, prompts, max_new_tokens=self.ctx.train.max_new_tokens
        )
        self.report.setdefault("eval accuracy (exact match)", {})[when] = result["exact_match"]
        if when == "after":
            path = self.ctx.run_dir.path / "generations.jsonl"
            path.write_text("".join(json.dumps(s) + "\n" for s in result["samples"]))

    def check_loss_mask(self, dataset: Any, *, masked: bool) -> None:
        stats = label_mask_stats(dataset, stop_token_ids(self.tokenizer))
        check_label_mask(stats, masked=masked)
        self.report["loss mask"] = stats

    def train_and_finish(self, trainer: Any, *, title: str) -> dict[str, Any]:
        """Verify the strategy, train (resuming if asked), evaluate, save ``final/``, write the summary."""
        from transformers import PrinterCallback

        ctx, c = self.ctx, self.ctx.components
        trainer.remove_callback(PrinterCallback)
        c.strategy.verify(trainer.accelerator)
        resume = resolve_resume(ctx.cfg.resume, ctx.run_dir.path)
        if resume:
            self.report["run"]["resumed from"] = resume
        result = trainer.train(resume_from_checkpoint=resume)
        metrics: dict[str, Any] = dict(result.metrics)
        if trainer.eval_dataset is not None:
            metrics.update(trainer.evaluate())
        if not trainer.is_world_process_zero():
            return metrics
        self.evaluate_generations(self.eval_prompts, "after")
        final = save_final(trainer.model, self.tokenizer, ctx.run_dir.final, merge=ctx.cfg.merge)
        self.report["final metrics"] = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        self.report["cost"] = {
            "wall time (s)": round(ctx.elapsed(), 1),
            "train time (s)": metrics.get("train_runtime"),
            "tokens/s (train, non-pad)": _tokens_per_second(ctx),
            "peak memory (GiB)": round(peak_memory_gb(ctx.device), 3),
        }
        self.report["outputs"] = final
        if ctx.train.write_plots:
            ctx.run_dir.plot_losses()
        ctx.run_dir.write_summary(f"{title}: {ctx.run_name}", self.report.items())
        ctx.run_dir.write_json("result.json", self.report)
        return metrics


def _tokens_per_second(ctx: RunContext) -> float | None:
    rates = [
        r["train_tokens_per_second"] for r in ctx.run_dir.read_metrics() if "train_tokens_per_second" in r
    ]
    return round(rates[-1], 1) if rates else None
