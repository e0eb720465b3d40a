"""The memory estimate under tensor, sequence and pipeline parallelism, and strategy=auto's model-parallel
rungs (components/memory/parallel.py, estimate.py, ladder.py, spec.py; docs/memory.md derives the rules).

Pure arithmetic against hand-computed figures and independent oracles: DeepSpeed's own TP plan reading and
its ZeRO estimators, its pipeline partitioner, torch's interleaved 1F1B schedule. The strategies here are
test stand-ins that declare their axes (``Strategy.axes``, ``searched_axes``) the way the real options do."""

from __future__ import annotations

import io
import itertools
import re
from dataclasses import dataclass, replace
from typing import ClassVar

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.memory.arch import Arch, param_counts
from hydratune.components.memory.estimate import (
    ACTIVATION_SLACK,
    LOGITS_BYTES,
    GiB,
    RunSpec,
    activation_bytes_per_token_layer,
    estimate,
)
from hydratune.components.memory.ladder import choose, ordered
from hydratune.components.memory.parallel import bubble_fraction, in_flight, slices, stage_layers
from hydratune.components.memory.shapes import StrategyShape
from hydratune.components.memory.spec import spec_from_config, strategy_rungs
from hydratune.components.strategy import DeepSpeed, ModelSplit, Strategy
from tests.unit.test_estimate import LLAMA3_8B

ARCH = {
    "llama3_8b": LLAMA3_8B,
    "llama3_70b": {
        **LLAMA3_8B,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
    },
}
ZERO1, ZERO2, ZERO3 = (StrategyShape("deepspeed", stage=s) for s in (1, 2, 3))
ZERO2_OFFLOAD = StrategyShape("deepspeed", stage=2, offload_optimizer="cpu")
ZERO3_OFFLOAD = StrategyShape("deepspeed", stage=3, offload_optimizer="cpu", offload_param="cpu")


def full(model: str, **over) -> RunSpec:
    """A full bf16 fine-tune under DeepSpeed (16-bit residual stream), one micro-batch of 4096 tokens."""
    a = Arch.from_dict(ARCH[model])
    spec = RunSpec(
        arch=a, trainable=param_counts(a).total, full_finetune=True, weight_bytes=2, compute_bytes=2
    )
    return replace(spec, **{"strategy": ZERO1, "num_gpus": 8, "seq_len": 4096, **over})


# ---- test stand-ins for the options that split the model ------------------------------------------
@dataclass(frozen=True)
class NDDeepSpeed(DeepSpeed):
    """A DeepSpeed option whose ``strategy.tp_size`` / ``strategy.sp_size`` sizes strategy=auto tries."""

    searched_axes: ClassVar[tuple[str, ...]] = ("tp", "sp")


@dataclass(frozen=True)
class NDPipeline(ModelSplit, Strategy):
    """A pipeline option: ``strategy.pp_size`` stages, ``strategy.schedule``, data parallel replicas."""

    pp_size: int = 2

    axes: ClassVar[frozenset[str]] = frozenset({"pp"})
    searched_axes: ClassVar[tuple[str, ...]] = ("pp",)

    def applicable(self, world_size: int) -> bool:
        return world_size > 1

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        chunks = 2 if self.schedule == "interleaved_1f1b" else 1
        return StrategyShape("ddp", pipeline_schedule=self.schedule, pipeline_chunks=chunks)


OPTIONS = {
    "zero1": NDDeepSpeed(stage=1),
    "zero3": NDDeepSpeed(stage=3),
    "pipeline": NDPipeline(),
    "zero3_offload": DeepSpeed(stage=3, offload_optimizer="cpu", offload_param="cpu"),
}


