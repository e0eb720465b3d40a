"""Fewer device syncs per step: what HF's Trainer reads back from the GPU every step, read at log steps.

HF's Trainer gathers and ``.item()``s the token count of every micro-batch, which stalls the host until
the GPU has caught up. ``DeferredTokenCount`` keeps the running count on the device and reads it once per
logged record (and before a checkpoint saves the trainer state), so the host can queue the next steps.
"""

from __future__ import annotations

from typing import Any


class DeferredTokenCount:
    """Trainer mixin: ``num_input_tokens_seen`` summed on the device, gathered at log and save time only."""

    _pending_tokens: Any = None

    def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
        mode = self.args.include_num_input_tokens_seen  # type: ignore[attr-defined]
        if mode == "no" or "input_ids" not in inputs:
            return
        count = count_tokens(inputs, self.processing_class, non_padding=mode == "non_padding")  # type: ignore[attr-defined]
        self._pending_tokens = count if self._pending_tokens is None else self._pending_tokens + count

    def flush_token_count(self) -> None:
        """Add the tokens counted since the last flush, summed over ranks (a collective: every rank calls)."""
        if self._pending_tokens is None:
            return
        pending, self._pending_tokens = self._pending_tokens, None
        self.state.num_input_tokens_seen += int(self.accelerator.gather(pending).sum().item())  # type: ignore[attr-defined]

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        self.flush_token_count()
        super().log(logs, *args, **kwargs)  # type: ignore[misc]

    def _save_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        self.flush_token_count()
        return super()._save_checkpoint(*args, **kwargs)  # type: ignore[misc]


def count_tokens(inputs: dict[str, Any], tokenizer: Any, *, non_padding: bool) -> Any:
    """Tokens of a micro-batch as a 0-d int64 tensor on its device (no sync): the attention mask's ones;
    a padding-free row (position_ids, no mask) is all real tokens; else tokens that are not padding."""
    import torch

    ids = inputs["input_ids"]
    if not non_padding:
        return torch.tensor(ids.numel(), device=ids.device, dtype=torch.int64)
    if inputs.get("attention_mask") is not None:
        return inputs["attention_mask"].sum().to(torch.int64)
    pad = getattr(tokenizer, "pad_token_id", None)
    if "position_ids" in inputs or pad is None:  # padding-free batches carry no padding at all
        return torch.tensor(ids.numel(), device=ids.device, dtype=torch.int64)
    return (ids != pad).sum().to(torch.int64)
