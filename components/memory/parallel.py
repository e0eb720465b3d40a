"""What one rank holds of a model split over tensor (tp), sequence (sp) and pipeline (pp) parallel ranks, as
plain numbers: its share of the parameters, and how many micro-batches' activations it keeps at once.

Pure arithmetic (no torch): the sizes come from the strategy (``ModelSplit.mesh``, read in
``components/memory/spec.py``); :mod:`hydratune.components.memory.estimate` turns a :class:`Slice` into bytes.
docs/memory.md ("Tensor, sequence and pipeline parallel") derives every rule here and cites its source:

- **TP** splits what the engines split: DeepSpeed 0.19.8's AutoTP follows transformers' ``tp_plan``
  (``base_model_tp_plan``: q/k/v/gate/up column-wise, o/down row-wise; ``_tp_plan``: ``lm_head``
  ``colwise_gather_output``), and so does transformers' own TP. Every decoder linear weight is split by tp;
  the biases of the column-wise ones too, those of the row-wise ones are whole (added after the
  all-reduce); norms and the embedding are whole on every rank (no ``embedding_rowwise`` in those plans);
  an untied ``lm_head`` is split, a tied one stays whole (AutoTP's tie fallback), and its logits are
  gathered whole. Megatron-LM also splits the embedding by vocabulary: it is not what these engines do.
- **SP** (DeepSpeed Ulysses) splits no weight; ZeRO shards over the data and sequence ranks together.
- **PP**: contiguous decoder layers per stage, balanced by parameter count as DeepSpeed's pipeline does
  (:func:`balanced_split`), the
  embedding with the first layer, the final norm and the output head (a copy of a tied embedding) with
  the last; the schedule decides how many micro-batches each stage keeps in flight (:func:`in_flight`,
  from ``torch.distributed.pipelining``'s schedules) and the idle fraction (:func:`bubble_fraction`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from hydratune.components.memory.arch import Arch, param_counts

#: transformers' ``base_model_tp_plan`` "rowwise" modules: input split, output all-reduced, bias whole
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Slice:
    """What one rank holds of the model (its tp shard of one pipeline stage): element counts before ZeRO
    shards them over the data-parallel ranks, and the micro-batches whose activations it keeps at once."""

    stage: int  # pipeline stage (0 without PP)
    stages: int  # pipeline stages (1 without PP)
    layers: int  # decoder layers on this rank
    params: int  # parameters held
    linear: int  # of which decoder linear weights (what bitsandbytes quantizes)
    head: int  # output-head weight elements held (lm_head, or the tied embedding); 0 off the last stage
    largest: int  # the largest single parameter held (DeepSpeed's offload buffers)
    experts: int  # of ``params``, a mixture's expert weights held (1/ep of them under expert parallel)
    gathered_unit: int  # ZeRO-3's largest module gathered at once: one layer, the embedding or the head
    in_flight: float  # micro-batches whose activations it holds at once (in units of all its layers)
    logits_in_flight: int  # micro-batches whose logits (and loss) it holds at once; 0 off the last stage

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1


def tp_layer(arch: Arch, tp: int = 1, ep: int = 1) -> tuple[int, int]:
    """(parameters of one decoder layer on a tp rank, of which linear weights): every linear weight split,
    the row-parallel biases, the norms and a mixture's router whole, its experts split over ``ep`` expert
    parallel ranks (experts are split by expert parallelism, not by tp)."""
    linear = bias = 0
    for name, (i, o, has_bias) in arch.linears().items():
        linear += ceil_div(i * o, tp)
        if has_bias:
            bias += o if name in ROW_PARALLEL else ceil_div(o, tp)
    whole = arch.norms_per_layer * arch.hidden_size + arch.qk_norm + arch.sinks
    if arch.is_moe:
        whole += arch.router_params + ceil_div(arch.expert_params(), max(1, ep))
    return linear + bias + whole, linear


def balanced_split(weights: Sequence[int], parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous groups of ``weights`` as DeepSpeed's pipeline balances them
    (``deepspeed.runtime.utils.partition_balanced``, ``PipelineModule(partition_method="parameters")``):
    the linear partition problem by dynamic programming, minimising the spread between the heaviest and the
    lightest group (ties: the later boundary), which also gives the smallest heaviest group here."""
    n = len(weights)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} units into {parts} non-empty groups")
    inf = float("inf")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    most = [[inf] * (parts + 1) for _ in range(n + 1)]
    least = [[inf] * (parts + 1) for _ in range(n + 1)]
    spread = [[inf] * (parts + 1) for _ in range(n + 1)]
    start = [[0] * (parts + 1) for _ in range(n + 1)]
    most[0][0] = spread[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, parts) + 1):
            for k in range(i):
                group = prefix[i] - prefix[k]
                hi, lo = max(most[k][j - 1], group), min(least[k][j - 1], group)
                if spread[i][j] >= hi - lo:
                    spread[i][j], most[i][j], least[i][j], start[i][j] = hi - lo, hi, lo, k
    bounds = [n]
    for j in range(parts, 0, -1):
        bounds.append(start[bounds[-1]][j])
    bounds.reverse()
    return [b - a for a, b in itertools.pairwise(bounds)]