# ---- TP: what a rank holds, against DeepSpeed reading transformers' tp_plan --------------------------
def deepspeed_tp_shard(model, tp: int) -> tuple[int, int]:
    """(parameters on one tp rank, its largest module) as DeepSpeed 0.19.8's AutoTP shards ``model``: the
    model's HF tp_plan (``_get_hf_tp_plan``) converted by ``TPPlanConverter`` and matched per weight by
    ``AutoTPConfig.find_matching_spec``, as ``_replace_with_config`` does; COLUMN splits weight and bias,
    ROW the weight only (``LinearAllreduce`` keeps the bias whole); an lm_head tied to the embedding stays
    whole (``_configure_gathered_column_tie_fallbacks``); unmatched modules stay whole."""
    from deepspeed.module_inject.autotp_config import AutoTPConfig, PartitionType
    from deepspeed.module_inject.tp_plan_converter import TPPlanConverter
    from deepspeed.runtime.tensor_parallel.config import _get_hf_tp_plan

    config = AutoTPConfig(tp_size=tp, layer_specs=TPPlanConverter.convert(_get_hf_tp_plan(model)))
    embedding = model.get_input_embeddings().weight
    seen: set[int] = set()
    total = largest = 0
    for name, module in model.named_modules():
        own = 0
        spec = config.find_matching_spec(f"{name}.weight", model.config.model_type)
        kind = spec.partition_type if spec is not None else PartitionType.SKIP
        for pname, p in module.named_parameters(recurse=False):
            split = kind == PartitionType.COLUMN or (kind == PartitionType.ROW and pname == "weight")
            n = p.numel() // tp if split and p is not embedding else p.numel()
            own += n
            total += n if id(p) not in seen else 0
            seen.add(id(p))
        largest = max(largest, own)
    return total, largest


@pytest.fixture(scope="module")
def meta_models(compose_cfg_module) -> dict:
    """Shipped models built on the meta device (no download): (composed config, HF model)."""
    import torch
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM

    out = {}
    for name in ("llama3_70b", "qwen2_5_7b", "gemma2_2b", "qwen2_5_0_5b"):
        cfg = compose_cfg_module(f"model={name}", "precision=bf16")
        with torch.device("meta"):
            out[name] = (cfg, AutoModelForCausalLM.from_config(instantiate(cfg.model).load_config()))
    return out


@pytest.fixture(scope="module")
def compose_cfg_module():
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        yield lambda *overrides: compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_slice_is_what_deepspeed_autotp_shards(meta_models: dict, tp: int) -> None:
    """Per-rank parameters and largest module of llama3_70b, qwen2_5_7b (q/k/v biases), gemma2_2b (4 norms
    a layer, tied) and qwen2_5_0_5b (tied) equal DeepSpeed's reading of their tp_plan, exactly."""
    for name, (cfg, model) in meta_models.items():
        arch = spec_from_config(cfg).arch
        if arch.num_kv_heads % tp:
            continue
        part = slices(arch, tp)[0]
        want_total, want_largest = deepspeed_tp_shard(model, tp)
        assert (part.params, part.largest) == (want_total, want_largest), name


