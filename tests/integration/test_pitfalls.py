"""Pitfalls the anchors' users keep hitting, designed out and tested."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

ONE_SGD_STEP = [
    "train.max_steps=1",
    "optimizer=sgd",
    "optimizer.lr=1.0",
    "optimizer.momentum=0.0",
    "scheduler=constant",
    "scheduler.warmup_ratio=0.0",
    "train.max_grad_norm=0.0",
    "train.eval_generations=0",
    "data.max_samples=64",
]


def test_gradient_accumulation_equals_the_larger_batch(run_recipe) -> None:
    """micro-batch 2 x accumulation 4 == micro-batch 8: token-normalised loss over the whole window."""
    big, _ = run_recipe(*ONE_SGD_STEP, "train.micro_batch_size=8", name="big")
    acc, _ = run_recipe(
        *ONE_SGD_STEP, "train.micro_batch_size=2", "train.gradient_accumulation_steps=4", name="acc"
    )
    a = load_file(big.run_dir.final / "model.safetensors")
    b = load_file(acc.run_dir.final / "model.safetensors")
    ctx = big
    ctx.seed_everything()
    init = ctx.components.model.build().state_dict()
    moved = [k for k in a if not torch.equal(a[k], init[k])]
    assert moved, "SGD step changed nothing: the comparison would be vacuous"
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6, msg=key)
    loss_a = next(r["loss"] for r in big.run_dir.read_metrics() if "loss" in r)
    loss_b = next(r["loss"] for r in acc.run_dir.read_metrics() if "loss" in r)
    assert loss_a == pytest.approx(loss_b, rel=1e-4)


def test_packed_examples_do_not_attend_across_boundaries(compose_cfg) -> None:
    """Logits of examples packed into one row (padding-free, per-example position ids) equal the
    logits of each example run alone. Training runs with ``use_cache=False`` (TRL's compute_loss and
    our Session both set it): with a KV cache transformers skips packed-sequence masking and leaks."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from hydratune.components.runtime.run import Components

    comps = Components.from_config(compose_cfg())
    tokenizer = comps.model.build_tokenizer()
    torch.manual_seed(0)
    model = comps.model.build().eval()
    rows = comps.data.load()["train"].select(range(3))
    examples = [
        {
            "input_ids": tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)[
                "input_ids"
            ]
        }
        for r in rows
    ]
    packed = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id, padding_free=True)(examples)
    assert packed["input_ids"].shape[0] == 1 and "attention_mask" not in packed
    with torch.no_grad():
        together = model(
            input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False
        ).logits[0]
        start = 0
        for ex in examples:
            ids = torch.tensor([ex["input_ids"]])
            alone = model(input_ids=ids, use_cache=False).logits[0]
            torch.testing.assert_close(
                together[start : start + len(ex["input_ids"])], alone, atol=1e-5, rtol=1e-4
            )
            start += len(ex["input_ids"])


def test_packing_trains(run_recipe) -> None:
    # packed rows of 8 (not 32): measured, the loss 6.23 -> 4.65 over the 10 steps (6.24 -> 4.64 with 32)
    ctx, _ = run_recipe(
        "train.max_steps=10", "train.micro_batch_size=8", "data.packing=true", "train.eval_generations=0",
        name="packed",
    )  # fmt: skip
    curve = [r["loss"] for r in ctx.run_dir.read_metrics() if "loss" in r]
    assert curve[-1] < curve[0]
    assert ctx.run_dir.path.joinpath("final", "model.safetensors").is_file()


def test_label_mask_checks() -> None:
    from datasets import Dataset

    from hydratune.components.config.errors import ConfigError
    from hydratune.components.text.masking import check_label_mask, label_mask_stats

    eos = 9
    everything = Dataset.from_list([{"input_ids": [1, 2, eos], "labels": [1, 2, eos]}] * 4)
    nothing = Dataset.from_list([{"input_ids": [1, 2, eos], "labels": [-100, -100, -100]}] * 4)
    no_eos = Dataset.from_list([{"input_ids": [1, 2, eos], "labels": [-100, 2, -100]}] * 4)
    good = Dataset.from_list([{"input_ids": [1, 2, eos], "labels": [-100, 2, eos]}] * 4)
    with pytest.raises(ConfigError, match="no-op"):
        check_label_mask(label_mask_stats(everything, {eos}), masked=True)
    check_label_mask(label_mask_stats(everything, {eos}), masked=False)  # full loss on raw text is fine
    with pytest.raises(ConfigError, match="no token in the loss"):
        check_label_mask(label_mask_stats(nothing, {eos}), masked=True)
    with pytest.raises(ConfigError, match="stop"):
        check_label_mask(label_mask_stats(no_eos, {eos}), masked=True)
    check_label_mask(label_mask_stats(good, {eos}), masked=True)
