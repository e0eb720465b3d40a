"""Reward-model and DPO recipes on the tiny model and the demo preference pairs (that they learn: a margin
widening, pairs ranked: tests/learning/test_preference_learns.py)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hydratune.components.config.errors import ConfigError
from tests.support.runs import assert_base_untouched

#: the learning tier's settings (tests/learning/test_preference_learns.py)
SHORT = ["train.micro_batch_size=16", "train.log_every=5", "train.eval_generations=0", "train.save_every=0"]


# 16 rows, no eval split: the training pairs probed before and after are the first 8 of them, nothing is
# evaluated at the end. Two steps of 4 pairs (with "train.max_steps=2") are enough for what these tests check:
# AdamW's first step moves every parameter with a gradient, DPO's included (at the start the policy equals
# its reference, and the loss's gradient is -beta/2 times that of the chosen minus the rejected log-probs).
RUN = [
    *("data.max_samples=16", "data.eval_path=null", "data.eval_fraction=0"),  # 16 rows, no eval split
    *("train.micro_batch_size=4", "train.eval_generations=0", "train.eval_every=0", "train.log_every=1"),
]


#: what each recipe's trainer must be running (the loss it was asked for)
TRAINER_FACTS = {
    "kto": lambda t: t.loss_type == "kto" and t.calculate_KL and t.ref_model is not None,
    "orpo": lambda t: type(t).__name__ == "HydratuneORPOTrainer" and t.beta == 0.1,
    "simpo": lambda t: t.loss_type == "simpo" and t.cpo_alpha == 0.0 and t.simpo_gamma == 1.0,
}


def test_dpo_with_lora_trains_only_the_adapter_and_keeps_no_reference_copy(run_recipe, monkeypatch) -> None:
    """Also: the probe of the initial adapter runs at the end, off the start-up path, with the numbers a
    probe before the first step gives (the oracle: the same run with the deferral off), and the trained
    adapter is put back before it is saved."""
    from hydratune.components.runtime import trainer_loop

    ctx, _ = run_recipe("recipe=dpo", "peft=lora", *RUN, "train.max_steps=2", name="dpo_lora")
    assert ctx.trainer.ref_model is None  # the reference is the policy with its initial adapter
    adapter = load_file(ctx.run_dir.final / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)
    assert_base_untouched(ctx)

    before, after = (untimed(ctx_report(ctx, when)) for when in ("before", "after"))
    assert before.pop("scored").startswith("after training, its ")
    assert before["eval_rewards/margins"] == 0.0 and after["eval_rewards/margins"] != 0.0
    sections = list(json.loads((ctx.run_dir.path / "result.json").read_text()))
    assert sections.index("training pairs (before)") < sections.index("training pairs (after)")
    cost = list(json.loads((ctx.run_dir.path / "result.json").read_text())["cost"])
    assert cost.index("training pairs probe before (s)") < cost.index("training pairs probe after (s)")
    monkeypatch.setattr(trainer_loop, "DEFER_SHARE", 0.0)  # the probe before the first step, as before
    at_start, _ = run_recipe("recipe=dpo", "peft=lora", *RUN, "train.max_steps=2", name="dpo_lora_at_start")
    assert untimed(ctx_report(at_start, "before")) == before  # no "scored": probed before the first step
    assert untimed(ctx_report(at_start, "after")) == after


def untimed(report: dict) -> dict:
    """A probe's numbers without transformers' seconds (model_preparation_time: some evaluate() calls)."""
    return {k: v for k, v in report.items() if not k.endswith("_time")}


def test_reward_model_with_lora_saves_its_score_head(run_recipe) -> None:
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    ctx, _ = run_recipe("recipe=reward", "peft=lora", *RUN, "train.max_steps=2", name="rm")
    adapter = load_file(ctx.run_dir.final / "adapter_model.safetensors")
    heads = [k for k in adapter if "score" in k]
    assert heads, "the score head was not saved: it would reload randomly initialised"
    trained_head = ctx.model.base_model.model.score.modules_to_save["default"].weight.detach()
    ctx.seed_everything()
    base = ctx.components.model.build(task="seq_cls")
    assert not torch.equal(base.score.weight, trained_head)  # it trained: a reload of the init would differ
    reloaded = PeftModel.from_pretrained(base, ctx.run_dir.final).base_model.model.score
    torch.testing.assert_close(reloaded.modules_to_save["default"].weight, trained_head)
    assert AutoModelForSequenceClassification  # the full-model path is covered below


def test_reward_model_full_saves_a_sequence_classifier(run_recipe) -> None:
    from transformers import AutoModelForSequenceClassification

    ctx, _ = run_recipe("recipe=reward", *RUN, "train.max_steps=2", "train.probe_pairs=3", name="rm_full")
    model = AutoModelForSequenceClassification.from_pretrained(ctx.run_dir.final)
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None
    assert "training pairs (after)" in ctx_report_sections(ctx)
    # the probe is bounded, timed and can be turned off (no hidden pass: issue 39)
    result = json.loads((ctx.run_dir.path / "result.json").read_text())
    assert {"training pairs probe before (s)", "training pairs probe after (s)"} <= set(result["cost"])
    off, _ = run_recipe("recipe=reward", *RUN, "train.max_steps=1", "train.probe_pairs=0", name="rm_off")
    assert not any(k.startswith("training pairs") for k in ctx_report_sections(off))


def test_preference_file_missing_rejected_fails_before_model_load(run_recipe, tmp_path, monkeypatch) -> None:
    from hydratune.components.model import CausalLM

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(CausalLM, "build", no_load)
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "1 + 1?", "chosen": "2"}\n' * 4)
    with pytest.raises(ConfigError, match="'rejected'"):
        run_recipe("recipe=dpo", f"data.path={path}", "data.eval_path=null")


def test_sft_data_for_dpo_is_refused_before_load(run_recipe) -> None:
    with pytest.raises(ConfigError) as info:
        run_recipe("recipe=dpo", "data=demo_sft")
    assert info.value.key == "data" and "demo_dpo" in str(info.value)


def ctx_report(ctx, when: str) -> dict:
    return json.loads((ctx.run_dir.path / "result.json").read_text())[f"training pairs ({when})"]


def ctx_report_sections(ctx) -> set[str]:
    return set(json.loads((ctx.run_dir.path / "result.json").read_text()))


def test_sft_then_dpo_chain(run_recipe, tmp_path) -> None:
    sft, _ = run_recipe(*RUN, "train.max_steps=2", name="sft")
    chained = f"model.from_run=${{latest_run:sft,{tmp_path}/outputs}}"
    dpo, _ = run_recipe("recipe=dpo", chained, *RUN, "train.max_steps=2", name="dpo")
    assert dpo.components.model.name_or_path == str(sft.run_dir.final)
    ctx_sections = ctx_report_sections(dpo)
    assert "training pairs (after)" in ctx_sections
    assert dpo.trainer.ref_model is not None  # full fine-tuning: a frozen copy is the reference
    # ... a copy of the policy as it started: no margin before the first step
    assert ctx_report(dpo, "before")["eval_rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    # the DPO policy started from the SFT weights, not from a fresh random init
    from safetensors.torch import load_file as load

    start = load(sft.run_dir.final / "model.safetensors")
    sft.seed_everything()  # the SFT steps moved the weights: a fresh random init would not pass below
    fresh = sft.components.model.build().state_dict()
    assert any(not torch.equal(v, fresh[k]) for k, v in start.items())
    dpo.seed_everything()
    assert all(
        torch.equal(v, start[k]) for k, v in dpo.components.model.build().state_dict().items() if k in start
    )


def test_from_run_with_only_an_adapter_on_a_random_base_is_refused(run_recipe, tmp_path) -> None:
    lora, _ = run_recipe("peft=lora", *RUN, "train.max_steps=2", name="lora")
    with pytest.raises(ConfigError, match="merge=true"):
        run_recipe("recipe=dpo", f"model.from_run={lora.run_dir.path}", name="dpo")


@pytest.mark.parametrize("recipe", list(TRAINER_FACTS))
def test_each_recipe_trains_checkpoints_resumes_and_exports(run_recipe, tmp_path, recipe) -> None:
    from transformers import AutoModelForCausalLM

    from hydratune.components.commands.export import export

    first, _ = run_recipe(f"recipe={recipe}", *RUN, "train.max_steps=2", "train.save_every=2", name="a")
    assert TRAINER_FACTS[recipe](first.trainer)
    steps = "train.max_steps=3", "train.save_every=2", "resume=true"
    resumed, _ = run_recipe(f"recipe={recipe}", *RUN, *steps, name="b")
    assert resumed.cfg.resume.endswith("checkpoint-2")
    assert [r["step"] for r in resumed.run_dir.read_metrics() if "loss" in r] == [3]
    report = (resumed.run_dir.path / "summary.md").read_text()
    assert "training pairs (after)" in report and "rewards/margins" in report
    model = AutoModelForCausalLM.from_pretrained(export(resumed.run_dir.path, tmp_path / "exported"))
    assert model.config.vocab_size > 0


def test_the_probe_takes_the_first_probe_pairs() -> None:
    from types import SimpleNamespace

    from datasets import Dataset

    from hydratune.components.runtime.trainer_loop import training_pairs

    trainer = SimpleNamespace(train_dataset=Dataset.from_dict({"i": list(range(10))}))
    assert training_pairs(trainer, 3)["training pairs"]["i"] == [0, 1, 2]
    assert training_pairs(trainer, 50)["training pairs"]["i"] == list(range(10))
    assert training_pairs(trainer, 0) == {}


def test_a_stopped_run_says_its_deferred_before_probe_was_skipped() -> None:
    """An adapter run scores its "before" probe at its end; one stopped early (its after probe skipped too)
    says so in that section and keeps no empty cost row."""
    from types import SimpleNamespace

    from hydratune.components.runtime.trainer_loop import TrainerLoop

    loop = TrainerLoop.__new__(TrainerLoop)  # no trainer: nothing may be evaluated
    section, cost = "training pairs (before)", "training pairs probe before (s)"
    loop.session = SimpleNamespace(report={section: {}}, probe_cost={cost: None})
    loop.probes, loop.initial, loop.trainer = {"training pairs": None}, {"w": torch.zeros(1)}, None
    loop.probe_initial(skipped=True)
    assert loop.session.report[section]["skipped"].startswith("the run stopped")
    assert cost not in loop.session.probe_cost and loop.initial is None
