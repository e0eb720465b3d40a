"""What a strategy does to memory, as plain numbers: each strategy component says its own shape
(``Strategy.memory_shape()`` in ``components/strategy/``), and the estimate reads only this; and the run
being estimated (:class:`RunSpec`: the model, the strategy's shape, the batch, the mesh) as plain values.

Pure: no torch, no Hydra (``bench/memory.py`` builds shapes on a machine without either).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hydratune.components.memory.arch import Arch
from hydratune.components.memory.parallel import bubble_fraction

#: ASSUMED relative throughput (1.0 = DDP): NOT measured. No throughput measurement with provenance backs
#: these numbers (docs/memory.md measures memory only); they encode the usual order single = ddp > ZeRO-0
#: > ZeRO-1 > ZeRO-2 > FSDP > ZeRO++ > ZeRO-3 > optimizer offload > parameter offload > NVMe, i.e. less
#: communication and no host round trip first. strategy=auto uses only the order (the fastest rung that
#: fits); the printed "speed (assumed)" values are these assumptions. By ZeRO stage (0-3):
ZERO_SPEED = (0.97, 0.96, 0.95, 0.73)
ZEROPP_SPEED = 0.78  # ZeRO-3 with quantized weights / a hierarchical partition (less traffic)
FSDP_SPEED = 0.80
#: the cost of moving states off the GPU, multiplied in: optimizer states (and step) / parameters
OPTIMIZER_OFFLOAD_SPEED = {"none": 1.0, "cpu": 0.32, "nvme": 0.1}
PARAM_OFFLOAD_SPEED = {"none": 1.0, "cpu": 0.77, "nvme": 0.7}
#: Gradient checkpointing recomputes the forward pass: about a third more compute.
CHECKPOINTING_SPEED = 0.75
#: ASSUMED, NOT measured either: the cost of each doubling of a model-parallel dimension, multiplied in.
#: Tensor parallel all-reduces activations twice per layer forward and twice backward (inside a node);
#: Ulysses sequence parallel all-to-alls q/k/v and the attention output (4 per layer each way); pipeline
#: parallel sends one activation per micro-batch and stage, and idles for the bubble, which is computed
#: (``parallel.bubble_fraction``), not assumed. They order the model-parallel rungs among themselves only:
#: strategy=auto tries them after every data-parallel rung on the GPUs and before any offload
#: (``ladder.Rung.tier``).
TP_SPEED = 0.88
SP_SPEED = 0.92
PP_SPEED = 0.97
EP_SPEED = 0.95  # an all-to-all each way per mixture block (ASSUMED, like the others)


@dataclass(frozen=True)
class StrategyShape:
    """What a strategy does to memory, independent of its class: where states live, how they shard."""

    kind: str  # single | ddp | fsdp | deepspeed
    stage: int = 0  # ZeRO stage (FSDP ≈ 3 with resharding, 2 without; ddp 1: torch's ZeroRedundancyOptimizer)
    offload_optimizer: str = "none"  # none | cpu | nvme
    offload_param: str = "none"  # none | cpu | nvme
    reduce_bucket_size: float = 0.0  # elements (DeepSpeed); 0 = hidden² (HF "auto", the YAMLs' null)
    allgather_bucket_size: float = 0.0
    prefetch_bucket_size: float = 0.0  # ZeRO-3; 0 = "auto" (0.9 hidden²)
    max_live_parameters: float = 1e9
    overlap_comm: bool = True
    quantized_weights: bool = False  # ZeRO++ qwZ
    hpz_partition_size: int = 1  # ZeRO++ hpZ: a secondary copy of the weights sharded inside a node
    sub_group_size: float = 1e9  # ZeRO-3: fp32 gradients are made one sub-group of this many at a time
    pipeline_schedule: str = "1f1b"  # gpipe | 1f1b | interleaved_1f1b: micro-batches in flight per stage
    pipeline_chunks: int = 1  # model chunks per pipeline rank (interleaved_1f1b: 2 or more)

    @property
    def is_deepspeed(self) -> bool:
        return self.kind == "deepspeed"

    @property
    def speed(self) -> float:
        """ASSUMED relative throughput (see ``ZERO_SPEED``): by kind and stage, times the offload costs."""
        if self.kind in ("single", "ddp"):
            base = 1.0
        elif self.kind == "fsdp":
            base = FSDP_SPEED
        elif self.stage >= 3 and (self.quantized_weights or self.hpz_partition_size > 1):
            base = ZEROPP_SPEED
        else:
            base = ZERO_SPEED[min(self.stage, 3)]
        offload = OPTIMIZER_OFFLOAD_SPEED[self.offload_optimizer] * PARAM_OFFLOAD_SPEED[self.offload_param]
        return base * offload


SINGLE = StrategyShape("single")


def parallel_speed(
    tp: int = 1,
    sp: int = 1,
    pp: int = 1,
    micro_batches: int = 1,
    shape: StrategyShape = SINGLE,
    ep: int = 1,
) -> float:
    """ASSUMED relative throughput of a tp x sp x pp split (1.0: none), times the computed pipeline bubble's
    share of busy time: each doubling of tp / sp / pp / ep costs ``TP_SPEED`` / ``SP_SPEED`` / ``PP_SPEED``
    / ``EP_SPEED``."""
    cost = TP_SPEED ** math.log2(tp) * SP_SPEED ** math.log2(sp) * PP_SPEED ** math.log2(pp)
    cost *= EP_SPEED ** math.log2(ep)
    return cost * (1 - bubble_fraction(pp, micro_batches, shape.pipeline_schedule, shape.pipeline_chunks))


def elements(value: Any) -> float:
    """DeepSpeed bucket sizes: a number of elements, or null / "auto" (0 here: hidden² at estimate time)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


