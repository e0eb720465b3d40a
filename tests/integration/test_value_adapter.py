"""PPO's critic as a second LoRA adapter on the policy's own base (``recipe.value_model=adapter``, issue 48):
each loss reaches only its own adapter (and the value head), never the base; the run trains, saves the critic
beside the policy's adapter (not in it) and resumes exactly."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from tests.conftest import _run_in, composed
from tests.support.rl import FAST_PPO

#: two iterations of 16 rollouts, a checkpoint after each
ADAPTER_PPO = [
    *FAST_PPO, "peft=lora", "recipe.value_model=adapter", "recipe.num_iterations=2",
    "recipe.rollout_batch_size=16", "recipe.mini_batch_size=8", "train.micro_batch_size=8",
    "train.save_every=1",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two iterations straight, and the same run resumed from the first one's checkpoint."""
    root = tmp_path_factory.mktemp("value_adapter")
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        straight, _ = _run_in(root, composed, *ADAPTER_PPO, name="straight")
        checkpoint = straight.run_dir.checkpoints / "checkpoint-1"
        resumed, _ = _run_in(root, composed, *ADAPTER_PPO, f"resume={checkpoint}", name="resumed")
    GlobalHydra.instance().clear()
    return {"straight": straight, "resumed": resumed}


def test_ppo_with_the_critic_adapter_trains_saves_it_apart_and_resumes_exactly(runs) -> None:
    from safetensors.torch import load_file

    straight, resumed = runs["straight"], runs["resumed"]
    records = straight.run_dir.read_metrics()
    assert [r["step"] for r in records] == [1, 2]
    assert all(torch.isfinite(torch.tensor([r["loss/value"], r["loss/policy"]])).all() for r in records)
    assert records[1]["values/mean"] != 0  # the critic moved from V = 0 (zero head, B = 0)
    final = straight.run_dir.final
    # final/: the policy's adapter alone; the critic (head + its adapter) in value.safetensors
    assert not (final / "critic").exists()
    policy = load_file(final / "adapter_model.safetensors")
    value = load_file(final / "value.safetensors")
    adapter = {k: v for k, v in value.items() if k.startswith("adapter.")}
    assert {k for k in value if not k.startswith("adapter.")} == {"head.weight", "head.bias"}
    assert {k.removeprefix("adapter.") for k in adapter} == set(policy)  # the same modules adapted
    assert value["head.weight"].abs().sum() > 0
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # trained from B = 0
    assert not any(torch.equal(adapter[f"adapter.{k}"], v) for k, v in policy.items() if "lora_B" in k)
    report = json.loads((straight.run_dir.path / "result.json").read_text())
    assert "a value LoRA adapter + value head on the policy's own base" in report["run"]["value model"]
    # resumed from checkpoint-1 (the critic adapter restored from value.safetensors): iteration 2 bit for bit

    def numbers(ctx: Any) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "time"} for r in ctx.run_dir.read_metrics()]

    assert numbers(resumed) == numbers(straight)[1:]
    for name in ("adapter_model.safetensors", "value.safetensors"):
        a, b = load_file(final / name), load_file(resumed.run_dir.final / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient_checkpointing"])
def test_each_loss_reaches_only_its_own_adapter_never_the_base(compose_cfg, checkpointing: bool) -> None:
    """The policy loss: the policy's adapter alone; the value loss: the critic's adapter and head alone; no
    gradient on a base weight; the policy computes as before the critic came on. Under gradient checkpointing
    too, whose backward runs each layer's forward again after the critic's adapter context has ended."""
    from peft import LoraConfig, get_peft_model

    from hydratune.components.rl import ppo_parts
    from hydratune.components.rl.value_adapter import CRITIC_ADAPTER, AdapterCritic
    from hydratune.components.runtime.run import Components

    torch.manual_seed(0)
    base = Components.from_config(compose_cfg()).model.build()
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    ids = torch.randint(3, 100, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        before = policy(input_ids=ids).logits
    critic = AdapterCritic(policy)
    policy.train()
    acc = SimpleNamespace(autocast=contextlib.nullcontext, unwrap_model=lambda m: m)
    model = ppo_parts.ActorCritic(policy, critic, "adapter", None, acc)
    _, _, values = model.forward(ids, mask, 4)
    assert torch.equal(values, torch.zeros_like(values))  # V = 0 at the start: zero head, B = 0
    with torch.no_grad():
        torch.testing.assert_close(policy(input_ids=ids).logits, before, rtol=0, atol=0)
        for p in [*critic.adapter_parameters(), *critic.head.parameters(), *policy.parameters()]:
            if p.requires_grad:  # every adapter's B and the head non-zero: gradients reach every part
                p.add_(torch.randn_like(p) * 0.1)
    named = {**{f"policy.{n}": p for n, p in policy.named_parameters()}}
    named.update({f"head.{n}": p for n, p in critic.head.named_parameters()})
    assert any(".critic." in n for n in named) and any(".default." in n for n in named)

    def gradients(loss_of: Any) -> dict[str, torch.Tensor]:
        """The gradients ``loss_of(logp, values)`` leaves, by parameter (None and all-zero ones left out)."""
        for p in named.values():
            p.grad = None
        logp, _, values = model.forward(ids, mask, 4)
        with torch.no_grad():  # the reference in between, as PPO computes it (peft's disable_adapter)
            model.reference_logprobs(ids, mask, 4)
        loss_of(logp, values).backward()
        return {n: p.grad.clone() for n, p in named.items() if p.grad is not None and p.grad.abs().sum() > 0}

    def policy_loss(logp: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return -logp.mean()

    def value_loss(logp: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return (values - 1).pow(2).mean()

    policy_part, value_part = gradients(policy_loss), gradients(value_loss)
    if checkpointing:  # the recomputed layers ran with the adapter of their forward: the same gradients
        layers = [m for m in policy.modules() if getattr(m, "gradient_checkpointing", False)]
        assert layers
        for layer in layers:
            layer.gradient_checkpointing = False
        for loss_of, got in ((policy_loss, policy_part), (value_loss, value_part)):
            plain = gradients(loss_of)
            assert plain.keys() == got.keys()
            for name in plain:
                torch.testing.assert_close(got[name], plain[name], rtol=0, atol=1e-6)
    default = {n for n in named if ".default." in n}
    own = {n for n in named if f".{CRITIC_ADAPTER}." in n} | {"head.weight", "head.bias"}
    assert set(policy_part) == default  # every policy LoRA matrix, nothing else
    assert set(value_part) == own  # every critic LoRA matrix and the head, nothing else
    assert not any(p.requires_grad for n, p in named.items() if "lora_" not in n and not n.startswith("head"))
    assert policy.active_adapter == "default" and policy.training
