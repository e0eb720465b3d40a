"""Generation-based evaluation: greedy answers to eval prompts, scored by exact match."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def normalise(text: str) -> str:
    """Compare answers modulo surrounding white space and case."""
    return " ".join(text.strip().split()).lower()


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: list[list[dict[str, str]]],
    *,
    max_new_tokens: int = 32,
    batch_size: int = 16,
) -> list[str]:
    """Greedy completions of chat prompts, left-padded, stopping at EOS."""
    import torch

    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    outputs: list[str] = []
    try:
        for start in range(0, len(conversations), batch_size):
            texts = [
                tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
                for conv in conversations[start : start + batch_size]
            ]
            batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            with torch.no_grad():
                ids = model.generate(
                    **batch,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
            new = ids[:, batch["input_ids"].shape[1] :]
            outputs += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return outputs


def exact_match(predictions: list[str], answers: list[str]) -> float:
    """Fraction of predictions equal to their answer after ``normalise``."""
    if not answers:
        return 0.0
    hits = sum(normalise(p) == normalise(a) for p, a in zip(predictions, answers, strict=True))
    return hits / len(answers)


def evaluate_generations(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[tuple[list[dict[str, str]], str]],
    *,
    max_new_tokens: int = 32,
) -> dict[str, Any]:
    """Exact-match accuracy and the samples themselves (prompt, answer, prediction)."""
    conversations = [conv for conv, _ in prompts]
    answers = [ans for _, ans in prompts]
    preds = generate(model, tokenizer, conversations, max_new_tokens=max_new_tokens)
    samples = [
        {"prompt": conv[-1]["content"], "answer": ans, "prediction": pred}
        for conv, ans, pred in zip(conversations, answers, preds, strict=True)
    ]
    return {"exact_match": exact_match(preds, answers), "samples": samples}
