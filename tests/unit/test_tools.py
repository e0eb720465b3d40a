"""GRPO's ``recipe.tools`` (components/tools.py): resolved, trusted and described before load; the chat
template checked for tool calls; every fault of a call an error message for the model, counted."""

from __future__ import annotations

import re

import pytest
from transformers import AutoTokenizer

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.trust import target_refusals
from hydratune.components.text.chat_template import resolve_chat_template
from hydratune.components.tools import Tool, ToolStats, check_template, resolve_tools, schema
from tests.support import tools


def test_a_dotted_tool_resolves_and_its_schema_comes_from_hints_and_docstring() -> None:
    [add] = resolve_tools(["tests.support.tools.add"], trusted=False)
    spec = schema(add)["function"]
    assert spec["name"] == "add" and spec["description"] == "Add two whole numbers."
    assert spec["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first number"}
    assert spec["parameters"]["required"] == ["a", "b"]


def test_a_partial_tools_bound_keyword_is_hidden_from_the_model_and_applied() -> None:
    node = {"_target_": "tests.support.tools.scaled", "_partial_": True, "factor": 3}
    [scaled] = resolve_tools([node], trusted=False)
    assert list(schema(scaled)["function"]["parameters"]["properties"]) == ["a"]
    assert Tool(scaled, 5, ToolStats()).as_function()(a=2) == "6"


@pytest.mark.parametrize(
    ("spec", "message", "hint"),
    [
        (
            "tests.support.tools.ad",
            "has no function 'ad'; did you mean add?",
            "recipe.tools[1]=tests.support.tools.add",
        ),
        ("tests.support.tool.add", "no module 'tests.support.tool'", "def add(a: int, b: int) -> str"),
        ("tests.support.tools.undocumented", "no docstring", "docstring with an Args: section"),
        ("os.getcwd", "not a plain function", "trust_targets=true"),
        ("json.dumps", "installed package or the standard library", "trust_targets=true"),
        (
            {"_target_": "tests.support.tools.scaled", "factor": print},
            "binds arguments that are calls",
            "trust",
        ),
    ],
)
def test_a_bad_tool_is_refused_naming_its_index_and_the_fix(spec, message, hint) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_tools(["tests.support.tools.add", spec], trusted=False)
    assert info.value.key.startswith("recipe.tools[1]"), info.value
    assert message in str(info.value) and hint in info.value.hint, info.value


def test_two_tools_of_one_name_are_refused() -> None:
    with pytest.raises(ConfigError, match="two tools are named add") as info:
        resolve_tools(["tests.support.tools.add", "tests.support.tools.add"], trusted=True)
    assert info.value.key == "recipe.tools[1]"


def test_a_tool_node_must_be_a_partial_unless_trusted() -> None:
    partial = {"recipe": {"tools": [{"_target_": "tests.support.tools.add", "_partial_": True}]}}
    called = {"recipe": {"tools": [{"_target_": "os.system", "command": "true"}]}}
    assert list(target_refusals(partial)) == []
    [(key, why)] = list(target_refusals(called))
    assert key == "recipe.tools[0]._target_" and "must be partials" in why


def test_every_fault_of_a_call_is_an_error_message_for_the_model_and_counted() -> None:
    stats = ToolStats()
    call = {
        f.__name__: Tool(f, 0.2, stats).as_function()
        for f in (tools.add, tools.boom, tools.number, tools.hang)
    }
    try:
        assert call["add"](a=2, b=3) == "5"
        assert call["boom"](a=1) == "error: boom raised ZeroDivisionError: cannot divide 1 by zero"
        assert call["number"](a=1) == "error: number returned a int, not a string"
        assert call["hang"](a=1) == "error: hang took longer than 0.2 s"
        assert call["add"](a=2, c=3).startswith("error: add takes (a, b), not ")
        assert call["add"](a=2).startswith("error: add takes (a, b)")
    finally:
        tools.RELEASE.set()  # the hung call's thread returns
    counts = stats.drain()
    assert counts == {
        "tools/calls": 6.0,
        "tools/errors_raised": 1.0,
        "tools/errors_not_a_string": 1.0,
        "tools/errors_timeout": 1.0,
        "tools/errors_bad_arguments": 2.0,
    }
    assert set(stats.drain().values()) == {0.0}  # since the last drain


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return AutoTokenizer.from_pretrained("components/assets/tiny")


