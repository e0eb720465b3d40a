"""GRPO on TRL's GRPOTrainer with the tiny model: the reference is built without a hub, bad settings are
refused before load (that the reward rises: tests/learning/test_rl_learns.py)."""

from __future__ import annotations

import pytest
import torch

from hydratune.components.config.errors import ConfigError
from tests.support.rl import FAST_GRPO


def test_grpo_with_kl_on_a_random_init_policy_gets_its_reference_from_the_start_weights(run_recipe) -> None:
    # TRL rebuilds the reference from config._name_or_path, which a model built from a config lacks:
    # the recipe saves the starting weights and points the config there.
    ctx, _ = run_recipe(*FAST_GRPO, "recipe.beta=0.04", "train.max_steps=1", name="grpo_kl")
    reference = ctx.trainer.ref_model
    assert reference is not None and reference is not ctx.trainer.model
    ctx.seed_everything()
    start = ctx.components.model.build().state_dict()
    assert all(torch.equal(v, start[k]) for k, v in reference.state_dict().items())
    assert any("kl" in r for r in ctx.run_dir.read_metrics())


def test_grpo_with_lora_uses_the_adapter_free_policy_as_reference(run_recipe) -> None:
    ctx, _ = run_recipe(*FAST_GRPO, "peft=lora", "recipe.beta=0.04", "train.max_steps=1", name="grpo_lora")
    assert ctx.trainer.ref_model is None  # TRL disables the adapter instead of copying the weights
    assert (ctx.run_dir.final / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["data=demo_sft"], "data"),
        (["recipe.loss_type=ppo"], "recipe.loss_type"),
        (["recipe.scale_rewards=always"], "recipe.scale_rewards"),
        (["train.micro_batch_size=12"], "recipe.num_generations"),
        (["recipe.reward_funcs=[]"], "recipe.reward_funcs"),
        (["recipe.reward_model=/nonexistent/run"], "recipe.reward_model"),
    ],
)
def test_grpo_refuses_bad_settings_before_load(run_recipe, monkeypatch, overrides, key) -> None:
    from hydratune.components.model import CausalLM

    monkeypatch.setattr(CausalLM, "build", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ConfigError) as info:
        run_recipe("recipe=grpo", *overrides)
    assert info.value.key == key, info.value


def test_grpo_on_your_data_keeps_no_demo_length_and_applies_data_max_prompt_length(
    run_recipe, compose_cfg, tmp_path, monkeypatch
) -> None:
    """Your data.path: not the demo's max_completion_length 8 or max_prompt_length 64, and plan warns about
    the demo's lr and micro-batch kept. Prompts over data.max_prompt_length are dropped and counted (each
    kept one measures within it, chat template and generation prompt included: what TRL renders), and
    those left to cut (``on_overlong=truncate``, which GRPO cannot do) are refused before the model loads,
    in plan and training alike."""
    from hydratune.components.data.prepare import plan_data
    from hydratune.components.runtime.checks import warnings_for
    from hydratune.components.runtime.run import Components
    from hydratune.components.runtime.session import Session
    from tests.support.data import write_jsonl

    long = "Explain every step carefully. " * 30
    rows = [{"prompt": f"{i}+1?" + (long if i % 3 == 0 else ""), "answer": str(i + 1)} for i in range(24)]
    path = write_jsonl(tmp_path / "prompts.jsonl", rows)
    demo = compose_cfg("recipe=grpo")
    assert (demo.recipe.max_completion_length, demo.data.max_prompt_length) == (8, 64)
    cfg = compose_cfg("recipe=grpo", f"data.path={path}")
    assert (cfg.recipe.max_completion_length, cfg.data.max_prompt_length, cfg.data.on_overlong) == (
        256,
        256,
        "drop",
    )
    notes = warnings_for(cfg, Components.from_config(cfg))
    assert any("keeps the demo's optimizer.lr=0.001, train.micro_batch_size=32" in n for n in notes), notes
    tuned = compose_cfg("recipe=grpo", f"data.path={path}", "optimizer.lr=1e-6", "train.micro_batch_size=16")
    assert not any("keeps the demo's" in n for n in warnings_for(tuned, Components.from_config(tuned)))

    limit = ["data.max_prompt_length=64", "data.eval_fraction=0.0"]
    comps = Components.from_config(compose_cfg("recipe=grpo", f"data.path={path}", *limit))
    lines = plan_data(comps, 0)
    assert "# data: dropped (prompt over data.max_prompt_length): 8" in lines, lines
    assert "# data: train rows: 16" in lines
    tok = comps.model.build_tokenizer(convert=False)
    kept = comps.data.enforce_length(comps.data.load(), tok)["train"]
    assert len(kept) == 16 and all(
        len(tok.apply_chat_template(p, add_generation_prompt=True)) <= 64 for p in kept["prompt"]
    )
    assert sorted(int(a) - 1 for a in kept["answer"]) == [i for i in range(24) if i % 3]

    def loaded(*args: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(Session, "build_model", loaded)
    cut = [f"data.path={path}", *limit, "data.on_overlong=truncate"]
    with pytest.raises(ConfigError) as training:
        run_recipe(*FAST_GRPO, *cut, name="grpo_cut")
    comps = Components.from_config(compose_cfg("recipe=grpo", *cut))
    with pytest.raises(ConfigError) as plan:
        plan_data(comps, 0)
    assert training.value.key == plan.value.key == "data.on_overlong"
    assert "8 of 24 train (longest" in str(plan.value) and str(training.value) == str(plan.value)
