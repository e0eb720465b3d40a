"""GRPO with ``recipe.tools`` on the tiny model: TRL's tool loop runs the wrapped tools, and what is
trained is only the model's own tokens (its tool call and its answer), never the tool's result: the loss
mask of real episodes decoded. The policy's generation is scripted (a random-init model emits no tool
call): the tool loop, the tools, the template and the loss mask are the real ones."""

from __future__ import annotations

import re

import pytest
import torch

from hydratune.components.tools import marked_episode
from tests.support.rl import FAST_GRPO

TOOLS = [
    *FAST_GRPO,
    "recipe.tools=[tests.support.tools.add,tests.support.tools.boom]",
    "model.chat_template=qwen2_5",
    "data.max_prompt_length=1024",  # the tools' schemas are in every prompt
    "recipe.num_generations=4",
    "train.micro_batch_size=8",
    "recipe.max_completion_length=256",
    "train.max_steps=1",
    "recipe.max_tool_calls=1",
    # the qwen2_5 system prompt and the tools' schemas are ~650 of the tiny tokenizer's tokens; TRL drops a
    # tool result that would take the episode past the model's max_position_embeddings (256 in its config)
    "+model.architecture.max_position_embeddings=2048",
]


def script(prompt: str, tool_result: str | None, boom: bool) -> str:
    """The scripted policy: for 'What is X + Y?' a call of add(X, Y) (or of boom(X)), then the tool's result
    as the answer (after an error: the same call again, which recipe.max_tool_calls=1 leaves unanswered)."""
    if tool_result is not None and not tool_result.startswith("error"):
        return f"{tool_result}<|im_end|>"
    x, y = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1])
    name = "boom" if boom else "add"
    arguments = f'{{"a": {x}}}' if boom else f'{{"a": {x}, "b": {y}}}'
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'


def run_scripted(run_recipe, monkeypatch, overrides, policy, name):
    """A GRPO run whose generation is ``policy(prompt text, last tool result or None, index)``: the run's
    context and each step's batch as TRL hands it to the loss."""
    from trl import GRPOTrainer

    recorded: list[dict] = []
    score = GRPOTrainer._generate_and_score_completions

    def scripted(self, prompt_ids, images, fields, num_generations, has_tool_images=False):
        texts = [self._tokenizer.decode(ids) for ids in prompt_ids]
        results = [re.findall(r"<tool_response>\n(.*?)\n</tool_response>", t, re.S) for t in texts]
        replies = [
            policy(t, r[-1] if r else None, i) for i, (t, r) in enumerate(zip(texts, results, strict=True))
        ]
        return [self._tokenizer.encode(r, add_special_tokens=False) for r in replies], None

    def record(self, inputs):
        output = score(self, inputs)
        recorded.append({k: v.detach().clone() for k, v in output.items() if isinstance(v, torch.Tensor)})
        return output

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", scripted)
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", record)
    ctx, _ = run_recipe(*overrides, name=name)
    return ctx, recorded


def episodes(tokenizer, batch):
    """``(prompt text, marked episode)`` of each rollout of a batch: untrained spans in [[...]]."""
    trained = batch["completion_mask"] * batch["tool_mask"]  # what TRL's loss sums over
    prompts = tokenizer.batch_decode(batch["prompt_ids"], skip_special_tokens=False)
    rows = zip(prompts, batch["completion_ids"], trained, batch["completion_mask"], strict=True)
    for prompt, ids, mask, real in rows:
        n = int(real.sum())  # padded on the right
        yield prompt, marked_episode(tokenizer, ids[:n].tolist(), mask[:n].tolist())


def test_only_the_models_own_tokens_are_trained_and_tool_faults_are_counted(run_recipe, monkeypatch) -> None:
    ctx, recorded = run_scripted(
        run_recipe, monkeypatch, TOOLS, lambda text, result, i: script(text, result, i % 2 == 1), "grpo_tools"
    )
    tokenizer = ctx.trainer.processing_class
    [batch] = recorded
    seen: list[str] = []
    for prompt, episode in episodes(tokenizer, batch):
        x, y = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1])
        if '"name": "boom"' in episode:
            result = f"error: boom raised ZeroDivisionError: cannot divide {x} by zero"
            call = f'<tool_call>\n{{"name": "boom", "arguments": {{"a": {x}}}}}\n</tool_call><|im_end|>'
            answer = call  # called again: the limit (1 round) leaves it unanswered
        else:
            call = (
                f'<tool_call>\n{{"name": "add", "arguments": {{"a": {x}, "b": {y}}}}}\n</tool_call><|im_end|>'
            )
            result = answer = str(x + y)
            answer += "<|im_end|>"
        assert episode == (
            f"{call}[[\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n"
            f"<|im_start|>assistant\n]]{answer}"
        ), episode
        seen.append("boom" if "boom" in call else "add")
    assert sorted(set(seen)) == ["add", "boom"]  # both kinds of episode were decoded
    [logged] = [r for r in ctx.run_dir.read_metrics() if "tools/calls" in r]
    assert logged["tools/calls"] == len(seen) == 8
    assert logged["tools/errors_raised"] == seen.count("boom") and logged["tools/errors_timeout"] == 0
    import json

    summary = json.loads((ctx.run_dir.path / "result.json").read_text())["tools"]
    booms = seen.count("boom")
    assert summary["episodes"] == 8 and summary["cut by recipe.max_tool_calls"] == booms
    assert summary["tool calls per episode (mean, max)"] == f"{(8 + booms) / 8:.2f}, 2"
    assert summary["cut by length (a call left unanswered)"] == 0
    assert summary["tool errors"] == f"raised {booms}, not_a_string 0, timeout 0, bad_arguments 0"
    sample = summary["sample episode (untrained in [[...]])"]
    assert "\n" not in sample and sample.startswith("<tool_call>\\n")  # one line: a cell of summary.md
    assert "<tool_response>" in sample.split("[[")[1]  # the tool's response: in the untrained span


