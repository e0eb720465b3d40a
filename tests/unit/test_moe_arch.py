"""Mixtures of experts in the arithmetic (components/memory/arch.py): parameter counts equal transformers'
own models built on the meta device, the shipped MoE options give their published totals and active
parameters, LoRA's trainable count equals peft's, and the estimate names total and active parameters."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hydratune.components.memory.arch import Arch, param_counts
from hydratune.components.memory.spec import arch_of_model
from hydratune.components.peft import LoRA
from tests.support.data import REPO

TINY = dict(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3_moe": dict(
        intermediate_size=64, moe_intermediate_size=16, head_dim=8, num_experts=4, num_experts_per_tok=2
    ),
    "mixtral": dict(intermediate_size=24, num_local_experts=4, num_experts_per_tok=2),
    "olmoe": dict(intermediate_size=24, num_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(
        intermediate_size=24,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
    ),
}


def meta_model(model_type: str) -> tuple[Any, Any]:
    config = AutoConfig.for_model(model_type, **TINY, **SHAPES[model_type])
    with torch.device("meta"):
        return config, AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("model_type", sorted(SHAPES))
def test_total_and_active_parameters_equal_transformers(model_type: str) -> None:
    config, model = meta_model(model_type)
    counts = param_counts(Arch.from_dict(config.to_dict()))
    assert counts.total == sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)  # every layer's
    arch = Arch.from_dict(config.to_dict())
    idle = experts * (arch.num_experts - arch.experts_per_token) // arch.num_experts
    assert counts.active == counts.total - idle


@pytest.mark.parametrize(
    ("option", "total", "active"),
    [  # the model cards' figures (B, rounded); gpt-oss counts its active ones without the embedding
        ("qwen3_30b_a3b", 30.5, 3.3),
        ("mixtral_8x7b", 46.7, 12.9),
        ("olmoe_1b_7b", 6.9, 1.3),
        ("gpt_oss_20b", 20.9, 3.6),
    ],
)
def test_shipped_moe_options_give_the_published_sizes(
    compose_cfg, option: str, total: float, active: float
) -> None:
    arch = arch_of_model(compose_cfg(f"model={option}").model)
    counts = param_counts(arch)
    embedding = counts.embedding if option == "gpt_oss_20b" else 0
    assert counts.total / 1e9 == pytest.approx(total, rel=0.02)
    assert (counts.active - embedding) / 1e9 == pytest.approx(active, rel=0.02)


def test_the_tiny_moe_asset_is_a_mixture() -> None:
    arch = Arch.from_dict(json.loads((REPO / "components/assets/tiny_moe/config.json").read_text()))
    assert (arch.num_experts, arch.experts_per_token, arch.is_moe) == (8, 2, True)
    assert not Arch.from_dict(json.loads((REPO / "components/assets/tiny/config.json").read_text())).is_moe


@pytest.mark.parametrize(
    ("r", "targets", "parameters"),
    [
        (16, "all-linear", None),  # peft 0.21's all-linear reaches the router and every expert
        (8, ["q_proj", "v_proj"], ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
        (4, ["q_proj", "gate"], ["mlp.experts.down_proj"]),
    ],
)
def test_lora_on_experts_counts_what_peft_trains(r: int, targets: Any, parameters: Any) -> None:
    from peft import LoraConfig, get_peft_model

    folder = REPO / "components/assets/tiny_moe"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    config = LoraConfig(
        r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=targets, target_parameters=parameters
    )
    peft_model = get_peft_model(model, config)
    trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    arch = Arch.from_dict(json.loads((folder / "config.json").read_text()))
    assert (
        LoRA(r=r, dropout=0.0, target_modules=targets, target_parameters=parameters).trainable_params(arch)
        == trained
    )


def test_the_estimate_names_total_and_active_parameters(compose_cfg, capsys) -> None:
    from hydratune.components.commands.estimate_tables import cli

    assert cli(["model=qwen3_30b_a3b", "estimate.num_gpus=8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    found = re.search(r"([\d.]+) B params .*128 experts, 8 per token, ([\d.]+) B active per token", out)
    assert found and float(found.group(1)) == pytest.approx(30.5, rel=0.02)
    assert float(found.group(2)) == pytest.approx(3.3, rel=0.02)


def test_the_estimate_holds_every_expert(compose_cfg) -> None:
    """Weights in memory are all the experts' (the active ones are what a token computes with)."""
    from hydratune.components.memory.estimate import estimate
    from hydratune.components.memory.spec import spec_from_config

    cfg = compose_cfg("model=qwen3_30b_a3b", "strategy=ddp", "precision=bf16", "estimate.num_gpus=1")
    spec = spec_from_config(cfg)
    held = estimate(spec).row("parameters")
    assert held == pytest.approx(4 * param_counts(spec.arch).total, rel=0.01)  # fp32 weights, bf16 autocast


