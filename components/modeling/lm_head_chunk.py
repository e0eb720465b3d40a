"""How many positions the chunked LM head (components/runtime/lm_loss.py) projects at once: one fact, read
by the loss and by the memory estimate (no torch here)."""

#: logits held at once: ``chunk`` positions x the vocabulary, ~64 MiB in fp32 (341 positions at 49,152 words)
CHUNK_ELEMENTS = 1 << 24


def chunk_for(vocab: int) -> int:
    """Positions per chunk for a vocabulary of ``vocab`` words (at least 64)."""
    return max(64, CHUNK_ELEMENTS // max(1, vocab))
