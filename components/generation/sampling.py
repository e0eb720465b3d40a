"""Batched generation: prompts sorted by length into batches (little padding), left-padded, greedy or
sampled, each completion returned with its token count and why it stopped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydratune.components.text.masking import stop_token_ids


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn; ``temperature=0`` is greedy decoding."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    num_return_sequences: int = 1

    def generate_kwargs(self) -> dict[str, Any]:
        if self.temperature == 0:
            return {"do_sample": False, "num_return_sequences": self.num_return_sequences}
        return {
            "do_sample": True,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k or None,
            "num_return_sequences": self.num_return_sequences,
        }


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: int
    finish_reason: str  # stop (an end-of-turn / EOS token) | length (max_new_tokens reached)
    ids: tuple[
        int, ...
    ] = ()  # the tokens (the stop token included): what a tool loop parses and goes on from


def length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices sorted longest first and cut into batches: similar lengths share a batch, and the
    batches are the same whatever the number of processes they are later dealt to."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def complete_images(
    model: Any, processor: Any, text: str, images: list[Any], sampling: Sampling, streamer: Any = None
) -> list[Completion]:
    """The completions of one rendered prompt with images: the model's ``processor`` expands each image
    placeholder of ``text`` to its image tokens and makes the pixels the model reads beside them."""
    import torch

    inputs = processor(text=[text], images=[list(images)], return_tensors="pt", add_special_tokens=False)
    ids = inputs.pop("input_ids")[0].tolist()
    inputs.pop("attention_mask", None)
    dtype = next(model.parameters()).dtype
    extra = {k: v.to(dtype) if torch.is_floating_point(v) else v for k, v in inputs.items()}
    [done] = complete(model, processor.tokenizer, [ids], sampling, streamer, extra=extra)
    return done


def complete(
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    sampling: Sampling,
    streamer: Any = None,
    extra: dict[str, Any] | None = None,
) -> list[list[Completion]]:
    """The completions of one batch of tokenized prompts (``num_return_sequences`` each), left-padded;
    ``streamer`` (a transformers streamer, one prompt) sees the tokens as they are generated; ``extra``:
    more model inputs (an image prompt's pixels, ``complete_images``)."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stops = sorted(stop_token_ids(tokenizer))
    width = max(len(ids) for ids in prompts)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts], device=device)
    # a mixture of experts trained with its load-balancing loss on: no router logits while generating (with
    # a KV cache they cover the new tokens only, and transformers' loss then fails against the whole mask)
    moe = hasattr(getattr(model, "config", None), "output_router_logits")
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=pad,
            eos_token_id=stops,
            streamer=streamer,
            **{k: v.to(device) for k, v in (extra or {}).items()},
            **({"output_router_logits": False} if moe else {}),
            **sampling.generate_kwargs(),
        )
    n = sampling.num_return_sequences
    results: list[list[Completion]] = [[] for _ in prompts]
    for row, ids in enumerate(out[:, width:].tolist()):
        ended = next((i for i, t in enumerate(ids) if t in stops), None)
        kept = ids if ended is None else ids[: ended + 1]
        text = tokenizer.decode(kept, skip_special_tokens=True)
        reason = "length" if ended is None else "stop"
        results[row // n].append(Completion(text, len(kept), reason, tuple(kept)))
    return results