@pytest.fixture
def tokenizer(tiny_tokenizer):
    """The tiny model's tokenizer, its own chat template put back after the test."""
    original = tiny_tokenizer.chat_template
    yield tiny_tokenizer
    tiny_tokenizer.chat_template = original


@pytest.mark.parametrize("name", ["qwen2_5", "qwen3", "llama3_1"])
def test_templates_that_render_tool_calls_pass(tokenizer, name) -> None:
    tokenizer.chat_template = resolve_chat_template(name)[0]
    check_template(tokenizer)  # qwen3 is not prefix-preserving: TRL has a training template for it


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (None, "does not render a tool call"),  # the tiny model's own: content only
        ("chatml", "does not render a tool call"),
        ("phi3", "does not render a tool call"),
    ],
)
def test_templates_without_tool_calls_are_refused_naming_one_that_works(tokenizer, name, why) -> None:
    if name:
        tokenizer.chat_template = resolve_chat_template(name)[0]
    with pytest.raises(ConfigError, match=why) as info:
        check_template(tokenizer)
    assert info.value.key == "model.chat_template" and "model.chat_template=qwen2_5" in info.value.hint


def test_a_template_trl_cannot_parse_tool_calls_of_is_refused(tokenizer) -> None:
    # renders tool calls and results, but TRL knows no response template for it
    tokenizer.chat_template = resolve_chat_template("qwen2_5")[0] + " "
    with pytest.raises(ConfigError, match="cannot parse tool calls") as info:
        check_template(tokenizer)
    assert info.value.key == "model.chat_template"


def test_grpo_checks_its_tools_before_load_and_plan_shows_their_schemas(compose_cfg) -> None:
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("recipe=grpo", "recipe.tools=[tests.support.tools.add]", "recipe.max_tool_calls=2")
    comps = Components.from_config(cfg)
    comps.recipe.check(cfg, comps)
    lines = comps.recipe.plan_lines(cfg, comps)
    assert lines[0] == "# tools (1; rounds per episode: 2; timeout 10 s):"
    assert lines[1].startswith('#   add: {"properties": {"a": {"description": "the first number"')
    bad = compose_cfg("recipe=grpo", "recipe.tools=[tests.support.tools.add,tests.support.tools.bom]")
    comps = Components.from_config(bad)
    with pytest.raises(ConfigError, match="did you mean boom") as info:
        comps.recipe.check(bad, comps)
    assert (
        info.value.key == "recipe.tools[1]" and info.value.hint == "recipe.tools[1]=tests.support.tools.boom"
    )


def test_the_bundled_calculator_is_a_tool_and_refuses_what_is_not_arithmetic() -> None:
    [calculator] = resolve_tools(["hydratune.components.agent_tools.calculator"], trusted=False)
    call = Tool(calculator, 5, stats := ToolStats()).as_function()
    assert call(expression="12 * (3 + 4)") == "84" and call(expression="7 / 2") == "3.5"
    assert call(expression="__import__('os')").startswith(
        "error: calculator raised ValueError: not arithmetic"
    )
    assert call(expression="2 ** 99999999").startswith("error: calculator raised ValueError")
    assert stats.drain()["tools/errors_raised"] == 2


def test_tools_with_text_prompts_are_refused_before_load(compose_cfg, tokenizer) -> None:
    """TRL parses tool calls out of chat completions only: text prompts would never call a tool."""
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("recipe=grpo", "recipe.tools=[tests.support.tools.add]")
    comps = Components.from_config(cfg)
    tokenizer.chat_template = resolve_chat_template("qwen2_5")[0]
    rows = {"train": [{"prompt": "What is 2 + 2?", "answer": "4"}]}
    with pytest.raises(ConfigError, match="needs chat prompts") as info:
        comps.recipe.check_data(comps, rows, tokenizer)
    assert info.value.key == "recipe.tools"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tests.support.tools.NoReset", r"has no reset\(\*\*row\)"),
        ("tests.support.tools.Fixed", "cannot describe tool step"),
        ("tests.support.tools.Countr", "did you mean Counter?"),
        ("collections.Counter", "installed package or the standard library"),
        ("tests.support.tools.add", "not a class"),
    ],
)
def test_a_bad_environment_is_refused_before_load(spec, message) -> None:
    from hydratune.components.environment import resolve_environment

    with pytest.raises(ConfigError, match=message) as info:
        resolve_environment(spec, trusted=False)
    assert info.value.key.startswith("recipe.environment"), info.value


