"""Reward-model training on TRL's RewardTrainer: a one-logit score head learns to rank chosen above
rejected. The saved model (final/) is what ``recipe=ppo`` and ``recipe=grpo`` take as a reward model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hydratune.components.config.ranges import NON_NEGATIVE, knob
from hydratune.components.recipe import Recipe, recipe
from hydratune.components.runtime.run import RunContext


@recipe
@dataclass(frozen=True)
class Reward(Recipe):
    """Reward model on TRL's RewardTrainer; the score head is saved with the model (and a LoRA adapter)."""

    title: ClassVar[str] = "Reward model"
    data_kinds: ClassVar[tuple[str, ...]] = ("preference",)
    produces_causal_lm: ClassVar[bool] = False  # a sequence classifier: PPO, GRPO and best_of_n score with it
    overlong_pairs: ClassVar[str] = "drop"  # RewardTrainer drops a pair with a side past max_length

    # pushes mean rewards towards 0 (Eisenstein et al.)
    center_rewards_coefficient: float | None = knob(None, NON_NEGATIVE)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from trl import RewardConfig, RewardTrainer

        from hydratune.components.runtime.session import Session
        from hydratune.components.runtime.trainer_loop import TrainerLoop, training_pairs

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
        return session.run(TrainerLoop(session, trainer, training_pairs(trainer, ctx.train.probe_pairs)))
