"""DPO's and KTO's log-probs through hydratune's chunked LM head (components/runtime/fused_head.py) against
TRL 1.16's own DPOTrainer / KTOTrainer (their fused head) on the same tiny model and batch, in fp32: the
per-token and per-sequence log-probs, the loss, its gradients and TRL's metrics, for a full model with its
frozen reference, a LoRA adapter (the reference: the adapter disabled) and KTO (its KL pass besides); the
metrics off a log step; three DPO training steps."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tests.support.data import TINY

PAIRS = [
    {"prompt": f"{i} plus {i + 1} is", "chosen": f" {2 * i + 1}.", "rejected": f" {i} and {i} again, no"}
    for i in range(8)
]
#: KTO's unpaired rows: each pair's answers, desirable and not
ROWS = [
    {"prompt": r["prompt"], "completion": r[side], "label": side == "chosen"}
    for r in PAIRS
    for side in ("chosen", "rejected")
]


def trainers(tmp: Path, kind: str) -> tuple[object, object]:
    """TRL's trainer (``kind``: dpo full, dpo LoRA, kto full) and the chunked one on equal models (seeded: a
    policy off its reference, a LoRA adapter initialised off zero), the same rows and arguments (fp32, 3
    steps of micro-batch 4)."""
    import trl
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hydratune.components.runtime.fused_head import with_chunked_head
    from hydratune.recipes import dpo, kto

    lora = kind == "lora"
    name, metrics, rows = (
        ("DPO", dpo.HEAD_METRICS, PAIRS) if kind != "kto" else ("KTO", kto.HEAD_METRICS, ROWS)
    )
    trainer_cls, config_cls = getattr(trl, f"{name}Trainer"), getattr(trl, f"{name}Config")
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(TINY)))
    model = copy.deepcopy(reference)
    if not lora:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p), alpha=0.02)
    tok = AutoTokenizer.from_pretrained(str(TINY))
    built = []
    for cls in (trainer_cls, with_chunked_head(trainer_cls, metrics)):
        peft = None
        if lora:
            from peft import LoraConfig

            peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        config = config_cls(
            output_dir=str(tmp / f"{cls.__module__}_{kind}"),
            **{"per_device_train_batch_size": 4, "learning_rate": 1e-2, "max_steps": 3, "logging_steps": 1},
            **{"save_strategy": "no", "seed": 0, "bf16": False, "report_to": [], "use_cpu": True},
        )
        torch.manual_seed(1)  # the adapter's initial weights
        trainer = cls(
            copy.deepcopy(model),
            None if lora else copy.deepcopy(reference),
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
            peft_config=peft,
        )
        built.append(trainer)
    return built[0], built[1]


@pytest.fixture(scope="module", params=["dpo", "lora", "kto"], ids=["dpo-full", "dpo-lora", "kto-full"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    return trainers(tmp_path_factory.mktemp("fused_head"), request.param)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    return trainers(tmp_path_factory.mktemp("fused_head"), "dpo")


def first_batch(trainer: object) -> dict:
    return trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))


def per_token(trainer: object, batch: dict) -> torch.Tensor:
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    out = trainer.model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        labels=labels,
        fused_lm_head=True,
    )
    return out.log_probs


def at_step(trainer: object, step: int, log_every: int) -> None:
    """The trainer's state as train() has it during step ``step + 1``, a log every ``log_every`` steps."""
    trainer.state.global_step, trainer.state.logging_steps = step, log_every
    for m in trainer._metrics.values():
        m.clear()


def test_log_probs_loss_gradients_and_metrics_equal_trls(pair: tuple[object, object]) -> None:
    trl, chunked = pair
    batch = first_batch(trl)
    assert torch.equal(batch["input_ids"], first_batch(chunked)["input_ids"])
    want, got = per_token(trl, batch), per_token(chunked, batch)
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert torch.allclose(got.sum(1), want.sum(1), atol=1e-5, rtol=0)  # the per-sequence log-probs
    assert bool((want != 0).any(1).all())  # every row has completion tokens
    losses, grads = [], []
    for t in (trl, chunked):
        at_step(t, 0, 1)
        t.model.zero_grad()
        loss = t.compute_loss(t.model, batch)
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in t.model.named_parameters() if p.requires_grad})
    assert torch.allclose(losses[0], losses[1], atol=1e-5, rtol=0), losses
    assert abs(float(losses[0]) - 0.6931) > 1e-3  # the policy is off its reference
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], g, atol=1e-5, rtol=1e-5), name
    assert trl._metrics["train"].keys() == chunked._metrics["train"].keys()
    for key, values in trl._metrics["train"].items():  # a log step: TRL's every metric
        assert chunked._metrics["train"][key] == pytest.approx(values, abs=1e-5), key


def test_off_a_log_step_the_loss_is_trls_and_the_head_metrics_wait(full: tuple[object, object]) -> None:
    from hydratune.recipes.dpo import HEAD_METRICS

    trl, chunked = full
    batch = first_batch(trl)
    for t in (trl, chunked):
        at_step(t, 1, 5)  # the second step, a log every 5: no log
    loss = chunked.compute_loss(chunked.model, batch)
    assert torch.allclose(loss, trl.compute_loss(trl.model, batch), atol=1e-5, rtol=0)
    logged = chunked._metrics["train"]
    assert set(HEAD_METRICS) <= trl._metrics["train"].keys()
    assert not set(HEAD_METRICS) & logged.keys(), logged.keys()
    for key in ("rewards/chosen", "rewards/margins", "logps/chosen", "logps/rejected"):
        assert logged[key] == pytest.approx(trl._metrics["train"][key], abs=1e-5), key


def test_three_training_steps_log_trls_numbers_and_end_with_its_weights(full: tuple[object, object]) -> None:
    trl, chunked = full
    logs = []
    for t in (trl, chunked):
        at_step(t, 0, 1)  # no metrics left from the other tests
        t.model.zero_grad()
        t.train()
        logs.append([r for r in t.state.log_history if "loss" in r])
    assert [r["step"] for r in logs[0]] == [r["step"] for r in logs[1]] == [1, 2, 3]
    keys = ("loss", "rewards/margins", "logps/chosen", "entropy", "logits/chosen", "mean_token_accuracy")
    for a, b in zip(*logs, strict=True):
        for key in keys:
            assert b[key] == pytest.approx(a[key], abs=1e-5), (a["step"], key)
    assert logs[0][-1]["rewards/margins"] != pytest.approx(logs[0][0]["rewards/margins"], abs=1e-3)  # trained
    # Adam moves a weight by up to lr (1e-2) a step whatever its gradient's size, so the last bits of a tiny
    # gradient show: measured 1.7e-4 at most after the 3 steps (model.layers.0.mlp.up_proj.weight)
    for (name, p), q in zip(trl.model.named_parameters(), chunked.model.parameters(), strict=True):
        assert torch.allclose(q, p, atol=5e-4, rtol=0), (name, float((q - p).abs().max()))
