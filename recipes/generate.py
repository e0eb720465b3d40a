"""Batched generation over a file of prompts, with a trained run's model or any model.

``hydratune recipe=generate model.from_run=<run dir> data.path=prompts.jsonl`` renders every prompt with
the model's chat template (as trained), sorts them by length into batches, generates, and writes
``generations.jsonl`` (index, prompt, completion, tokens, finish reason, the reference if the data has
one) in input order. ``launcher.nproc_per_node=N`` deals the batches to N processes (one per GPU, gloo on
CPU) and merges their outputs in input order. An adapter run is used as trained (adapter on its base,
quantized or not); nothing is merged and nothing trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hydratune.components.recipe import recipe
from hydratune.components.runtime.inference import BatchedGeneration
from hydratune.components.runtime.run import RunContext


@recipe
@dataclass(frozen=True)
class Generate(BatchedGeneration):
    """Batched generation over a file of prompts with a run's model (model.from_run=<run dir>)."""

    title: ClassVar[str] = "Generate"
    image_rows: ClassVar[bool] = True  # image rows: each generated through the processor (complete_rows)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        session, _, merged, seconds = self.generate_all(ctx)
        if not ctx.is_main_process:
            return {}
        metrics = summarize(merged, seconds)
        session.write_report(metrics, cost={"generation time (s)": round(seconds, 3)})
        return metrics


def summarize(records: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Counts, tokens/s, finish reasons, and greedy-style exact match where references exist."""
    from hydratune.components.generation.evaluation import exact_match

    tokens = sum(r["tokens"] for r in records)
    metrics: dict[str, Any] = {
        "prompts": len({r["index"] for r in records}),
        "completions": len(records),
        "tokens generated": tokens,
        "tokens/s (all processes)": round(tokens / max(seconds, 1e-9), 1),
        "stopped at end of turn": sum(r["finish_reason"] == "stop" for r in records),
        "cut at max_new_tokens": sum(r["finish_reason"] == "length" for r in records),
    }
    scored = [r for r in records if "reference" in r]
    if scored:
        metrics["exact match"] = exact_match(
            [r["completion"] for r in scored], [r["reference"] for r in scored]
        )
    return metrics
