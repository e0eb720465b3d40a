"""A LoRA reward model trained on an SFT run (``recipe=reward peft=lora model.from_run=<sft run>``) used where
a reward model is named: its run dir resolves through the chain (adapter run → its saved ``model.from_run`` →
the SFT run's final model) before load, and scores as trained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from tests.conftest import SHORT, _run_in
from tests.support.runs import as_cli_run

#: the reward model's few steps: 16 pairs, no eval split
REWARD = [
    "recipe=reward", "peft=lora", "data.max_samples=16", "data.eval_path=null", "data.eval_fraction=0",
    "train.micro_batch_size=4",
]  # fmt: skip


@pytest.fixture(scope="module")
def reward_lora(sft_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA reward run (2 steps) on the session's full SFT run, with a CLI run's files."""
    root = tmp_path_factory.mktemp("reward_lora")
    overrides = [*SHORT, *REWARD, f"model.from_run={sft_runs['full']}"]
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        fn = lambda *o: compose(config_name="config", overrides=list(o))  # noqa: E731
        ctx, _ = _run_in(root, fn, *overrides, name="rm")
        path = as_cli_run(ctx, overrides)
    GlobalHydra.instance().clear()
    final = path / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "config.json").exists()
    return path


def test_a_lora_reward_run_on_an_sft_run_passes_the_checks_and_scores(compose_cfg, reward_lora) -> None:
    from hydratune.components.rewards import RewardModel
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    for recipe in (["recipe=ppo"], ["recipe=best_of_n"]):
        cfg = compose_cfg(*recipe, f"recipe.reward.model={reward_lora}")
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