def test_expert_parallel_splits_the_experts_and_their_states(compose_cfg) -> None:
    """``strategy=zero2 strategy.ep_size=8`` on 8 GPUs (Qwen3-30B-A3B, fp32 AdamW), derived by hand in
    docs/memory.md: each GPU holds the dense part whole and 1/8 of the experts; ZeRO-2 shards the dense
    part's gradients and moments over the 8 ranks, the experts' over the ranks sharing the same experts
    (8 / 8 = 1: not at all)."""
    from hydratune.components.memory.estimate import estimate
    from hydratune.components.memory.spec import spec_from_config

    args = ("model=qwen3_30b_a3b", "strategy=zero2", "precision=fp32", "estimate.num_gpus=8")
    spec = spec_from_config(compose_cfg(*args, "launcher.nproc_per_node=8", "strategy.ep_size=8"))
    assert spec.ep == 8
    experts = spec.arch.num_layers * spec.arch.expert_params()
    dense = param_counts(spec.arch).total - experts
    e = estimate(spec)
    assert e.row("parameters") == pytest.approx(4 * (dense + experts / 8), rel=1e-6)
    assert e.row("gradients") == pytest.approx(4 * (dense / 8 + experts / 8), rel=1e-6)
    assert e.row("optimizer states") == pytest.approx(8 * (dense / 8 + experts / 8), rel=1e-6)
    whole = estimate(spec_from_config(compose_cfg(*args)))  # ep 1: every expert on every GPU
    assert whole.row("parameters") == pytest.approx(4 * (dense + experts), rel=1e-6)


@pytest.mark.parametrize(("only", "step"), [([0], 1), ([], 2)])
def test_a_mixture_with_dense_layers_between_is_estimated_with_a_note(
    compose_cfg, tmp_path, only: list[int], step: int
) -> None:
    """Issue 49: Qwen3-MoE with ``mlp_only_layers`` / ``decoder_sparse_step`` > 1 trains: the disk check and
    the estimate count every layer as a mixture layer (not less than transformers builds) and say so."""
    from transformers import Qwen3MoeConfig

    from hydratune.components.runtime import diskspace
    from hydratune.components.runtime.checks import unmodelled_notes
    from hydratune.components.runtime.run import Components

    shape = {**TINY, **SHAPES["qwen3_moe"], "num_hidden_layers": 4}
    config = Qwen3MoeConfig(**shape, mlp_only_layers=only, decoder_sparse_step=step)
    with torch.device("meta"):
        built = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    arch = Arch.from_dict(config.to_dict())
    every_layer = Arch.from_dict(Qwen3MoeConfig(**shape).to_dict())
    assert param_counts(arch).total == param_counts(every_layer).total >= built
    dense = 1 if only else 2  # layers 0 (named), or 0 and 2 (every second layer sparse)
    assert arch.unmodelled == (
        f"{dense} of the 4 layers are dense MLPs between the mixture's (mlp_only_layers={only}, "
        f"decoder_sparse_step={step}): not modelled, the estimate counts every layer as a mixture layer of "
        "4 experts",
    )
    config.save_pretrained(tmp_path)
    cfg = compose_cfg("model=tiny_moe", f"model.name_or_path={tmp_path}")
    comps = Components.from_config(cfg)
    total, _ = diskspace.planned_bytes(cfg, comps)  # was an UnboundLocalError before every run
    assert total > 0
    assert unmodelled_notes(comps) == [f"memory estimate: {arch.unmodelled[0]}"]


def test_no_rung_splits_a_mixture_by_tensor_parallel(compose_cfg) -> None:
    """strategy=auto and the estimate's ladder never offer strategy.tp_size on a mixture (issue 49: refused
    before load); an explicit one is refused naming strategy.tp_size with a fix that splits the experts."""
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.memory.spec import spec_from_config, strategy_rungs

    spec = spec_from_config(compose_cfg("model=qwen3_30b_a3b", "estimate.num_gpus=8"))
    rungs = strategy_rungs(spec)
    assert rungs and all(rung.tp == 1 for rung in rungs)
    assert any(rung.ep > 1 for rung in rungs)
    with pytest.raises(ConfigError, match="mixture of experts") as info:
        spec_from_config(compose_cfg("model=qwen3_30b_a3b", "strategy.tp_size=2", "estimate.num_gpus=2"))
    assert info.value.key == "strategy.tp_size" and "strategy.ep_size" in info.value.hint