@pytest.mark.parametrize("gpus", [8, 16])
@pytest.mark.parametrize("tp", [2, 8])
@pytest.mark.parametrize("shape", ["zero2", "zero2_offload", "zero3_offload"])
def test_tp_model_states_agree_with_deepspeed(meta_models: dict, shape: str, tp: int, gpus: int) -> None:
    """ZeRO on top of TP: DeepSpeed's estimators applied to one tp rank's shard (AutoTP's, above) over the
    world / tp data-parallel ranks, within 1 %; for stage 2 offload plus the one largest-parameter 16-bit
    buffer its code allocates and its estimator omits (docs/memory.md: temp_grad_buffer_for_gpu_offload)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cfg, model = meta_models["llama3_70b"]
    total, largest = deepspeed_tp_shard(model, tp)
    dp = gpus // tp
    strategy = {"zero2": ZERO2, "zero2_offload": ZERO2_OFFLOAD, "zero3_offload": ZERO3_OFFLOAD}[shape]
    spec = replace(
        spec_from_config(cfg), strategy=strategy, num_gpus=min(gpus, 8), num_nodes=gpus // 8, tp=tp
    )
    if shape == "zero3_offload":
        _, want = estimate_zero3_model_states_mem_needs(total, largest, dp, 1, True, True, True, 1.0)[:2]
    else:
        _, want = estimate_zero2_model_states_mem_needs(total, dp, 1, shape == "zero2_offload", 1.0)
        want += 2 * largest if shape == "zero2_offload" else 0
    assert estimate(spec).model_states == pytest.approx(want, rel=0.01)


@pytest.mark.parametrize("gpus", [8, 16])
def test_llama3_70b_zero1_tp8_by_hand(gpus: int) -> None:
    """Issue 26's acceptance command: each GPU holds every decoder linear / 8, the embedding whole, lm_head
    / 8; ZeRO-1 shards the 12 B/param of fp32 masters + Adam over the world / 8 data-parallel ranks."""
    h, i, layers, kv, vocab = 8192, 28672, 80, 1024, 128256
    linear = (2 * h * h + 2 * h * kv + 3 * h * i) // 8
    held = layers * (linear + 2 * h) + vocab * h + vocab * h // 8 + h
    assert held == 9_739_706_368
    dp = gpus // 8
    est = estimate(full("llama3_70b", tp=8, num_nodes=gpus // 8, gradient_checkpointing=True))
    assert est.part.params == held
    assert est.row("parameters") == est.row("gradients") == 2 * held
    assert est.row("optimizer states") == pytest.approx(12 * held / dp)
    assert est.row("fp32 gradient copy") == pytest.approx(4 * held / dp)
    assert est.peak_phase == "optimizer step"  # 16 B/param of 9.7 B: far over 80 GB (182 GiB at dp 1)
    assert est.total / GiB == pytest.approx(191.6 if dp == 1 else 115.4, abs=0.1)


# ---- activations: Korthikanti et al. 2022 ------------------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_tp_activations_split_the_tensor_parallel_region_only(tp: int) -> None:
    """Per layer and token (bf16 stream, full fine-tune, SDPA): outside the TP region the two norms' inputs
    and outputs (4 x 2h) and the q/k/v and gate/up inputs (2 x 2h); inside it q, the attention output and
    o_proj's input (3 x 2 x q_dim), k and v (2 x 2 x kv_dim), the log-sum-exp (4 B x heads), the MLP's gate,
    up, SiLU(gate) and down_proj's input (4 x 2 x i): Korthikanti's sbh(10 + 24/t), a Llama layer's terms."""
    h, q, kv, i, heads = 4096, 4096, 1024, 14336, 32
    outside = 4 * 2 * h + 2 * 2 * h
    inside = 3 * 2 * q + 2 * 2 * kv + 4 * heads + 4 * 2 * i
    spec = full("llama3_8b", tp=tp, micro_batch=2)
    assert activation_bytes_per_token_layer(spec) == pytest.approx(outside + inside / tp)
    tokens = 2 * 4096
    stack = (32 * (outside + inside / tp) + 3 * 2 * h) * tokens * (1 + ACTIVATION_SLACK)
    est = estimate(spec)
    assert est.row("activations") == pytest.approx(stack)
    assert est.row("logits + loss") == LOGITS_BYTES * 128256 * tokens  # gathered whole: not / tp


@pytest.mark.parametrize("sp", [2, 8, 16])
def test_sp_splits_activations_and_logits_not_the_states(sp: int) -> None:
    """Ulysses: every activation and the logits / sp (k and v / min(sp, KV heads): DeepSpeed replicates the
    8 KV heads at sp 16); no weight is split and ZeRO shards over the data x sequence ranks, so the model
    states equal the data-parallel-only run's on the same GPUs."""
    h, q, kv, i, heads = 4096, 4096, 1024, 14336, 32
    outside, inside_but_kv = 4 * 2 * h + 2 * 2 * h, 3 * 2 * q + 4 * heads + 4 * 2 * i
    nodes = 2 if sp == 16 else 1
    dp_only = full("llama3_8b", strategy=ZERO2, num_nodes=nodes)
    spec = replace(dp_only, sp=sp)
    per_token = (outside + inside_but_kv) / sp + 2 * 2 * kv / min(sp, 8)
    assert activation_bytes_per_token_layer(spec) == pytest.approx(per_token)
    est, base = estimate(spec), estimate(dp_only)
    assert est.model_states == pytest.approx(base.model_states)
    assert est.row("logits + loss") == pytest.approx(base.row("logits + loss") / sp)
    stack = (32 * per_token + 3 * 2 * h / sp) * 4096 * (1 + ACTIVATION_SLACK)
    assert est.row("activations") == pytest.approx(stack)


def test_zero_shards_over_the_data_and_sequence_ranks_only() -> None:
    """ZeRO-3 with tp 2 x sp 2 on 8 GPUs: the tp shard is partitioned over world / tp = 4 ranks (DeepSpeed's
    sequence-data-parallel group), not over 8 and not over the 2 data-parallel replicas."""
    spec = full("llama3_8b", strategy=ZERO3, tp=2, sp=2)
    est = estimate(spec)
    assert (spec.zero_ranks, spec.data_parallel) == (4, 2)
    assert est.row("parameters") == pytest.approx(2 * est.part.params / 4)
    assert est.row("optimizer states") == pytest.approx(12 * est.part.params / 4)


