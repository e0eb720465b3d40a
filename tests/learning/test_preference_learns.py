"""Preference recipes learn on the tiny model: DPO widens the chosen / rejected margin, a reward model learns
to rank its training pairs; tens of steps each (tests/integration/test_preference.py tests the same recipes'
mechanics in a few steps)."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_preference import SHORT, ctx_report


def test_dpo_widens_the_chosen_rejected_margin(run_recipe) -> None:
    """DPO's margin: beta * [(log pi - log ref)(chosen) - (log pi - log ref)(rejected)] on training pairs."""
    ctx, _ = run_recipe("recipe=dpo", *SHORT, "train.max_steps=60", "train.probe_pairs=128", name="dpo")
    before, after = ctx_report(ctx, "before"), ctx_report(ctx, "after")
    assert before["eval_rewards/margins"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at the start
    assert after["eval_rewards/margins"] > 0.005, after
    assert ctx.trainer.ref_model is not None  # full fine-tuning: a frozen copy is the reference


def test_reward_model_learns_to_rank_its_training_pairs(run_recipe, tmp_path) -> None:
    """Pairwise accuracy on the training pairs rises from chance to >= 0.8.

    The demo pairs (right sum vs a near miss) need arithmetic, which a random-init model does not learn
    within a test's budget (150 steps: 0.45 -> 0.52). Here chosen is the bare number and rejected a
    refusal in words: a surface feature a random-init score head separates in a few dozen steps. Coin
    flipping scores 0.5; on the 128 probed pairs one binomial std at p = 0.5 is 0.044, so 0.8 is ~7 std
    above it. (The untrained head is not a coin: it ranks these systematic pairs 0.16 at seed 42.)"""
    import random

    rng = random.Random(0)
    refusals = ["I do not know", "no idea, sorry", "that is too hard", "ask someone else"]
    rows = []
    for _ in range(256):
        a, b = rng.randrange(100), rng.randrange(10)
        rows.append({"prompt": f"What is {a} + {b}?", "chosen": str(a + b), "rejected": rng.choice(refusals)})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ctx, _ = run_recipe(
        "recipe=reward",
        f"data.path={path}",
        "data.eval_path=null",
        "train.eval_every=0",  # no eval split: the probe on the training pairs is the measurement
        "train.probe_pairs=128",
        *SHORT,
        "train.max_steps=30",
        name="rm_acc",
    )
    before, after = ctx_report(ctx, "before")["eval_accuracy"], ctx_report(ctx, "after")["eval_accuracy"]
    assert after >= 0.8 and after > before, (before, after)