def test_an_environment_is_planned_and_its_reset_checked_against_the_rows(compose_cfg) -> None:
    from hydratune.components.environment import check_reset, resolve_environment
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg(
        "recipe=grpo", "recipe.environment=tests.support.tools.Counter", "recipe.reward_funcs=[]"
    )
    comps = Components.from_config(cfg)
    comps.recipe.check(cfg, comps)  # no reward function: the environment's get_reward is one
    lines = comps.recipe.plan_lines(cfg, comps)
    assert lines[:2] == [
        "# tools (1; rounds per episode: no limit; timeout 10 s):",
        "# environment Counter (a fresh one per rollout), its methods:",
    ]
    assert lines[2].startswith('#   step: {"properties": {"by": {"description": "how much to add"')
    row = {"prompt": [{"role": "user", "content": "hi"}], "answer": "4"}
    check_reset(resolve_environment("tests.support.tools.Counter", trusted=False), row, "d.jsonl")
    with pytest.raises(
        ConfigError, match=r"Fixed.reset cannot take the columns of d.jsonl's rows \(prompt, answer\)"
    ):
        check_reset(tools.Fixed, row, "d.jsonl")


def test_a_prompt_that_the_tools_schemas_push_over_the_limit_is_refused(compose_cfg, tokenizer) -> None:
    """The data's prompt lengths do not count the schemas the template adds to every prompt."""
    from hydratune.components.runtime.run import Components

    tokenizer.chat_template = resolve_chat_template("qwen2_5")[0]
    prompt = [{"role": "user", "content": "What is 2 + 2?"}]
    alone = len(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)["input_ids"])
    tools_on = "recipe.tools=[tests.support.tools.add,tests.support.tools.boom]"
    context = "+model.architecture.max_position_embeddings=2048"
    cfg = compose_cfg("recipe=grpo", tools_on, f"data.max_prompt_length={alone + 100}", context)
    comps = Components.from_config(cfg)
    with pytest.raises(
        ConfigError, match=r"with the tools' schemas the chat template adds is \d+ tokens"
    ) as info:
        comps.recipe.check_prompt_with_tools(comps, prompt, tokenizer)
    assert info.value.key == "data.max_prompt_length"
    enough = int(re.search(r"data.max_prompt_length=(\d+)", info.value.hint).group(1))
    cfg = compose_cfg("recipe=grpo", tools_on, f"data.max_prompt_length={enough}", context)
    comps = Components.from_config(cfg)
    comps.recipe.check_prompt_with_tools(comps, prompt, tokenizer)  # the hint's value works
    # within the prompt limit, past the tiny model's context (256): no room for a reply
    cfg = compose_cfg("recipe=grpo", tools_on, f"data.max_prompt_length={enough}")
    comps = Components.from_config(cfg)
    with pytest.raises(ConfigError, match=r"context \(max_position_embeddings\) is 256") as info:
        comps.recipe.check_prompt_with_tools(comps, prompt, tokenizer)
    assert info.value.key == "recipe.tools"
    wide = re.search(r"\+model.architecture.max_position_embeddings=\d+", info.value.hint).group(0)
    cfg = compose_cfg("recipe=grpo", tools_on, f"data.max_prompt_length={enough}", wide)
    comps = Components.from_config(cfg)
    comps.recipe.check_prompt_with_tools(comps, prompt, tokenizer)  # the hint's value works