# ---- PP ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["llama3_8b", "llama3_70b", "qwen2_5_0_5b", "gemma2_2b"])
def test_pipeline_stages_are_deepspeeds_balanced_partition(compose_cfg, model: str) -> None:
    """Layers per stage equal DeepSpeed's ``partition_balanced`` over per-layer parameter counts with the
    embedding on the first layer and the final norm + head (a copy of a tied embedding) on the last."""
    from deepspeed.runtime.utils import partition_balanced

    arch = spec_from_config(compose_cfg(f"model={model}")).arch
    c = param_counts(arch)
    units = [c.layer] * c.num_layers
    units[0] += c.embedding
    units[-1] += c.final_norm + (c.lm_head or c.embedding)
    for pp in (2, 4, 8, c.num_layers):
        bounds = partition_balanced(units, pp)
        assert list(stage_layers(arch, pp)) == [int(b - a) for a, b in itertools.pairwise(bounds)]
    assert stage_layers(Arch.from_dict(ARCH["llama3_8b"]), 4) == (7, 9, 9, 7)


def torch_interleaved_peak(pp: int, micro_batches: int, chunks: int, rank: int) -> int:
    """Chunk-micro-batches in flight at the peak of rank ``rank`` in torch's own ScheduleInterleaved1F1B
    order (its ``_calculate_single_rank_operations``; forwards minus backwards so far)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

    schedule = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)  # the order needs no stages
    schedule.n_local_stages, schedule.pp_group_size, schedule._n_microbatches = chunks, pp, micro_batches
    schedule.number_of_rounds = max(1, micro_batches // pp)
    schedule.microbatches_per_round = micro_batches // schedule.number_of_rounds
    live = peak = 0
    for action in filter(None, schedule._calculate_single_rank_operations(rank)):
        live += {_ComputationType.FORWARD: 1, _ComputationType.FULL_BACKWARD: -1}[action.computation_type]
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("pp", "m", "chunks"), [(4, 8, 2), (4, 2, 2), (2, 8, 3), (8, 16, 2)])
def test_micro_batches_in_flight_follow_the_schedules(pp: int, m: int, chunks: int) -> None:
    """GPipe keeps all m; 1F1B min(m, p - stage) (Schedule1F1B's warm-up, then one backward before each
    forward); interleaved 1F1B as torch's own order says, which is Korthikanti et al.'s p + (p-1)/v on the
    first rank when p divides m."""
    for stage in range(pp):
        assert in_flight("gpipe", pp, m, stage) == m
        assert in_flight("1f1b", pp, m, stage) == min(m, pp - stage)
        got = in_flight("interleaved_1f1b", pp, m, stage, chunks)
        assert got * chunks == torch_interleaved_peak(pp, m, chunks, stage)
    if m % pp == 0:
        assert in_flight("interleaved_1f1b", pp, m, 0, chunks) == pytest.approx(pp + (pp - 1) / chunks)
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(4, 8, "interleaved_1f1b", 2) == pytest.approx(3 / 19)
    assert bubble_fraction(1, 8) == 0


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_stages_by_hand(schedule: str) -> None:
    """llama3_8b, 4 stages of (7, 9, 9, 7) layers, 8 micro-batches, checkpointed: each stage's weights,
    gradients and Adam states are its own layers' (+ embedding / norm + head), 16 B/param under DDP-style
    replication with fp32 weights; activations are each layer's input x the micro-batches in flight, the
    logits on the last stage (GPipe: all 8 losses kept)."""
    pipeline = StrategyShape("ddp", pipeline_schedule=schedule)
    a = Arch.from_dict(ARCH["llama3_8b"])
    c = param_counts(a)
    spec = RunSpec(arch=a, trainable=c.total, full_finetune=True, weight_bytes=4, compute_bytes=4)
    spec = replace(spec, strategy=pipeline, num_gpus=4, pp=4, micro_batches=8, seq_len=1024)
    spec = replace(spec, gradient_checkpointing=True)
    est = estimate(spec)
    layers = (7, 9, 9, 7)
    held = [
        7 * c.layer + c.embedding,
        9 * c.layer,
        9 * c.layer,
        7 * c.layer + c.final_norm + c.lm_head,
    ]
    assert [e.part.params for e in est.stages] == held
    flight = [8, 8, 8, 8] if schedule == "gpipe" else [4, 3, 2, 1]
    boundary = 4 * 4096 * 1024  # fp32 residual x tokens
    one_layer = activation_bytes_per_token_layer(spec) * 1024
    for k, e in enumerate(est.stages):
        assert e.row("parameters") == e.row("gradients") == 4 * held[k]
        assert e.row("optimizer states") == 8 * held[k]
        kept = layers[k] * boundary + (3 if k == 3 else 1) * boundary
        assert e.row("activations") == pytest.approx((flight[k] * kept + one_layer) * (1 + ACTIVATION_SLACK))
        logits = LOGITS_BYTES * 128256 * 1024 * (8 if schedule == "gpipe" else 1) if k == 3 else 0
        assert e.row("logits + loss") == pytest.approx(logits)
    assert est is max(est.stages, key=lambda e: e.peak_allocated)  # the heaviest stage is reported
    assert est.bubble == pytest.approx(3 / 11)


ND_SPECS = {
    "tp8": {"tp": 8},
    "sp4_zero3": {"sp": 4, "strategy": ZERO3},
    "tp2_sp2_zero3_offload": {"tp": 2, "sp": 2, "strategy": ZERO3_OFFLOAD},
    "pp4_1f1b": {"pp": 4, "micro_batches": 8, "strategy": StrategyShape("ddp")},
    "pp2_tp2_interleaved": {
        "pp": 2,
        "tp": 2,
        "micro_batches": 4,
        "strategy": StrategyShape(
            "deepspeed", stage=1, pipeline_schedule="interleaved_1f1b", pipeline_chunks=2
        ),
    },
}


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("layout", list(ND_SPECS))
def test_rows_sum_to_the_peak_on_every_rank(layout: str, lora: bool) -> None:
    """The per-GPU table adds up on every stage of every layout, and no state is counted twice or lost:
    over the stages, the parameters held sum to one tp rank's whole model."""
    spec = full("llama3_8b", **ND_SPECS[layout])
    if lora:
        spec = replace(spec, trainable=41_943_040, full_finetune=False, lora_inputs_per_layer=4096)
    est = estimate(spec)
    for e in est.stages or [est]:
        assert sum(r.bytes for r in e.rows if r.in_peak) == pytest.approx(e.peak_allocated, rel=1e-12)
    whole = slices(spec.arch, spec.tp)[0].params
    stage_params = [e.part.params for e in est.stages] if est.stages else [est.part.params]
    pp_copy = param_counts(spec.arch).embedding if spec.pp > 1 and spec.arch.tie_word_embeddings else 0
    assert sum(stage_params) == whole + pp_copy


