"""Reward-model training on TRL's RewardTrainer: a one-logit score head learns to rank chosen above
rejected. The saved model (final/) is what ``recipe=ppo`` and ``recipe=grpo`` take as a reward model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from components.checks import require_preferences
from components.registry import component
from components.run import Components, RunContext


@component("recipe")
@dataclass
class Reward:
    """Knobs of reward modelling; the score head is saved with the model (and with a LoRA adapter)."""

    center_rewards_coefficient: float | None = None  # pushes mean rewards towards 0 (Eisenstein et al.)

    def check(self, cfg: DictConfig, comps: Components) -> None:
        require_preferences("reward", comps)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from trl import RewardConfig, RewardTrainer

        from components.session import Session, training_pairs

        c = ctx.components
        session = Session.start(ctx)
        data = session.load_data()
        session.build_model(task="seq_cls")
        args = RewardConfig(
            **ctx.training_args(
                max_length=c.data.max_length,
                center_rewards_coefficient=self.center_rewards_coefficient,
                disable_dropout=True,
            )
        )
        trainer = session.trainer(RewardTrainer, args, data)
        return session.train_and_finish(trainer, title="Reward model", probes=training_pairs(trainer))
