"""Best-of-N sampling: N completions per prompt, scored by a reward, the best kept as training data.

``hydratune recipe=best_of_n model.from_run=<policy run> recipe.reward.model=<reward run>`` samples
``n`` completions of every prompt (recipe=generate's batching and data parallelism), scores them with a
reward model run or any reward function the RL recipes accept, and writes ``best_of_n.jsonl`` (chat
``messages`` that ``recipe=sft data=jsonl_messages data.path=…`` reads) and, with ``pairs=true``,
``pairs.jsonl`` (best vs worst as ``prompt`` / ``chosen`` / ``rejected``: ``recipe=dpo data.path=…``):
rejection-sampling fine-tuning in two commands. The summary compares the mean reward of the first sample
with the best of N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import POSITIVE, Range, knob
from hydratune.components.recipe import recipe
from hydratune.components.rewards import reward_model_path
from hydratune.components.rewards_http import OneReward
from hydratune.components.runtime.inference import BatchedGeneration, write_jsonl
from hydratune.components.runtime.run import Components, RunContext


@recipe
@dataclass(frozen=True)
class BestOfN(BatchedGeneration, OneReward):
    """recipe=generate's knobs (``num_return_sequences`` is N, sampled at ``temperature``) and the reward."""

    num_return_sequences: int = knob(8, Range(2), hint="best of N needs N >= 2 samples")  # N
    temperature: float = knob(1.0, POSITIVE, hint="greedy samples are all the same; e.g. 1.0")
    output: str = "samples.jsonl"  # every sample with its reward
    pairs: bool = False  # also write best/worst preference pairs (pairs.jsonl)

    title: ClassVar[str] = "Best-of-N"

    def check(self, cfg: DictConfig, comps: Components) -> None:
        super().check(cfg, comps)
        if not self.reward and self.reward_url is None:
            raise ConfigError("no reward", key="recipe.reward", hint="recipe.reward.model=<reward run dir>")
        self.check_one_reward(cfg)
        if reward_model_path(self.reward):
            from hydratune.components.rewards import reward_model_dir

            reward_model_dir(reward_model_path(self.reward))  # raises naming recipe.reward.model

    def plan_lines(self, cfg: DictConfig, comps: Components) -> list[str]:
        """Where a reward model loads: separately, once the policy is freed."""
        from hydratune.components.reward_placement import separate

        path = None if self.reward_url else reward_model_path(self.reward)
        return [f"# best_of_n: {separate('best_of_n', path)}"] if path else []

    def run(self, ctx: RunContext) -> dict[str, Any]:
        session, rows, records, seconds = self.generate_all(ctx)  # the policy is freed on its return
        if not ctx.is_main_process:
            return {}
        for line in self.plan_lines(ctx.cfg, ctx.components):
            session.report.setdefault("run", {})["reward model"] = line.removeprefix("# best_of_n: ")
        reward = self.reward_function(ctx.device)  # recipe.reward_url, else recipe.reward
        scores = score(reward, rows, records)
        for r, s in zip(records, scores, strict=True):
            r["reward"] = s
        out = ctx.run_dir.path
        write_jsonl(out / self.output, records)
        best, pairs = select(rows, records)
        write_jsonl(out / "best_of_n.jsonl", best)
        if self.pairs:
            write_jsonl(out / "pairs.jsonl", pairs)
        n = self.num_return_sequences
        firsts = [r["reward"] for r in records if r["sample"] == 0]
        metrics = {
            "prompts": len(rows),
            "prompts with only empty samples (no row)": len(rows) - len(best),
            "samples per prompt": n,
            "mean reward, first sample": sum(firsts) / len(firsts),
            f"mean reward, best of {n}": sum(b["reward"] for b in best) / len(best),
            "mean reward, all samples": sum(scores) / len(scores),
            "preference pairs": len(pairs) if self.pairs else "not written (pairs=false)",
            "seconds generating": round(seconds, 1),
        }
        session.report["outputs"] = {
            "best_of_n.jsonl": f"recipe=sft data=jsonl_messages data.path={out / 'best_of_n.jsonl'}",
            **({"pairs.jsonl": f"recipe=dpo data.path={out / 'pairs.jsonl'}"} if self.pairs else {}),
        }
        session.write_report(metrics)
        return metrics


def score(reward: Any, rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[float]:
    """One reward per record: the reward function sees the prompt turns, the completion and the row's
    reference as ``answer`` (what exact_match & co read)."""
    prompts = [rows[r["index"]]["conversation"] for r in records]
    completions = [r["completion"] for r in records]
    answers = [rows[r["index"]]["reference"] for r in records]
    return [float(x) for x in reward(prompts=prompts, completions=completions, answer=answers)]


def select(
    rows: list[dict[str, Any]], records: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per prompt: the highest-reward non-empty sample as an SFT row, and (best, worst) as a preference pair
    when their rewards differ (ties teach nothing). The first sample wins a tie for best; a prompt whose
    samples are all empty gives no row (the trainers refuse empty replies)."""
    by_prompt: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r["completion"].strip():
            by_prompt.setdefault(r["index"], []).append(r)
    best_rows, pairs = [], []
    for index, samples in sorted(by_prompt.items()):
        conversation = list(rows[index]["conversation"])
        best = max(samples, key=lambda r: r["reward"])  # max keeps the first of equal rewards
        worst = min(samples, key=lambda r: r["reward"])
        reply = {"role": "assistant", "content": best["completion"]}
        best_rows.append({"messages": [*conversation, reply], "reward": best["reward"]})
        if best["reward"] > worst["reward"]:
            rejected = [{"role": "assistant", "content": worst["completion"]}]
            pairs.append({"prompt": conversation, "chosen": [reply], "rejected": rejected})
    return best_rows, pairs