# ---- strategy=auto -------------------------------------------------------------------------------------
def test_rungs_keep_tp_in_a_node_and_the_model_divisible(compose_cfg) -> None:
    """qwen2_5_7b has 28 heads and 4 KV heads: tp 2 / 4 only (not 8), sp 2 / 4 (28 % 8); pp up to 8 on 8
    GPUs; on 2 x 8 GPUs tp 16 would leave the node. Offload options get no model-parallel variants."""
    spec = replace(spec_from_config(compose_cfg("model=qwen2_5_7b")), seq_len=4096, num_gpus=8)
    labels = {r.label for r in strategy_rungs(spec, OPTIONS)}
    assert {"zero1 tp_size=2", "zero1 tp_size=4", "zero1 sp_size=2", "zero1 sp_size=4"} <= labels
    assert not {"zero1 tp_size=8", "zero1 sp_size=8", "zero3_offload tp_size=2"} & labels
    assert {"pipeline", "pipeline pp_size=4", "pipeline pp_size=8"} <= labels
    two_nodes = {r.label for r in strategy_rungs(replace(spec, num_nodes=2), OPTIONS)}
    assert "pipeline pp_size=16" in two_nodes
    llama = full("llama3_8b", num_gpus=4, num_nodes=2)  # 32 heads, 8 KV heads: tp 8 divides them, not a node
    assert {"zero1 tp_size=4", "zero1 sp_size=8"} <= {r.label for r in strategy_rungs(llama, OPTIONS)}
    assert "zero1 tp_size=8" not in {r.label for r in strategy_rungs(llama, OPTIONS)}
    odd = {r.label for r in strategy_rungs(replace(spec, seq_len=4095), OPTIONS)}
    assert not any("sp_size" in label for label in odd)  # Ulysses needs the sequence divisible


