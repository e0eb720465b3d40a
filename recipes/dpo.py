"""Direct preference optimisation on TRL's DPOTrainer.

The reference is the memory-cheap one: with a PEFT adapter, the policy with its adapter at its
initial value (no second copy of the base weights); otherwise a frozen copy of the policy (under ZeRO-3,
whose policy is partitioned as it loads, the model loaded again into its own sharded inference engine), or
reference log-probs computed once up front (``recipe.precompute_ref_log_probs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import FINITE, POSITIVE, Range, knob
from hydratune.components.head_path import check_loss_impl, head_path, head_plan_line
from hydratune.components.recipe import Recipe, recipe
from hydratune.components.runtime.run import Components, RunContext

LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
#: TRL's DPO metrics computed from the head's per-token statistics (at log steps only under the chunked head)
HEAD_METRICS = ("entropy", "logits/chosen", "logits/rejected", "mean_token_accuracy")


@recipe
@dataclass(frozen=True)
class DPO(Recipe):
    """DPO on TRL's DPOTrainer: the KL strength ``beta``, the loss (or a weighted mix of losses)."""

    title: ClassVar[str] = "DPO"
    image_rows: ClassVar[bool] = True  # image pairs: TRL's vision preference collator
    data_kinds: ClassVar[tuple[str, ...]] = ("preference",)

    beta: float = knob(0.1, POSITIVE, hint="typical: 0.01-0.5")
    loss_type: list[str] = field(default_factory=lambda: ["sigmoid"])
    loss_weights: list[float] | None = knob(None, FINITE)  # one per loss_type
    # cDPO / robust: the assumed share of flipped labels (TRL's DPOTrainer takes [0, 0.5))
    label_smoothing: float = knob(0.0, Range(0, 0.5, high_open=True))
    precompute_ref_log_probs: bool = False
    # trl: TRL's fused LM head; chunked: the completion tokens' log-probs through hydratune's chunked LM head
    # (components/runtime/fused_head.py), the head's metrics at log steps only: a fifth of the head's memory,
    # not faster on a CPU (docs/speed.md), so not the default
    loss_impl: str = "trl"

    def check(self, cfg: DictConfig, comps: Components) -> None:
        check_loss_impl(self.loss_impl)
        unknown = [t for t in self.loss_type if t not in LOSS_TYPES]
        if unknown:
            raise ConfigError(
                f"unknown loss {unknown[0]!r}", key="recipe.loss_type", hint=f"one of {LOSS_TYPES}"
            )
        if self.loss_weights is not None and len(self.loss_weights) != len(self.loss_type):
            raise ConfigError("one weight per loss_type", key="recipe.loss_weights")

    def plan_lines(self, cfg: DictConfig, comps: Components) -> list[str]:
        return [head_plan_line("dpo", self.loss_impl, comps, HEAD_METRICS)]

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from trl import DPOConfig, DPOTrainer

        from hydratune.components.runtime.fused_head import choose_head
        from hydratune.components.runtime.session import Session
        from hydratune.components.runtime.trainer_loop import TrainerLoop, training_pairs

        c = ctx.components
        session = Session.start(ctx)
        data = session.load_data()
        images = data.has_images  # image pairs: the processor tokenizes them batch by batch
        if images:
            self.check_image_pairs(session)
        session.build_model()
        adapter_or_precomputed = c.peft.is_adapter or self.precompute_ref_log_probs
        reference = None if adapter_or_precomputed else session.frozen_reference()
        args = DPOConfig(
            **ctx.training_args(
                beta=self.beta,
                loss_type=self.loss_type,
                loss_weights=self.loss_weights,
                label_smoothing=self.label_smoothing,
                precompute_ref_log_probs=self.precompute_ref_log_probs,
                max_length=None if images else c.data.max_length,
            )
        )
        extra = {"processing_class": session.processor} if images else {}
        trainer_cls = choose_head(session, DPOTrainer, head_path(self.loss_impl, c), HEAD_METRICS)
        trainer = session.trainer(trainer_cls, args, data, ref_model=reference, **extra)
        return session.run(TrainerLoop(session, trainer, training_pairs(trainer, ctx.train.probe_pairs)))

    def check_image_pairs(self, session: Any) -> None:
        """Image pairs (a vision-language model; its processor tokenizes them in TRL's vision collator),
        checked before the model loads: TRL 1.16 computes no reference log-probs ahead for them. The
        summary says that data.max_length does not cut them (an image's tokens would be cut)."""
        if self.precompute_ref_log_probs:
            raise ConfigError(
                "recipe.precompute_ref_log_probs=true with image pairs: TRL 1.16's DPOTrainer computes no "
                "reference log-probs ahead for vision datasets",
                key="recipe.precompute_ref_log_probs",
                hint="recipe.precompute_ref_log_probs=false (the reference scores each batch as it trains)",
            )
        session.report["data"]["tokens"] = (
            "image pairs, tokenized by the model's processor batch by batch (TRL's vision collator): each "
            "image expanded to its image tokens in the prompt, the loss on the chosen / rejected completions "
            "only; data.max_length does not cut them (an image's tokens or a completion would be cut)"
        )
