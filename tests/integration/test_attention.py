"""varlen_sdpa: packed rows attend only within their documents, ordinary rows are exactly sdpa, the
padding-free SFT default trains on the same examples as padded batches, and the GPU dispatch."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from hydratune.components.config.errors import ConfigError
from hydratune.components.modeling import attention
from tests.conftest import REPO

TINY = str(REPO / "components" / "assets" / "tiny")
LENGTHS = (7, 12, 4)
PAD = 3


def tiny(impl: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    attention.register()
    numbers = AutoConfig.from_pretrained(TINY).to_dict()
    numbers.update(overrides)  # model_type=qwen2: another architecture with the tiny numbers
    config = AutoConfig.for_model(numbers.pop("model_type"), **numbers)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()


def documents(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 600, (n,), generator=gen) for n in LENGTHS]


@pytest.mark.parametrize(
    "overrides",
    [{}, {"num_key_value_heads": 4}, {"model_type": "qwen2"}],
    ids=["llama-gqa", "llama-mha", "qwen2-gqa"],
)
def test_packed_row_matches_each_document_alone(overrides: dict[str, Any]) -> None:
    model = tiny(attention.NAME, **overrides)
    docs = documents()
    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions).logits[0]
        alone = torch.cat([model(input_ids=d[None]).logits[0] for d in docs])
        crossed = model(input_ids=ids).logits[0]  # one long document: the later ones see the first
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(crossed[LENGTHS[0] :], alone[LENGTHS[0] :], atol=1e-3)


@pytest.mark.parametrize("min_ratio", [0.0, float("inf")], ids=["sdpa_loop", "sdpa_regroup"])
def test_both_cpu_fallbacks_match_the_documents_alone(monkeypatch, min_ratio: float) -> None:
    monkeypatch.setattr(attention, "LOOP_MIN_WORK_RATIO", min_ratio)
    test_packed_row_matches_each_document_alone({})


def test_padded_batch_is_exactly_sdpa_and_so_is_generation() -> None:
    ours, sdpa = tiny(attention.NAME), tiny("sdpa")
    docs = documents(1)
    ids = torch.nn.utils.rnn.pad_sequence(docs, batch_first=True, padding_value=PAD)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(d) for d in docs], batch_first=True)
    with torch.no_grad():
        assert torch.equal(
            ours(input_ids=ids, attention_mask=mask).logits, sdpa(input_ids=ids, attention_mask=mask).logits
        )
    left = torch.stack([torch.cat([torch.full((2,), PAD), docs[2]]), docs[0][:6]])
    left_mask = torch.stack([torch.tensor([0, 0, 1, 1, 1, 1]), torch.ones(6, dtype=torch.long)])
    kwargs = {"attention_mask": left_mask, "max_new_tokens": 4, "do_sample": False, "pad_token_id": PAD}
    assert torch.equal(ours.generate(left, **kwargs), sdpa.generate(left, **kwargs))


def assert_same_training(batch: dict[str, Any], reference: dict[str, Any]) -> None:
    """The tiny model (the same init each time) gives ``batch`` the loss and gradients of ``reference``."""
    results = []
    for b in (batch, reference):
        model = tiny(attention.NAME).train()
        loss = model(**b).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss, grads), (loss_ref, grads_ref) = results
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    for name, grad in grads_ref.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_padding_free_loss_and_grads_equal_the_padded_batch() -> None:
    examples = []
    for d in documents(2):
        labels = d.tolist()
        labels[: len(labels) // 2] = [-100] * (len(labels) // 2)  # a prompt without loss
        examples.append({"input_ids": d.tolist(), "labels": labels})
    padded = DataCollatorForLanguageModeling(pad_token_id=PAD)(examples)
    flat = DataCollatorForLanguageModeling(pad_token_id=PAD, padding_free=True)(examples)
    assert "attention_mask" not in flat and flat["input_ids"].shape == (1, sum(LENGTHS))
    assert_same_training(flat, padded)


def test_rows_of_one_length_are_collated_dense_with_the_same_loss() -> None:
    """hydratune's padding-free collator: a micro-batch of rows all one length (fixed-length chunks: nothing
    to pad) comes out as the plain ``[rows, length]`` batch, with the loss and gradients of the flattened
    one; rows of several lengths are flattened as before."""
    from hydratune.components.text.batching import dense_when_equal

    collator = dense_when_equal(DataCollatorForLanguageModeling)(pad_token_id=PAD, padding_free=True)
    gen = torch.Generator().manual_seed(3)
    examples = [{"input_ids": torch.randint(4, 600, (9,), generator=gen).tolist()} for _ in range(3)]
    dense = collator(examples)
    flat = DataCollatorForLanguageModeling(pad_token_id=PAD, padding_free=True)(examples)
    assert dense["input_ids"].shape == (3, 9) and "position_ids" not in dense
    assert collator.padding_free  # the collator itself unchanged
    assert_same_training(dense, flat)
    mixed = collator([{"input_ids": d.tolist()} for d in documents(2)])
    assert mixed["input_ids"].shape == (1, sum(LENGTHS)) and "position_ids" in mixed


# ---- dispatch (the GPU path, checked without a GPU) ---------------------------------------------------
@pytest.mark.parametrize(
    ("device", "dtype", "dropout", "docs", "varlen", "flash", "cap", "expected"),
    [
        ("cuda", torch.bfloat16, 0.0, 8, True, False, (9, 0), "varlen_attn"),
        ("cuda", torch.float16, 0.0, 8, True, True, (8, 0), "varlen_attn"),
        ("cuda", torch.bfloat16, 0.1, 8, True, True, (9, 0), "flash_attn"),  # varlen_attn has no dropout
        ("cuda", torch.bfloat16, 0.1, 8, True, False, (9, 0), "sdpa_regroup"),
        ("cuda", torch.bfloat16, 0.0, 8, True, False, (7, 5), "sdpa_regroup"),  # pre-Ampere
        ("cuda", torch.float32, 0.0, 8, True, True, (9, 0), "sdpa_regroup"),  # FlashAttention: 16-bit only
        ("cpu", torch.float32, 0.0, 8, True, True, (0, 0), "sdpa_loop"),  # long-tailed lengths
        ("cpu", torch.bfloat16, 0.0, 1000, False, False, (0, 0), "sdpa_regroup"),
    ],
)
def test_backend_selection(device, dtype, dropout, docs, varlen, flash, cap, expected) -> None:
    got = attention.select_backend(
        device,
        dtype,
        dropout,
        64,
        docs,
        has_varlen=varlen,
        has_flash_attn=flash,
        capability=cap,
        work_ratio=5.0,
    )
    assert got == expected


def test_cpu_regroups_documents_of_similar_length() -> None:
    similar = attention.Documents(torch.tensor([0, 30, 58, 90], dtype=torch.int32), 32, 1)
    skewed = attention.Documents(torch.tensor([0, 120, 130, 140], dtype=torch.int32), 120, 1)
    assert similar.padded_work_ratio < 2 < skewed.padded_work_ratio
    pick = lambda d: attention.select_backend(  # noqa: E731
        "cpu",
        torch.float32,
        0.0,
        32,
        3,
        has_varlen=False,
        has_flash_attn=False,
        work_ratio=d.padded_work_ratio,
    )
    assert (pick(similar), pick(skewed)) == ("sdpa_regroup", "sdpa_loop")


def _reference_varlen(calls: list[dict[str, Any]]) -> Any:
    """Stands in for torch's varlen_attn on CPU: records the call, computes per-document SDPA."""

    def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
        calls.append({"cu": cu_q.tolist(), "max": max_q, "window": window_size, "gqa": enable_gqa})
        bounds = cu_q.tolist()
        outs = []
        for s, e in itertools.pairwise(bounds):
            qs, ks, vs = (t[s:e].transpose(0, 1)[None] for t in (q, k, v))
            o = torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, scale=scale, is_causal=window_size == (-1, 0), enable_gqa=enable_gqa
            )
            outs.append(o[0].transpose(0, 1))
        return torch.cat(outs)

    return varlen_attn


