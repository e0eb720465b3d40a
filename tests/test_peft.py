"""Each PEFT option trains exactly the parameters it should (component level, tiny random model)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from components.errors import ConfigError
from components.peft import (
    IA3,
    BitFit,
    DoRA,
    Freeze,
    FullFineTune,
    LoRA,
    PrefixTuning,
    PTuning,
    merge_and_unload,
)


def tiny(bias: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=bias,
        max_position_embeddings=64,
        use_cache=False,
    )
    return LlamaForCausalLM(config)


def train_steps(model: torch.nn.Module, steps: int = 2) -> dict[str, torch.Tensor]:
    """A couple of real AdamW steps; returns the state before training."""
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return before


def changed(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> set[str]:
    return {k for k, v in model.named_parameters() if not torch.equal(before[k], v)}


@pytest.mark.parametrize(
    ("component", "expect"),
    [
        (LoRA(r=4), lambda n: "lora_" in n),
        (DoRA(r=4), lambda n: "lora_" in n),
        (IA3(), lambda n: "ia3_" in n),
        (BitFit(), lambda n: n.endswith("bias")),
        (Freeze(last_n_layers=1), lambda n: ".layers.2." in n),
        (PrefixTuning(num_virtual_tokens=4), lambda n: "prompt_encoder" in n),
        (PTuning(num_virtual_tokens=4, encoder_hidden_size=16), lambda n: "prompt_encoder" in n),
    ],
    ids=lambda c: type(c).__name__ if not callable(c) or isinstance(c, type) else "",
)
def test_only_the_intended_parameters_change(component, expect) -> None:
    model = component.apply(tiny())
    before = train_steps(model)
    diff = changed(model, before)
    assert diff, "nothing trained"
    assert all(expect(n) for n in diff), sorted(n for n in diff if not expect(n))[:5]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(expect(n) for n in trainable)


def test_full_finetune_trains_everything() -> None:
    model = FullFineTune().apply(tiny())
    before = train_steps(model)
    # embeddings of tokens absent from the batch may keep their values; every other tensor moves
    assert len(changed(model, before)) >= len(before) - 1


def test_bitfit_without_biases_fails_clearly() -> None:
    with pytest.raises(ConfigError, match="BitFit") as info:
        BitFit().apply(tiny(bias=False))
    assert "peft=lora" in str(info.value)


def test_lora_targets_checked_against_module_names() -> None:
    names = [n for n, _ in tiny().named_modules()]
    LoRA(target_modules=["q_proj", "v_proj"]).check_targets(names)
    LoRA(target_modules="all-linear").check_targets(names)
    with pytest.raises(ConfigError) as info:
        LoRA(target_modules=["nope_proj"]).check_targets(names)
    assert info.value.key == "peft.target_modules" and "q_proj" in str(info.value)


def test_lora_rank_zero_is_rejected() -> None:
    with pytest.raises(ConfigError, match="rank"):
        LoRA(r=0).apply(tiny())


def test_reward_model_lora_saves_its_score_head() -> None:
    assert "score" in LoRA(task_type="SEQ_CLS").peft_config().modules_to_save


def test_merge_folds_the_adapter_in() -> None:
    model = LoRA(r=4).apply(tiny())
    train_steps(model)
    model.eval()  # no adapter dropout
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        merged = merge_and_unload(model)
        assert not any("lora_" in n for n, _ in merged.named_parameters())
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(ConfigError, match="cannot be merged"):
        merge_and_unload(PrefixTuning(num_virtual_tokens=4).apply(tiny()))
