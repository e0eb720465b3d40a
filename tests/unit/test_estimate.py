"""The memory estimate (components/memory/estimate.py), strategy=auto, `hydratune estimate` and the GPU
bench's CPU side. Pure arithmetic except one meta-device build; no weights, no network, no GPU."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hydratune.components.memory.arch import Arch, lora_params, param_counts
from hydratune.components.memory.estimate import (
    GB,
    LOGITS_BYTES,
    GiB,
    RunSpec,
    estimate,
    model_state_bytes,
    quantized_bytes_per_param,
)
from hydratune.components.memory.ladder import choose
from hydratune.components.memory.shapes import StrategyShape
from hydratune.components.memory.spec import parse_memory, spec_from_config, strategy_shapes
from hydratune.components.peft import LoRA

#: every strategy option's shape on 8-GPU nodes (the components declare them: conf/strategy/ is the source)
STRATEGY_SHAPES = strategy_shapes(gpus_per_node=8)


def shapes_for(spec: RunSpec) -> dict[str, StrategyShape]:
    """The ladder's rungs for ``spec``: the options that apply to its world size."""
    return strategy_shapes(spec.world_size, spec.num_gpus)


def trainable_params(arch: Arch, peft: dict) -> int:
    """What a LoRA option trains, as the component counts it."""
    return LoRA(**{k: v for k, v in peft.items() if k != "_target_"}).trainable_params(arch)


REPO = Path(__file__).resolve().parents[2]
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
    lora = {"_target_": "hydratune.components.peft.LoRA", "r": 16, "target_modules": "all-linear"}
    assert trainable_params(a, lora) == 41_943_040  # peft's count for Llama-3.1-8B r=16 all-linear
    qv = trainable_params(a, {**lora, "target_modules": ["q_proj", "v_proj"]})
    assert qv == 16 * 32 * ((4096 + 4096) + (4096 + 1024))
    assert lora_params(a, 16, ["q_proj", "v_proj"]) == qv  # the arithmetic the bench uses without Hydra


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
    from hydra.utils import instantiate

    assert instantiate(compose_cfg(f"optimizer={option}").optimizer).memory_kind == kind


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


def test_sfts_chunked_head_holds_one_chunk_of_logits(compose_cfg) -> None:
    """SFT's default loss (recipe.loss_impl=chunked) holds one chunk of positions' logits, the decision the
    run makes (recipes/sft.py loss_path); TRL's head, or a strategy that shards the head, the whole
    micro-batch's."""
    from hydratune.components.modeling.lm_head_chunk import chunk_for

    base = ["model=llama3_8b", "peft=lora", "precision=bf16", "data.max_length=4096"]
    vocab = Arch.from_dict(LLAMA3_8B).vocab_size
    chunked = estimate(spec_from_config(compose_cfg(*base)))
    trl_spec = spec_from_config(compose_cfg(*base, "recipe.loss_impl=trl"))
    trl = estimate(trl_spec)
    sharded = estimate(spec_from_config(compose_cfg(*base, "strategy=zero3")))
    assert chunked.row("logits + loss") == pytest.approx(LOGITS_BYTES * vocab * chunk_for(vocab))
    assert trl.row("logits + loss") == pytest.approx(LOGITS_BYTES * vocab * trl_spec.tokens)
    assert trl_spec.tokens > chunk_for(vocab)
    assert sharded.row("logits + loss") == trl.row("logits + loss")
    assert chunked.row("activations") == trl.row("activations")


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
    for peft in (None, {"r": 8}):
        spec = full_spec(LLAMA3_8B, micro_batch=mb, seq_len=seq, attn_implementation=attn)
        if peft:
            spec = replace(spec, trainable=trainable_params(spec.arch, peft), full_finetune=False)
        off, on = estimate(spec), estimate(replace(spec, gradient_checkpointing=True))
        assert on.row("activations") <= off.row("activations")
        assert on.peak_allocated <= off.peak_allocated


def test_lora_and_qlora_need_less_than_full() -> None:
    full = full_spec(LLAMA3_8B, micro_batch=2, seq_len=2048)
    lora = replace(full, trainable=trainable_params(full.arch, {}), full_finetune=False)
    qlora = replace(lora, quant_bits=4, double_quant=True)
    assert estimate(qlora).total < estimate(lora).total < estimate(full).total


