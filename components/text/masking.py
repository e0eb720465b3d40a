"""Loss-mask sanity: catch assistant-only masks that silently train on everything or nothing."""

from __future__ import annotations

from itertools import islice
from typing import Any

from hydratune.components.config.errors import ConfigError

IGNORE = -100
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
    "<|endoftext|>",
    "<turn|>",  # Gemma 4
    "<|END_OF_TURN_TOKEN|>",  # Cohere
    "<|eot|>",
    "<|return|>",  # GPT-OSS
    "<end_of_utterance>",  # Idefics3 / SmolVLM
)


def stop_token_ids(tokenizer: Any) -> set[int]:
    """EOS plus the end-of-turn tokens of common chat templates that the vocabulary holds."""
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def label_mask_stats(dataset: Any, stop_ids: set[int], limit: int = 256) -> dict[str, float]:
    """Over the first ``limit`` rows: the share of rows with no trained token, with every token
    trained, the overall trained fraction, and the share of rows whose trained tokens include EOS. A
    dataset without a length (a stream) gives its first ``limit`` rows."""
    rows = list(islice(dataset, limit)) if not hasattr(dataset, "__len__") else None
    n = len(rows) if rows is not None else min(limit, len(dataset))
    none = every = with_eos = 0
    trained = total = 0
    for row in rows if rows is not None else dataset.select(range(n)):
        ids = row["input_ids"]
        labels = row.get("labels")
        if labels is None:  # masks not yet folded into labels
            mask = row.get("assistant_masks") or row.get("completion_mask") or [1] * len(ids)
            labels = [t if m else IGNORE for t, m in zip(ids, mask, strict=True)]
        kept = [t for t in labels if t != IGNORE]
        none += not kept
        every += len(kept) == len(ids)
        with_eos += any(t in stop_ids for t in kept)
        trained += len(kept)
        total += len(ids)
    return {
        "rows": n,
        "rows_without_trained_tokens": none / max(n, 1),
        "rows_fully_trained": every / max(n, 1),
        "trained_token_fraction": trained / max(total, 1),
        "rows_with_eos_trained": with_eos / max(n, 1),
    }


def check_label_mask(stats: dict[str, float], *, masked: bool) -> None:
    """Fail loudly when a prompt-masked loss masks everything or nothing, or never learns to stop."""
    if stats["rows"] == 0:
        raise ConfigError("the training set is empty after tokenisation", key="data")
    if stats["rows_without_trained_tokens"] > 0:
        raise ConfigError(
            f"{stats['rows_without_trained_tokens']:.0%} of rows have no token in the loss: "
            "the chat template marks no assistant tokens (missing {% generation %} markers?) "
            "or truncation cut the answers off",
            key="recipe.assistant_only_loss",
            hint="raise data.max_length, fix the template (model.chat_template), or set "
            "recipe.assistant_only_loss=false",
        )
    if masked and stats["rows_fully_trained"] == 1.0:
        raise ConfigError(
            "assistant-only / completion-only loss is on, but every token of every row is in the loss: "
            "the mask is a no-op (the template's generation markers wrap the whole conversation?)",
            key="recipe.assistant_only_loss",
            hint="fix the chat template's {% generation %} markers, or set recipe.assistant_only_loss=false",
        )
    if stats["rows_with_eos_trained"] < 0.5:
        raise ConfigError(
            f"only {stats['rows_with_eos_trained']:.0%} of rows train the end-of-sequence token: the model "
            "would not learn to stop",
            key="model.chat_template",
            hint="make the template put the EOS / end-of-turn token inside the assistant's "
            "{% generation %} block, or raise data.max_length",
        )
