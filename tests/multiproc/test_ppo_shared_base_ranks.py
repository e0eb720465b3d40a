"""PPO with a LoRA reward run on the policy's own base and the critic as a third adapter on it
(``recipe.value_model=adapter``, issue 48) on 2 CPU ranks (DDP) equals one process.

The same seeds and the same 8 prompts (one draw: each rank takes every other one): greedy rollouts
(``recipe.top_k=1``), one iteration, two PPO epochs of one mini-batch each (rank: 4 rollouts, one process: 8;
the second step is the first to reach the critic's adapter, through the head the first one moved), no
whitening (a rank would whiten over its own half): the two ranks' averaged gradient is the one process's
(every response is the full 4 tokens, so each rank's token mean is half of the whole). Tolerance: 1e-5 on the
rewards and the trained weights (the batches pad differently, so float sums round differently; the trained
weights move by ~1e-3). One launch per layout. ZeRO-2 on 2 ranks (DeepSpeed trains one engine, so the critic
is the policy's value head there: ``recipe.value_model=adapter`` is refused) against one process with the same
value head: the reward adapter switched inside the engine, whose weights ZeRO-2 keeps whole. GRPO's reward
adapter on 2 DDP ranks scores as on one process (near-greedy: see its test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.cells import forked

#: one iteration, greedy, both layouts
SHARED = [
    "recipe=ppo", "peft=lora", "recipe.num_iterations=1", "recipe.ppo_epochs=2", "recipe.top_k=1",
    "recipe.whiten_advantages=false", "recipe.response_length=4", "train.eval_generations=0",
    "train.save_every=0", "train.log_every=1", "train.write_plots=false", "recipe.value_model=adapter",
]  # fmt: skip
TWO_RANKS = [
    "strategy=ddp", "launcher.nproc_per_node=2", "recipe.rollout_batch_size=4", "recipe.mini_batch_size=4",
    "train.micro_batch_size=4",
]  # fmt: skip
ONE_PROCESS = ["recipe.rollout_batch_size=8", "recipe.mini_batch_size=8", "train.micro_batch_size=8"]


@pytest.fixture(scope="module")
def layouts(warm, sft_runs, reward_lora, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ppo_shared_ranks")
    common = [*SHARED, f"model.from_run={sft_runs['full']}", f"recipe.reward.model={reward_lora}"]
    runs = {name: root / name for name in ("two", "one", "zero2", "one_head")}
    forked(warm, runs["two"], *common, *TWO_RANKS, what="PPO on 2 ranks")
    forked(warm, runs["one"], *common, *ONE_PROCESS, what="PPO on one process")
    head = [*common, "recipe.value_model=head"]  # DeepSpeed trains one engine: the critic is a head
    forked(warm, runs["zero2"], *head, *TWO_RANKS, "strategy=zero2", what="PPO on 2 ranks, ZeRO-2")
    forked(warm, runs["one_head"], *head, *ONE_PROCESS, what="PPO on one process, a value head")
    return runs


@pytest.mark.parametrize(("ranks", "alone"), [("two", "one"), ("zero2", "one_head")], ids=["ddp", "zero2"])
def test_ppo_with_the_reward_adapter_on_two_ranks_equals_one_process(layouts, ranks: str, alone: str) -> None:
    from safetensors.torch import load_file

    results = {k: json.loads((layouts[k] / "result.json").read_text()) for k in (ranks, alone)}
    for info in results.values():  # both put the reward adapter on their base
        assert "a LoRA adapter on the policy's base" in info["run"]["reward model"]
    (two,), (one,) = ([json.loads(x) for x in (layouts[k] / "metrics.jsonl").read_text().splitlines()]
                      for k in (ranks, alone))  # fmt: skip
    assert one["response_length"] == two["response_length"] == 4  # every response whole: equal token counts
    for key in (
        "reward/mean",
        "reward/std",
        "kl",
        "loss/policy",
        "loss/value",
        "values/mean",
        "returns/mean",
    ):
        assert abs(one[key] - two[key]) <= 1e-5, (key, one[key], two[key])
    assert one["reward/std"] > 0  # real scores from the reward adapter, not a constant
    for name in ("adapter_model.safetensors", "value.safetensors"):
        a, b = (load_file(layouts[k] / "final" / name) for k in (ranks, alone))
        assert a.keys() == b.keys() and a, name
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5, msg=key)
    policy, critic = (
        load_file(layouts[alone] / "final" / n) for n in ("adapter_model.safetensors", "value.safetensors")
    )
    assert any(v.abs().sum() > 0 for k, v in policy.items() if "lora_B" in k)  # the policy's adapter moved
    if ranks == "two":
        assert any(v.abs().sum() > 0 for k, v in critic.items() if "lora_B" in k)  # and the critic's
        assert "a value LoRA adapter + value head" in results[ranks]["run"]["value model"]
    else:
        assert "ZeRO-2" in results[ranks]["run"]["strategy"], results[ranks]["run"]


def test_grpo_with_the_reward_adapter_on_two_ranks_scores_as_one_process(
    warm, sft_runs, reward_lora, tmp_path
) -> None:
    """GRPO (TRL) with the reward adapter on the policy's base on 2 DDP ranks against one process, 2 steps.
    TRL samples with a seed of each rank's own, so the completions match one process's only near-greedy
    (temperature 1e-3): every group's rewards are then equal (no advantage, no update), and what is compared
    is the reward adapter's scoring of each rank's prompts, gathered."""
    from tests.support.rl import FAST_GRPO
    from tests.support.runs import read_jsonl

    common = [
        *FAST_GRPO, "peft=lora", f"model.from_run={sft_runs['full']}", f"recipe.reward_model={reward_lora}",
        "train.max_steps=2", "recipe.num_generations=4", "recipe.max_completion_length=6",
        "recipe.temperature=0.001", "train.write_plots=false",
    ]  # fmt: skip
    runs = {"two": tmp_path / "two", "one": tmp_path / "one"}
    forked(
        warm, runs["two"], *common, "strategy=ddp", "launcher.nproc_per_node=2", "train.micro_batch_size=8"
    )
    forked(warm, runs["one"], *common, "train.micro_batch_size=16")
    steps = {k: [r for r in read_jsonl(run / "metrics.jsonl") if "reward" in r] for k, run in runs.items()}
    assert [r["step"] for r in steps["two"]] == [r["step"] for r in steps["one"]] == [1, 2]
    for a, b in zip(steps["two"], steps["one"], strict=True):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-5)
        assert (
            a["reward_std"] == pytest.approx(b["reward_std"], abs=1e-5) and b["reward_std"] > 0
        )  # real scores
    for run in runs.values():
        info = json.loads((run / "result.json").read_text())
        assert "a LoRA adapter on the policy's base" in info["run"]["reward model"]
