"""Simple preference optimisation (Meng et al. 2024) on TRL's CPOTrainer with ``loss_type="simpo"``
(``trl.experimental``, pinned: ``components/runtime/trl_experimental.py``): no reference model.

The loss is ``-log sigmoid(beta/|y_w| log pi(y_w|x) - beta/|y_l| log pi(y_l|x) - gamma)``: the
length-normalised log-likelihoods are the rewards, ``gamma`` the target margin. ``sft_weight`` > 0 adds the
chosen response's NLL (CPO's behaviour-cloning term; the paper's SimPO has none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hydratune.components.config.ranges import NON_NEGATIVE, POSITIVE, knob
from hydratune.components.recipe import Recipe, recipe
from hydratune.components.runtime.run import RunContext


@recipe
@dataclass(frozen=True)
class SimPO(Recipe):
    """SimPO on TRL's CPOTrainer: a length-normalised reward margin with a target gamma, no reference."""

    title: ClassVar[str] = "SimPO"
    data_kinds: ClassVar[tuple[str, ...]] = ("preference",)
    demo_data: ClassVar[str] = "demo_dpo"

    beta: float = knob(2.0, POSITIVE, hint="the paper: 2.0-2.5")  # the reward scale
    # the target reward margin (the paper: 0.5-1.6, gamma / beta around 0.5); TRL's simpo_gamma
    gamma: float = knob(1.0, NON_NEGATIVE, hint="the paper: 0.5-1.6")
    sft_weight: float = knob(0.0, NON_NEGATIVE)  # CPO's NLL term on the chosen response (0: the paper's)

    def trainer_args(self, max_length: int) -> dict[str, Any]:
        """CPOConfig's fields this recipe sets."""
        return {
            "loss_type": "simpo",
            "beta": self.beta,
            "simpo_gamma": self.gamma,
            "cpo_alpha": self.sft_weight,
            "max_length": max_length,
        }

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from hydratune.components.runtime.trainer_loop import train_on_pairs
        from hydratune.components.runtime.trl_experimental import experimental

        config_cls, trainer_cls = experimental("cpo", "CPOConfig", "CPOTrainer")
        return train_on_pairs(ctx, config_cls, trainer_cls, self.trainer_args(ctx.components.data.max_length))
