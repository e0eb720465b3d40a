"""Data files the tests write, and the bundled tiny model's assets."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "components" / "assets"
TINY = ASSETS / "tiny"  # the tiny model's tokenizer and config


def write_jsonl(path: Path, rows: list[dict[str, Any]], *, bom: bool = False, crlf: bool = False) -> str:
    """``rows`` as JSON lines (UTF-8, non-ASCII kept; a byte-order mark or CRLF ends if asked): the path."""
    text = ("\r\n" if crlf else "\n").join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return str(path)


def chat(question: str, answer: str = "4") -> dict[str, Any]:
    """A one-exchange conversation in the messages format."""
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


#: the special-token markers of chat templates (made single tokens of the tiny tokenizer)
MARKER = re.compile(
    r"<\|[^|<>\s]{1,40}\|>|<\uff5c[^\uff5c]{1,40}\uff5c>|</?[a-z_]{2,30}>|<[a-z_]+\|>|<\|[a-z_]+>|<[A-Z_]{3,}>"
)


def tiny_tokenizer_for(template: str) -> Any:
    """The bundled tiny BPE tokenizer knowing ``template``'s markers as single special tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY))
    tok.add_special_tokens(
        {
            "additional_special_tokens": sorted(set(MARKER.findall(template))),
            "bos_token": "<|bos|>",
            "eos_token": "<|endoftext|>",
        }
    )
    tok.chat_template = template
    return tok


def trained_text(tok: Any, ids: list[int], mask: list[int]) -> str:
    """The text of the tokens that carry loss."""
    return tok.decode([t for t, m in zip(ids, mask, strict=True) if m])


def multi_turn(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Conversations of 1-3 exchanges, a third with a system turn, some long enough to be truncated."""
    rng = random.Random(seed)
    words = ["one", "two", "add", "sum", "the", "is", "and", "numbers", "model", "task"]
    rows = []
    for _ in range(n):
        messages = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.3 else []
        for _ in range(rng.choice((1, 2, 3))):
            messages.append({"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(2, 30)))})
            messages.append(
                {"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(1, 20)))}
            )
        rows.append({"messages": messages})
    return rows


def tiny_export(out: Path, seed: int) -> Path:
    """A model dir as save_pretrained writes it (config.json, tokenizer, safetensors weights) of the tiny
    model, randomly initialised with ``seed``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(out)
    AutoTokenizer.from_pretrained(TINY).save_pretrained(out)
    return out
