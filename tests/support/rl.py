"""The short RL settings the PPO and GRPO tests share (tests/integration, tests/learning)."""

from __future__ import annotations

#: PPO in a few seconds an iteration on the tiny model: 32 rollouts of 8 tokens, two mini-batches
FAST_PPO = [
    "recipe=ppo",
    "recipe.rollout_batch_size=32",
    "recipe.mini_batch_size=16",
    "recipe.response_length=8",
    "train.micro_batch_size=16",
    "train.eval_generations=0",
    "train.save_every=0",
]

#: what every PPO iteration logs
PER_ITERATION = (
    "reward/mean",
    "kl",
    "loss/policy",
    "loss/value",
    "clipfrac/policy",
    "clipfrac/value",
    "entropy",
    "response_length",
)

# No eval split (the final evaluation would sample 8 completions for each of 64 eval prompts).
FAST_GRPO = [
    "recipe=grpo",
    "data.eval_path=null",
    "train.eval_every=0",  # no eval split: periodic eval would be refused before load
    "train.micro_batch_size=32",  # 4 prompts x num_generations 8 per step
    "train.eval_generations=0",
    "train.save_every=0",
    "train.log_every=1",
]


def train_rewards(ctx) -> list[float]:
    """The mean reward of each GRPO step, from the run's metrics."""
    return [r["reward"] for r in ctx.run_dir.read_metrics() if "reward" in r]