def test_eager_attention_adds_the_s_squared_term() -> None:
    sdpa = full_spec(LLAMA3_8B, micro_batch=1, seq_len=4096)
    eager = replace(sdpa, attn_implementation="eager")
    assert estimate(eager).row("activations") > 1.3 * estimate(sdpa).row("activations")


# ---- strategies and strategy=auto ---------------------------------------------------------------
#: what each shipped option does to memory, written out by hand: the shapes the components declare must
#: say the same (a component that misreports its offload or stage fails here)
SHIPPED_SHAPES = {
    "single": ("single", 0, "none", "none"),
    "ddp": ("ddp", 0, "none", "none"),
    "fsdp": ("fsdp", 3, "none", "none"),
    "zero0": ("deepspeed", 0, "none", "none"),
    "zero1": ("deepspeed", 1, "none", "none"),
    "zero2": ("deepspeed", 2, "none", "none"),
    "zero3": ("deepspeed", 3, "none", "none"),
    "zero2_offload": ("deepspeed", 2, "cpu", "none"),
    "zero3_offload": ("deepspeed", 3, "cpu", "cpu"),
    "zero3_nvme": ("deepspeed", 3, "nvme", "nvme"),
    "zero3pp": ("deepspeed", 3, "none", "none"),
}


@pytest.mark.parametrize("option", sorted(SHIPPED_SHAPES))
def test_the_composed_option_declares_its_shape(compose_cfg, option: str) -> None:
    """The comparison table's shapes come from the option YAMLs in conf/strategy/ as composed."""
    from hydra.utils import instantiate

    got = instantiate(compose_cfg(f"strategy={option}").strategy).memory_shape(8)
    assert (got.kind, got.stage, got.offload_optimizer, got.offload_param) == SHIPPED_SHAPES[option]
    assert STRATEGY_SHAPES[option] == got


def test_assumed_speeds_keep_the_documented_order() -> None:
    """single = ddp > zero0 > zero1 > zero2 > fsdp > zero3pp > zero3 > zero2_offload > zero3_offload >
    zero3_nvme: strategy=auto walks this order (components/memory/shapes.py)."""
    order = ["ddp", "zero0", "zero1", "zero2", "fsdp", "zero3pp", "zero3", "zero2_offload", "zero3_offload"]
    speeds = [STRATEGY_SHAPES[name].speed for name in [*order, "zero3_nvme"]]
    assert speeds == sorted(speeds, reverse=True) and len(set(speeds)) == len(speeds)
    assert strategy_shapes(1)["single"].speed == STRATEGY_SHAPES["ddp"].speed == 1.0


def test_auto_llama3_8b_full_on_one_80gb_gpu_needs_offload(compose_cfg) -> None:
    cfg = compose_cfg("model=llama3_8b", "precision=bf16", "data.max_length=2048", "estimate.num_gpus=1")
    spec = spec_from_config(cfg)
    shapes = shapes_for(spec)
    decision = choose(spec, shapes, 80 * GiB, 0.1, per_gpu_batch=8)
    # nothing fits, or a rung that moves the optimizer states off the GPU (whichever options offer one)
    chosen = shapes.get(decision.strategy or "")
    assert chosen is None or chosen.offload_optimizer != "none", decision.explain()
    assert decision.strategy is not None  # zero2_offload among today's options


def test_auto_llama3_70b_on_8x80gb_is_zero3(compose_cfg) -> None:
    cfg = compose_cfg("model=llama3_70b", "precision=bf16", "estimate.num_gpus=8")
    spec = spec_from_config(cfg)
    decision = choose(spec, shapes_for(spec), 80 * GiB, 0.1, per_gpu_batch=32)
    assert decision.strategy in ("zero3", "zero3_offload"), decision.explain()
    assert decision.micro_batch * decision.accumulation == 32
    assert decision.estimate is not None and decision.estimate.fits(80 * GiB, 0.1)


def test_auto_tiny_on_one_gpu_is_single(compose_cfg) -> None:
    cfg = compose_cfg("estimate.num_gpus=1")
    spec = spec_from_config(cfg)
    decision = choose(spec, shapes_for(spec), 24 * GiB, 0.1, per_gpu_batch=32)
    assert (decision.strategy, decision.micro_batch, decision.accumulation) == ("single", 32, 1)