@pytest.mark.parametrize("gib", [8, 22, 24, 40, 64, 80, 141])
def test_auto_takes_model_parallel_exactly_when_zero_alone_does_not_fit(gib: int) -> None:
    """llama3_8b full fine-tune, 8 GPUs of ``gib``: the choice is a tp / sp / pp rung exactly when no
    data-parallel rung on the GPUs fits (at micro-batch 1, with or without checkpointing), and offload only
    when neither does."""
    spec = full("llama3_8b", micro_batch=2, seq_len=8192)
    rungs = strategy_rungs(spec, OPTIONS)
    decision = choose(spec, rungs, gib * GiB, 0.1, per_gpu_batch=4)

    def kind(rung) -> str:  # classified from the shape and mesh, not from Rung.tier
        if "none" not in (rung.shape.offload_optimizer, rung.shape.offload_param):
            return "offload"
        return "model parallel" if rung.tp * rung.sp * rung.pp > 1 else "ZeRO"

    def fits(wanted: str) -> bool:
        return any(
            kind(r) == wanted
            and estimate(r.apply(spec, gradient_checkpointing=gc, micro_batch=1)).fits(gib * GiB)
            for r, gc in ordered(rungs, False)
        )

    chosen = kind(decision.rung) if decision.rung else None
    assert chosen == next((k for k in ("ZeRO", "model parallel", "offload") if fits(k)), None), (
        decision.explain()
    )
    if chosen == "model parallel":
        assert any(
            o.split("=")[0] in ("strategy.tp_size", "strategy.sp_size", "strategy.pp_size")
            for o in decision.overrides
        )


def test_auto_emits_the_tp_overrides_and_keeps_the_global_batch(compose_cfg, monkeypatch) -> None:
    """ZeRO-1 alone does not fit llama3_8b on 8 x 40 GB; ZeRO-1 with tp 2 does: auto says so in the overrides
    a user types, composes them (the run dir replays them) and keeps micro x accumulation x dp."""
    import hydratune.components.strategy
    from hydratune.components.auto import resolve_auto

    monkeypatch.setattr(hydratune.components.strategy, "training_options", lambda: OPTIONS)
    cfg = compose_cfg(
        "model=llama3_8b",
        "precision=bf16",
        "strategy=auto",
        "strategy.candidates=[zero1]",
        "estimate.num_gpus=8",
        "estimate.gpu_memory=40GB",
        "data.max_length=1024",
        "train.micro_batch_size=2",
        "train.gradient_accumulation_steps=2",
    )
    composed: list[list[str]] = []

    def compose_strategy(choice: list[str]):
        composed.append(choice)
        return compose_cfg(choice[0]).strategy

    new, text = resolve_auto(cfg, compose_strategy=compose_strategy)
    assert composed == [["strategy=zero1", "strategy.tp_size=2"]], text
    assert "chose strategy=zero1 strategy.tp_size=2 model.gradient_checkpointing=" in text
    assert "tensor/sequence/pipeline parallel" in text
    dp = 8 // 2
    assert new.train.micro_batch_size * new.train.gradient_accumulation_steps * dp == 2 * 2 * 8


def test_auto_keeps_the_micro_batch_when_told(compose_cfg) -> None:
    """``strategy.tune_micro_batch=false``: the rung must fit at the configured micro-batch, which stays; only
    the accumulation may change (to keep the global batch)."""
    from hydratune.components.auto import resolve_auto

    cfg = compose_cfg(
        "strategy=auto",
        "strategy.tune_micro_batch=false",
        "estimate.gpu_memory=80GB",
        "estimate.num_gpus=1",
        "train.micro_batch_size=4",
        "train.gradient_accumulation_steps=8",
    )
    new, _ = resolve_auto(cfg, compose_strategy=lambda choice: compose_cfg(*choice).strategy)
    assert (new.train.micro_batch_size, new.train.gradient_accumulation_steps) == (4, 8)


