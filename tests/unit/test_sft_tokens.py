"""hydratune tokenizes SFT rows itself, a batch at a time (components/text/sft_tokens.py), and hands TRL the
tokens: TRL is the oracle. Every case compares, row by row, ``input_ids`` and ``labels`` (and packing's
``seq_lengths``) with what TRL 1.16's ``SFTTrainer._prepare_dataset`` made of the same rows on the path
hydratune took before (TRL's masks, or hydratune's turn-by-turn mask pretokenized, then TRL's labels,
truncation, dropping of untrained rows and packing)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.chats import ChatDataset
from hydratune.components.text.chat_template import (
    HYDRATUNE,
    choose_method,
    mask_conversations,
    resolve_chat_template,
)
from hydratune.components.text.sft_tokens import pack, plan_tokens, tokenize_batch
from tests.support.data import TINY, chat, multi_turn, write_jsonl
from tests.unit.test_tool_calling import tool_chat

DEMO = Path(__file__).resolve().parents[2] / "components" / "assets" / "demo"


def tokenizer(template: str | None = None) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY)
    if template:
        tok.chat_template = resolve_chat_template(template)[0]
    return tok


def rows_of(path: str, fmt: str = "auto") -> Any:
    return ChatDataset(path=path, format=fmt, eval_fraction=0.0).load()["train"]


def as_prompt_completion(dataset: Any) -> Any:
    """Rows of ``messages`` + ``completion_turns`` in TRL's conversational prompt/completion shape, as the
    previous recipes/sft.py handed them to TRL for ``completion_only_loss``."""

    def split(row: dict[str, Any]) -> dict[str, Any]:
        cut = len(row["messages"]) - row["completion_turns"]
        return {"prompt": row["messages"][:cut], "completion": row["messages"][cut:]}

    drop = [c for c in ("messages", "answer", "completion_turns") if c in dataset.column_names]
    return dataset.map(split, remove_columns=drop)


def trl_prepared(rows: Any, tok: Any, knobs: dict[str, Any]) -> Any:
    """What SFTTrainer prepared from ``rows`` before hydratune tokenized them (the previous recipes/sft.py:
    TRL's masks, or hydratune's turn-by-turn mask as pretokenized ``assistant_masks``). ``knobs``:
    assistant_only, completion_only, max_length and packing."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    max_length, packing = knobs["max_length"], knobs.get("packing", False)
    assistant = knobs["assistant_only"] and "messages" in rows.column_names
    completion = knobs["completion_only"] and "completion_turns" in rows.column_names
    trl_masks = False
    if assistant and choose_method(tok)[0] == HYDRATUNE:
        messages, tools = rows["messages"], rows["tools"] if "tools" in rows.column_names else None
        firsts = None
        if completion:
            firsts = [len(m) - c for m, c in zip(messages, rows["completion_turns"], strict=True)]
        masked = mask_conversations(
            tok,
            messages,
            tools=[json.loads(t) if t else None for t in tools] if tools else None,
            firsts=firsts,
        )
        rows = Dataset.from_dict(
            {
                "input_ids": [m.input_ids for m in masked],
                "assistant_masks": [m.assistant_masks for m in masked],
            }
        )
    elif assistant:
        trl_masks = True
    if completion and (trl_masks or not assistant):
        rows = as_prompt_completion(rows)
    args = SFTConfig(
        output_dir="unused",
        assistant_only_loss=trl_masks,
        completion_only_loss=completion,
        max_length=max_length,
        packing=packing,
        dataset_text_field="text",
        report_to="none",
        use_cpu=True,
    )
    patched = trl_masks and not has_generation_markers(tok.chat_template)
    trainer = SimpleNamespace(
        _tokenizer=tok,
        completion_only_loss=completion,
        chat_template=get_training_chat_template(tok) if patched else None,
    )
    return SFTTrainer._prepare_dataset(trainer, rows, tok, args, packing, None, "train")


def ours(rows: Any, tok: Any, knobs: dict[str, Any]) -> Any:
    """hydratune's tokens of ``rows`` (``knobs`` as ``trl_prepared``'s)."""
    from datasets import Dataset

    plan = plan_tokens(rows.column_names, tok, label="test", **knobs)
    out = Dataset.from_dict(tokenize_batch(plan, tok, rows[:], where="train", first=0))
    return pack(out, plan) if plan.packing else out