def test_auto_keeps_the_global_batch_and_takes_the_largest_micro_batch() -> None:
    spec = full_spec(LLAMA3_8B, seq_len=4096, num_gpus=8)
    decision = choose(spec, shapes_for(spec), 80 * GiB, 0.1, per_gpu_batch=64)
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
    from hydratune.components.auto import is_auto, resolve_auto

    cfg = compose_cfg(
        "strategy=auto",
        "estimate.gpu_memory=80GB",
        "estimate.num_gpus=1",
        "train.micro_batch_size=4",
        "train.gradient_accumulation_steps=8",
    )
    assert is_auto(cfg)
    new, text = resolve_auto(cfg, compose_strategy=lambda choice: compose_cfg(*choice).strategy)
    assert not is_auto(new) and new.strategy._target_.endswith(".Single")
    assert new.train.micro_batch_size * new.train.gradient_accumulation_steps == 32
    assert "chose strategy=single" in text


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
    assert all("provenance" in m for m in measured.values())  # every entry says where it comes from
    errors = {
        c.name: bench.estimate_for(c).peak_allocated / measured[c.name]["peak"] - 1
        for c in bench.CONFIGS
        if isinstance(measured.get(c.name), dict)
        and not measured[c.name]["provenance"].startswith("unknown")  # shown in the doc, not counted
    }
    assert len(errors) >= 8
    assert all(abs(e) <= 0.15 for e in errors.values()), errors


