"""recipe=distill in-process on the tiny model: a random student learns from the bundled teacher (the tiny
model after the SFT demo) for a few steps; the teacher stays frozen and bit-identical."""

from __future__ import annotations

import torch


def test_the_student_learns_and_the_teacher_stays_frozen(run_recipe) -> None:
    from transformers import AutoModelForCausalLM

    from hydratune.components.config.resolvers import asset

    ctx, _ = run_recipe(
        "recipe=distill",
        "train.max_steps=3",
        "train.micro_batch_size=8",
        "train.eval_generations=8",
        "train.max_new_tokens=6",
        name="distill",
    )
    teacher = ctx.trainer.teacher_model
    assert teacher is not ctx.trainer.model and not teacher.training
    assert all(not p.requires_grad and p.grad is None for p in teacher.parameters())
    bundled = AutoModelForCausalLM.from_pretrained(asset("tiny_teacher"), dtype=torch.float32).state_dict()
    after = teacher.state_dict()
    assert after.keys() == bundled.keys()
    assert all(torch.equal(after[k], bundled[k]) for k in bundled)  # bit-identical after training

    ctx.seed_everything()  # the student's start: the random init the run began from
    start = ctx.components.model.build().state_dict()
    student = ctx.trainer.model.state_dict()
    assert any(not torch.equal(student[k], start[k]) for k in start)  # the student moved

    records = [r for r in ctx.run_dir.read_metrics() if "loss" in r]
    assert len(records) == 3 and all(0 < r["loss"] < 20 for r in records)  # the divergence per step, finite
    for r in records:  # the samples' log-probs under each model and the teacher's agreement, every step
        assert r["student_logp"] < 0 and r["teacher_logp"] < 0 and 0 <= r["teacher_agreement"] <= 1
    summary = (ctx.run_dir.path / "summary.md").read_text()
    assert "| teacher | 1 |" in summary  # the teacher's exact match beside the student's before / after
    assert "Distillation" in summary and "generalized JSD, beta=0.5" in summary
