"""GRPO on TRL's GRPOTrainer with the tiny model: the reference is built without a hub, bad settings are
refused before load (that the reward rises: tests/learning/test_rl_learns.py)."""

from __future__ import annotations

import pytest
import torch

from components.config.errors import ConfigError
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
    from components.model import CausalLM

    monkeypatch.setattr(CausalLM, "build", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ConfigError) as info:
        run_recipe("recipe=grpo", *overrides)
    assert info.value.key == key, info.value