def test_a_stateful_environment_trains_a_fresh_instance_per_rollout_and_gives_the_reward(
    run_recipe, monkeypatch
) -> None:
    """recipe.environment: the Counter's step() is the episode's tool, get_reward() the only reward; TRL
    pools instances, yet each of 2 steps' rollouts sees a fresh one (its first episode)."""
    call = '<tool_call>\n{"name": "step", "arguments": {"by": 2}}\n</tool_call><|im_end|>'
    overrides = [*TOOLS, "recipe.tools=[]", "recipe.environment=tests.support.tools.Counter"]
    overrides += ["recipe.reward_funcs=[]", "train.max_steps=2"]
    ctx, recorded = run_scripted(
        run_recipe,
        monkeypatch,
        overrides,
        lambda text, result, i: call if result is None else f"{result}<|im_end|>",
        "grpo_env",
    )
    tokenizer = ctx.trainer.processing_class
    assert len(recorded) == 2
    for batch in recorded:
        for _, episode in episodes(tokenizer, batch):
            assert episode == (
                f"{call}[[\n<|im_start|>user\n<tool_response>\n2 (episode 1)\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n]]2 (episode 1)<|im_end|>"
            ), episode
    rewards = [r["reward"] for r in ctx.run_dir.read_metrics() if "reward" in r]
    assert rewards == [2.0, 2.0]  # the environment's count, the only reward


def test_a_tool_run_stopped_by_sigterm_resumes_with_its_tools(run_recipe, monkeypatch, tmp_path) -> None:
    """SIGTERM during step 2 (checkpoint, stop), then resume=<run dir>: step 3 runs the tool loop again
    (8 calls logged) and the summary counts the resumed part's episodes. The policy calls the environment's
    step(): no file of the checkpoint holds the environment (nothing of its module is pickled), and every
    episode of the resumed run gets a fresh one (its first episode, its count from 0)."""
    import json

    from hydratune.components.config.errors import Interrupted
    from tests.support import rewards

    overrides = [
        *TOOLS,
        "recipe.environment=tests.support.tools.Counter",
        "train.max_steps=3",
        "recipe.reward_funcs=[tests.support.rewards.brevity_then_sigterm]",
    ]
    call = '<tool_call>\n{"name": "step", "arguments": {"by": 2}}\n</tool_call><|im_end|>'

    def policy(text: str, result: str | None, i: int) -> str:
        return call if result is None else f"{result}<|im_end|>"

    rewards.CALLS["n"] = 0
    with pytest.raises(Interrupted):
        run_scripted(run_recipe, monkeypatch, overrides, policy, "cut")
    cut = tmp_path / "outputs" / "day" / "cut"
    checkpoint = cut / "checkpoints" / "checkpoint-2"
    assert (checkpoint / "hydratune_complete.json").is_file()
    files = [f for f in checkpoint.rglob("*") if f.is_file()]
    assert any(f.suffix in (".bin", ".pt", ".pth") for f in files)  # the pickles TRL and hydratune write
    assert [f.name for f in files if b"tests.support.tools" in f.read_bytes()] == []
    resumed, recorded = run_scripted(
        run_recipe, monkeypatch, [*overrides, f"resume={cut}"], policy, "resumed"
    )
    assert [r["step"] for r in resumed.run_dir.read_metrics() if "tools/calls" in r] == [3]
    [batch] = recorded
    for _, episode in episodes(resumed.trainer.processing_class, batch):
        assert episode.startswith(call) and episode.endswith("]]2 (episode 1)<|im_end|>"), episode
    result = json.loads((resumed.run_dir.path / "result.json").read_text())
    assert result["run"]["resumed from"].endswith("checkpoint-2") and result["tools"]["episodes"] == 8
