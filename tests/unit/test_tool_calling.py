"""What users bring to chat SFT, nothing dropped in silence: tool calls and tool results (OpenAI and ShareGPT
shapes) with a ``tools`` column, OpenAI content parts, templates without a system role, conversations that
end on a user turn, and template checks on every row before the model loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.formats import parse_messages
from hydratune.components.text.chat_template import (
    HYDRATUNE,
    choose_method,
    mask_conversation,
    trl_template_files,
)
from tests.support.data import TINY, chat, tiny_tokenizer_for, trained_text, write_jsonl

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},  # OpenAI: JSON text
}
TOOL_RESULT = "18 degrees and sunny"


def tool_chat(city: str = "Paris", result: str = TOOL_RESULT) -> dict[str, Any]:
    call = json.loads(json.dumps(TOOL_CALL))
    call["function"]["arguments"] = json.dumps({"city": city})
    return {
        "messages": [
            {"role": "user", "content": f"Weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": result},
            {"role": "assistant", "content": f"It is {result} in {city}."},
        ],
        "tools": json.dumps(TOOLS),
    }


def plan(compose_cfg: Any, *overrides: str) -> list[str]:
    """``mode=plan``'s data check, in process: the lines it prints, or its ConfigError."""
    from hydratune.components.data.prepare import plan_data
    from hydratune.components.runtime.run import Components

    comps = Components.from_config(compose_cfg("mode=plan", *overrides))
    return plan_data(comps, 0)


# ---- parsing: nothing dropped ---------------------------------------------------------------------
def test_tool_calls_and_tool_results_are_kept_in_openai_shape() -> None:
    turns = parse_messages(tool_chat()["messages"], "messages")
    assert turns[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    assert turns[2] == {
        "role": "tool",
        "content": TOOL_RESULT,
        "tool_call_id": "call_1",
        "name": "get_weather",
    }
    with pytest.raises(ValueError, match="arguments are not valid JSON"):
        bad = {"function": {"name": "f", "arguments": "{x"}}
        parse_messages([{"role": "assistant", "tool_calls": [bad]}], "m")


def test_sharegpt_function_call_and_observation_map_onto_tool_calls() -> None:
    turns = parse_messages(
        [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
            {"from": "observation", "value": TOOL_RESULT},
            {"from": "gpt", "value": "Sunny."},
        ],
        "conversations",
    )
    assert [t["role"] for t in turns] == ["user", "assistant", "tool", "assistant"]
    assert turns[1]["content"] == "" and turns[1]["tool_calls"] == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ]


