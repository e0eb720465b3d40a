"""What users bring, nothing dropped in silence: every column of the data is read or reported as ignored
(the summary's data section, ``mode=plan``); a column that marks another task (KTO's ``label``, ``tools``
without messages, ``score`` / ``rating``, preference pairs given to chat or prompt data) stops the run before
the model loads unless ``data.ignore_columns`` names it; ``recipe.completion_only_loss`` trains the
completion of prompt/completion rows; ``recipe=eval`` renders the whole conversation, system prompt
included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.preferences import PreferenceDataset
from hydratune.components.data.prompts import PromptDataset
from hydratune.components.data.source import Source

# TRL's unpaired preference format (KTO): a completion and whether it is good
KTO = [
    {"prompt": "What is 2 + 2?", "completion": "4", "label": True},
    {"prompt": "What is 2 + 3?", "completion": "7", "label": False},
    {"prompt": "What is 3 + 3?", "completion": "6", "label": True},
]
PAIR = {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"}
CHAT = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def refusal(data: Source) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        data.load()
    return err.value


def test_unpaired_feedback_stops_sft_until_the_label_is_ignored(tmp_path: Path) -> None:
    """KTO's {prompt, completion, label} loaded as SFT data trained the label=false completions too."""
    path = write(tmp_path / "kto.jsonl", KTO)
    err = refusal(ChatDataset(path=path, eval_fraction=0.0))
    assert err.key == "data.ignore_columns" and "'label'" in str(err)
    assert "recipe=kto" in err.hint and "data.ignore_columns=[label]" in err.hint

    loaded = ChatDataset(path=path, eval_fraction=0.0, ignore_columns=["label"]).load()
    assert len(loaded["train"]) == 3
    assert loaded.info["columns used"] == "prompt, completion"
    assert loaded.info["columns ignored"] == "label (data.ignore_columns)"


@pytest.mark.parametrize(
    ("cls", "rows", "column", "instead"),
    [
        (ChatDataset, [{"prompt": "2 + 2?", "completion": "4", "tools": TOOLS}] * 3, "tools", "messages"),
        (ChatDataset, [{"messages": CHAT, "score": 0.9}] * 3, "score", "recipe=reward"),
        (ChatDataset, [{"messages": CHAT, "rating": 4}] * 3, "rating", "recipe=reward"),
        (ChatDataset, [{"messages": CHAT, **PAIR}] * 3, "chosen", "recipe=dpo"),
        (PromptDataset, [PAIR] * 3, "chosen", "recipe=dpo"),
        (PromptDataset, KTO, "label", "recipe=kto"),
        (PromptDataset, [{"prompt": "2 + 2?", "answer": "4", "tools": TOOLS}] * 3, "tools", "messages"),
        (PreferenceDataset, [{**PAIR, "score": 1.0}] * 3, "score", "recipe=reward"),
        (PreferenceDataset, KTO, "label", "recipe=kto"),
    ],
)
def test_a_column_of_another_task_stops_every_data_kind(
    tmp_path: Path, cls: type[Source], rows: list[dict[str, Any]], column: str, instead: str
) -> None:
    path = write(tmp_path / "d.jsonl", rows)
    err = refusal(cls(path=path, eval_fraction=0.0))
    assert err.key == "data.ignore_columns" and f"'{column}'" in str(err), str(err)
    assert instead in err.hint and "data.ignore_columns=[" in err.hint and column in err.hint
    names = ["chosen", "rejected"] if column == "chosen" else [column]
    ignored = cls(path=path, eval_fraction=0.0, ignore_columns=names)
    if cls is PreferenceDataset and column == "label":  # no pair to fall back on: the next error says so
        assert "'chosen'" in str(refusal(ignored))
    else:
        ignored.load()  # the way out works


def test_tools_beside_messages_are_read_and_a_label_without_completion_is_only_reported(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "tools.jsonl", [{"messages": CHAT, "tools": TOOLS, "label": "math"}] * 3)
    loaded = ChatDataset(path=path, eval_fraction=0.0).load()
    assert loaded.info["columns used"] == "messages, tools"
    assert loaded.info["columns ignored"] == "label"


