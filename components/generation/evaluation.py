"""Generation-based evaluation: greedy answers to eval prompts, scored by exact match.

Eval prompts are tokenized once, before the model loads (``eval_prompts``), with the same length policy
as the training rows, so one overlong eval row cannot allocate a 100k-token generation later.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Pair = tuple[list[dict[str, str]], str]  # (conversation up to the answer, reference answer)


@dataclass(frozen=True)
class EvalPrompt:
    """One eval prompt, rendered with the generation prompt and tokenized; ``truncated`` when its start
    was cut to fit the length limit."""

    ids: list[int]
    answer: str
    question: str  # the last turn's text, shown in generations.jsonl
    truncated: bool = False
    conversation: list[dict[str, str]] | None = None  # the turns the prompt was rendered from
    #: an image row's images (PIL, in placeholder order): the processor expands them at generation time
    images: list[Any] | None = None
    text: str = ""  # the rendered prompt (what the processor reads, with its image placeholders)


def normalise(text: str) -> str:
    """Compare answers modulo surrounding white space and case."""
    return " ".join(text.strip().split()).lower()


def eval_pairs(data_component: Any, splits: Any, limit: int | None = None) -> list[Pair]:
    """(conversation, answer) per eval row (the first ``limit``: the data component's ``pairs``); ``[]``
    when the eval rows have no prompt to complete or no reference answer."""
    pairs = data_component.pairs(splits, "eval", limit) or []
    return [] if any(answer is None for _, answer in pairs) else pairs


def eval_prompts(
    pairs: list[Pair],
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int,
    on_overlong: str = "truncate",
    key: str = "data.max_length",
    images: list[list[Any]] | None = None,
    template: dict[str, Any] | None = None,
) -> tuple[list[EvalPrompt], dict[str, int]]:
    """Tokenize ``pairs`` with the chat template's generation prompt and apply ``on_overlong`` to prompts
    longer than ``max_length`` tokens: ``truncate`` keeps their last ``max_length`` tokens (the question
    and the generation prompt, as PPO's rollouts do), ``drop`` leaves them out, ``error`` names the first.
    Returns the prompts and the counts of what was cut or dropped (for the summary). ``images`` (one list
    per pair): an image row's prompt keeps its images and is never cut (a cut could split an image's
    tokens; the processor expands them at generation time). ``template``: more keywords for
    ``apply_chat_template`` (a tool loop's: the tools' schemas)."""
    out: list[EvalPrompt] = []
    counts: dict[str, int] = {}
    for i, (conversation, answer) in enumerate(pairs):
        text = tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True, **(template or {})
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        question = conversation[-1]["content"] if conversation else ""
        if images is not None and images[i]:
            question = question if isinstance(question, str) else _text_of(question)
            out.append(EvalPrompt(ids, answer, question, False, conversation, list(images[i]), text))
            continue
        if len(ids) <= max_length:
            out.append(EvalPrompt(ids, answer, question, conversation=conversation))
            continue
        if on_overlong == "error":
            raise ConfigError(
                f"eval prompt {i} has {len(ids)} tokens > {key}={max_length}",
                key=key,
                hint=f"raise {key}, or set data.on_overlong=truncate or drop",
            )
        reason = "eval prompts dropped (too long)" if on_overlong == "drop" else "eval prompts truncated"
        counts[reason] = counts.get(reason, 0) + 1
        if on_overlong != "drop":
            out.append(EvalPrompt(ids[-max_length:], answer, question, True, conversation))
    return out, counts


def _text_of(content: Any) -> str:
    """A list of content parts as text (an image part as ``<image>``), for generations.jsonl."""
    return "".join(p.get("text") or "" if p.get("type") == "text" else "<image>" for p in content)


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    *,
    max_new_tokens: int = 32,
    batch_size: int = 16,
) -> list[str]:
    """Greedy completions of tokenized prompts, left-padded, stopping at EOS or an end-of-turn token."""
    from hydratune.components.generation.sampling import Sampling, complete

    greedy = Sampling(max_new_tokens=max_new_tokens)
    outputs: list[str] = []
    with eval_mode(model):
        for start in range(0, len(prompts), batch_size):
            batch = complete(model, tokenizer, prompts[start : start + batch_size], greedy)
            outputs += [done.text for [done] in batch]
    return outputs


@contextlib.contextmanager
def eval_mode(model: PreTrainedModel) -> Iterator[None]:
    """``model`` in eval mode inside the block, its train/eval mode as it was after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def generate_prompts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[EvalPrompt],
    *,
    max_new_tokens: int = 32,
    processor: Any = None,
) -> list[str]:
    """Greedy answers to ``prompts``: text prompts batched (``generate``), image prompts one at a time
    through the model's ``processor`` (its images expanded to their image tokens, with the pixels)."""
    from hydratune.components.generation.sampling import Sampling, complete_images

    texts = [i for i, p in enumerate(prompts) if not p.images]
    out: list[str] = [""] * len(prompts)
    found = generate(model, tokenizer, [prompts[i].ids for i in texts], max_new_tokens=max_new_tokens)
    for i, answer in zip(texts, found, strict=True):
        out[i] = answer
    pictured = [i for i, p in enumerate(prompts) if p.images]
    if pictured and processor is None:
        raise ValueError("image prompts need the model's processor")
    greedy = Sampling(max_new_tokens=max_new_tokens)
    with eval_mode(model):
        for i in pictured:
            [done] = complete_images(model, processor, prompts[i].text, prompts[i].images, greedy)
            out[i] = done.text
    return out


def exact_match(predictions: list[str], answers: list[str]) -> float:
    """Fraction of predictions equal to their answer after ``normalise``."""
    if not answers:
        return 0.0
    hits = sum(normalise(p) == normalise(a) for p, a in zip(predictions, answers, strict=True))
    return hits / len(answers)


def evaluate_generations(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[EvalPrompt],
    *,
    max_new_tokens: int = 32,
    processor: Any = None,
) -> dict[str, Any]:
    """Exact-match accuracy and the samples themselves (prompt, answer, prediction); image prompts through
    the model's ``processor``."""
    answers = [p.answer for p in prompts]
    preds = generate_prompts(model, tokenizer, prompts, max_new_tokens=max_new_tokens, processor=processor)
    samples = [
        {"prompt": p.question, "answer": p.answer, "prediction": pred}
        | ({"prompt_truncated": True} if p.truncated else {})
        | ({"images": len(p.images)} if p.images else {})
        for p, pred in zip(prompts, preds, strict=True)
    ]
    return {"exact_match": exact_match(preds, answers), "samples": samples}
