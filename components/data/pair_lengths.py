"""What ``data.max_length`` does to preference rows (reward, DPO, ORPO, SimPO, KTO), measured before the model
loads: every prompt and prompt + response tokenized as the trainers tokenize them (the chat template with the
generation prompt for the prompt alone, the whole conversation for prompt + response, the row's tools), and
counted per split: the rows the trainer cuts and the tokens it cuts, the rows whose prompt alone fills the
limit (nothing left to train: TRL's DPOTrainer drops them without a word, its CPO / KTO trainers would train
an empty response) and, for the reward trainer, the pairs it drops because a side is longer than the limit.
A split that the limit would leave without a row to train is refused before load, naming the fix."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed.workers import SHARD_ROWS, Workers, ranges

#: what a trainer does with a row past data.max_length: ``truncate`` (prompt + response cut at the limit,
#: the start kept: DPO, ORPO, SimPO, KTO) or ``drop`` (the pair left out: the reward trainer)
OVERLONG = ("truncate", "drop")
RESPONSES = ("chosen", "rejected", "completion")
COUNTS = ("rows", "over", "tokens_cut", "prompt_fills", "longest")


@dataclass(frozen=True)
class PairLengths:
    """``recipe.tokens()`` of the preference recipes: no tokens are made here (the trainer tokenizes), the
    lengths are measured and counted (``prepare``'s facts) and checked (:func:`check_pairs`)."""

    max_length: int
    overlong: str = "truncate"

    def key(self) -> dict[str, Any]:
        """What the counts depend on besides the rows and the tokenizer (the data cache's key)."""
        return asdict(self) | {"recipe": "pairs"}

    def prepare(self, splits: Any, tokenizer: Any, workers: Workers) -> tuple[dict[str, Any], dict[str, Any]]:
        """No token splits; the facts: ``{"pairs": {split: counts}, "max_length", "overlong"}``."""
        counts = {}
        for name, split in splits.items():
            spans = ranges(len(split), 4 * workers.num_proc)
            tasks = [functools.partial(_measure, split, tokenizer, self.max_length, span) for span in spans]
            parts = workers.run(tasks, f"measuring {name} rows", len(split)) if len(split) else []
            counts[name] = _sum(parts)
        return {}, {"pairs": counts, "max_length": self.max_length, "overlong": self.overlong}


def _sum(parts: list[dict[str, int]]) -> dict[str, int]:
    total = dict.fromkeys(COUNTS, 0)
    for part in parts:
        for k, v in part.items():
            total[k] = max(total[k], v) if k == "longest" else total[k] + v
    return total


def _measure(
    table: Any, tokenizer: Any, limit: int, span: tuple[int, int], tick: Callable[[int], None]
) -> dict[str, int]:
    """One task of :meth:`PairLengths.prepare`: the counts of rows ``span``."""
    found = dict.fromkeys(COUNTS, 0)
    for a in range(span[0], span[1], SHARD_ROWS):
        batch = table[a : min(a + SHARD_ROWS, span[1])]
        for prompt, responses in row_lengths(tokenizer, batch):
            longest = max(responses)
            found["rows"] += 1
            found["longest"] = max(found["longest"], longest)
            found["over"] += longest > limit
            found["tokens_cut"] += sum(max(0, n - limit) for n in responses)
            found["prompt_fills"] += prompt >= limit
        tick(len(batch["prompt"]))
    return found


def row_lengths(tokenizer: Any, batch: dict[str, list[Any]]) -> list[tuple[int, list[int]]]:
    """Per row: the prompt's tokens (with the generation prompt) and each prompt + response's tokens, as
    TRL's preference trainers render them (message lists through the chat template, with the row's
    tools)."""
    responses = [c for c in RESPONSES if c in batch]
    tools = batch.get("tools") or [None] * len(batch["prompt"])
    out = []
    for i, prompt in enumerate(batch["prompt"]):
        kwargs = {"tools": json.loads(tools[i]) if isinstance(tools[i], str) else tools[i]}
        prompt_ids = _ids(tokenizer, prompt, add_generation_prompt=True, **kwargs)
        whole = [_ids(tokenizer, prompt + batch[c][i], **kwargs) for c in responses]
        out.append((len(prompt_ids), [len(ids) for ids in whole]))
    return out


def _ids(tokenizer: Any, messages: Any, **kwargs: Any) -> list[int]:
    if isinstance(messages, str):  # text rows (the canonical rows are message lists; kept for safety)
        return tokenizer(messages)["input_ids"]
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def pair_notes(facts: dict[str, Any]) -> dict[str, str]:
    """One line per split: the rows past data.max_length, what the trainer does with them and the tokens cut,
    and the rows whose prompt alone fills the limit."""
    limit, overlong, notes = facts["max_length"], facts["overlong"], {}
    for name, c in facts["pairs"].items():
        rows = f"{c['rows']:,} row{'' if c['rows'] == 1 else 's'}, the longest {c['longest']:,} tokens"
        if overlong == "drop":
            done = f"{c['over']:,} longer than the limit, dropped by the trainer"
            done += f" ({c['tokens_cut']:,} tokens over)"
        else:
            done = f"{c['over']:,} truncated ({c['tokens_cut']:,} tokens cut)"
        notes[f"length ({name}, data.max_length={limit})"] = (
            f"{rows}; {done}; {c['prompt_fills']:,} whose prompt alone fills the limit (nothing to train)"
        )
    return notes


def check_pairs(facts: dict[str, Any], rows: dict[str, int]) -> None:
    """Before the model loads: a split with rows of which none is left to train within data.max_length is
    refused (the trainer would stop on an empty dataset after the load, or train empty responses)."""
    limit = facts["max_length"]
    for name, c in facts["pairs"].items():
        if not rows.get(name) or not c["rows"]:
            continue
        lost = c["over"] if facts["overlong"] == "drop" else c["prompt_fills"]
        if lost == c["rows"]:
            why = "has a side longer than" if facts["overlong"] == "drop" else "has a prompt that alone fills"
            raise ConfigError(
                f"no {name} row is left to train within data.max_length={limit}: each of its {c['rows']:,} "
                f"rows {why} the limit (the longest row has {c['longest']:,} tokens)",
                key="data.max_length",
                hint=f"raise data.max_length (e.g. data.max_length={-(-c['longest'] // 256) * 256}), or "
                "shorten the prompts",
            )