@functools.cache
def stage_layers(arch: Arch, pp: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage: balanced by parameter count with the embedding on the first
    layer's stage and the final norm + output head (a copy of a tied embedding) on the last one's."""
    counts = param_counts(arch)
    head = counts.lm_head or counts.embedding  # a tied head is a copy of the embedding on the last stage
    units = [counts.layer] * counts.num_layers
    if pp == 1:
        return (counts.num_layers,)
    units[0] += counts.embedding
    units[-1] += counts.final_norm + head
    return tuple(balanced_split(units, pp))


def in_flight(schedule: str, pp: int, micro_batches: int, stage: int, chunks: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of all its layers.

    GPipe: all forwards before any backward (every micro-batch). 1F1B: ``min(m, pp - stage)`` warm-up
    forwards, then one forward and one backward in turn (``Schedule1F1B``). Interleaved 1F1B with ``chunks``
    model chunks per rank: ``_get_warmup_ops`` forwards of one chunk each, plus the one in flight
    (``ScheduleInterleaved1F1B``; for m a multiple of pp, rank 0 holds ``pp + (pp-1)/chunks``: Korthikanti et
    al. 2022's ``1 + (p-1)/(p v)`` factor on all its layers). Without PP one micro-batch at a time."""
    m = max(1, micro_batches)
    if pp <= 1:
        return 1.0
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved_1f1b":
        v = max(1, chunks)
        per_round = m // max(1, m // pp)
        warmup = min((v - 1) * per_round + 2 * (pp - 1 - stage), m * v)
        return min(warmup + 1, m * v) / v
    return float(min(m, pp - stage))


def bubble_fraction(pp: int, micro_batches: int, schedule: str = "1f1b", chunks: int = 1) -> float:
    """The share of a step each stage sits idle: ``(p-1)/(m+p-1)`` for GPipe and 1F1B (Huang et al. 2019;
    Narayanan et al. 2021), ``(p-1)/(v m+p-1)`` with ``v`` interleaved chunks per rank."""
    if pp <= 1:
        return 0.0
    v = max(1, chunks) if schedule == "interleaved_1f1b" else 1
    return (pp - 1) / (v * max(1, micro_batches) + pp - 1)


def slices(
    arch: Arch,
    tp: int = 1,
    pp: int = 1,
    schedule: str = "1f1b",
    micro_batches: int = 1,
    chunks: int = 1,
    ep: int = 1,
) -> list[Slice]:
    """One :class:`Slice` per pipeline stage (one without PP) of a tp rank (holding 1/ep of the experts)."""
    counts = param_counts(arch)
    layer, linear = tp_layer(arch, tp, ep)
    experts = ceil_div(arch.expert_params(), max(1, ep)) if arch.is_moe else 0
    biggest_linear = max(ceil_div(i * o, tp) + (o if b else 0) for i, o, b in arch.linears().values())
    biggest_linear = max(biggest_linear, ceil_div(arch.fused_expert_param, max(1, ep)))
    head = ceil_div(counts.lm_head, tp) if counts.lm_head else counts.embedding  # tied: whole
    logits = max(1, micro_batches) if schedule == "gpipe" and pp > 1 else 1  # GPipe: every loss kept
    out = []
    for stage, layers in enumerate(stage_layers(arch, pp)):
        first, last = stage == 0, stage == pp - 1
        held = [counts.embedding, counts.vision] if first else []  # a VLM's image encoder: the first stage
        if last:  # a tied head is the embedding itself on a single stage, a copy of it on a later one
            held += [counts.final_norm, head] if counts.lm_head or pp > 1 else [counts.final_norm]
        params = layers * layer + sum(held)
        out.append(
            Slice(
                stage=stage,
                stages=pp,
                layers=layers,
                params=params,
                linear=layers * linear,
                head=head if last else 0,
                largest=max([biggest_linear, *held]),
                experts=layers * experts,
                gathered_unit=max([layer, *held]),
                in_flight=in_flight(schedule, pp, micro_batches, stage, chunks),
                logits_in_flight=logits if last else 0,
            )
        )
    return out


def mesh_refusal(
    arch: Arch,
    tp: int = 1,
    sp: int = 1,
    pp: int = 1,
    *,
    gpus_per_node: int | None = None,
    seq_len: int | None = None,
    ep: int = 1,
) -> tuple[str, str] | None:
    """(knob, why) when the model cannot be split ``tp x sp x pp`` (None: it can). ``gpus_per_node``: keep
    TP inside a node; ``seq_len``: Ulysses needs it divisible by sp (DeepSpeed's SP data loader); ``ep``:
    expert parallel needs a mixture whose experts it divides."""
    if ep > 1 and (not arch.is_moe or arch.num_experts % ep):
        has = f"{arch.num_experts} experts" if arch.is_moe else "no experts (a dense model)"
        return "strategy.ep_size", f"ep {ep} must divide a mixture's experts; this model has {has}"
    if tp > 1 and arch.is_moe:  # runtime/split_checks.py check_tensor_split_kind refuses it before load
        return "strategy.tp_size", f"tp {tp} does not split a mixture of experts (fused experts, not Linears)"
    heads, kv = arch.num_heads, arch.num_kv_heads
    if tp > 1 and (heads % tp or kv % tp):
        return "strategy.tp_size", f"tp {tp} must divide the {heads} attention heads and {kv} KV heads"
    if tp > 1 and gpus_per_node and gpus_per_node % tp:
        return "strategy.tp_size", f"tp {tp} must divide the {gpus_per_node} GPUs of a node (TP stays in one)"
    local_heads, local_kv = heads // tp, max(1, kv // tp)
    if sp > 1 and (local_heads % sp or (local_kv % sp and sp % local_kv)):
        return "strategy.sp_size", (
            f"sp {sp} must divide the {local_heads} attention heads per tp rank, and divide or be a multiple "
            f"of the {local_kv} KV heads (DeepSpeed Ulysses)"
        )
    if sp > 1 and seq_len and seq_len % sp:
        return "strategy.sp_size", f"sp {sp} must divide the sequence length {seq_len}"
    if pp > arch.num_layers:
        return "strategy.pp_size", f"pp {pp} exceeds the {arch.num_layers} decoder layers"
    return None