def test_hydratune_bench_harness_on_cpu(capsys) -> None:
    """bench/hydratune_memory.py: the 16 documented configurations + the two offload ones, each composing
    to a hydratune run with a few steps; without a GPU it measures nothing and exits 0."""
    import torch

    spec = importlib.util.spec_from_file_location("hydratune_memory", REPO / "bench" / "hydratune_memory.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    bench_spec = importlib.util.spec_from_file_location("bench_memory", REPO / "bench" / "memory.py")
    bench = importlib.util.module_from_spec(bench_spec)
    sys.modules["bench_memory"] = bench
    bench_spec.loader.exec_module(bench)
    assert set(harness.CONFIGS) == {c.name for c in bench.CONFIGS} | {
        "full_bf16_zero2_offload",
        "full_bf16_zero3_offload",
    }
    assert "train.max_steps=3" in harness.overrides("full_bf16")
    # the hydratune-composed run estimates like the bench's spec where the two agree (full fp32 + autocast;
    # model=tiny's config.json adds q/k/v/o biases: 0.01 %); the run's SFT takes the chunked LM head, the
    # bench's plain loop the whole logits
    from hydratune.components.modeling.lm_head_chunk import chunk_for

    plain = bench.spec_for(bench.CONFIGS[0])
    want = estimate(replace(plain, logits_chunk=chunk_for(plain.arch.vocab_size))).peak_allocated
    assert harness.estimated_peak("full_bf16") == pytest.approx(want, rel=1e-3)
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU path is not exercised")
    assert harness.main(["--only", "full_bf16"]) == 0
    assert "no CUDA GPU, nothing measured" in capsys.readouterr().out


# ---- DeepSpeed 0.19.8 as the oracle -------------------------------------------------------------
#: the cells of issue 16: (strategy shape, DeepSpeed estimator's cpu_offload, cpu_offload_params)
ORACLE_STRATEGIES = {
    "zero2": (STRATEGY_SHAPES["zero2"], False, False),
    "zero3": (STRATEGY_SHAPES["zero3"], False, False),
    "zero2_offload": (STRATEGY_SHAPES["zero2_offload"], True, False),
    "zero3_offload": (STRATEGY_SHAPES["zero3_offload"], True, True),
    "zero3_optimizer_offload": (StrategyShape("deepspeed", stage=3, offload_optimizer="cpu"), True, False),
}
#: where DeepSpeed's estimator disagrees with its own optimizer code, the code's allocation is the reference
#: (docs/memory.md, "DeepSpeed's estimator vs its code", says which lines and why)
GPU_GAPS = {"zero3"}  # the 16-bit gradient partition is missing, the fp32 gradients are per sub-group
HOST_GAPS = {"zero2_offload", "zero3_offload", "zero3_optimizer_offload"}  # +2 B/param 16-bit buffers


class _Partition:
    """What ``_create_fp16_sub_groups`` reads of a ZeRO-3 parameter."""

    def __init__(self, numel: int) -> None:
        self.numel = numel

    def partition_numel(self) -> int:
        return self.numel


@pytest.fixture(scope="module")
def meta_models() -> dict[str, dict]:
    """total params, DeepSpeed's largest layer and the parameter sizes of the shipped big models, built on
    the meta device from conf/model/*.yaml (no download)."""
    import torch
    from deepspeed.runtime.zero import stage3
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM

    out = {}
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        for name in ("llama3_8b", "qwen2_5_7b", "llama3_70b"):
            cfg = compose(config_name="config", overrides=[f"model={name}", "precision=bf16"])
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(instantiate(cfg.model).load_config())
            # DeepSpeed's model_to_params dedupes by data_ptr(), which is 0 for every meta tensor: its
            # total collapses to one tensor, so the total comes from the (deduplicated) parameters
            sizes = [p.numel() for p in model.parameters()]
            out[name] = {
                "cfg": cfg,
                "total": sum(sizes),
                "largest": stage3.model_to_params(model)[1],
                "sizes": sizes,
            }
    GlobalHydra.instance().clear()
    return out


def deepspeed_estimate(strategy: str, total: int, largest: int, gpus: int) -> tuple[int, int]:
    """(host RAM per node, GPU) from DeepSpeed's own estimator functions, buffer factor 1.0."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    shape, offload, offload_params = ORACLE_STRATEGIES[strategy]
    if shape.stage == 2:
        return estimate_zero2_model_states_mem_needs(total, gpus, 1, offload, additional_buffer_factor=1.0)
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
        total, largest, gpus, 1, offload, offload_params, zero_init=True, additional_buffer_factor=1.0
    )
    return cpu, gpu


def code_allocation(strategy: str, model: dict, gpus: int) -> tuple[float, float]:
    """(host RAM per node, GPU) that DeepSpeed's optimizer code allocates for the model states (bf16,
    torch Adam), term by term; deepspeed/runtime/zero/stage3.py and stage_1_and_2.py line numbers."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    total, largest, n = model["total"], model["largest"], gpus
    shape = ORACLE_STRATEGIES[strategy][0]
    part = total / n
    if shape.stage == 2 and shape.offload_optimizer == "none":
        return 4 * total * n, 2 * total + (2 + 4 + 4 + 8) * part  # load; bf16 params, partition's grads
    if shape.stage == 2:  # 560-575 fp32 + bf16 staging partitions, 940 fp32 grads, Adam; 659 GPU buffer
        return max(4 * total * n, (4 + 2 + 4 + 8) * part * n), 2 * total + 2 * largest
    gathered = 4 * largest  # DeepSpeed's largest_layer_memory: gathered 16-bit params + grads
    if shape.offload_optimizer == "none":
        fake = type("Z3", (), {"sub_group_size": shape.sub_group_size})()
        partitions = [_Partition(-(-s // n)) for s in model["sizes"]]
        sub_groups = DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(fake, partitions)
        biggest = max(sum(p.numel for p in g) for g in sub_groups)
        # bf16 params + 791 bf16 gradient buffer + fp32 masters + Adam; 2683 fp32 grads per sub-group
        return 4 * largest * n, (2 + 2 + 4 + 8) * part + 4 * biggest + gathered
    host = (4 + 8 + 4 + 2) * part  # fp32 masters, Adam, 1337-1342 fp32 grads, 791 bf16 grads (333: cpu)
    if shape.offload_param != "none":
        return (host + 2 * part) * n, gathered  # the bf16 partitions on the host too
    return host * n, 2 * part + gathered


@pytest.mark.parametrize("gpus", [1, 8])
@pytest.mark.parametrize("strategy", list(ORACLE_STRATEGIES))
@pytest.mark.parametrize("model", ["llama3_8b", "qwen2_5_7b", "llama3_70b"])
def test_model_states_agree_with_deepspeed(meta_models: dict, model: str, strategy: str, gpus: int) -> None:
    """The model-state part of the estimate (GPU) and the host RAM are within ±10 % of DeepSpeed's own
    estimator, or of its code's allocation in the cells where the estimator is known to be wrong."""
    m = meta_models[model]
    spec = replace(spec_from_config(m["cfg"]), strategy=ORACLE_STRATEGIES[strategy][0], num_gpus=gpus)
    est = estimate(spec)
    assert est.params_total == m["total"]
    ds_cpu, ds_gpu = deepspeed_estimate(strategy, m["total"], m["largest"], gpus)
    code_cpu, code_gpu = code_allocation(strategy, m, gpus)
    want_gpu = code_gpu if strategy in GPU_GAPS else ds_gpu
    want_cpu = code_cpu if strategy in HOST_GAPS else ds_cpu
    assert est.model_states == pytest.approx(want_gpu, rel=0.10), (est.model_states / GiB, ds_gpu / GiB)
    assert est.cpu_bytes == pytest.approx(want_cpu, rel=0.10), (est.cpu_bytes / GiB, ds_cpu / GiB)
    # where the reference is the code, the code agrees with the estimator's terms it does count
    assert code_gpu == pytest.approx(ds_gpu, rel=0.25) and code_cpu == pytest.approx(ds_cpu, rel=0.15)


@pytest.mark.parametrize("gpus", [8, 16])
def test_zero3pp_holds_the_hpz_secondary_copy(gpus: int) -> None:
    """ZeRO++ hpZ keeps a second copy of the 16-bit weights sharded over the hpZ group (8 ranks)
    next to the primary partition over all ranks (partition_parameters.py, _partition_param_sec)."""
    spec = full_spec(LLAMA3_8B, num_gpus=8, num_nodes=gpus // 8, compute_bytes=2)
    zero3 = estimate(replace(spec, strategy=STRATEGY_SHAPES["zero3"]))
    zero3pp = estimate(replace(spec, strategy=STRATEGY_SHAPES["zero3pp"]))
    phi = zero3.params_total
    assert zero3pp.row("parameters") == pytest.approx(2 * phi / gpus)
    assert zero3pp.row("hpZ secondary weights") == pytest.approx(2 * phi / 8)
    assert zero3pp.model_states - zero3.model_states == pytest.approx(2 * phi / 8)


SUM_RUNS = {
    "full": {},
    "full_gc_long": {"gradient_checkpointing": True, "seq_len": 4096, "micro_batch": 4},
    "lora": {
        "trainable": 41_943_040,
        "full_finetune": False,
        "weight_bytes": 2,
        "lora_inputs_per_layer": 4096,
    },
    "qlora_gc": {
        "trainable": 41_943_040,
        "full_finetune": False,
        "quant_bits": 4,
        "double_quant": True,
        "gradient_checkpointing": True,
    },
}


@pytest.mark.parametrize("gpus", [1, 8])
@pytest.mark.parametrize("run", list(SUM_RUNS))
@pytest.mark.parametrize("strategy", sorted(STRATEGY_SHAPES))
def test_rows_sum_to_peak_allocated(strategy: str, run: str, gpus: int) -> None:
    """Every term of the peak has a row, and the rows held at the peak add up to it exactly."""
    spec = replace(full_spec(LLAMA3_8B, strategy=STRATEGY_SHAPES[strategy], num_gpus=gpus), **SUM_RUNS[run])
    est = estimate(spec)
    in_peak = [r for r in est.rows if r.in_peak]
    assert sum(r.bytes for r in in_peak) == pytest.approx(est.peak_allocated, rel=1e-12)
    assert all("not at the peak" not in r.note for r in in_peak)


def test_printed_rows_sum_to_peak_allocated(compose_cfg) -> None:
    """The table as printed: the GiB of the rows held at the peak add up to `peak allocated` (2-decimal
    rounding aside), for a step-peak run (ZeRO-3, fp32 gradient sub-group) and a fwd/bwd-peak one."""
    import io

    from rich.console import Console

    from hydratune.components.commands.estimate_tables import render

    for overrides in (
        ("model=llama3_70b", "strategy=zero3", "estimate.num_gpus=8", "model.gradient_checkpointing=true"),
        ("model=llama3_8b", "strategy=zero2_offload", "data.max_length=4096"),
        ("model=llama3_8b", "peft=lora", "quantization=nf4", "strategy=zero3pp", "estimate.num_gpus=8"),
    ):
        buf = io.StringIO()
        render(
            compose_cfg(*overrides, "precision=bf16", "estimate.gpu_memory=80GB"),
            Console(file=buf, width=200),
        )
        lines = [line.strip("│┃ ").split("│") for line in buf.getvalue().splitlines() if line.startswith("│")]
        cells = {cols[0].strip(): cols for cols in lines if len(cols) == 3}
        peak = float(cells["peak allocated"][1])
        held = [
            float(cols[1])
            for name, cols in cells.items()
            if name not in ("peak allocated", "total", "CPU RAM (per node)", "LoRA/adapter states")
            and "not at the peak" not in cols[2]
        ]
        assert len(held) >= 4
        assert sum(held) == pytest.approx(peak, abs=0.005 * len(held) + 0.005), (overrides, held, peak)


def test_acceptance_llama3_70b_zero3_offload_fits_8x24gb(compose_cfg) -> None:
    """Issue 16's command: 70B full fine-tune, ZeRO-3 + CPU offload, 8 x 24 GB fits, and strategy=auto
    for the same run picks an offload rung that the estimate says fits."""
    from hydratune.components.memory.spec import gpu_memory_of

    base = (
        "model=llama3_70b",
        "precision=bf16",
        "estimate.num_gpus=8",
        "estimate.gpu_memory=24GB",
        "model.gradient_checkpointing=true",
        "train.micro_batch_size=1",
        "data.max_length=2048",
    )
    cfg = compose_cfg(*base, "strategy=zero3_offload")
    est = estimate(spec_from_config(cfg))
    assert est.row("gradients") == 0 and est.fits(gpu_memory_of(cfg), 0.1), est.total / GiB
    assert 11 * GiB < est.total < 14 * GiB  # ≈ 12.7 GiB
    auto = compose_cfg(*base, "strategy=auto")
    spec = spec_from_config(auto)
    decision = choose(spec, shapes_for(spec), gpu_memory_of(auto), 0.1, per_gpu_batch=1)
    assert decision.strategy is not None and "offload" in decision.strategy, decision.explain()
    assert decision.estimate is not None and decision.estimate.fits(24 * GiB, 0.1)


def test_grpo_sequences_are_a_prompt_and_its_whole_episode_and_generation_holds_their_kv_cache(
    compose_cfg,
) -> None:
    """recipe=grpo: prompt limit + max_completion_length tokens a sequence (TRL caps every turn and tool
    result of an episode at max_completion_length, so max_tool_calls adds no tokens); generation holds the
    keys and values of micro_batch x accumulation sequences: with a long accumulation that is the peak."""
    tools = ["recipe=grpo", "recipe.tools=[tests.support.tools.add]", "model.chat_template=qwen2_5"]
    tools += ["data.max_prompt_length=1024", "recipe.max_completion_length=512", "recipe.num_generations=2"]
    spec = spec_from_config(compose_cfg(*tools, "recipe.max_tool_calls=3", "train.micro_batch_size=2"))
    more_calls = spec_from_config(compose_cfg(*tools, "recipe.max_tool_calls=9", "train.micro_batch_size=2"))
    assert spec.seq_len == more_calls.seq_len == 1024 + 512
    assert spec.generation_tokens == more_calls.generation_tokens == 2 * 1536
    assert any("add turns, not tokens" in n for n in spec.notes)
    a = spec.arch
    est = estimate(spec)
    kv = est.row("KV cache (generation)")
    assert kv == 2 * 1536 * a.num_layers * 2 * a.num_kv_heads * a.head_dim * spec.compute_bytes
    assert est.peak_phase == "forward/backward" and est.row("activations") > kv  # 2 sequences each
    accumulated = spec_from_config(
        compose_cfg(*tools, "train.micro_batch_size=2", "train.gradient_accumulation_steps=64")
    )
    generating = estimate(accumulated)
    assert accumulated.generation_tokens == 128 * 1536
    assert generating.peak_phase == "generation" and generating.row("KV cache (generation)") == 64 * kv
    held = [r for r in generating.rows if r.in_peak]
    assert {r.name for r in held} >= {"parameters", "optimizer states", "KV cache (generation)"}
    assert "activations" not in {r.name for r in held}
    assert sum(r.bytes for r in held) == pytest.approx(generating.peak_allocated)
    plain = spec_from_config(compose_cfg("recipe=sft"))
    assert plain.generation_tokens == 0 and not plain.notes