@pytest.mark.parametrize("recipe", ["generate", "eval"])
def test_generate_and_eval_refuse_a_first_prompt_the_schemas_push_past_the_limit_or_the_context(
    compose_cfg, recipe
) -> None:
    """As GRPO: the check mode=plan and the run make with the rows and the tokenizer (``check_data``)."""
    from hydratune.components.runtime.run import Components

    tools_on = (f"recipe={recipe}", "recipe.tools=[tests.support.tools.add]", "model.chat_template=qwen2_5")
    wide = "+model.architecture.max_position_embeddings=2048"
    cases = [
        (("data.max_prompt_length=300", wide), "data.max_prompt_length", "over data.max_prompt_length=300"),
        (("data.max_prompt_length=1024",), "recipe.tools", r"context \(max_position_embeddings\) is 256"),
        (("data.max_prompt_length=1024", wide), None, None),
    ]
    for overrides, key, message in cases:
        cfg = compose_cfg(*tools_on, *overrides)
        comps = Components.from_config(cfg)
        comps.recipe.check(cfg, comps)
        tokenizer, rows = comps.model.build_tokenizer(convert=False), comps.data.whole().load()
        if key is None:
            comps.recipe.check_data(comps, rows, tokenizer)  # fits both
            continue
        with pytest.raises(ConfigError, match=message) as info:
            comps.recipe.check_data(comps, rows, tokenizer)
        assert info.value.key == key, overrides


def test_eval_over_episodes_checks_its_tools_rewards_and_knobs_before_load(compose_cfg, tokenizer) -> None:
    """recipe=eval with recipe.tools / recipe.environment: a misspelt tool named with its close match, a
    reward needed, lm-eval's knobs refused beside them, the episodes' knobs named unused without them; the
    template must render tool calls; mode=plan says what runs instead of lm-eval."""
    from hydratune.components.runtime.run import Components

    def refusal(*overrides: str) -> ConfigError:
        cfg = compose_cfg("recipe=eval", *overrides)
        comps = Components.from_config(cfg)
        with pytest.raises(ConfigError) as info:
            comps.recipe.check(cfg, comps)
        return info.value

    from hydratune.recipes.eval import EPISODE_KNOBS

    plain = Components.from_config(compose_cfg("recipe=eval")).recipe  # lm-eval's: no knob of episodes set
    assert not plain.scores_episodes and plain.changed(EPISODE_KNOBS) == []
    err = refusal("recipe.tools=[tests.support.tools.add,tests.support.tools.ad]")
    assert err.key == "recipe.tools[1]" and "did you mean add" in str(err)
    err = refusal("recipe.tools=[tests.support.tools.add]", "recipe.reward_funcs=[]")
    assert err.key == "recipe.reward_funcs" and "no reward" in str(err)
    assert refusal("recipe.tools=[tests.support.tools.add]", "recipe.tasks=[gsm8k]").key == "recipe.tasks"
    cfg = compose_cfg("recipe=eval", "recipe.max_tool_calls=2", "recipe.temperature=0.5")
    comps = Components.from_config(cfg)
    [unused] = comps.recipe.warnings(cfg, comps)
    assert unused.startswith("recipe.max_tool_calls, recipe.temperature: not used: lm-eval's tasks run")
    err = refusal("recipe.environment=tests.support.tools.Counter", "recipe.num_return_sequences=4")
    assert err.key == "recipe.num_return_sequences"
    cfg = compose_cfg(
        "recipe=eval", "recipe.environment=tests.support.tools.Counter", "recipe.reward_funcs=[]"
    )
    comps = Components.from_config(cfg)
    comps.recipe.check(cfg, comps)  # the environment's get_reward is the reward
    lines = comps.recipe.plan_lines(cfg, comps)
    assert (
        lines[0].startswith("# eval: episodes of the tool loop")
        and "scored by Counter.get_reward" in lines[0]
    )
    assert "no lm-eval task runs" in lines[0]
    assert "# environment Counter (a fresh one per episode), its methods:" in lines
    with pytest.raises(ConfigError, match="does not render a tool call") as info:
        comps.recipe.check_data(comps, comps.data.whole().load(), tokenizer)  # the tiny model's own template
    assert info.value.key == "model.chat_template"


