"""Odds-ratio preference optimisation (Hong et al. 2024) on TRL's ORPOTrainer (``trl.experimental``,
pinned: ``components/runtime/trl_experimental.py``): no reference model.

The loss is the chosen sequence's NLL minus
``lambda * log sigmoid(log odds(chosen) - log odds(rejected))``, the odds of a response ``p / (1 - p)``
with ``p`` its length-normalised likelihood ``exp(mean log p)``. TRL's NLL runs over the chosen prompt and
response, as the paper's reference implementation does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hydratune.components.config.ranges import POSITIVE, knob
from hydratune.components.recipe import Recipe, recipe
from hydratune.components.runtime.run import RunContext


@recipe
@dataclass(frozen=True)
class ORPO(Recipe):
    """ORPO on TRL's ORPOTrainer: SFT and an odds-ratio preference term in one loss, no reference model."""

    title: ClassVar[str] = "ORPO"
    data_kinds: ClassVar[tuple[str, ...]] = ("preference",)
    demo_data: ClassVar[str] = "demo_dpo"

    # the paper's lambda: the weight of the odds-ratio term against the NLL
    beta: float = knob(0.1, POSITIVE, hint="the paper: 0.1-0.25")

    def trainer_args(self, max_length: int) -> dict[str, Any]:
        """ORPOConfig's fields this recipe sets."""
        return {"beta": self.beta, "max_length": max_length}

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from hydratune.components.runtime.trainer_loop import train_on_pairs
        from hydratune.components.runtime.trl_experimental import experimental

        config_cls, trainer_cls = experimental("orpo", "ORPOConfig", "ORPOTrainer")
        return train_on_pairs(ctx, config_cls, trainer_cls, self.trainer_args(ctx.components.data.max_length))