def assert_same(mine: Any, theirs: Any) -> None:
    assert len(mine) == len(theirs) > 0
    for column in (
        "input_ids",
        "labels",
        *(("seq_lengths",) if "seq_lengths" in theirs.column_names else ()),
    ):
        for i, (a, b) in enumerate(zip(mine[column], theirs[column], strict=True)):
            assert list(a) == list(b), f"{column} of row {i} differs"


CASES = {
    # name: (rows, template, assistant_only, completion_only, max_length)
    "markers, assistant-only": ("multi", None, True, False, 64),
    "markers, every token": ("multi", None, False, False, 64),
    "markers, truncated to 12 (rows left untrained dropped)": ("multi", None, True, False, 12),
    "alpaca, assistant-only completion": ("alpaca", None, True, True, 64),
    "alpaca, completion only": ("alpaca", None, False, True, 64),
    "prompt_completion, completion only": ("prompt_completion", None, True, True, 64),
    "text": ("text", None, True, True, 16),
    "chatml: hydratune's mask": ("multi", "chatml", True, False, 48),
    "chatml: hydratune's mask of the completion": ("alpaca", "chatml", True, True, 64),
    "qwen2_5 patched by TRL, tool calls and schemas": ("tools", "qwen2_5", True, False, 256),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sft_tokens")
    tools = [
        tool_chat(city) if i % 2 else chat(f"Q{i}?", f"A{i}.") for i, city in enumerate(["Paris", "Rome"] * 6)
    ]
    return {
        "multi": write_jsonl(root / "multi.jsonl", multi_turn(60)),
        "alpaca": str(DEMO / "alpaca.jsonl"),
        "prompt_completion": str(DEMO / "prompt_completion.jsonl"),
        "text": str(DEMO / "text.jsonl"),
        "tools": write_jsonl(root / "tools.jsonl", tools),
    }


@pytest.mark.parametrize("case", list(CASES))
def test_tokens_are_trls(case: str, files: dict[str, str]) -> None:
    source, template, assistant_only, completion_only, max_length = CASES[case]
    rows = rows_of(files[source])
    rows = rows.select(range(min(len(rows), 80)))
    tok = tokenizer(template)
    knobs = {"assistant_only": assistant_only, "completion_only": completion_only, "max_length": max_length}
    mine, theirs = ours(rows, tok, knobs), trl_prepared(rows, tok, knobs)
    assert_same(mine, theirs)
    if "truncated" in case:
        assert len(theirs) < len(rows)  # the case does drop rows


def test_packed_tokens_are_trls(files: dict[str, str]) -> None:
    rows, tok = rows_of(files["multi"]), tokenizer()
    knobs = {"assistant_only": True, "completion_only": False, "max_length": 96, "packing": True}
    mine, theirs = ours(rows, tok, knobs), trl_prepared(rows, tok, knobs)
    assert_same(mine, theirs)
    assert len(mine) < len(rows)  # rows were packed together


def test_a_row_the_template_cannot_render_is_named(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "bad.jsonl", [chat("a", "b"), {"messages": [{"role": "assistant", "content": "x"}]}]
    )
    rows, tok = rows_of(path), tokenizer("gemma3")  # gemma3 requires user/assistant alternation from a user
    plan = plan_tokens(
        rows.column_names, tok, assistant_only=True, completion_only=False, label="gemma3", max_length=64
    )
    with pytest.raises(ConfigError, match=r"eval row 11: the chat template \(gemma3\) cannot render") as err:
        tokenize_batch(plan, tok, rows[:], where="eval", first=10)
    assert err.value.key == "model.chat_template"


def test_packing_an_empty_split_gives_an_empty_packed_split() -> None:
    """``data.packing=true`` with no eval rows (``data.eval_fraction=0``): TRL's pack_dataset raises on an
    empty dataset (a missing ``seq_lengths`` column), which stopped such a run while preparing its data."""
    from types import SimpleNamespace

    from datasets import Dataset

    from hydratune.components.text.sft_tokens import pack

    plan = SimpleNamespace(max_length=8, packing_strategy="bfd")
    ids = [[1, 2, 3], [4, 5]]
    rows = Dataset.from_dict({"input_ids": ids, "labels": ids, "extra": [0, 1]})
    packed = pack(rows, plan)
    assert packed["input_ids"] == [[1, 2, 3, 4, 5]] and packed["seq_lengths"] == [[3, 2]]
    empty = pack(rows.select([]), plan)
    assert len(empty) == 0 and set(empty.column_names) == {"input_ids", "labels", "seq_lengths"}
