"""A mixture of experts on the dense path (one process): the tiny MoE trains with its load-balancing loss
logged, every router's choices counted (equal to the top-k of the router logits the model returns), the
expert load in the summary, LoRA on the experts refused with dropout before load and trained without."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from hydratune.components.config.errors import ConfigError
from hydratune.components.runtime.expert_load import ExpertLoad, routers
from tests.support.data import REPO


def test_expert_load_counts_the_routers_top_k() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(REPO / "components/assets/tiny_moe")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    report: dict[str, Any] = {}
    load = ExpertLoad(model, report)
    assert len(routers(model)) == config.num_hidden_layers
    ids = torch.randint(0, config.vocab_size, (3, 24))
    out = model(input_ids=ids, output_router_logits=True)
    for layer, logits in enumerate(out.router_logits):  # the oracle: the model's own router logits
        chosen = torch.topk(logits.softmax(-1), config.num_experts_per_tok, dim=-1).indices
        expected = torch.bincount(chosen.reshape(-1), minlength=config.num_local_experts)
        assert load.interval[layer].tolist() == expected.double().tolist()
    model.eval()
    model(input_ids=ids)  # evaluation passes are not counted
    logs = {"loss": 1.0}
    load.on_log(None, None, None, logs=logs)
    counts = [c for c in load.run]
    imbalance = sum(float(c.max() / c.mean()) for c in counts) / len(counts)
    assert logs["expert_imbalance"] == pytest.approx(imbalance, abs=1e-4)
    load.on_train_end(None, None, None)
    assert set(report["expert load"]) == {"layer 0", "layer 1"}
    assert f"{3 * 24 * config.num_experts_per_tok:,} assignments" in report["expert load"]["layer 0"]


def test_the_tiny_moe_trains_with_its_aux_loss_and_expert_load(run_recipe) -> None:
    ctx, _ = run_recipe(
        "model=tiny_moe",
        "train.max_steps=12",
        "train.eval_every=0",
        "train.eval_generations=2",  # generation after training: no router logits with a KV cache
        "train.log_every=4",
        name="moe",
    )
    records = [r for r in ctx.run_dir.read_metrics() if "loss" in r]
    assert records and all(r["aux_loss"] > 0 and r["expert_imbalance"] >= 1 for r in records)
    assert records[-1]["loss"] < records[0]["loss"]
    summary = (ctx.run_dir.path / "summary.md").read_text()
    assert "## expert load" in summary and "| layer 1 |" in summary


def test_lora_on_the_experts_is_refused_with_dropout_before_load(compose_cfg) -> None:
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("model=tiny_moe", "peft=lora", "mode=plan")
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg))
    assert err.value.key == "peft.dropout" and "peft.dropout=0" in err.value.hint
    cfg = compose_cfg("model=tiny_moe", "peft=lora", "peft.dropout=0", "mode=plan")
    check_before_load(cfg, Components.from_config(cfg))


def test_lora_on_the_experts_trains_them(run_recipe) -> None:
    from safetensors.torch import load_file

    ctx, _ = run_recipe("model=tiny_moe", "peft=lora", "peft.dropout=0", "train.max_steps=4", name="moe_lora")
    adapter = load_file(ctx.run_dir.final / "adapter_model.safetensors")
    experts = [k for k in adapter if ".mlp.experts." in k and "lora_B" in k]
    assert experts and all(adapter[k].abs().sum() > 0 for k in experts)  # trained from their zero init
    config = json.loads((ctx.run_dir.final / "adapter_config.json").read_text())
    assert config["r"] == 16


def test_lora_on_the_experts_exports_merged_with_the_adapters_logits(run_recipe, tmp_path) -> None:
    """LoRA on the experts (peft's ``target_parameters``) of a saved tiny-MoE base, exported: the merged
    model's logits are the adapter on its base's (by hand: 4e-7), not the base's alone (0.07 apart)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hydratune.components.commands.export import export
    from hydratune.components.modeling.trained import TrainedRun
    from tests.support.runs import as_cli_run

    short = ["model=tiny_moe", "train.save_every=0", "train.eval_every=0"]
    base, _ = run_recipe(*short, "train.max_steps=2", name="moe_base")
    lora = [*short, f"model.from_run={base.run_dir.path}", "peft=lora", "peft.dropout=0"]
    lora += ["peft.init_lora_weights=gaussian", "train.max_steps=3"]
    ctx, _ = run_recipe(*lora, name="moe_lora_export")
    run_dir = as_cli_run(ctx, lora)
    assert any(".mlp.experts." in key for key in load_file(run_dir / "final" / "adapter_model.safetensors"))
    adapter_model, _ = TrainedRun.open(run_dir).load()
    merged = AutoModelForCausalLM.from_pretrained(export(run_dir, tmp_path / "merged"))
    assert not any("lora" in name for name, _ in merged.named_parameters())
    whole = AutoModelForCausalLM.from_pretrained(base.run_dir.final)
    ids = torch.randint(0, merged.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want, before = (m.eval()(input_ids=ids).logits for m in (merged, adapter_model, whole))
    assert not torch.allclose(want, before, atol=1e-3)  # the experts' adapter changed the model
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_generation_asks_no_router_logits() -> None:
    """With the load-balancing loss on (TRL sets ``output_router_logits``), generating with a KV cache gave
    router logits of the new tokens only and transformers' loss failed against the whole mask."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hydratune.components.generation.sampling import Sampling, complete
    from tests.support.data import TINY

    config = AutoConfig.from_pretrained(REPO / "components/assets/tiny_moe")
    config.output_router_logits = True
    model = AutoModelForCausalLM.from_config(config).eval()
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    out = complete(model, tokenizer, [[5, 6, 7], [8, 9]], Sampling(max_new_tokens=4))
    assert len(out) == 2
