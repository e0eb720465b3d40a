"""recipe=generate with ``recipe.tools``, ``hydratune chat --tools`` and recipe=eval over episodes: the tool
loop GRPO trains with, run at inference (components/tool_loop.py ToolLoop). The tiny model's generation is
scripted (a random-init model emits no tool call); the recipe, TRL's parser, the tools, the environment, the
token layout and the rewards are real."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoTokenizer

from tests.support.data import ASSETS
from tests.support.runs import read_jsonl

TOOLS = [
    "recipe=generate",
    "recipe.tools=[tests.support.tools.add,tests.support.tools.boom]",
    "recipe.max_tool_calls=1",
    "recipe.max_new_tokens=64",
    "recipe.batch_size=3",
    "data.max_samples=6",
    "model.chat_template=qwen2_5",
    "data.max_prompt_length=1024",  # the tools' schemas are in every prompt
    "+model.architecture.max_position_embeddings=2048",  # the tiny model's 256 would not hold them
]
RESULT = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
#: what the template puts between a tool call and the model's next turn, with the tool's result in it
SUFFIX = "\n<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call><|im_end|>'


def script(text: str) -> str:
    """'What is X + Y?': X = 5 calls add(X, Y), then answers the result; X = 30 calls boom(X), then again
    (left unanswered at max_tool_calls=1); X = 55 calls a tool that does not exist; X = 77 calls the
    environment's step(2) where the prompt shows that tool; else answers 0."""
    results = RESULT.findall(text)
    x, y = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1])
    if results:
        return call("boom", {"a": x}) if x == 30 else f"{results[-1]}<|im_end|>"
    if x == 77 and '"name": "step"' in text:
        return call("step", {"by": 2})
    if x in (5, 30, 55):
        name, arguments = {5: ("add", {"a": x, "b": y}), 30: ("boom", {"a": x}), 55: ("nope", {})}[x]
        return call(name, arguments)
    return "0<|im_end|>"


@pytest.fixture
def scripted(monkeypatch):
    """The model's ``generate`` replaced by :func:`script` over each row's decoded context; every context it
    was given is recorded."""
    from hydratune.components.runtime import inference

    contexts: list[str] = []
    load = inference.load_model

    def load_scripted(comps, device):
        model = load(comps, device)
        tokenizer = AutoTokenizer.from_pretrained(ASSETS / "tiny")

        def generate(input_ids, attention_mask, pad_token_id, **kwargs):
            rows = zip(input_ids, attention_mask, strict=True)
            texts = [tokenizer.decode(ids[mask.bool()]) for ids, mask in rows]
            contexts.extend(texts)
            new = [tokenizer.encode(script(t), add_special_tokens=False) for t in texts]
            width = max(map(len, new))
            pad = [ids + [pad_token_id] * (width - len(ids)) for ids in new]
            return torch.cat([input_ids, torch.tensor(pad, dtype=input_ids.dtype)], dim=1)

        model.generate = generate
        return model

    monkeypatch.setattr(inference, "load_model", load_scripted)
    return contexts