def test_gpu_path_calls_varlen_attn_with_document_boundaries(monkeypatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(attention, "select_backend", lambda *a, **k: "varlen_attn")
    monkeypatch.setattr(attention, "_varlen_attn", lambda: _reference_varlen(calls))
    monkeypatch.setattr(attention, "_varlen_takes_gqa", lambda: True)
    model = tiny(attention.NAME)
    docs = documents(3)
    batch = DataCollatorForLanguageModeling(pad_token_id=PAD, padding_free=True)(
        [{"input_ids": d.tolist()} for d in docs]
    )
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        alone = torch.cat([model(input_ids=d[None]).logits[0] for d in docs])
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-5)
    bounds = [0, *torch.tensor(LENGTHS).cumsum(0).tolist()]
    assert len(calls) == model.config.num_hidden_layers
    assert all(c == {"cu": bounds, "max": max(LENGTHS), "window": (-1, 0), "gqa": True} for c in calls)


# ---- config -------------------------------------------------------------------------------------------
def test_auto_falls_back_for_softcapping_and_sliding_windows(caplog) -> None:
    gemma = AutoConfig.for_model("gemma2", attn_logit_softcapping=50.0, sliding_window=4096)
    qwen_sliding = AutoConfig.for_model("qwen2", use_sliding_window=True, sliding_window=64)
    with caplog.at_level(logging.WARNING, logger="hydratune"):
        assert attention.resolve("auto", gemma) == "eager"
    assert "soft-caps" in caplog.text
    assert attention.resolve("auto", qwen_sliding) == "sdpa"
    assert attention.resolve("auto", AutoConfig.for_model("qwen2")) == attention.NAME
    assert attention.resolve("eager", AutoConfig.for_model("qwen2")) == "eager"


