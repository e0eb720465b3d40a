"""SFT's data as its trainer reads it, prepared before the model loads and cached with the rows: every split
tokenized a batch at a time by the preparation's worker processes (``components/text/sft_tokens.py``: the
``input_ids`` and ``labels`` TRL's SFTTrainer would make of the rows), packed by TRL's own packing when
``data.packing`` is on. The trainer gets them with ``skip_prepare_dataset``."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import asdict, dataclass, field
from typing import Any

from hydratune.components.distributed.workers import COUNTS_KEY, Workers
from hydratune.components.text.sft_tokens import TokenPlan, pack, plan_tokens, tokenize_batch


def token_features() -> Any:
    from datasets import Features, List, Value

    return Features({"input_ids": List(Value("int32")), "labels": List(Value("int32"))})


@dataclass(frozen=True)
class SFTTokens:
    """The knobs that decide SFT's tokens (the recipe's masks, the data's length and packing); ``model``
    names the chat template in errors."""

    assistant_only: bool
    completion_only: bool
    max_length: int
    packing: bool
    packing_strategy: str
    model: Any = field(default=None, compare=False)

    @property
    def accepts_images(self) -> bool:
        """Image rows are not tokenized here for a vision-language model: its processor tokenizes them as
        batches are made (TRL's vision collator; ``prepare_data`` then makes no tokens). Text rows are."""
        return bool(self.model is not None and getattr(self.model, "is_vision", False))

    def key(self) -> dict[str, Any]:
        """What the tokens depend on besides the rows and the tokenizer (the data cache's key)."""
        return {k: v for k, v in asdict(self).items() if k != "model"} | {"recipe": "sft"}

    def unpacked(self) -> SFTTokens:
        """These knobs without packing: rows cut at ``max_length`` (a stream's first rows and eval rows;
        the feed packs the stream itself)."""
        return dataclasses.replace(self, packing=False)

    def plan(self, columns: list[str], tokenizer: Any) -> TokenPlan:
        from hydratune.components.text.chat_template import label_for

        label = label_for(self.model, tokenizer) if self.model is not None else ""
        return plan_tokens(
            columns,
            tokenizer,
            assistant_only=self.assistant_only,
            completion_only=self.completion_only,
            label=label,
            max_length=self.max_length,
            packing=self.packing,
            packing_strategy=self.packing_strategy,
        )

    def prepare(self, splits: Any, tokenizer: Any, workers: Workers) -> tuple[dict[str, Any], dict[str, Any]]:
        """The tokens of every split, and the facts for the summary: the plan, and the rows that
        truncation left with no trained token (dropped, as TRL drops them)."""
        plan = self.plan(splits["train"].column_names, tokenizer)
        out, dropped, counts = {}, {}, {}
        for name, split in splits.items():
            tokenize = functools.partial(_tokenize, plan, tokenizer, name)
            found: dict[str, int] = {}
            tokens = workers.map_rows(
                split, tokenize, token_features(), f"tokenizing {name} rows", f"tokens-{name}", found
            )
            counts[name] = found
            if plan.packing:
                tokens = pack(tokens, plan)
            elif len(tokens) < len(split):
                dropped[name] = len(split) - len(tokens)
            out[name] = tokens
        return out, {"plan": asdict(plan), "dropped": dropped, "counts": counts}


def _tokenize(plan: TokenPlan, tokenizer: Any, where: str, batch: dict[str, list[Any]], first: int) -> Any:
    counts: dict[str, int] = {}
    out = tokenize_batch(plan, tokenizer, batch, where=where, first=first, counts=counts)
    return {**out, COUNTS_KEY: counts}


def token_plan(facts: dict[str, Any]) -> TokenPlan:
    """The plan a preparation recorded (``SFTTokens.prepare``'s facts)."""
    return TokenPlan(**facts["plan"])
