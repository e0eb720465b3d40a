"""The memory estimate (components/estimate.py), strategy=auto, `hydratune estimate` and the GPU bench's
CPU side. Pure arithmetic except one meta-device build; no weights, no network, no GPU."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from components.estimate import (
    GB,
    STRATEGY_SHAPES,
    Arch,
    GiB,
    RunSpec,
    choose,
    estimate,
    model_state_bytes,
    param_counts,
    parse_memory,
    quantized_bytes_per_param,
    shape_of,
    spec_from_config,
    trainable_params,
)

REPO = Path(__file__).resolve().parent.parent
LLAMA3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "head_dim": 128,
}


def full_spec(arch: dict, **over) -> RunSpec:
    a = Arch.from_dict(arch)
    return replace(RunSpec(arch=a, trainable=param_counts(a).total, full_finetune=True), **over)


def model_states(est) -> float:
    return est.row("parameters") + est.row("gradients") + est.row("optimizer states")


# ---- the arithmetic -----------------------------------------------------------------------------
def test_seven_b_mixed_precision_adam_is_112_gb() -> None:
    assert model_state_bytes(7e9) == pytest.approx(112 * GB)
    assert model_state_bytes(7e9, stage=3, world_size=8) == pytest.approx(14 * GB)
    assert model_state_bytes(7e9, stage=1, world_size=8) == pytest.approx((4 * 7 + 12 * 7 / 8) * GB)
    assert model_state_bytes(7e9, stage=2, world_size=8) == pytest.approx((2 * 7 + 14 * 7 / 8) * GB)


@pytest.mark.parametrize(
    ("strategy", "n", "per_param"),
    [
        ("zero0", 1, 16),
        ("zero1", 8, 4 + 12 / 8),
        ("zero2", 8, 2 + 14 / 8),
        ("zero3", 8, 16 / 8),
        ("single", 1, 16),
    ],
)
def test_estimate_rows_follow_zero_shares(strategy: str, n: int, per_param: float) -> None:
    """The per-GPU table's weights + gradients + optimizer rows are the ZeRO paper's shares (16 B/param
    for mixed-precision Adam: DeepSpeed's bf16 + fp32 masters, or fp32 weights under autocast)."""
    spec = full_spec(LLAMA3_8B, strategy=STRATEGY_SHAPES[strategy], num_gpus=n)
    est = estimate(spec)
    assert model_states(est) == pytest.approx(per_param * est.params_total, rel=1e-9)


def test_parameter_counts_of_shipped_models() -> None:
    assert param_counts(Arch.from_dict(LLAMA3_8B)).total == pytest.approx(8.03e9, rel=0.002)
    qwen = {
        **LLAMA3_8B,
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "head_dim": 64,
    }
    assert param_counts(Arch.from_dict(qwen)).total == 494_032_768  # Qwen2.5-0.5B's published count


@pytest.mark.parametrize("option", ["tiny", "qwen2_5_0_5b", "gemma2_2b"])
def test_parameter_count_matches_the_meta_device_model(compose_cfg, option: str) -> None:
    import torch
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM

    cfg = compose_cfg(f"model={option}")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(instantiate(cfg.model).load_config())
    real = sum(p.numel() for p in model.parameters())
    assert spec_from_config(cfg).arch and estimate(spec_from_config(cfg)).params_total == real


def test_lora_trainable_parameters() -> None:
    a = Arch.from_dict(LLAMA3_8B)
    lora = {"_target_": "components.peft.LoRA", "r": 16, "target_modules": "all-linear"}
    assert trainable_params(a, lora) == 41_943_040  # peft's count for Llama-3.1-8B r=16 all-linear
    qv = trainable_params(a, {**lora, "target_modules": ["q_proj", "v_proj"]})
    assert qv == 16 * 32 * ((4096 + 4096) + (4096 + 1024))


def test_quantized_weight_bytes() -> None:
    assert quantized_bytes_per_param(4) == pytest.approx(0.5 + 0.5 / 8)  # fp32 absmax per 64
    extra_bits = (quantized_bytes_per_param(4, double_quant=True) - 0.5) * 8
    assert extra_bits == pytest.approx(0.127, abs=0.001)
    assert quantized_bytes_per_param(8) == 1.0


def test_parse_memory() -> None:
    assert parse_memory("80GB") == 80 * GiB
    assert parse_memory("24GiB") == 24 * GiB
    assert parse_memory("80") == 80 * GiB
    assert parse_memory("512MB") == 512 * 1024**2
    assert parse_memory("auto") is None


@pytest.mark.parametrize(
    ("option", "kind"),
    [
        ("adamw", "adamw"),
        ("adamw_8bit", "adamw_8bit"),
        ("paged_adamw_8bit", "adamw_8bit"),
        ("paged_adamw_32bit", "adamw"),
        ("adafactor", "adafactor"),
        ("sgd", "sgd_momentum"),
    ],
)
def test_optimizer_options_are_read(compose_cfg, option: str, kind: str) -> None:
    from components.estimate import optimizer_kind

    if not (REPO / "conf" / "optimizer" / f"{option}.yaml").is_file():
        pytest.skip(f"conf/optimizer/{option}.yaml is not there yet")
    assert optimizer_kind(compose_cfg(f"optimizer={option}").optimizer) == kind


def test_quantization_options_are_read(compose_cfg) -> None:
    if not (REPO / "conf" / "quantization" / "nf4.yaml").is_file():
        pytest.skip("conf/quantization/nf4.yaml is not there yet")
    base = ["model=llama3_8b", "peft=lora", "precision=bf16"]
    nf4 = estimate(spec_from_config(compose_cfg(*base, "quantization=nf4")))
    int8 = estimate(spec_from_config(compose_cfg(*base, "quantization=int8")))
    linear = param_counts(Arch.from_dict(LLAMA3_8B)).linear
    assert nf4.row("quantized weights") == pytest.approx(
        linear * quantized_bytes_per_param(4, double_quant=True)
    )
    assert linear < int8.row("quantized weights") < 1.01 * linear


# ---- monotonicity -------------------------------------------------------------------------------
def test_more_gpus_never_raise_zero3_memory() -> None:
    totals = [
        estimate(full_spec(LLAMA3_8B, strategy=STRATEGY_SHAPES["zero3"], num_gpus=n)).total
        for n in (1, 2, 4, 8, 16, 64)
    ]
    assert all(b <= a for a, b in itertools.pairwise(totals)), totals


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(("mb", "seq"), [(1, 512), (4, 2048), (16, 4096)])
def test_checkpointing_never_raises_activations(attn: str, mb: int, seq: int) -> None:
    for peft in (None, {"_target_": "x.LoRA", "r": 8}):
        spec = full_spec(LLAMA3_8B, micro_batch=mb, seq_len=seq, attn_implementation=attn)
        if peft:
            spec = replace(spec, trainable=trainable_params(spec.arch, peft), full_finetune=False)
        off, on = estimate(spec), estimate(replace(spec, gradient_checkpointing=True))
        assert on.row("activations") <= off.row("activations")
        assert on.peak_allocated <= off.peak_allocated


def test_lora_and_qlora_need_less_than_full() -> None:
    full = full_spec(LLAMA3_8B, micro_batch=2, seq_len=2048)
    lora = replace(full, trainable=trainable_params(full.arch, {"_target_": "x.LoRA"}), full_finetune=False)
    qlora = replace(lora, quant_bits=4, double_quant=True)
    assert estimate(qlora).total < estimate(lora).total < estimate(full).total


def test_eager_attention_adds_the_s_squared_term() -> None:
    sdpa = full_spec(LLAMA3_8B, micro_batch=1, seq_len=4096)
    eager = replace(sdpa, attn_implementation="eager")
    assert estimate(eager).row("activations") > 1.3 * estimate(sdpa).row("activations")


# ---- strategies and strategy=auto ---------------------------------------------------------------
@pytest.mark.parametrize("option", sorted(STRATEGY_SHAPES))
def test_shape_of_composed_option_matches_table(compose_cfg, option: str) -> None:
    """The comparison table's shapes agree with the option YAMLs in conf/strategy/."""
    if not (REPO / "conf" / "strategy" / f"{option}.yaml").is_file():
        pytest.skip(f"conf/strategy/{option}.yaml is not there yet")
    got, want = shape_of(compose_cfg(f"strategy={option}").strategy), STRATEGY_SHAPES[option]
    assert (got.kind, got.stage, got.offload_optimizer, got.offload_param) == (
        want.kind,
        want.stage,
        want.offload_optimizer,
        want.offload_param,
    )


def test_auto_llama3_8b_full_on_one_80gb_gpu_needs_offload(compose_cfg) -> None:
    cfg = compose_cfg("model=llama3_8b", "precision=bf16", "data.max_length=2048", "estimate.num_gpus=1")
    decision = choose(spec_from_config(cfg), 80 * GiB, 0.1, per_gpu_batch=8)
    assert decision.strategy in (None, "zero2_offload", "zero3_offload", "zero3_nvme"), decision.explain()


def test_auto_llama3_70b_on_8x80gb_is_zero3(compose_cfg) -> None:
    cfg = compose_cfg("model=llama3_70b", "precision=bf16", "estimate.num_gpus=8")
    decision = choose(spec_from_config(cfg), 80 * GiB, 0.1, per_gpu_batch=32)
    assert decision.strategy in ("zero3", "zero3_offload"), decision.explain()
    assert decision.micro_batch * decision.accumulation == 32
    assert decision.estimate is not None and decision.estimate.fits(80 * GiB, 0.1)


def test_auto_tiny_on_one_gpu_is_single(compose_cfg) -> None:
    cfg = compose_cfg("estimate.num_gpus=1")
    decision = choose(spec_from_config(cfg), 24 * GiB, 0.1, per_gpu_batch=32)
    assert (decision.strategy, decision.micro_batch, decision.accumulation) == ("single", 32, 1)


def test_auto_keeps_the_global_batch_and_takes_the_largest_micro_batch() -> None:
    spec = full_spec(LLAMA3_8B, seq_len=4096, num_gpus=8)
    decision = choose(spec, 80 * GiB, 0.1, per_gpu_batch=64)
    assert decision.strategy is not None and decision.micro_batch * decision.accumulation == 64
    if decision.micro_batch < 64:  # the next larger divisor would not fit
        bigger = next(d for d in range(decision.micro_batch + 1, 65) if 64 % d == 0)
        base = replace(
            spec,
            strategy=STRATEGY_SHAPES[decision.strategy],
            gradient_checkpointing=decision.gradient_checkpointing,
        )
        assert not estimate(replace(base, micro_batch=bigger)).fits(80 * GiB, 0.1)


def test_resolve_auto_replaces_the_strategy_node(compose_cfg) -> None:
    from components.auto import is_auto, resolve_auto

    cfg = compose_cfg(
        "strategy=auto",
        "estimate.gpu_memory=80GB",
        "estimate.num_gpus=1",
        "train.micro_batch_size=4",
        "train.gradient_accumulation_steps=8",
    )
    assert is_auto(cfg)
    new, text = resolve_auto(cfg, compose_strategy=lambda name: compose_cfg(f"strategy={name}").strategy)
    assert not is_auto(new) and new.strategy._target_.endswith(".Single")
    assert new.train.micro_batch_size * new.train.gradient_accumulation_steps == 32
    assert "chose strategy=single" in text


# ---- the command line ---------------------------------------------------------------------------
def hydratune_estimate(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "COLUMNS": "160", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "recipes", "estimate", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    return proc, time.perf_counter() - start


def test_cli_estimate_llama3_8b_lora_on_24gb() -> None:
    proc, seconds = hydratune_estimate(
        "model=llama3_8b", "peft=lora", "precision=bf16", "estimate.gpu_memory=24GB"
    )
    assert proc.returncode in (0, 1), proc.stderr
    assert "Memory per GPU" in proc.stdout and "zero3_offload" in proc.stdout
    assert ("FITS" in proc.stdout) or ("DOES NOT FIT" in proc.stdout)
    assert seconds <= 10, seconds


def test_cli_estimate_llama3_70b_auto_names_the_choice() -> None:
    proc, seconds = hydratune_estimate(
        "model=llama3_70b", "strategy=auto", "estimate.num_gpus=8", "estimate.gpu_memory=80GB"
    )
    assert proc.returncode == 0, proc.stderr
    assert "chose strategy=zero3" in proc.stdout and "fastest rung that fits" in proc.stdout
    assert seconds <= 10, seconds


# ---- the GPU bench's CPU side -------------------------------------------------------------------
def test_bench_configurations_and_committed_table() -> None:
    spec = importlib.util.spec_from_file_location("bench_memory", REPO / "bench" / "memory.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_memory"] = bench  # dataclasses look their module up while the class is built
    spec.loader.exec_module(bench)
    assert len(bench.CONFIGS) >= 8
    assert {c.peft for c in bench.CONFIGS} == {"full", "lora", "qlora"}
    assert {c.strategy for c in bench.CONFIGS} >= {"single", "zero0", "zero2", "zero3"}
    for c in bench.CONFIGS:
        assert 1 * GiB < bench.estimate_for(c).peak_allocated < 40 * GiB
    measured = json.loads((REPO / "docs" / "memory.json").read_text())["results"]
    errors = {
        c.name: bench.estimate_for(c).peak_allocated / measured[c.name]["peak"] - 1
        for c in bench.CONFIGS
        if isinstance(measured.get(c.name), dict)
    }
    assert len(errors) >= 8
    assert all(abs(e) <= 0.15 for e in errors.values()), errors