def test_auto_picks_sequence_parallel_for_a_long_context() -> None:
    """llama3_8b at 64k tokens on 8 x 80 GB: no data-parallel rung fits (the logits of 64k tokens alone are
    94 GiB); sequence parallel splits them, tensor parallel would not (gathered whole)."""
    spec = full("llama3_8b", seq_len=65536)
    decision = choose(spec, strategy_rungs(spec, OPTIONS), 80 * GiB, 0.1, per_gpu_batch=1)
    assert decision.rung is not None and decision.rung.sp > 1, decision.explain()
    assert "strategy.sp_size=" in " ".join(decision.overrides)


def test_auto_picks_a_pipeline_when_only_stages_fit() -> None:
    """Replicated data parallel and the pipeline option only: llama3_8b in fp32 DDP needs 16 B/param on
    every GPU (120 GiB); 4 or more stages fit 80 GB, and the micro-batch split leaves >= 4 x pp micro-batches
    (a small bubble)."""
    from hydratune.components.strategy import DDP

    spec = replace(
        full("llama3_8b", seq_len=1024), weight_bytes=4, compute_bytes=4, strategy=StrategyShape("ddp")
    )
    options = {"ddp": DDP(), "pipeline": NDPipeline()}
    decision = choose(spec, strategy_rungs(spec, options), 80 * GiB, 0.1, per_gpu_batch=8)
    assert decision.strategy == "pipeline" and decision.rung.pp >= 4, decision.explain()
    assert decision.accumulation >= 4 * decision.rung.pp
    assert decision.micro_batch * decision.accumulation * (8 // decision.rung.pp) == 8 * 8
    assert "pipeline bubble" in decision.explain()


# ---- the command --------------------------------------------------------------------------------------
def render_with(compose_cfg, strategy: dict, *overrides: str) -> str:
    from omegaconf import OmegaConf, open_dict
    from rich.console import Console

    from hydratune.components.commands.estimate_tables import render

    cfg = compose_cfg("precision=bf16", "estimate.gpu_memory=80GB", *overrides)
    with open_dict(cfg):
        cfg.strategy = OmegaConf.create({"_target_": f"{__name__}.{strategy.pop('cls')}", **strategy})
    buf = io.StringIO()
    render(cfg, Console(file=buf, width=200))
    return buf.getvalue()


def test_estimate_prints_the_mesh_and_the_tp_split(compose_cfg) -> None:
    out = render_with(
        compose_cfg,
        {"cls": "NDDeepSpeed", "stage": 1, "tp_size": 8},
        "model=llama3_70b",
        "estimate.num_gpus=8",
    )
    assert "mesh: dp 1 x tp 8 x sp 1 x pp 1 = 8 processes" in out
    assert "9.740 B held" in out and "DOES NOT FIT" in out
    rows = {m[0]: float(m[1]) for m in re.findall(r"│ (parameters|optimizer states)\s+│\s+([\d.]+)", out)}
    assert rows == {"parameters": 18.14, "optimizer states": 108.85}


def test_estimate_prints_every_pipeline_stage(compose_cfg) -> None:
    out = render_with(
        compose_cfg,
        {"cls": "NDPipeline", "pp_size": 4},
        "model=llama3_8b",
        "estimate.num_gpus=4",
        "train.gradient_accumulation_steps=8",
        "model.gradient_checkpointing=true",
    )
    assert "Per pipeline stage" in out and "(heaviest)" in out and "bubble (p-1)/(m+p-1) = 27.3%" in out
    assert re.search(r"│ 1[^│]*│\s+7 │ embedding", out) and re.search(
        r"│ 4 \(heaviest\)\s+│\s+7 │ norm \+ head", out
    )
    assert "pipeline stage" in out and "the heaviest" in out


def test_an_impossible_split_is_refused_before_load(compose_cfg) -> None:
    """tp not dividing the KV heads, tp x sp x pp not dividing the world, pp over the layers: ConfigError
    naming the knob (exit 2 from the CLI), never a silent estimate."""
    for strategy, world, key in (
        ({"cls": "NDDeepSpeed", "tp_size": 16}, 16, "strategy.tp_size"),
        ({"cls": "NDDeepSpeed", "tp_size": 4}, 6, "strategy.tp_size"),
        ({"cls": "NDPipeline", "pp_size": 96}, 96, "strategy.pp_size"),
    ):
        with pytest.raises(ConfigError) as err:
            render_with(compose_cfg, strategy, "model=llama3_70b", f"estimate.num_gpus={world}")
        assert err.value.key == key
