"""Supervised fine-tuning on TRL's SFTTrainer.

tokenizer → data (checked, length policy) → model (+ PEFT) → trainer → train or resume → evaluate →
save → report. Everything but the trainer's own knobs comes from the shared components.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from components.errors import ConfigError
from components.registry import component
from components.run import Components, RunContext

LOSS_TYPES = ("nll", "dft")


@component("recipe")
@dataclass
class SFT:
    """Knobs of the SFT recipe; everything else comes from the other groups and ``train:``."""

    assistant_only_loss: bool = True  # conversational data: loss on assistant turns only
    completion_only_loss: bool = True  # prompt/completion data: loss on the completion only
    loss_type: str = "nll"  # nll | dft

    def check(self, cfg: DictConfig, comps: Components) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(
                f"unknown '{self.loss_type}'", key="recipe.loss_type", hint=f"one of {LOSS_TYPES}"
            )
        if not hasattr(comps.data, "prompts"):
            raise ConfigError(
                f"recipe=sft needs chat / instruction / text data, got {type(comps.data).__name__}",
                key="data",
                hint="use data=demo_sft or a ChatDataset option",
            )
        check_padding_free(comps)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from trl import SFTConfig, SFTTrainer

        from components.session import Session

        c = ctx.components
        session = Session.start(ctx)
        data = session.load_data()
        conversational = "messages" in data["train"].column_names
        masked = self.assistant_only_loss and conversational
        model = session.build_model()
        session.evaluate_generations(c.data.prompts("eval")[: ctx.train.eval_generations], "before")
        padding_free = uses_padding_free(c)
        extra: dict[str, Any] = {}
        if padding_free:
            # one flattened row per micro-batch, no pad token: counting every input token is exact (a
            # pad == EOS tokenizer would make "non_padding" skip the real EOS tokens)
            extra["data_collator"] = padding_free_collator(session.tokenizer, model)

        args = SFTConfig(
            **ctx.training_args(
                assistant_only_loss=masked,
                completion_only_loss=self.completion_only_loss,
                loss_type=self.loss_type,
                max_length=c.data.max_length,
                packing=c.data.packing,
                packing_strategy=c.data.packing_strategy,
                dataset_text_field="text",
                **({"include_num_input_tokens_seen": "all"} if padding_free else {}),
            )
        )
        trainer = session.trainer(SFTTrainer, args, data, **extra)
        session.check_loss_mask(trainer.train_dataset, masked=masked)
        return session.train_and_finish(trainer, title="SFT")


def uses_padding_free(comps: Components) -> bool:
    """Padding-free micro-batches: ``data.padding_free`` without ``data.packing`` (packing decides then)."""
    return bool(getattr(comps.data, "padding_free", False)) and not comps.data.packing


def check_padding_free(comps: Components) -> None:
    """Refuse padding-free batches where documents would see each other; warn where they are slow."""
    from components.peft import PromptLearning

    if not uses_padding_free(comps):
        return
    if isinstance(comps.peft, PromptLearning):
        raise ConfigError(
            f"padding-free batches with peft={type(comps.peft).__name__}: its virtual tokens are prepended "
            "once per row, so the examples flattened into that row would share them and attend to each other",
            key="data.padding_free",
            hint="set data.padding_free=false (or use peft=lora)",
        )
    if comps.model.attn_implementation in ("sdpa", "eager"):
        logging.getLogger("hydratune").warning(
            "data.padding_free=true with model.attn_implementation=%s: correct, but transformers builds a "
            "dense [tokens, tokens] block mask for every micro-batch (slower than padding); use "
            "model.attn_implementation=auto, or data.padding_free=false",
            comps.model.attn_implementation,
        )


def padding_free_collator(tokenizer: Any, model: Any) -> Any:
    """TRL's collator in padding-free mode: each micro-batch becomes one row with restarting
    ``position_ids`` (and ``cu_seq_lens``), no attention mask, no pad token.

    Passed explicitly because TRL 1.16 refuses ``SFTConfig(padding_free=True)`` with ``max_length``
    unless packing, while its dataset preparation truncates to ``max_length`` all the same: this keeps
    the truncation, so the examples and their tokens are exactly those of padded batches."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    # what SFTTrainer does for the collator it builds itself: the model agrees on the pad token
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id, padding_free=True)