def test_content_parts_are_joined_and_a_non_text_part_is_refused_by_row(tmp_path: Path) -> None:
    parts = [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]
    rows = [{"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "4"}]}] * 4
    data = ChatDataset(path=write_jsonl(tmp_path / "parts.jsonl", rows), eval_fraction=0.0).load()
    assert data["train"][0]["messages"][0] == {"role": "user", "content": "What is 2+2?"}

    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    rows.append(
        {"messages": [{"role": "user", "content": [image, parts[1]]}, {"role": "assistant", "content": "4"}]}
    )
    path = write_jsonl(tmp_path / "image.jsonl", rows)
    with pytest.raises(ConfigError, match=r"image\.jsonl:5 \(row 5\): .*'image_url' content part") as info:
        ChatDataset(path=path).load()
    assert "non-text parts" in info.value.hint


def test_tools_column_and_tool_turns_load_with_exactly_their_keys(tmp_path: Path) -> None:
    other = tool_chat("Rome")
    other["messages"][1]["tool_calls"][0]["function"] = {"name": "get_time", "arguments": {"zone": "CET"}}
    rows = [tool_chat(), other, {**chat("hi", "hello"), "tools": None}]
    data = ChatDataset(path=write_jsonl(tmp_path / "tools.jsonl", rows), eval_fraction=0.0).load()
    train = data["train"]
    assert train.column_names == ["messages", "answer", "tools"]
    assert json.loads(train[0]["tools"]) == TOOLS and train[2]["tools"] is None
    first, second = train[0]["messages"], train[1]["messages"]
    assert first[0] == {"role": "user", "content": "Weather in Paris?"}  # no None-valued tool keys
    assert first[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert second[1]["tool_calls"][0]["function"]["arguments"] == {"zone": "CET"}  # keys not merged
    assert train[2]["messages"] == chat("hi", "hello")["messages"]


def test_a_conversation_ending_on_a_user_turn_is_counted_and_named(tmp_path: Path) -> None:
    rows = [
        chat("1+1?", "2"),
        chat("2+2?", "4"),
        {"messages": [*chat("3+3?", "6")["messages"], {"role": "user", "content": "and?"}]},
    ]
    path = write_jsonl(tmp_path / "open.jsonl", rows)
    info = ChatDataset(path=path, eval_fraction=0.0).load().info
    note = next(v for k, v in info.items() if "ending after the last assistant turn" in k)
    assert note.startswith("1 ") and f"{path}:3 (row 3)" in note


# ---- templates: tools rendered and masked -----------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen2_5", "qwen3", "llama3_1"])
def test_templates_that_render_tools_train_the_call_and_never_the_result(name: str) -> None:
    """TRL's qwen2_5 / qwen3 (TRL's training templates) and llama3_1 (hydratune's turn-by-turn mask): the
    tool-calling turn is trained as rendered, the tool result and the schemas are not."""
    tok = tiny_tokenizer_for(trl_template_files()[name].read_text())
    messages = parse_messages(tool_chat()["messages"], "messages")
    method, patched = choose_method(tok)
    if method == HYDRATUNE:
        masked = mask_conversation(tok, messages, label=name, tools=TOOLS)
        ids, mask = masked.input_ids, masked.assistant_masks
    else:
        out = tok.apply_chat_template(
            messages,
            tools=TOOLS,
            chat_template=patched,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        ids, mask = out["input_ids"], out["assistant_masks"]
    trained = trained_text(tok, ids, mask)
    assert "get_weather" in trained and "Paris" in trained and "It is 18 degrees" in trained
    assert TOOL_RESULT not in trained.replace(f"It is {TOOL_RESULT}", "")
    assert "The weather in a city" not in trained  # the schema is prompt


def test_a_template_that_cannot_render_tools_is_refused_before_load(compose_cfg: Any, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tools.jsonl", [tool_chat(result=f"{t} degrees") for t in range(6)])
    schemas = write_jsonl(
        tmp_path / "schemas.jsonl", [{**chat(f"hi {n}", "hello"), "tools": TOOLS} for n in range(6)]
    )
    for data_path, what in ((path, "tool_calls"), (schemas, "tools column's schemas")):
        with pytest.raises(
            ConfigError, match=rf"train row \d+: the chat template \(chatml\) does not render the .*{what}"
        ) as info:
            plan(compose_cfg, "data=jsonl_messages", f"data.path={data_path}", "model.chat_template=chatml")
        assert info.value.key == "model.chat_template" and "qwen2_5" in info.value.hint
    lines = plan(compose_cfg, "data=jsonl_messages", f"data.path={path}", "model.chat_template=qwen2_5")
    assert "# data: train rows: 5" in lines


def test_a_template_for_other_special_tokens_names_the_missing_token() -> None:
    from hydratune.components.text.chat_template import resolve_chat_template
    from hydratune.components.text.tokenizer import build_tokenizer

    tok = build_tokenizer(str(TINY))  # ChatML tokens, no <|eot_id|>
    tok.chat_template = resolve_chat_template("llama3_2")[0]
    with pytest.raises(ConfigError, match=r"'<\|eot_id\|>', which is not a token of this tokenizer") as info:
        mask_conversation(tok, chat("2+2?", "4")["messages"], label="llama3_2")
    assert "special tokens" in info.value.args[0]


# ---- every row, before load ---------------------------------------------------------------------------
def test_plan_checks_every_row_not_the_first_eight(compose_cfg: Any, tmp_path: Path) -> None:
    """Row 20 breaks Gemma's alternation rule; TRL masks Gemma's template, so only a check of every row
    finds it before the model loads."""
    rows = [chat(f"{i}+1?", str(i + 1)) for i in range(30)]
    rows[20] = {"messages": [{"role": "user", "content": "a"}, *chat("b", "c")["messages"]]}
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    overrides = (
        "data=jsonl_messages",
        f"data.path={path}",
        "data.eval_fraction=0",
        "model.chat_template=gemma",
    )
    with pytest.raises(
        ConfigError, match=r"train row 20: the chat template \(gemma\) cannot render.*alternate"
    ):
        plan(compose_cfg, *overrides)


def test_a_template_without_a_system_role_gets_the_system_prompt_folded(
    compose_cfg: Any, tmp_path: Path
) -> None:
    from hydratune.components.text.chat_template import resolve_chat_template

    path = write_jsonl(tmp_path / "chat.jsonl", [chat(f"{i}+1?", str(i + 1)) for i in range(10)])
    # Gemma's template on the tiny tokenizer's markers (its <end_of_turn> is no token of it: mode=plan refuses
    # that template before load, as the model would not learn to stop)
    gemma = resolve_chat_template("gemma")[0].replace("<start_of_turn>", "<|im_start|>")
    template = tmp_path / "gemma.jinja"
    template.write_text(gemma.replace("<end_of_turn>", "<|im_end|>"))
    overrides = (
        "data=jsonl_messages",
        f"data.path={path}",
        f"model.chat_template={template}",
        "data.system_prompt=Be brief.",
    )
    lines = plan(compose_cfg, *overrides)
    assert any("system turns: 10 folded into the first user turn" in line for line in lines), lines
    with pytest.raises(ConfigError, match=r"\) has no system role, and 9 train rows") as info:
        plan(compose_cfg, *overrides, "data.fold_system=false")
    assert info.value.key == "data.fold_system"
    from hydratune.components.text.chat_template import fold_system

    folded = fold_system([{"role": "system", "content": "Be brief."}, *chat("2+2?", "4")["messages"]])
    assert folded == [{"role": "user", "content": "Be brief.\n\n2+2?"}, {"role": "assistant", "content": "4"}]
