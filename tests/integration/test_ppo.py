"""PPO: the algorithm's pieces against hand-computed values, then the recipe end to end on the tiny model
(that it raises a reward: tests/learning/test_rl_learns.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hydratune.components.config.errors import ConfigError
from hydratune.components.rl import ppo_parts as ppo
from tests.support import rewards
from tests.support.rl import FAST_PPO, PER_ITERATION
from tests.support.runs import assert_base_untouched


# ---------------------------------------------------------------------------------------- the pieces
def test_gae_matches_a_hand_computation() -> None:
    # 3 real tokens + 1 padding token whose reward / value must be ignored; gamma 0.9, lam 0.8
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0]])
    values = torch.tensor([[0.5, 0.4, 0.6, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = ppo.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # deltas: d2 = 1 + 0.9*0 - 0.6 = 0.4; d1 = 0 + 0.9*0.6 - 0.4 = 0.14; d0 = 0 + 0.9*0.4 - 0.5 = -0.14
    a2 = 0.4
    a1 = 0.14 + 0.9 * 0.8 * a2  # 0.428
    a0 = -0.14 + 0.9 * 0.8 * a1  # 0.16816
    torch.testing.assert_close(adv, torch.tensor([[a0, a1, a2, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[a0 + 0.5, a1 + 0.4, a2 + 0.6, 0.0]]))


def test_whiten_uses_only_masked_entries() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -50.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    out = ppo.whiten(x, mask)
    kept = out[mask.bool()]
    assert kept.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert kept.std().item() == pytest.approx(1.0, abs=1e-5)
    # masked entries 1..5: mean 3, unbiased variance 2.5
    torch.testing.assert_close(kept, (torch.tensor([1.0, 2, 3, 4, 5]) - 3) / math.sqrt(2.5))
    assert out[~mask.bool()].eq(0).all()
    unshifted = ppo.whiten(x, mask, shift_mean=False)[mask.bool()]
    assert unshifted.mean().item() == pytest.approx(3.0, abs=1e-5)


def test_policy_loss_clips_the_ratio() -> None:
    mask = torch.ones(1, 1)
    # ratio 1.5 > 1 + 0.2 with advantage +2: the clipped term -2 * 1.2 = -2.4 is the larger (used)
    loss, clipfrac = ppo.policy_loss(
        torch.tensor([[math.log(1.5)]]), torch.zeros(1, 1), torch.tensor([[2.0]]), mask, 0.2
    )
    assert loss.item() == pytest.approx(-2.4) and clipfrac.item() == 1.0
    # ratio 0.5 with advantage +2: unclipped -1.0 > clipped -1.6, no clipping
    loss, clipfrac = ppo.policy_loss(
        torch.tensor([[math.log(0.5)]]), torch.zeros(1, 1), torch.tensor([[2.0]]), mask, 0.2
    )
    assert loss.item() == pytest.approx(-1.0) and clipfrac.item() == 0.0
    # ratio 1.5 with advantage -1: the pessimistic unclipped term 1.5 is kept
    loss, clipfrac = ppo.policy_loss(
        torch.tensor([[math.log(1.5)]]), torch.zeros(1, 1), torch.tensor([[-1.0]]), mask, 0.2
    )
    assert loss.item() == pytest.approx(1.5) and clipfrac.item() == 0.0
    # both tokens together, and a masked third one that would dominate if counted
    new, adv = torch.tensor([[math.log(1.5), math.log(0.5), 5.0]]), torch.tensor([[2.0, 2.0, 100.0]])
    loss, clipfrac = ppo.policy_loss(new, torch.zeros(1, 3), adv, torch.tensor([[1, 1, 0]]), 0.2)
    assert loss.item() == pytest.approx((-2.4 - 1.0) / 2) and clipfrac.item() == pytest.approx(0.5)


def test_value_loss_clips_the_update() -> None:
    mask = torch.ones(1, 1)
    # old 0, new 1, return 1, clip 0.2: clipped value 0.2 has error 0.64 > 0 -> 0.5 * 0.64
    loss, clipfrac = ppo.value_loss(torch.ones(1, 1), torch.zeros(1, 1), torch.ones(1, 1), mask, 0.2)
    assert loss.item() == pytest.approx(0.32) and clipfrac.item() == 1.0
    # a move within the clip range: both errors are (0.1 - 1)^2 = 0.81
    loss, clipfrac = ppo.value_loss(torch.full((1, 1), 0.1), torch.zeros(1, 1), torch.ones(1, 1), mask, 0.2)
    assert loss.item() == pytest.approx(0.405) and clipfrac.item() == 0.0


def test_kl_estimators() -> None:
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert ppo.kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))  # log p - log q
    # k3 = (q/p - 1) - log(q/p) = (0.5 - 1) - log 0.5
    assert ppo.kl_penalty(logp, ref, "k3").item() == pytest.approx(-0.5 + math.log(2))
    assert ppo.kl_penalty(logp, logp, "k1").item() == 0.0 and ppo.kl_penalty(logp, logp, "k3").item() == 0.0
    # k3 is never negative, k1 is when the reference is likelier
    assert ppo.kl_penalty(ref, logp, "k1").item() < 0 < ppo.kl_penalty(ref, logp, "k3").item()
    with pytest.raises(ValueError):
        ppo.kl_penalty(logp, ref, "k2")


def test_per_token_rewards_put_the_score_on_the_last_real_token() -> None:
    kl = torch.tensor([[0.1, 0.2, 0.3, 9.0]])
    out = ppo.per_token_rewards(torch.tensor([1.0]), kl, torch.tensor([[1, 1, 1, 0]]), kl_coef=0.5)
    torch.testing.assert_close(out, torch.tensor([[-0.05, -0.1, -0.15 + 1.0, 0.0]]))


def test_adaptive_kl_controller_moves_towards_the_target() -> None:
    ctl = ppo.AdaptiveKLController(0.1, target=1.0, horizon=100)
    ctl.update(current_kl=2.0, n_steps=10)  # KL too high: error clipped to +0.2 -> x(1 + 0.2 * 10/100)
    assert ctl.value == pytest.approx(0.1 * 1.02)
    ctl.update(current_kl=0.5, n_steps=10)  # KL too low: error -0.5 clipped to -0.2 -> x0.98
    assert ctl.value == pytest.approx(0.1 * 1.02 * 0.98)
    fixed = ppo.FixedKLController(0.1)
    fixed.update(5.0, 10)
    assert fixed.value == 0.1


def test_missing_eos_penalty_only_hits_truncated_responses() -> None:
    response = torch.tensor([[5, 2, 7, 8], [5, 6, 7, 8]])  # EOS = 2 in the first row only
    out, mask, has_eos = ppo.truncate_after_eos(response, [2], pad_id=3)
    assert out.tolist() == [[5, 2, 3, 3], [5, 6, 7, 8]]  # everything after the first EOS is padding
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]  # the EOS itself is a real token
    assert has_eos.tolist() == [True, False]
    scores = ppo.apply_missing_eos_penalty(torch.tensor([1.0, 1.0]), has_eos, -1.0)
    assert scores.tolist() == [1.0, 0.0]
    assert ppo.apply_missing_eos_penalty(torch.tensor([1.0, 1.0]), has_eos, None).tolist() == [1.0, 1.0]


def test_running_moments_match_the_batch_statistics() -> None:
    moments, a, b = ppo.RunningMoments(), torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 20.0])
    moments.update(a)
    moments.update(b)
    both = torch.cat([a, b])
    assert moments.mean == pytest.approx(both.mean().item())
    assert moments.std == pytest.approx(both.std(unbiased=False).item())


@pytest.fixture(scope="module")
def tiny():
    from hydratune.components.config.resolvers import asset
    from hydratune.components.model import CausalLM

    torch.manual_seed(0)
    spec = CausalLM(name_or_path=asset("tiny"), init="random")
    return spec.build().eval(), spec.build_tokenizer()


def test_rollout_pads_left_and_restores_the_tokenizer(tiny) -> None:
    model, tok = tiny
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
        for c in ("What is 1 + 2?", "What is 12 + 34 and then some more words?")
    ]
    torch.manual_seed(0)
    ro = ppo.rollout(model, tok, prompts, max_new_tokens=4)
    assert tok.padding_side == "right"  # training padding is untouched
    assert ro.query_mask[0, 0] == 0 and ro.query[0, 0] == tok.pad_token_id  # the short prompt is padded left
    assert ro.query_mask[:, -1].eq(1).all()  # every prompt ends where generation starts
    assert ro.response.shape == ro.response_mask.shape and ro.response.shape[1] <= 4


def test_log_probs_do_not_depend_on_left_padding(tiny) -> None:
    model, tok = tiny
    ids = torch.tensor([[7, 8, 9, 10, 11, 12]])
    alone, _, _ = ppo.sequence_logprobs(model, ids, torch.ones_like(ids), 3)
    padded = torch.cat([torch.full((1, 3), tok.pad_token_id), ids], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    shifted, entropy, _ = ppo.sequence_logprobs(model, padded, mask, 3)
    torch.testing.assert_close(shifted, alone, atol=1e-4, rtol=1e-4)
    assert entropy.shape == (1, 3) and (entropy > 0).all()


# ------------------------------------------------------------------------------------------ the recipe
def test_ppo_with_lora_keeps_no_reference_copy_and_trains_only_adapter_and_head(
    run_recipe, monkeypatch
) -> None:
    import gc

    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    def no_copy(model):
        raise AssertionError("a reference copy of the weights was made under PEFT")

    def llama_models() -> int:
        gc.collect()
        return sum(isinstance(o, LlamaForCausalLM) for o in gc.get_objects())

    base_models: list[int] = []
    disable, before = PeftModel.disable_adapter, llama_models()  # other tests' models may be alive

    def counting_disable(self):
        if not base_models:  # once: how many Llama models the run holds while the reference is evaluated
            base_models.append(llama_models() - before)
        return disable(self)

    monkeypatch.setattr(ppo, "frozen_copy", no_copy)
    monkeypatch.setattr(PeftModel, "disable_adapter", counting_disable)
    # one iteration: a rollout, the reference's log-probs (through disable_adapter) and the updates of the
    # adapter and the value head, which is all this test looks at
    ctx, _ = run_recipe(*FAST_PPO, "peft=lora", "recipe.num_iterations=1", name="ppo_lora")
    assert base_models == [1]  # the reference ran through disable_adapter() on the one and only model
    final = ctx.run_dir.final
    adapter = load_file(final / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter) and not (final / "model.safetensors").exists()
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)
    head = load_file(final / "value.safetensors")
    assert head["weight"].abs().sum() > 0  # the value head (zero at the start) was trained
    assert_base_untouched(ctx)


def test_ppo_against_a_trained_reward_model_with_a_critic_from_it(run_recipe, tmp_path, monkeypatch) -> None:
    import copy

    # a reward model trained 2 steps on 16 pairs, no eval split: scores of its own, not an untrained head's
    rm, _ = run_recipe(
        "recipe=reward", "train.max_steps=2", "train.save_every=0", "train.eval_every=0",
        "data.max_samples=16", "data.eval_path=null", "data.eval_fraction=0", "train.micro_batch_size=4",
        name="rm",
    )  # fmt: skip
    built = []  # the critic as the loop built it, before any update

    def keep_initial(*args, **kwargs):
        critic = separate_critic(*args, **kwargs)
        built.append(copy.deepcopy(critic).eval())
        return critic

    separate_critic = ppo.separate_critic
    monkeypatch.setattr(ppo, "separate_critic", keep_initial)
    chained = f"recipe.reward.model=${{latest_run:reward,{tmp_path}/outputs}}"
    ctx, _ = run_recipe(
        *FAST_PPO,
        chained,
        "recipe.num_iterations=2",
        "recipe.value_model=separate",
        "recipe.adaptive_kl=true",
        "recipe.kl_estimator=k3",
        "recipe.reward_normalization=true",
        "recipe.target_kl=0.01",
        "recipe.kl_horizon=10",
        name="ppo_rm",
    )
    records = ctx.run_dir.read_metrics()
    # the first iteration's KL is 0 (policy == reference), below target_kl: the coefficient shrinks
    assert records[1]["kl_coef"] < records[0]["kl_coef"]
    assert all(math.isfinite(r["loss/value"]) and math.isfinite(r["reward/mean"]) for r in records)
    assert records[0]["reward/std"] > 0  # real-valued scores from the reward model, not 0/1 matches
    # the critic started from the reward model's trunk and score head
    from safetensors.torch import load_file

    critic = load_file(ctx.run_dir.final / "value.safetensors")
    start = load_file(rm.run_dir.final / "model.safetensors")
    assert critic.keys() == start.keys()
    # ... in numbers: the critic's first value predictions are the reward model's scores. The value at the
    # last token of prompt + completion is read where critic_values reads it (one dummy token appended).
    from hydratune.components.rewards import RewardModel

    (initial,) = built
    reward = RewardModel(str(rm.run_dir.final))
    prompts = ["What is 1 + 2?", "What is 12 + 34?", "What is 5 + 5?"]
    completions = ["3", "46", "I do not know"]
    scores = torch.tensor(reward(prompts, completions))
    values = []
    for prompt, completion in zip(prompts, completions, strict=True):
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        text = reward.tokenizer.apply_chat_template(messages, tokenize=False)
        ids = reward.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        ids = torch.cat([ids, ids[:, :1]], dim=1)
        with torch.no_grad():
            values.append(ppo.critic_values(initial, ids, torch.ones_like(ids), 1)[0, 0])
    torch.testing.assert_close(torch.stack(values), scores, atol=1e-4, rtol=1e-4)
    # and the reward model's scores are its own: they differ from each other and from an untrained init
    rm.seed_everything()
    untrained = rm.components.model.build(task="seq_cls").eval()
    untrained.config.pad_token_id = reward.tokenizer.pad_token_id
    reward.model = untrained
    assert scores.std() > 0 and (scores - torch.tensor(reward(prompts, completions))).abs().max() > 1e-3


def test_ppo_refuses_the_wrong_data_and_bad_knobs_before_load(run_recipe, tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        run_recipe("recipe=ppo", "data=demo_sft")
    assert info.value.key == "data" and "demo_ppo" in str(info.value)
    with pytest.raises(ConfigError) as info:
        run_recipe("recipe=ppo", "recipe.kl_estimator=k2")
    assert info.value.key == "recipe.kl_estimator"
    with pytest.raises(ConfigError) as info:
        run_recipe("recipe=ppo", "recipe.reward.model=/nonexistent/run")
    assert info.value.key == "recipe.reward.model"
    for overrides, key in (
        (["strategy=zero2", "recipe.value_model=separate"], "recipe.value_model"),  # one engine
        (["strategy=zero2", "train.micro_batch_size=5"], "recipe.mini_batch_size"),
    ):
        with pytest.raises(ConfigError) as info:
            run_recipe("recipe=ppo", *overrides)
        assert info.value.key == key, overrides
    # a whole checkpoint of another recipe (a trainer's) is not one PPO can continue from
    from hydratune.components.runtime.checkpoint import mark_complete

    other = tmp_path / "sft" / "checkpoints" / "checkpoint-1"
    other.mkdir(parents=True)
    (other / "model.safetensors").write_bytes(b"weights")
    mark_complete(other, 1)
    with pytest.raises(ConfigError) as info:
        run_recipe(*FAST_PPO, "recipe.num_iterations=1", f"resume={other}")
    assert info.value.key == "resume" and "loop_state.pt" in str(info.value)


def test_ppo_is_deterministic_on_cpu_and_writes_its_run_dir(run_recipe) -> None:
    def ppo(name: str):
        ctx, _ = run_recipe(*FAST_PPO, "recipe.num_iterations=2", "train.save_every=2", name=name)
        return ctx

    def metrics(ctx) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "time"} for r in ctx.run_dir.read_metrics()]

    a, b = ppo("a"), ppo("b")
    assert metrics(a) == metrics(b)
    # what a PPO run leaves (that it raises a reward: tests/learning/test_rl_learns.py)
    records = a.run_dir.read_metrics()
    assert len(records) == 2
    assert all(math.isfinite(r["kl"]) and math.isfinite(r["loss"]) for r in records)
    for key in (*PER_ITERATION, "reward/std", "kl_coef", "eos_fraction", "approx_kl", "lr"):
        assert key in records[-1], key
    run = a.run_dir.path
    assert (run / "final" / "model.safetensors").is_file() and (run / "final" / "value.safetensors").is_file()
    assert (run / "checkpoints" / "checkpoint-2" / "hydratune_complete.json").is_file()
    result = json.loads((run / "result.json").read_text())
    assert result["run"]["recipe"] == "ppo" and "reward/mean" in result["final metrics"]
    assert (run / "summary.md").is_file()


def test_ppo_metrics_reach_the_configured_trackers(run_recipe) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ctx, _ = run_recipe(
        *FAST_PPO, "recipe.num_iterations=3", "tracker=[tensorboard,jsonl]", name="ppo_tracked"
    )
    run, records = ctx.run_dir.path, ctx.run_dir.read_metrics()
    (events,) = (run / "tensorboard").glob("events.out.tfevents.*")
    board = EventAccumulator(str(events))
    board.Reload()
    rows = [json.loads(line) for line in (run / "tracker.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["run"] == ctx.run_name for r in rows)
    for key in PER_ITERATION:
        scalars = board.Scalars(key)
        assert [s.step for s in scalars] == [1, 2, 3], key  # the iteration is the step
        expected = [r[key] for r in records]  # the same numbers as metrics.jsonl
        assert [s.value for s in scalars] == pytest.approx(expected, rel=1e-6, abs=1e-7), key
        assert [r[key] for r in rows] == expected, key


@pytest.mark.parametrize(
    "extra",
    [
        ["recipe.adaptive_kl=true", "recipe.target_kl=0.01", "recipe.reward_normalization=true"],
        ["peft=lora", "recipe.value_model=separate"],  # an adapter and a critic folder to reload
    ],
    ids=["full", "lora_critic"],
)
def test_ppo_interrupted_and_resumed_matches_an_uninterrupted_run(run_recipe, extra) -> None:
    """4 iterations straight, versus SIGTERM during iteration 2 (checkpoint, stop) then resume=<run dir>:
    the resumed iterations 3-4 log the same numbers and end with the same weights, bit for bit on CPU
    (weights, optimizer, cosine schedule, RNG states, KL controller, reward moments, prompt order)."""
    from safetensors.torch import load_file

    from hydratune.components.config.errors import Interrupted

    common = [*FAST_PPO, *extra, "recipe.num_iterations=4"]
    common += ["recipe.reward._target_=tests.support.rewards.brevity"]
    full, _ = run_recipe(*common, name="straight")
    rewards.CALLS["n"] = 0
    interrupted = [*common, "recipe.reward._target_=tests.support.rewards.brevity_then_sigterm"]
    with pytest.raises(Interrupted):
        run_recipe(*interrupted, name="cut")
    cut = full.run_dir.path.parent / "cut"
    assert [r["step"] for r in map(json.loads, (cut / "metrics.jsonl").open())] == [1, 2]
    assert (cut / "checkpoints" / "checkpoint-2" / "hydratune_complete.json").is_file()
    summary = (cut / "summary.md").read_text()
    assert "stopped by SIGTERM at step 2" in summary and f"hydratune resume={cut}" in summary
    # resumed with the cut run's config (resume refuses another reward): its SIGTERM fired on call 2 only
    resumed, _ = run_recipe(*interrupted, f"resume={cut}", name="resumed")

    def numbers(ctx) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "time"} for r in ctx.run_dir.read_metrics()]

    assert [r["step"] for r in numbers(resumed)] == [3, 4]
    assert numbers(resumed) == numbers(full)[2:]
    run = json.loads((resumed.run_dir.path / "result.json").read_text())["run"]
    assert run["resumed from"].endswith("checkpoint-2")
    assert run["iterations run"].startswith("iterations 3 to 4 (1 to 2 are in ")
    for final in sorted(p.name for p in full.run_dir.final.glob("*.safetensors")):
        a, b = load_file(full.run_dir.final / final), load_file(resumed.run_dir.final / final)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), final


def test_frozen_models_under_zero3_offload_get_an_inference_config(compose_cfg) -> None:
    """The second DeepSpeed plugin (reference / reward model): ZeRO-3 with the trained model's parameter
    offload, but no optimizer, no optimizer offload, no accumulation; DeepSpeed accepts it."""
    from hydratune.components.runtime.run import Components, batch_plan
    from hydratune.components.strategy import validate_deepspeed_config

    cfg = compose_cfg("recipe=ppo", "strategy=zero3_offload", "train.gradient_accumulation_steps=4")
    comps = Components.from_config(cfg)
    plan = batch_plan(cfg, comps, "cuda")
    trained, frozen = (
        comps.strategy.deepspeed_config(plan, "cuda"),
        comps.strategy.inference_config(plan, "cuda"),
    )
    assert "optimizer" in trained and "offload_optimizer" in trained["zero_optimization"]
    assert "optimizer" not in frozen and "offload_optimizer" not in frozen["zero_optimization"]
    assert frozen["zero_optimization"]["stage"] == 3
    assert frozen["zero_optimization"]["offload_param"] == trained["zero_optimization"]["offload_param"]
    assert frozen["gradient_accumulation_steps"] == 1 and trained["gradient_accumulation_steps"] == 4
    assert frozen["train_batch_size"] == plan.micro_batch_size * plan.world_size
    validate_deepspeed_config(frozen)


def test_ppo_under_fsdp_passes_cpu_checks_and_refuses_what_its_loop_does_not_do(
    compose_cfg, monkeypatch
) -> None:
    """PPO shards with fully_shard itself, so FSDP passes the checks on CPU (the trainer recipes still need
    a GPU); what its loop does not do is refused, not ignored, on a GPU host too (its detection patched
    where ``Strategy.resolve_device`` looks it up): fp16 (no sharded loss scaling), FSDP's activation
    checkpointing, sharded checkpoints."""
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components
    from hydratune.components.strategy import core

    cfg = compose_cfg("recipe=ppo", "strategy=fsdp", "launcher.nproc_per_node=2")
    assert check_before_load(cfg, Components.from_config(cfg)) == "cpu"
    monkeypatch.setattr(core, "detect_device", lambda requested="auto": "cuda")
    for override, key in (
        ("precision=fp16", "precision"),
        ("strategy.activation_checkpointing=true", "strategy.activation_checkpointing"),
        ("strategy.state_dict_type=SHARDED_STATE_DICT", "strategy.state_dict_type"),
    ):
        cfg = compose_cfg("recipe=ppo", "strategy=fsdp", override)
        comps = Components.from_config(cfg)
        assert comps.strategy.resolve_device() == "cuda"
        with pytest.raises(ConfigError) as info:
            check_before_load(cfg, comps)  # the strategy's loop_refusal, for a recipe owning its loop
        assert info.value.key == key and "a loop we own (recipe=ppo)" in str(info.value), override


# ------------------------------------------------------------- tests that fail when PPO itself breaks


def test_ppo_kl_penalty_keeps_the_policy_near_the_reference(run_recipe) -> None:
    """Same seed, same steps, kl_coef=0 versus 1: the penalised policy stays much closer to the reference
    (fails when ``per_token_rewards`` drops ``-kl_coef * kl``: the two runs are then identical)."""

    def late_kl(coef: str) -> list[float]:
        ctx, _ = run_recipe(
            *FAST_PPO, "recipe.num_iterations=10", f"recipe.kl_coef={coef}", "recipe.missing_eos_penalty=0",
            "recipe.reward._target_=tests.support.rewards.brevity", name=f"kl_{coef}",
        )  # fmt: skip
        return [r["kl"] for r in ctx.run_dir.read_metrics()[-4:]]  # iterations 7-10

    free, held = late_kl("0"), late_kl("1.0")
    # measured (seed 42): mean KL of iterations 7-10, 1.15 without the penalty, 0.19 with it
    assert sum(held) < 0.5 * sum(free), (held, free)


def test_ppo_advantages_subtract_the_value_baseline(run_recipe) -> None:
    """A constant reward of 1: the value head learns it, so GAE's advantages (returns - values) shrink
    towards 0 while the returns stay near 1 (fails when GAE ignores the values, i.e. Monte-Carlo returns
    as advantages: advantages == returns)."""
    ctx, _ = run_recipe(
        *FAST_PPO, "recipe.num_iterations=4", "recipe.missing_eos_penalty=0",
        "recipe.reward._target_=tests.support.rewards.constant", name="baseline",
    )  # fmt: skip
    records = ctx.run_dir.read_metrics()
    for r in records:  # GAE's identity on every iteration's rollout
        assert r["advantages/mean"] == pytest.approx(r["returns/mean"] - r["values/mean"], abs=1e-4), r
    first, last = records[0], records[-1]
    assert first["values/mean"] == 0.0  # the head starts at V = 0: advantages = returns, once
    # measured (seed 42): values 0 -> 0.54, advantages 0.84 -> 0.37, returns 0.84 -> 0.91
    assert last["values/mean"] > 0.3 and last["returns/mean"] > 0.7, last
    assert last["advantages/mean"] < 0.6 * first["advantages/mean"], (first, last)


def test_ppo_clips_the_policy_ratio_over_several_epochs(run_recipe) -> None:
    """Four epochs over each rollout at lr 1e-3: the policy's ratio leaves [1 - eps, 1 + eps], the clipped
    term is used (clipfrac > 0), and a tight clip range moves the policy less than a loose one (fails when
    ``policy_loss`` loses its clipped branch: clipfrac 0, and the two runs identical)."""

    def moved(clip: str) -> list[dict]:
        ctx, _ = run_recipe(
            *FAST_PPO, "recipe.num_iterations=2", "recipe.ppo_epochs=4", f"recipe.clip_ratio={clip}",
            "recipe.reward._target_=tests.support.rewards.brevity", name=f"clip_{clip}",
        )  # fmt: skip
        return ctx.run_dir.read_metrics()

    tight, loose = moved("0.05"), moved("0.5")
    assert max(r["clipfrac/policy"] for r in tight) > 0.05, tight
    # how far the policy went during iteration 1's update: approx_kl to the rollout's policy (averaged
    # over the update's mini-batches) and the KL to the reference that iteration 2 measures
    # measured (seed 42): clipfrac 0.58 / 0.54; approx_kl 0.028 vs 0.072; kl 0.198 vs 0.276
    assert tight[0]["approx_kl"] < 0.6 * loose[0]["approx_kl"], (tight[0], loose[0])
    assert tight[1]["kl"] < 0.9 * loose[1]["kl"], (tight[1], loose[1])
