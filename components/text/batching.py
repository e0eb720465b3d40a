"""Padding-free micro-batches: each micro-batch flattened into one row, documents kept apart by position ids.

Same examples and tokens per step as padded batches (so the same training), no pad tokens; the attention
of ``components/modeling/attention.py`` keeps each document to itself without a dense block mask.
"""

from __future__ import annotations

import copy
import functools
import logging
import re
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError

if TYPE_CHECKING:
    from hydratune.components.runtime.run import Components


def uses_padding_free(comps: Components) -> bool:
    """Padding-free micro-batches: ``data.padding_free`` without ``data.packing`` (packing decides then), and
    not under a strategy that splits each row's tokens (it needs ``[micro_batch, tokens]`` rows)."""
    chat = comps.data.kind == "chat" and comps.data.padding_free and not comps.data.packing
    return chat and not comps.strategy.model_split.splits_sequences


#: the summary's note on the batches of a sequence-split strategy
SPLIT_ROWS = (
    "right-padded [micro_batch, tokens] rows, tokens a multiple of strategy.sp_size, position ids "
    "restarting at each document: the engine splits every row's tokens over the sequence-parallel ranks "
    "(data.padding_free does not apply: it flattens a micro-batch into one row)"
)


def packs_padding_free(data: Any) -> bool:
    """A stream packed best-fit: its packed rows go through the padding-free collator (as TRL's do)."""
    return bool(getattr(data, "streaming", False) and data.packing and data.packing_strategy != "wrapped")


def collator_for(comps: Components, tokenizer: Any, model: Any, device: str) -> Any | None:
    """The SFT data collator the components ask for (None: TRL's own)."""
    split = comps.strategy.model_split
    if split.splits_sequences:
        return split_rows_collator(tokenizer, split.sp_size, equal_across_ranks=device == "cpu")
    if uses_padding_free(comps) or packs_padding_free(comps.data):  # a stream packed best-fit: as TRL's
        return padding_free_collator(tokenizer, model)
    return None


def split_rows_collator(tokenizer: Any, multiple: int, *, equal_across_ranks: bool) -> Any:
    """TRL's collator for rows whose tokens a sequence-parallel engine splits: right-padded to a multiple
    of ``multiple`` tokens (labels -100 on padding), with ``position_ids`` (restarting at each document of a
    packed row: the attention keeps documents apart by them, the engines drop the mask). With
    ``equal_across_ranks`` (gloo, whose all-gather takes equal shapes only) every rank's batch is padded to
    the longest of the step (a collective: the collator must run in the training process)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    pad = {"input_ids": tokenizer.pad_token_id, "labels": -100, "position_ids": 0, "attention_mask": 0}

    class SplitRows(DataCollatorForLanguageModeling):
        def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
            batch = super().torch_call(examples)
            return gloo_equal_length(batch, pad) if equal_across_ranks else batch

    return SplitRows(
        pad_token_id=tokenizer.pad_token_id, return_position_ids=True, pad_to_multiple_of=multiple
    )


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
    return dense_when_equal(DataCollatorForLanguageModeling)(
        pad_token_id=tokenizer.pad_token_id, padding_free=True
    )


@functools.cache
def dense_when_equal(base: type) -> type:
    """``base`` (TRL's collator) in padding-free mode, except that a micro-batch of rows all one length, each
    one document (fixed-length chunks: nothing to pad), is collated as the plain ``[rows, length]`` batch:
    the same tokens, labels and loss without the per-document attention a flattened row needs (on a CPU the
    tiny model's step took 30 ms flattened against TRL's 24 ms on such rows)."""

    class EqualRowsDense(base):  # type: ignore[misc, valid-type]
        def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
            one_length = len({len(e["input_ids"]) for e in examples}) == 1
            if self.padding_free and len(examples) > 1 and one_length and "seq_lengths" not in examples[0]:
                dense = copy.copy(self)
                dense.padding_free = False
                return base.torch_call(dense, examples)
            return super().torch_call(examples)

    return EqualRowsDense


def gloo_equal_length(batch: dict[str, Any], pad: dict[str, int]) -> dict[str, Any]:
    """Pad ``batch``'s ``[rows, tokens]`` tensors on the right to the longest batch of any rank (a MAX
    all-reduce over the world): DeepSpeed's Ulysses data loader all-gathers the SP group's batches, and
    gloo's all-gather takes equal shapes only (NCCL takes uneven ones). ``pad``: each key's padding value."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return batch
    length = torch.tensor([batch["input_ids"].shape[1]])
    dist.all_reduce(length, op=dist.ReduceOp.MAX)
    extra = int(length) - batch["input_ids"].shape[1]
    if extra:
        for key, value in pad.items():
            if key in batch:
                batch[key] = torch.nn.functional.pad(batch[key], (0, extra), value=value)
    return batch


def image_token_ids(processor: Any) -> set[int]:
    """The ids of a processor's image tokens: the placeholder each image expands to and the tokens around
    and between its tiles (Idefics3's ``<fake_token_around_image>``, ``<global-img>``, ``<row_i_col_j>``;
    Gemma's / Qwen's begin / end of image)."""
    tokenizer = processor.tokenizer
    names = (
        "image_token",
        "fake_image_token",
        "global_image_tag",
        "global_image_token",
        "boi_token",
        "eoi_token",
        "vision_start_token",
        "vision_end_token",
        "image_start_token",
        "image_end_token",
    )
    tokens = {getattr(processor, n) for n in names if isinstance(getattr(processor, n, None), str)}
    tokens |= {t for t in tokenizer.get_vocab() if re.fullmatch(r"<row_\d+_col_\d+>", t)}
    ids = {tokenizer.convert_tokens_to_ids(t) for t in tokens}
    if isinstance(getattr(processor, "image_token_id", None), int):
        ids.add(processor.image_token_id)
    # what an image expands into, as transformers marks it (Gemma 3's <image_soft_token>: not its image_token)
    ids |= {i for i in getattr(processor, "image_token_ids", None) or [] if isinstance(i, int)}
    return {i for i in ids if i is not None and i != tokenizer.unk_token_id}


class NoImageTokenLoss:
    """A collator of image rows (TRL's ``DataCollatorForVisionLanguageModeling``) whose labels never hold
    an image token: whatever the loss mask marks (the assistant's answer, or every token with
    ``recipe.assistant_only_loss=false``), an image's tokens are set to -100. ``enabled=False`` leaves the
    inner collator's labels as they are (the test's break-check).

    The rows with images go first in each batch: transformers 5.23's Idefics3 processor fails on a batch
    whose first row has no image and a later one has (``Unable to convert output
    'text_replacement_offsets'``); the order of a micro-batch's rows does not change its loss (a sum over
    its tokens)."""

    enabled: bool = True

    def __init__(self, inner: Any, ids: set[int]) -> None:
        self.inner, self.ids = inner, sorted(ids)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        examples = sorted(examples, key=lambda row: not row.get("images"))  # stable: images first
        batch = self.inner(examples)
        if self.enabled and "labels" in batch:
            image = torch.isin(batch["input_ids"], torch.tensor(self.ids, dtype=batch["input_ids"].dtype))
            batch["labels"] = batch["labels"].masked_fill(image, -100)
        return batch
