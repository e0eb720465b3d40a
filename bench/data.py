"""Deterministic synthetic data for the throughput harness, built from single-token words of the tiny
tokenizer so every row's token count is exactly what was drawn.

Regimes (each written as jsonl for hydratune and TRL, and as token lists for the raw loop):

* ``packed``: ``{"text": ...}`` rows of ``seq_len - 1`` tokens, exactly ``seq_len`` with the EOS every
  trainer appends (no padding anywhere).
* ``variable``: chat rows ``{"messages": [user, assistant]}`` whose chat-template length is drawn from a
  log-normal distribution (median ``median``, clipped to ``[min_len, max_len]``): the padding-waste case.
* ``pairs``: preference rows ``{"prompt", "chosen", "rejected"}`` with prompt + completion lengths from
  the same distribution (prompt 2/3, completion 1/3).

    python bench/data.py --out /tmp/bench_data --regime variable --rows 2000 --median 300 --max 2048
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from functools import cache
from pathlib import Path
from typing import Any

from common import TINY

#: the length distributions of the two modes
GPU_LENGTHS = {"median": 300, "max_len": 2048, "min_len": 16, "sigma": 1.0}
CPU_LENGTHS = {"median": 30, "max_len": 128, "min_len": 16, "sigma": 0.9}


#: the tokenizer the rows are built for: the tiny model's, or a real model's (``use_tokenizer``)
TOKENIZER_DIR: list[Path] = [TINY]


def use_tokenizer(path: str | Path) -> None:
    """Build the rows for the tokenizer in ``path`` (``--real`` mode) instead of the tiny one."""
    TOKENIZER_DIR[0] = Path(path)
    for cached in (tokenizer, words, chat_overhead):
        cached.cache_clear()


@cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER_DIR[0])


@cache
def words() -> tuple[str, ...]:
    """Alphabetic words (with their leading space) that the tokenizer encodes as one token each."""
    tok = tokenizer()
    found = []
    for piece, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
        if piece.startswith("Ġ") and piece[1:].isalpha() and len(piece) > 2:
            word = " " + piece[1:]
            if len(tok(word, add_special_tokens=False)["input_ids"]) == 1:
                found.append(word)
    if len(found) < 20:
        raise RuntimeError(f"only {len(found)} single-token words in the tiny tokenizer")
    return tuple(found)


def text_of(n: int, rng: random.Random) -> str:
    """``n`` tokens' worth of words, each with its leading space (so none merges with what precedes it)."""
    pool = words()
    return "".join(rng.choice(pool) for _ in range(n))


def sample_lengths(
    n: int, median: int, max_len: int, min_len: int = 16, sigma: float = 1.0, seed: int = 0
) -> list[int]:
    """``n`` long-tailed lengths: log-normal with the given median, clipped to ``[min_len, max_len]``
    (clipping above and below the median leaves the median where it is)."""
    rng = random.Random(seed)
    mu = math.log(median)
    return [min(max_len, max(min_len, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def chat_length(messages: list[dict[str, str]]) -> int:
    return len(as_ids(tokenizer().apply_chat_template(messages, tokenize=True)))


@cache
def chat_overhead() -> int:
    """Template tokens of a user + assistant exchange (role headers, end markers, newlines)."""
    one = words()[0]
    return chat_length([{"role": "user", "content": one}, {"role": "assistant", "content": one}]) - 2


def chat_row(length: int, rng: random.Random) -> dict[str, Any]:
    """A user / assistant exchange of exactly ``length`` tokens under the tiny chat template."""
    content = max(2, length - chat_overhead())
    assistant = max(1, content // 3)
    user = content - assistant
    return {
        "messages": [
            {"role": "user", "content": text_of(user, rng)},
            {"role": "assistant", "content": text_of(assistant, rng)},
        ]
    }


def make(regime: str, out_dir: str | Path, rows: int, seq_len: int, lengths: dict[str, Any], seed: int = 0):
    """Write ``<regime>.jsonl`` (hydratune / TRL) and ``<regime>.tokens.jsonl`` (raw loop) under
    ``out_dir``; returns (jsonl path, tokens path, the drawn lengths)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 1)
    tok = tokenizer()
    records, token_rows = [], []
    if regime == "packed":
        drawn = [seq_len] * rows
        for _ in range(rows):  # seq_len - 1 words + the EOS that hydratune and TRL append to text rows
            text = text_of(seq_len - 1, rng)
            records.append({"text": text})
            token_rows.append(
                {"input_ids": tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]}
            )
    elif regime == "variable":
        drawn = sample_lengths(rows, seed=seed, **lengths)
        for length in drawn:
            row = chat_row(length, rng)
            records.append(row)
            token_rows.append({"input_ids": as_ids(tok.apply_chat_template(row["messages"], tokenize=True))})
    elif regime in ("pairs", "chat_pairs"):
        drawn = sample_lengths(rows, seed=seed, **lengths)
        for length in drawn:
            completion = max(1, length // 3)
            prompt, chosen, rejected = (
                text_of(n, rng) for n in (length - completion, completion, completion)
            )
            if regime == "pairs":
                records.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
                enc = [tok(t, add_special_tokens=False)["input_ids"] for t in (prompt, chosen, rejected)]
                token_rows.append({"prompt": enc[0], "chosen": enc[1], "rejected": enc[2]})
                continue
            # conversational (a chat model's data: every trainer applies its template), the raw loop's
            # tokens the template's: the prompt with the assistant header, each answer with its end marker
            user = [{"role": "user", "content": prompt}]
            records.append(
                {
                    "prompt": user,
                    "chosen": [{"role": "assistant", "content": chosen}],
                    "rejected": [{"role": "assistant", "content": rejected}],
                }
            )
            head = as_ids(tok.apply_chat_template(user, add_generation_prompt=True, tokenize=True))
            answers = []
            for text in (chosen, rejected):
                whole = as_ids(
                    tok.apply_chat_template([*user, {"role": "assistant", "content": text}], tokenize=True)
                )
                answers.append(whole[len(head) :])
            token_rows.append({"prompt": head, "chosen": answers[0], "rejected": answers[1]})
    else:
        raise ValueError(f"unknown regime {regime!r}")
    path, tokens = out / f"{regime}.jsonl", out / f"{regime}.tokens.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    tokens.write_text("".join(json.dumps(r) + "\n" for r in token_rows))
    return path, tokens, drawn


def as_ids(encoded: Any) -> list[int]:
    """``apply_chat_template(tokenize=True)``'s ids (a list, or a mapping holding them)."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def describe(lengths: list[int]) -> dict[str, float]:
    return {
        "rows": len(lengths),
        "median": statistics.median(lengths),
        "mean": round(statistics.fmean(lengths), 1),
        "max": max(lengths),
        "p90": sorted(lengths)[int(0.9 * (len(lengths) - 1))],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--regime", choices=["packed", "variable", "pairs"], default="variable")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--median", type=int, default=300)
    parser.add_argument("--max", type=int, default=2048)
    args = parser.parse_args()
    lens = {**GPU_LENGTHS, "median": args.median, "max_len": args.max}
    *_, drawn = make(args.regime, args.out, args.rows, args.seq_len, lens)
    print(json.dumps(describe(drawn)))
