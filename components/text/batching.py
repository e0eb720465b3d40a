"""Padding-free micro-batches: each micro-batch flattened into one row, documents kept apart by position ids.

Same examples and tokens per step as padded batches (so the same training), no pad tokens; the attention
of ``components/modeling/attention.py`` keeps each document to itself without a dense block mask.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from components.config.errors import ConfigError

if TYPE_CHECKING:
    from components.runtime.run import Components


def uses_padding_free(comps: Components) -> bool:
    """Padding-free micro-batches: ``data.padding_free`` without ``data.packing`` (packing decides then)."""
    return comps.data.kind == "chat" and comps.data.padding_free and not comps.data.packing


def check_padding_free(comps: Components) -> None:
    """Refuse padding-free batches where documents would see each other; warn where they are slow."""
    if not uses_padding_free(comps):
        return
    if comps.peft.adds_virtual_tokens:
        raise ConfigError(
            f"padding-free batches with {type(comps.peft).__name__}: its virtual tokens are prepended "
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
