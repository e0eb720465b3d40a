"""Batched generation over a file of prompts, with a trained run's model or any model.

``hydratune recipe=generate model.from_run=<run dir> data.path=prompts.jsonl`` renders every prompt with
the model's chat template (as trained), sorts them by length into batches, generates, and writes
``generations.jsonl`` (index, prompt, completion, tokens, finish reason, the reference if the data has
one) in input order. ``launcher.nproc_per_node=N`` deals the batches to N processes (one per GPU, gloo on
CPU) and merges their outputs in input order. An adapter run is used as trained (adapter on its base,
quantized or not); nothing is merged and nothing trains.

``recipe.tools=[...]`` runs every prompt as an episode of the tool loop GRPO trains with
(components/tool_loop.py ``ToolLoop``): each record then holds the transcript (``messages``: the model's
tool calls, the tools' results), its tool calls and their faults; ``completion`` is the last turn's text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.recipe import recipe
from hydratune.components.runtime.inference import BatchedGeneration
from hydratune.components.runtime.run import Components, RunContext
from hydratune.components.tools import ToolUse


@recipe
@dataclass(frozen=True)
class Generate(BatchedGeneration, ToolUse):
    """Batched generation over a file of prompts with a run's model (model.from_run=<run dir>)."""

    title: ClassVar[str] = "Generate"
    image_rows: ClassVar[bool] = True  # image rows: each generated through the processor (complete_rows)

    def check(self, cfg: DictConfig, comps: Components) -> None:
        super().check(cfg, comps)
        self.tool_functions(trusted=bool(cfg.get("trust_targets", False)))  # imported, trusted, described

    def plan_lines(self, cfg: DictConfig, comps: Components) -> list[str]:
        from hydratune.components.tools import plan_lines

        if not self.tools:
            return []
        return plan_lines(self.tool_functions(), self.max_tool_calls, self.tool_timeout, len(self.tools))

    def check_data(self, comps: Components, splits: Any, tokenizer: Any) -> None:
        """With tools: a chat template that renders tool calls and results, text rows, and the first prompt
        with the tools' schemas within the prompt limit and the model's context (as GRPO checks them)."""
        if not self.tools:
            return
        from hydratune.components.tools import check_prompt_fits, check_template, model_context, schema

        check_template(tokenizer)
        if getattr(splits, "has_images", False):
            raise ConfigError(
                "recipe.tools runs text conversations; these rows have images",
                key="recipe.tools",
                hint="data.images=false, or drop recipe.tools",
            )
        pairs = comps.data.pairs(splits, "train")
        if pairs:
            schemas = [schema(f) for f in self.tool_functions()]
            check_prompt_fits(comps.data, pairs[0][0], tokenizer, schemas, model_context(comps))

    def agent(self, tokenizer: Any) -> Any:
        if not self.tools:
            return None
        from hydratune.components.tool_loop import ToolLoop

        return ToolLoop(
            tokenizer, self.tool_functions(), limit=self.max_tool_calls, timeout=self.tool_timeout
        )

    def run(self, ctx: RunContext) -> dict[str, Any]:
        session, _, merged, seconds = self.generate_all(ctx)
        if not ctx.is_main_process:
            return {}
        metrics = summarize(merged, seconds)
        session.write_report(metrics, cost={"generation time (s)": round(seconds, 3)})
        return metrics


def summarize(records: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Counts, tokens/s, finish reasons, and greedy-style exact match where references exist; with tools,
    the episodes' tool calls, the episodes cut at recipe.max_tool_calls and the tool errors by kind."""
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
    if records and "tool_calls" in records[0]:
        from collections import Counter

        from hydratune.components.tools import FAULTS, UNKNOWN

        errors: Counter[str] = Counter()
        for r in records:
            errors.update(r["tool_errors"])
        calls = [r["tool_calls"] for r in records]
        metrics["cut by recipe.max_tool_calls"] = sum(r["finish_reason"] == "tool_limit" for r in records)
        metrics["tool calls"] = sum(calls)
        metrics["tool calls per episode (max)"] = max(calls)
        metrics["tool errors"] = ", ".join(f"{k} {errors[k]}" for k in (*FAULTS, UNKNOWN))
    scored = [r for r in records if "reference" in r]
    if scored:
        metrics["exact match"] = exact_match(
            [r["completion"] for r in scored], [r["reference"] for r in scored]
        )
    return metrics