# ---- the run being estimated --------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """Everything the estimate depends on, as plain values (build one with ``spec_from_config``)."""

    arch: Arch
    trainable: int  # parameters the optimizer updates
    full_finetune: bool  # trainable is the whole model (no adapter)
    weight_bytes: int = 4  # model.dtype: 4 (auto/float32: fp32 master weights + autocast) or 2
    compute_bytes: int = 2  # precision: 2 for bf16/fp16 autocast, 4 for fp32
    optimizer: str = "adamw"  # the optimizer component's memory_kind
    quant_bits: int | None = None  # 4 / 8 for bitsandbytes bases
    quant_type: str = "nf4"
    double_quant: bool = False
    micro_batch: int = 1
    seq_len: int = 1024
    gradient_checkpointing: bool = False
    attn_implementation: str = "sdpa"
    strategy: StrategyShape = SINGLE
    lora_inputs_per_layer: int = 0  # input features summed over one layer's LoRA-targeted linears
    lora_dropout: bool = False  # LoRA dropout keeps a mask per adapter input
    num_gpus: int = 1  # per node
    num_nodes: int = 1
    tp: int = 1  # tensor-parallel ranks of one model replica (the strategy's mesh)
    sp: int = 1  # sequence-parallel (Ulysses) ranks: each holds 1/sp of every sequence
    pp: int = 1  # pipeline stages
    ep: int = 1  # expert-parallel ranks (of the data-parallel ones): each holds 1/ep of a mixture's experts
    micro_batches: int = 1  # per optimizer step and replica (train.gradient_accumulation_steps): PP's m
    # a vision-language model: image tokens per row (already inside seq_len), parameters model.freeze keeps
    # frozen under full fine-tuning, whether the vision tower trains (then autograd keeps its activations)
    image_tokens: int = 0
    frozen_params: int = 0
    vision_trains: bool = False
    # recipe=distill: the frozen teacher held beside the student (inference only: weights, no states)
    teacher_params: int = 0
    teacher_bytes: float = 2  # per parameter, averaged (a k-bit teacher's linear weights, the rest whole)
    # recipe=ppo's reward model (recipe.reward.model): a separate frozen model, or only its LoRA adapter and
    # score head on the policy's base (components/rl/reward_adapter.py), held in fp32 as peft holds adapters
    reward_params: int = 0
    reward_bytes: int = 2
    reward_shared: bool = False
    # recipe=grpo: tokens whose keys and values a generation batch holds at once (the generation batch x a
    # prompt and its whole episode, every turn and tool result in it), in the compute dtype; 0: no generation
    generation_tokens: int = 0
    # what the spec's numbers assume or leave out, printed by the estimate as notes
    notes: tuple[str, ...] = ()
    # recipe=ppo's value function (recipe.value_model), trained beside the policy: a head (hidden + 1), a LoRA
    # adapter + head on the policy's base (adapter), or a whole critic model (separate); "" for other recipes
    value_model: str = ""
    value_params: int = 0
    # SFT's chunked LM head (recipe.loss_impl=chunked, components/modeling/lm_head_chunk.py): positions whose
    # logits are held at once; 0: the whole micro-batch's logits (TRL's head and every other recipe's)
    logits_chunk: int = 0

    @property
    def world_size(self) -> int:
        return max(1, self.num_gpus) * max(1, self.num_nodes)

    @property
    def zero_ranks(self) -> int:
        """Ranks that ZeRO / FSDP shard the states over: every rank holding the same weights, i.e. the data
        and sequence parallel ones, world / (tp x pp) (DeepSpeed shards over its sequence-data-parallel
        group, deepspeed/utils/groups.py ``_get_sequence_data_parallel_group``)."""
        return max(1, self.world_size // (max(1, self.tp) * max(1, self.pp)))

    @property
    def data_parallel(self) -> int:
        """Replicas that each see their own micro-batches: world / (tp x sp x pp)."""
        return max(1, self.world_size // (max(1, self.tp) * max(1, self.sp) * max(1, self.pp)))

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def residual_bytes(self) -> int:
        """dtype of the residual stream: fp32 when fp32 weights (or the fp32 norms that peft's
        ``prepare_model_for_kbit_training`` makes of a quantized base) meet autocast; DeepSpeed casts."""
        if self.strategy.is_deepspeed:
            return self.compute_bytes
        return 4 if (self.weight_bytes == 4 or self.quant_bits) else self.compute_bytes
