"""Kahneman-Tversky optimisation (Ethayarajh et al. 2024) on TRL's KTOTrainer: unpaired data.

Each row is one completion labelled desirable or not. The loss per row is
``w_D (1 - sigmoid(beta (r - z)))`` for a desirable completion and ``w_U (1 - sigmoid(beta (z - r)))``
for an undesirable one: ``r`` the log-ratio of policy to reference, ``z`` the batch's KL estimate (the
same completions paired with other prompts, so ``train.micro_batch_size`` must be at least 2). The
reference is DPO's: the adapter-free policy under PEFT, else a frozen copy (ZeRO-3: loaded again), or
log-probs computed once up front.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import POSITIVE, knob
from hydratune.components.head_path import check_loss_impl, head_path, head_plan_line
from hydratune.components.recipe import Recipe, recipe
from hydratune.components.runtime.run import Components, RunContext

LOSS_TYPES = ("kto", "apo_zero_unpaired")
WEIGHTS = "weigh the rarer label up (the paper: w_D n_D / (w_U n_U) in [1, 4/3])"


#: TRL's KTO metrics computed from the head's per-token statistics (at log steps only under the chunked head)
HEAD_METRICS = ("entropy", "logits/chosen", "logits/rejected")


@recipe
@dataclass(frozen=True)
class KTO(Recipe):
    """KTO on TRL's KTOTrainer: unpaired rows (prompt, completion, label), desirable / undesirable weights."""

    title: ClassVar[str] = "KTO"
    data_kinds: ClassVar[tuple[str, ...]] = ("unpaired", "preference")  # pairs are split into two rows

    beta: float = knob(0.1, POSITIVE, hint="typical: 0.01-0.5")
    # lambda_D: raise it when desirable rows are the fewer
    desirable_weight: float = knob(1.0, POSITIVE, hint=WEIGHTS)
    undesirable_weight: float = knob(1.0, POSITIVE, hint=WEIGHTS)  # lambda_U
    loss_type: str = "kto"  # kto | apo_zero_unpaired (no KL estimate)
    precompute_ref_log_probs: bool = False
    # trl: TRL's fused LM head; chunked: the completion tokens' log-probs through hydratune's chunked LM head
    # (components/runtime/fused_head.py), the head's metrics at log steps only: a fifth of the head's memory,
    # not faster on a CPU (docs/speed.md), so not the default
    loss_impl: str = "trl"

    def trainer_args(self, max_length: int) -> dict[str, Any]:
        """KTOConfig's fields this recipe sets."""
        return {
            "beta": self.beta,
            "desirable_weight": self.desirable_weight,
            "undesirable_weight": self.undesirable_weight,
            "loss_type": self.loss_type,
            "precompute_ref_log_probs": self.precompute_ref_log_probs,
            "max_length": max_length,
        }

    def check(self, cfg: DictConfig, comps: Components) -> None:
        check_loss_impl(self.loss_impl)
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(
                f"unknown loss {self.loss_type!r}", key="recipe.loss_type", hint=f"one of {LOSS_TYPES}"
            )
        if self.loss_type == "kto" and cfg.train.micro_batch_size < 2:
            raise ConfigError(
                f"KTO's KL estimate pairs each completion with another row's prompt in the same micro-batch, "
                f"so it needs at least 2 rows per micro-batch (got {cfg.train.micro_batch_size})",
                key="train.micro_batch_size",
                hint="set train.micro_batch_size=2 or more, or recipe.loss_type=apo_zero_unpaired (no KL)",
            )

    def plan_lines(self, cfg: DictConfig, comps: Components) -> list[str]:
        return [head_plan_line("kto", self.loss_impl, comps, HEAD_METRICS)]

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from trl import KTOConfig, KTOTrainer

        from hydratune.components.runtime.fused_head import choose_head
        from hydratune.components.runtime.session import Session
        from hydratune.components.runtime.trainer_loop import TrainerLoop, training_pairs

        c = ctx.components
        session = Session.start(ctx)
        data = session.load_data()
        session.build_model()
        adapter_or_precomputed = c.peft.is_adapter or self.precompute_ref_log_probs
        reference = None if adapter_or_precomputed else session.frozen_reference()
        args = KTOConfig(**ctx.training_args(**self.trainer_args(c.data.max_length)))
        trainer_cls = choose_head(session, KTOTrainer, head_path(self.loss_impl, c), HEAD_METRICS)
        trainer = session.trainer(trainer_cls, args, data, ref_model=reference)
        # with log-probs precomputed and no reference kept, TRL cannot score new rows after training
        scorable = not (self.precompute_ref_log_probs and reference is None)
        probes = training_pairs(trainer, ctx.train.probe_pairs) if scorable else {}
        return session.run(TrainerLoop(session, trainer, probes))
