"""Supervised fine-tuning on TRL's SFTTrainer.

tokenizer → data (checked, length policy) → assistant-only mask (TRL's, or hydratune's turn-by-turn one for
templates without {% generation %} markers) → model (+ PEFT) → trainer → train or resume → evaluate →
save → report. Everything but the trainer's own knobs comes from the shared components.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import DictConfig

from components.config.errors import ConfigError
from components.recipe import Recipe, recipe
from components.runtime.run import Components, RunContext
from components.text.batching import check_padding_free, padding_free_collator, uses_padding_free

LOSS_TYPES = ("nll", "dft")


@recipe
@dataclass(frozen=True)
class SFT(Recipe):
    """Supervised fine-tuning on TRL's SFTTrainer (chat, instruction, prompt/completion or text data)."""

    title: ClassVar[str] = "SFT"
    data_kinds: ClassVar[tuple[str, ...]] = ("chat",)

    assistant_only_loss: bool = True  # conversational data: loss on assistant turns only
    completion_only_loss: bool = True  # prompt/completion data: loss on the completion only
    loss_type: str = "nll"  # nll | dft

    def check(self, cfg: DictConfig, comps: Components) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(
                f"unknown '{self.loss_type}'", key="recipe.loss_type", hint=f"one of {LOSS_TYPES}"
            )
        check_padding_free(comps)

    def check_data(self, comps: Components, splits: Any, tokenizer: Any) -> None:
        """``mode=plan``: the assistant-only mask decided and checked on every row as training will (a
        template that cannot mask or render a row fails here too, naming it)."""
        from components.text.chat_template import check_splits, label_for

        if self.assistant_only_loss and "messages" in splits["train"].column_names:
            check_splits(tokenizer, splits, label_for(comps.model, tokenizer))

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from trl import SFTConfig, SFTTrainer

        from components.runtime.session import Session

        c = ctx.components
        session = Session.start(ctx)
        data = session.load_data()
        conversational = "messages" in data["train"].column_names
        masked = self.assistant_only_loss and conversational
        # TRL's {% generation %} masks, or hydratune's turn-by-turn mask for any other template (pre-tokenized
        # rows whose assistant_masks TRL folds into labels): decided, and failed if need be, before the model
        data, trl_masks = session.mask_assistant_turns(data) if masked else (data, False)
        model = session.build_model()
        session.evaluate_generations("before")
        extra: dict[str, Any] = {}
        if uses_padding_free(
            c
        ):  # one flattened row per micro-batch; components/runtime/trainer_hooks.py counts all its tokens
            extra["data_collator"] = padding_free_collator(session.tokenizer, model)

        args = SFTConfig(
            **ctx.training_args(
                assistant_only_loss=trl_masks,
                completion_only_loss=self.completion_only_loss,
                loss_type=self.loss_type,
                max_length=c.data.max_length,
                packing=c.data.packing,
                packing_strategy=c.data.packing_strategy,
                dataset_text_field="text",
            )
        )
        trainer = session.trainer(SFTTrainer, args, data, **extra)
        session.check_loss_mask(trainer.train_dataset, masked=masked)
        return session.train_and_finish(trainer)