def test_generate_runs_the_tool_loop_and_writes_each_prompts_transcript(run_recipe, scripted) -> None:
    ctx, metrics = run_recipe(*TOOLS, name="gen_tools")
    records = read_jsonl(ctx.run_dir.path / "generations.jsonl")
    by_x = {int(re.findall(r"What is (\d+)", r["prompt"])[0]): r for r in records}
    assert set(by_x) >= {5, 30, 55} and len(records) == 6
    add = by_x[5]
    assert add["messages"] == [
        {"role": "user", "content": "What is 5 + 6?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 5, "b": 6}}}],
        },
        {"role": "tool", "name": "add", "content": "11"},
        {"role": "assistant", "content": "11"},
    ]
    assert add["completion"] == "11" == add["reference"] and add["finish_reason"] == "stop"
    assert add["tool_calls"] == 1 and add["tool_errors"] == {}
    # the model's second turn went on from its own tokens and TRL's tool-result tokens, as in training
    [second] = [c for c in scripted if "What is 5 + 6?" in c and "<tool_response>" in c]
    assert second.endswith(call("add", {"a": 5, "b": 6}) + SUFFIX.format(11)), second
    assert '"name": "add"' in second.split("<|im_start|>user")[0]  # the schemas: in the system prompt
    boom = by_x[30]
    assert [m["role"] for m in boom["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert boom["messages"][2]["content"] == "error: boom raised ZeroDivisionError: cannot divide 30 by zero"
    assert boom["finish_reason"] == "tool_limit" and boom["tool_errors"] == {"raised": 1}
    nope = by_x[55]
    assert nope["messages"][2] == {
        "role": "tool",
        "name": "nope",
        "content": "{'error': 'Tool nope not found.'}",
    }
    assert nope["tool_errors"] == {"unknown": 1}
    plain = [r for x, r in by_x.items() if x not in (5, 30, 55)]
    assert all(r["tool_calls"] == 0 and len(r["messages"]) == 2 for r in plain)
    assert metrics["tool calls"] == 3 and metrics["cut by recipe.max_tool_calls"] == 1
    assert metrics["tool errors"] == "raised 1, not_a_string 0, timeout 0, bad_arguments 0, unknown 1"
    assert metrics["stopped at end of turn"] == 5


def test_chat_with_tools_runs_the_loop_and_keeps_the_calls_in_the_conversation(
    sft_runs, monkeypatch, capsys
) -> None:
    """``hydratune chat <run> --tools ...``: a full run (trained with its own template) is refused naming
    model.chat_template before load; with a qwen2_5 template the loop runs as recipe=generate's."""
    from hydratune.components.commands import chat
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.text.chat_template import resolve_chat_template
    from hydratune.components.tools import resolve_tools

    with pytest.raises(ConfigError, match="does not render a tool call") as info:
        chat.cli([str(sft_runs["full"]), "--tools", "tests.support.tools.add"])
    assert info.value.key == "model.chat_template" and "model.chat_template=qwen2_5" in info.value.hint
    with pytest.raises(ConfigError, match="did you mean add") as info:
        chat.cli([str(sft_runs["full"]), "--tools=tests.support.tools.add,tests.support.tools.ad"])
    assert info.value.key == "chat.tools[1]"

    model, tokenizer = chat.load(sft_runs["full"])
    tokenizer.chat_template = resolve_chat_template("qwen2_5")[0]

    def generate(input_ids, attention_mask, pad_token_id, **kwargs):
        text = tokenizer.decode(input_ids[0])
        new = tokenizer.encode(script(text), add_special_tokens=False)
        return torch.cat([input_ids, torch.tensor([new], dtype=input_ids.dtype)], dim=1)

    model.generate = generate
    model.config.max_position_embeddings = 2048  # the prompt with the schemas: 512 tokens
    functions = resolve_tools(["tests.support.tools.add"], trusted=False, key="chat.tools")
    agent = chat.tool_loop(sft_runs["full"], tokenizer, functions, {"max_tool_calls": 2, "tool_timeout": 5.0})
    lines = iter(["What is 5 + 6?", "/history", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(lines))
    options = {"system": None, "max_new_tokens": 64, "temperature": 0.0, "top_p": 1.0}
    chat.loop(model, tokenizer, options, agent=agent)
    out = capsys.readouterr().out
    assert "[tool add] 11" in out
    assert 'assistant:  [calls {"name": "add", "arguments": {"a": 5, "b": 6}}]' in out
    assert "  tool: 11\n  assistant: 11\n(4 turns)" in out


EVAL_EPISODES = [
    *(o for o in TOOLS if o != "recipe=generate"),
    "recipe=eval",
    "recipe.environment=tests.support.tools.Counter",
]


def test_eval_scores_each_prompts_episode_with_the_rewards_and_the_environment(run_recipe, scripted) -> None:
    """recipe=eval with tools and an environment: each of the 6 prompts an episode (a fresh Counter each),
    scored by exact_match and the Counter's get_reward, summed; the tool calls, cuts and faults counted."""
    ctx, metrics = run_recipe(*EVAL_EPISODES, name="eval_episodes")
    records = read_jsonl(ctx.run_dir.path / "episodes.jsonl")
    by_x = {int(re.findall(r"What is (\d+)", r["messages"][0]["content"])[0]): r for r in records}
    assert set(by_x) >= {5, 30, 55, 77} and len(records) == 6
    add, step = by_x[5], by_x[77]
    assert [m["role"] for m in add["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert add["completion"] == "11" == add["reference"] and add["rewards"] == {
        "exact_match": 1.0,
        "Counter": 0.0,
    }
    # the environment's method ran on this episode's own instance: its first episode, its count the reward
    assert step["messages"][2] == {"role": "tool", "name": "step", "content": "2 (episode 1)"}
    assert step["rewards"] == {"exact_match": 0.0, "Counter": 2.0} and step["reward"] == 2.0
    assert by_x[30]["finish_reason"] == "tool_limit" and by_x[30]["tool_errors"] == {"raised": 1}
    assert by_x[55]["tool_errors"] == {"unknown": 1}
    # the environment's tool was in every prompt's schemas, beside the tools
    assert all('"name": "step"' in c and '"name": "add"' in c for c in scripted)
    assert metrics["episodes"] == 6 and metrics["mean reward"] == pytest.approx(3 / 6)
    assert metrics["mean reward exact_match"] == pytest.approx(1 / 6)
    assert metrics["mean reward Counter"] == pytest.approx(2 / 6)
    assert metrics["tool calls per episode (mean)"] == pytest.approx(4 / 6)
    assert metrics["cut by recipe.max_tool_calls"] == 1 and metrics["tool errors"] == 2
    result = json.loads((ctx.run_dir.path / "result.json").read_text())
    assert (
        result["episodes"]["tool errors"] == "raised 1, not_a_string 0, timeout 0, bad_arguments 0, unknown 1"
    )
    assert result["final metrics"]["mean reward"] == pytest.approx(0.5)
    [logged] = ctx.run_dir.read_metrics()
    assert logged["episodes/mean_reward"] == pytest.approx(0.5)