def test_explicit_varlen_on_gemma2_is_a_config_error(compose_cfg) -> None:
    from hydra.utils import instantiate

    model = instantiate(compose_cfg("model=gemma2_2b", "model.attn_implementation=varlen_sdpa").model)
    with pytest.raises(ConfigError) as err:
        model.resolved_attn_implementation()
    assert err.value.key == "model.attn_implementation"


def test_padding_free_with_prompt_learning_is_refused_before_load(compose_cfg) -> None:
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("peft=prefix")
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg))
    assert err.value.key == "data.padding_free"
    cfg = compose_cfg("peft=prefix", "data.padding_free=false")
    check_before_load(cfg, Components.from_config(cfg))  # the padded layout is fine


def test_padding_free_with_plain_sdpa_warns(compose_cfg, caplog) -> None:
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    for impl, warned in (("sdpa", True), ("auto", False)):
        caplog.clear()
        cfg = compose_cfg(f"model.attn_implementation={impl}")
        with caplog.at_level(logging.WARNING, logger="hydratune"):
            check_before_load(cfg, Components.from_config(cfg))
        assert ("dense [tokens, tokens] block mask" in caplog.text) is warned


# ---- the SFT default end to end ----------------------------------------------------------------------
def test_default_sft_batches_are_padding_free_and_match_padded_training(run_recipe) -> None:
    short = ["train.max_steps=3", "train.micro_batch_size=8", "data.max_samples=24"]
    short += ["data.eval_path=null", "train.eval_every=0", "train.eval_generations=0"]
    ctx, _ = run_recipe(*short, name="padding_free")
    batch = next(iter(ctx.trainer.get_train_dataloader()))
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
    assert not (batch["input_ids"] == ctx.trainer.processing_class.pad_token_id).any()
    assert int((batch["position_ids"][0] == 0).sum()) == 8  # the micro-batch's 8 examples, one row
    padded_ctx, _ = run_recipe(*short, "data.padding_free=false", name="padded")

    def series(c: Any, key: str) -> list[float]:
        return [r[key] for r in c.run_dir.read_metrics() if "loss" in r and key in r]

    # same examples, same tokens counted, same losses: only the layout differs
    assert series(ctx, "num_input_tokens_seen") == series(padded_ctx, "num_input_tokens_seen")
    torch.testing.assert_close(series(ctx, "loss"), series(padded_ctx, "loss"), rtol=1e-4, atol=1e-4)
