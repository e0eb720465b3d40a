"""recipe=distill in-process on the tiny model: a random student learns from the bundled teacher (the tiny
model after the SFT demo) for a few steps; the teacher stays frozen and bit-identical."""

from __future__ import annotations

import json

import torch

#: what a record holds of the wall clock (differs between any two runs)
WALL = ("time", "step_time")


def test_the_student_learns_and_the_teacher_stays_frozen(run_recipe, monkeypatch) -> None:
    from transformers import AutoModelForCausalLM

    from hydratune.components.config.resolvers import asset
    from hydratune.components.runtime.distill_trainer import MeasuredDistillationTrainer

    generated = {"train": 0}  # recipe.lmbda=1 (the default): the student samples every training batch
    generate = MeasuredDistillationTrainer._generate_single_turn

    def counting(self, *args, **kwargs):
        generated["train"] += self.model.training
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(MeasuredDistillationTrainer, "_generate_single_turn", counting)
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
    assert generated["train"] == 3 and not any("on_policy" in r for r in records)
    for r in records:  # the samples' log-probs under each model and the teacher's agreement, every step
        assert r["student_logp"] < 0 and r["teacher_logp"] < 0 and 0 <= r["teacher_agreement"] <= 1
    summary = (ctx.run_dir.path / "summary.md").read_text()
    assert "| teacher | 1 |" in summary  # the teacher's exact match beside the student's before / after
    assert "Distillation" in summary and "generalized JSD, beta=0.5" in summary


def test_sigterm_then_resume_matches_a_straight_run(run_recipe, monkeypatch) -> None:
    """4 steps straight, versus SIGTERM during step 2 (checkpoint, stop) then resume=<run dir>: steps 3-4
    log the same numbers (the divergence, the samples' metrics) and end with the same weights, bit for bit on
    CPU (weights, optimizer, schedule, the RNG the student samples with)."""
    import pytest
    from safetensors.torch import load_file

    from hydratune.components.config.errors import Interrupted
    from hydratune.components.runtime.distill_trainer import MeasuredDistillationTrainer
    from tests.support.runs import sigterm_on_call

    common = ["recipe=distill", "train.max_steps=4", "train.micro_batch_size=4", "train.eval_every=0"]
    full, _ = run_recipe(*common, name="straight")
    # SIGTERM during step 2's loss: the driver checkpoints after this step, then stops
    original = sigterm_on_call(monkeypatch, MeasuredDistillationTrainer, "_compute_loss", at=2)
    with pytest.raises(Interrupted):
        run_recipe(*common, name="cut")
    monkeypatch.setattr(MeasuredDistillationTrainer, "_compute_loss", original)
    cut = full.run_dir.path.parent / "cut"
    assert [r["step"] for r in map(json.loads, (cut / "metrics.jsonl").open()) if "loss" in r] == [1, 2]
    assert (cut / "checkpoints" / "checkpoint-2" / "hydratune_complete.json").is_file()
    resumed, _ = run_recipe(*common, f"resume={cut}", name="resumed")

    def numbers(ctx) -> list[dict]:
        return [
            {k: v for k, v in r.items() if k not in WALL} for r in ctx.run_dir.read_metrics() if "loss" in r
        ]

    assert [r["step"] for r in numbers(resumed)] == [3, 4]
    assert numbers(resumed) == numbers(full)[2:]
    a, b = (load_file(ctx.run_dir.final / "model.safetensors") for ctx in (full, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_lmbda_0_trains_on_the_datasets_completions_only(run_recipe, monkeypatch) -> None:
    """recipe.lmbda=0 on the demo's chats: no generation while training (counted), every batch the rows'
    assistant answers after their prompts as the student's chat template writes them; decoded, the positions
    that carry loss are exactly each answer and its end of turn (no prompt token, nothing after)."""
    from hydratune.components.runtime.distill_trainer import MeasuredDistillationTrainer

    generated, batches = {"train": 0}, []
    generate, compute = (
        MeasuredDistillationTrainer._generate_single_turn,
        MeasuredDistillationTrainer._compute_loss,
    )

    def counting(self, *args, **kwargs):
        generated["train"] += self.model.training
        return generate(self, *args, **kwargs)

    def capturing(self, student, inputs, *args, **kwargs):
        if self.model.training:
            batches.append({k: v.clone() for k, v in inputs.items() if k.endswith(("_ids", "_mask"))})
        return compute(self, student, inputs, *args, **kwargs)

    monkeypatch.setattr(MeasuredDistillationTrainer, "_generate_single_turn", counting)
    monkeypatch.setattr(MeasuredDistillationTrainer, "_compute_loss", capturing)
    ctx, _ = run_recipe(
        "recipe=distill",
        "data=demo_sft",
        "recipe.lmbda=0",
        "train.max_steps=2",
        "train.micro_batch_size=8",
        "train.eval_every=0",
        "train.eval_generations=0",
        name="offline",
    )
    assert generated["train"] == 0 and len(batches) == 2
    tok = ctx.trainer.processing_class
    rows = {  # the prompt as the template writes it -> its answer turn
        tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True): r["completion"][0]
        for r in ctx.trainer.train_dataset
    }
    for batch in batches:
        for p_ids, p_mask, c_ids, c_mask in zip(
            batch["prompt_ids"],
            batch["prompt_mask"],
            batch["completion_ids"],
            batch["completion_mask"],
            strict=True,
        ):
            prompt = tok.decode(p_ids[p_mask.bool()])
            loss_tokens = tok.decode(c_ids[c_mask.bool()])  # the only positions the loss reads
            assert loss_tokens == rows[prompt]["content"] + tok.eos_token
    records = [r for r in ctx.run_dir.read_metrics() if "loss" in r]
    assert [r["on_policy"] for r in records] == [0.0, 0.0] and all(r["completions_cut"] == 0 for r in records)
    assert all(r["teacher_agreement"] > 0.8 for r in records)  # the teacher knows the demo's answers


def test_a_4bit_teacher_teaches_on_cpu(run_recipe) -> None:
    """recipe.teacher_quantization=nf4: the teacher's decoder linear layers are bitsandbytes' 4-bit ones (the
    head whole, as TRL's loss reads its weight), frozen; it still answers the held-out sums and the student
    trains against it."""
    import bitsandbytes as bnb

    ctx, _ = run_recipe(
        "recipe=distill",
        "recipe.teacher_quantization=nf4",
        "train.max_steps=2",
        "train.micro_batch_size=4",
        "train.eval_every=0",
        "train.eval_generations=8",
        "train.max_new_tokens=4",
        name="nf4",
    )
    teacher = ctx.trainer.teacher_model
    linears = [m for m in teacher.modules() if isinstance(m, torch.nn.Linear)]
    quantized = [m for m in linears if isinstance(m, bnb.nn.Linear4bit)]
    assert len(quantized) == len(linears) - 1 and not isinstance(
        teacher.get_output_embeddings(), bnb.nn.Linear4bit
    )
    assert all(not p.requires_grad for p in teacher.parameters())
    records = [r for r in ctx.run_dir.read_metrics() if "loss" in r]
    assert len(records) == 2 and all(0 < r["loss"] < 20 and r["teacher_logp"] < 0 for r in records)
    summary = (ctx.run_dir.path / "summary.md").read_text()
    teacher_em = float(summary.split("| teacher | ")[1].split(" |")[0])
    assert (
        teacher_em >= 0.75
    )  # the bf16 teacher: 0.984 on the 64 held-out sums; 4-bit rounding costs a little
