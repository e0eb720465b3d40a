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
from components.text.batching import SPLIT_ROWS, check_padding_free, collator_for
from components.text.masking import as_prompt_completion

LOSS_TYPES = ("nll", "dft")


@recipe
@dataclass(frozen=True)
class SFT(Recipe):
    """Supervised fine-tuning on TRL's SFTTrainer (chat, instruction, prompt/completion or text data)."""

    title: ClassVar[str] = "SFT"
    data_kinds: ClassVar[tuple[str, ...]] = ("chat",)
    splits_model: ClassVar[bool] = True
    trains_in_stages: ClassVar[bool] = True  # strategy=pipeline: loss_type=nll through the stages
    streams_data: ClassVar[bool] = True

    assistant_only_loss: bool = True  # conversational data: loss on assistant turns only
    # prompt/completion data (formats prompt_completion, alpaca): loss on the completion only, whatever
    # assistant_only_loss says (both on: the completion's assistant turns); no effect on messages data
    completion_only_loss: bool = True
    loss_type: str = "nll"  # nll | dft

    def check(self, cfg: DictConfig, comps: Components) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(
                f"unknown '{self.loss_type}'", key="recipe.loss_type", hint=f"one of {LOSS_TYPES}"
            )
        if comps.strategy.splits_layers and self.loss_type != "nll":
            raise ConfigError(
                f"loss_type={self.loss_type} is not computed by the pipeline stages (their loss is nll)",
                key="recipe.loss_type",
                hint="recipe.loss_type=nll, or another strategy",
            )
        check_padding_free(comps)

    def check_data(self, comps: Components, splits: Any, tokenizer: Any) -> None:
        """``mode=plan``: the assistant-only mask decided and checked on every row as training will (a
        template that cannot mask or render a row fails here too, naming it)."""
        from components.runtime.streaming import checkable
        from components.text.chat_template import check_splits, label_for

        if self.assistant_only_loss and "messages" in splits["train"].column_names:
            check_splits(tokenizer, checkable(splits), label_for(comps.model, tokenizer))

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from trl import SFTConfig, SFTTrainer

        from components.runtime.session import Session
        from components.runtime.streaming import sft_data_args

        c = ctx.components
        session = Session.start(ctx)
        data = session.load_data()
        columns = data["train"].column_names
        assistant_only = self.assistant_only_loss and "messages" in columns
        completion_only = self.completion_only_loss and "completion_turns" in columns
        masked = assistant_only or completion_only
        # TRL's {% generation %} masks, or hydratune's turn-by-turn mask for any other template (pre-tokenized
        # rows whose assistant_masks TRL folds into labels): decided, and failed if need be, before the model
        trl_masks = False
        if assistant_only:
            data, trl_masks = session.mask_assistant_turns(data, completion_only=completion_only)
        if completion_only and (trl_masks or not assistant_only):  # TRL masks the prompt
            data = {name: as_prompt_completion(split) for name, split in data.items()}
        model = session.build_model()
        session.evaluate_generations("before")
        extra: dict[str, Any] = {}
        # padding-free: one flattened row per micro-batch; a sequence split: padded rows the engine splits
        collator = collator_for(c, session.tokenizer, model, ctx.device)
        if collator is not None:
            extra["data_collator"] = collator
        if c.strategy.splits_sequences:
            session.report["data"]["batches"] = SPLIT_ROWS

        args = SFTConfig(
            **ctx.training_args(
                assistant_only_loss=trl_masks,
                completion_only_loss=completion_only,
                loss_type=self.loss_type,
                dataset_text_field="text",
                **sft_data_args(c.data),  # a stream: packed by hydratune's feed, resumed at its position
            )
        )
        trainer = session.trainer(SFTTrainer, args, data, **extra)
        session.check_loss_mask(trainer.train_dataset, masked=masked)
        return session.train_and_finish(trainer)