def test_every_column_is_reported_read_or_ignored(tmp_path: Path) -> None:
    """Mapped columns are named as the file names them; a column a mapping replaces, the prompt column of
    implicit pairs and unknown columns are listed as ignored, for train and eval files together."""
    train = write(
        tmp_path / "t.jsonl", [{"id": i, "question": "2+2?", "prompt": "x", "reply": "4"} for i in range(3)]
    )
    evals = write(tmp_path / "e.jsonl", [{"question": "2+2?", "reply": "4", "source": "web"}])
    chat = ChatDataset(
        path=train, eval_path=evals, columns={"prompt": "question", "completion": "reply"}
    ).load()
    assert chat.info["columns used"] == "question (as prompt), reply (as completion)"
    assert chat.info["columns ignored"] == "prompt (replaced by data.columns), id, source"

    convo = [{"role": "user", "content": "2+2?"}]
    pair = {
        "prompt": "2+2?",
        "chosen": [*convo, CHAT[1]],
        "rejected": [*convo, {"role": "assistant", "content": "5"}],
    }
    implicit = PreferenceDataset(path=write(tmp_path / "p.jsonl", [pair] * 3), eval_fraction=0.0).load()
    assert implicit.info["format"] == "implicit (detected)"
    assert (implicit.info["columns used"], implicit.info["columns ignored"]) == ("chosen, rejected", "prompt")

    prompts = PromptDataset(path=write(tmp_path / "q.jsonl", [{"prompt": "2+2?", "id": 1}] * 3)).load()
    assert (prompts.info["columns used"], prompts.info["columns ignored"]) == ("prompt", "id")


def test_ignore_columns_must_name_columns_of_the_file_and_not_mapped_ones(tmp_path: Path) -> None:
    path = write(tmp_path / "kto.jsonl", KTO)
    err = refusal(ChatDataset(path=path, ignore_columns=["lable"]))
    assert err.key == "data.ignore_columns" and "'lable'" in str(err) and "label" in str(err)
    with pytest.raises(ConfigError) as mapped:
        ChatDataset(path=path, columns={"completion": "label"}, ignore_columns=["label"]).validate()
    assert mapped.value.key == "data.ignore_columns"


# ------------------------------------------------------------------------------ completion-only loss


def test_completion_only_masks_a_conversational_prompt_with_any_template(tmp_path: Path) -> None:
    """hydratune's turn-by-turn mask (chatml here) trains only the completion's assistant turns: not the
    assistant turn inside a conversational prompt, which assistant-only loss alone would train."""
    from transformers import AutoTokenizer

    from hydratune.components.text.chat_template import CHATML
    from hydratune.components.text.sft_tokens import plan_tokens, tokenize_batch

    shot = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "two"}]
    row = {"prompt": [*shot, {"role": "user", "content": "2+2?"}], "completion": "four"}
    data = ChatDataset(path=write(tmp_path / "pc.jsonl", [row] * 3), eval_fraction=0.0).load()["train"]
    assert data[0]["completion_turns"] == 1
    tok = AutoTokenizer.from_pretrained(str(Path(__file__).resolve().parents[2] / "components/assets/tiny"))
    tok.chat_template = CHATML

    def trained(completion_only: bool) -> str:
        knobs = {"assistant_only": True, "completion_only": completion_only, "label": "chatml"}
        plan = plan_tokens(data.column_names, tok, **knobs, max_length=64)
        assert plan.mask == "hydratune"
        out = tokenize_batch(plan, tok, data[:1], where="train", first=0)
        return tok.decode([t for t in out["labels"][0] if t != -100])

    assert "two" in trained(False) and "four" in trained(False)
    assert "two" not in trained(True) and "four" in trained(True)


# ------------------------------------------------------------------------------------------ recipe=eval