def test_the_bundled_guessing_game_keeps_its_state_across_turns_and_rewards_the_find() -> None:
    """data=demo_agent's environment: the row's answer is the secret; higher / lower until found."""
    from hydratune.components.agent_tools import GuessingGame
    from hydratune.components.environment import resolve_environment

    factory = resolve_environment("hydratune.components.agent_tools.GuessingGame", trusted=False)
    game = factory()
    game.reset(answer="5", prompt=[])
    assert [game.guess(number=n) for n in (4, 6)] == ["higher", "lower"] and game.get_reward() == 0.0
    assert game.guess(number=5) == "correct" and game.get_reward() == 1.0 and game.guesses == 3
    game.reset(answer="1", prompt=[])
    assert game.get_reward() == 0.0 and game.guesses == 0
    assert isinstance(game, GuessingGame)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_the_agent_demo_trains_and_evaluates_every_secret(compose_cfg, split: str) -> None:
    """data=demo_agent: each split holds every secret 1-7. A split held out of the 70 rows took one secret's
    10 copies whole (data.dedup=split), so the GRPO demo's end-of-run eval played only the secret it never
    trained on, and scored 0 while its steps scored ~0.2."""
    from hydratune.components.runtime.run import Components

    loaded = Components.from_config(compose_cfg("recipe=grpo", "data=demo_agent")).data.load()
    assert sorted(set(loaded.splits[split]["answer"]), key=int) == [str(n) for n in range(1, 8)]


def test_the_agent_demo_transcripts_are_games_the_environment_plays_the_same() -> None:
    """demo/agent_sft.jsonl (the warm start): each transcript's guesses, replayed in the GuessingGame with its
    secret, get the transcript's answers and find the secret within recipe.max_tool_calls=3; every first guess
    1-7 is there, and only 4 wins every secret (the choice GRPO has to learn)."""
    import json
    from collections import Counter

    from hydratune.components.agent_tools import GuessingGame
    from hydratune.components.config.resolvers import ASSETS

    firsts: Counter[int] = Counter()
    for line in (ASSETS / "demo" / "agent_sft.jsonl").read_text().splitlines():
        messages = json.loads(line)["messages"]
        game = GuessingGame()
        game.reset(answer=messages[-1]["content"])
        calls = [m for m in messages if m.get("tool_calls")]
        replies = [m["content"] for m in messages if m["role"] == "tool"]
        guesses = [m["tool_calls"][0]["function"]["arguments"]["number"] for m in calls]
        assert [game.guess(number=n) for n in guesses] == replies and replies[-1] == "correct"
        assert len(guesses) <= 3 and game.get_reward() == 1.0
        firsts[guesses[0]] += 1
    assert sorted(firsts) == list(range(1, 8)) and firsts[4] == 7 and sum(firsts.values()) == 37


def test_the_guessing_game_bench_walks_the_game_the_environment_plays() -> None:
    """bench/guessing_game.py's exact reward (docs/agents.md): its game tree replies as GuessingGame does,
    so a policy that halves finds every secret in 3 guesses and, in 2, only 2, 4 and 6; a policy that
    guesses 1-7 at random finds a secret in 3 with 1 - (6/7)^3."""
    import sys
    from pathlib import Path

    from hydratune.components.agent_tools import GuessingGame

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from guessing_game import answer, finds

    def halving(history: tuple) -> list[float]:
        low, high = 1, 7
        for number, reply in history:
            low, high = (number + 1, high) if reply == "higher" else (low, number - 1)
        return [1.0 if n == (low + high) // 2 else 0.0 for n in range(1, 8)]

    game = GuessingGame()
    for secret in range(1, 8):
        game.reset(answer=str(secret))
        assert [answer(n, secret) for n in range(1, 8)] == [game.guess(number=n) for n in range(1, 8)]
    assert [finds(halving, s, 3) for s in range(1, 8)] == [1.0] * 7
    assert [finds(halving, s, 2) for s in range(1, 8)] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    uniform = [finds(lambda history: [1 / 7] * 7, s, 3) for s in range(1, 8)]
    assert uniform == pytest.approx([1 - (6 / 7) ** 3] * 7)
