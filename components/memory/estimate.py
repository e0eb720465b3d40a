"""Memory estimate before launch: what one GPU holds for a run, from the architecture numbers alone.

Pure arithmetic: nothing here imports torch, transformers or Hydra, so ``hydratune estimate`` answers
offline in well under a second and ``bench/memory.py`` can import it on a machine without Hydra. What a
run's components contribute comes from the components themselves (``components/memory/spec.py``).

The model of a training step (per GPU, bytes)::

    peak = max(fwd/bwd peak, optimizer-step peak) + DeepSpeed/DDP buffers
    fwd/bwd peak   = weights + optimizer states + low-precision weight copies + activations + logits
                     (+ DeepSpeed's gradient partitions, kept through the backward)
    step peak      = weights + gradients + optimizer states + the fp32 gradient copy (+ its temporaries)
    reserved total = peak * (1 + FRAGMENTATION) + CUDA_CONTEXT_BYTES

Every term is a row of the table, and the rows held in the larger phase sum to the peak exactly.

Gradients and activations are never both whole at once: activations are freed layer by layer as the
backward pass fills the gradients, so the forward/backward peak carries the activations and the step
peak carries the gradients (the usual ``16 bytes/param + activations`` sum over-counts small models).

Model states (Φ parameters, N data-parallel ranks, mixed-precision Adam: 2 bytes fp16/bf16 weights,
2 bytes gradients, 12 bytes fp32 master weights + Adam moments = 16 bytes/param)::

    DDP / ZeRO-0 16Φ      ZeRO-1 4Φ + 12Φ/N      ZeRO-2 2Φ + 14Φ/N      ZeRO-3 16Φ/N

plus the fp32 gradient copy at the step (4Φ/N; ZeRO-3: 4·min(sub_group_size, Φ/N)), ZeRO-3's gathered
modules and ZeRO++ hpZ's secondary copy (2Φ/hpz). Under ``offload_optimizer`` DeepSpeed keeps the
gradients on the host (docs/memory.md cites its code); ``tests/unit/test_estimate.py`` checks all of this
against DeepSpeed's own estimators or its code's allocation.

Activations per layer per token follow what autograd actually saves in a Llama-style block (RMSNorm
in fp32, q/k/v/o projections, RoPE, SDPA/flash attention saving q, k, v, its output and the
log-sum-exp; the gated MLP saving gate, up, SiLU(gate) and their product). ``eager`` attention also
keeps the softmax probabilities: ``heads * seq`` elements per token (the s² term). Gradient
checkpointing keeps each layer's input and recomputes one layer at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydratune.components.memory.arch import Arch, largest_param, param_counts
from hydratune.components.memory.parallel import Slice, bubble_fraction, slices
from hydratune.components.memory.shapes import SINGLE, StrategyShape

KiB, MiB, GiB = 1024, 1024**2, 1024**3
GB = 1000**3

#: Bytes the CUDA context, cuBLAS/cuDNN workspaces and NCCL take on every GPU, outside PyTorch's
#: allocator (``torch.cuda.max_memory_allocated`` does not see them; ``nvidia-smi`` does).
CUDA_CONTEXT_BYTES = int(0.75 * GiB)
#: Caching-allocator fragmentation: reserved memory runs this fraction above the allocated peak.
FRAGMENTATION = 0.05
#: Extra autograd/allocator slack on top of the counted activations (temporaries of norms, RoPE, the
#: attention kernel's workspace, the cross-entropy's intermediate buffers).
ACTIVATION_SLACK = 0.05
#: Bytes per element of the logits path for the loss: fp32 log-softmax output kept for backward, plus
#: its gradient and the gradient of the fp32 logits during the loss backward (3 x 4 bytes).
LOGITS_BYTES = 12


# ---- bytes per element --------------------------------------------------------------------------
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


def quantized_bytes_per_param(bits: int | None, quant_type: str = "nf4", double_quant: bool = False) -> float:
    """Storage of one quantized weight, scales included.

    4-bit (nf4/fp4): 0.5 byte + one fp32 absmax per block of 64 (0.5 bit/param); double quantization
    stores those absmax in 8 bits with one fp32 constant per 256 blocks: 8/64 + 32/(64*256) = 0.127 bit.
    8-bit (LLM.int8): 1 byte + a per-row fp32 scale (counted by ``quantized_weight_bytes``).
    """
    if bits == 4:
        overhead_bits = 8 / 64 + 32 / (64 * 256) if double_quant else 32 / 64
        return 0.5 + overhead_bits / 8
    if bits == 8:
        return 1.0
    raise ValueError(f"unsupported bits {bits}")


def optimizer_bytes(kind: str, param_bytes: int) -> float:
    """Optimizer-state bytes per trainable parameter (moments only; master weights are separate).

    torch keeps Adam's two moments in the parameter's dtype (8 bytes for fp32 params); bitsandbytes'
    8-bit Adam 2 bytes (paged or not); Adafactor's factored second moment is ~nothing per parameter;
    SGD 0, or one momentum buffer.
    """
    return {
        "adamw": 2.0 * param_bytes,
        "adamw_8bit": 2.0,
        "adafactor": 0.02,
        "sgd": 0.0,
        "sgd_momentum": float(param_bytes),
    }.get(kind, 2.0 * param_bytes)


def model_state_bytes(params: float, stage: int = 0, world_size: int = 1, k: float = 12.0) -> float:
    """Per-GPU model states of mixed-precision Adam under ZeRO (the ZeRO paper's arithmetic): 2 bytes of
    16-bit weights, 2 of gradients and ``k`` = 12 of fp32 master weights + moments per parameter.

    stage 0 (DDP): (4 + k)Φ, 1: 4Φ + kΦ/N, 2: 2Φ + (2 + k)Φ/N, 3: (4 + k)Φ/N."""
    n = max(1, world_size)
    weights = 2 * params / (n if stage >= 3 else 1)
    grads = 2 * params / (n if stage >= 2 else 1)
    states = k * params / (n if stage >= 1 else 1)
    return weights + grads + states


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


@dataclass
class Row:
    """One line of the per-GPU table."""

    name: str
    bytes: float
    note: str = ""
    in_peak: bool = True  # counted in the peak total (False: CPU RAM, or shown for information)


@dataclass
class Estimate:
    """Per-GPU memory of one run: rows, the phase-aware peak, and CPU RAM for offload."""

    spec: RunSpec
    rows: list[Row]
    peak_allocated: float  # what torch.cuda.max_memory_allocated should read
    cpu_bytes: float  # host RAM per node for offloaded states
    params_total: int
    params_trainable: int
    peak_phase: str = "forward/backward"  # the phase whose rows sum to peak_allocated
    model_states: float = 0.0  # weights, gradients, optimizer states and their step/gather copies (GPU)
    cpu_offload_bytes: float = 0.0  # host RAM per node for the offloaded states alone (no loading)
    part: Slice | None = None  # what this rank holds of the model (its tp shard of one pipeline stage)
    stages: list[Estimate] = field(default_factory=list)  # with PP: every stage's estimate, this the heaviest

    @property
    def bubble(self) -> float:
        """The pipeline bubble's share of the step (0 without PP)."""
        s, shape = self.spec, self.spec.strategy
        return bubble_fraction(s.pp, s.micro_batches, shape.pipeline_schedule, shape.pipeline_chunks)

    @property
    def total(self) -> float:
        """GPU memory the run needs: allocator peak + fragmentation + CUDA context."""
        return self.peak_allocated * (1 + FRAGMENTATION) + CUDA_CONTEXT_BYTES

    def fits(self, gpu_memory: float, margin: float = 0.1) -> bool:
        """True when ``total`` stays below ``gpu_memory`` bytes less a safety ``margin`` fraction."""
        return self.total <= gpu_memory * (1 - margin)

    def row(self, name: str) -> float:
        return sum(r.bytes for r in self.rows if r.name == name)


def layer_activation_terms(spec: RunSpec) -> tuple[float, float, float]:
    """Bytes autograd keeps per token for one decoder layer, no checkpointing, no model parallelism (see the
    module doc), as (outside the tensor-parallel region, inside it but k/v, k/v): Korthikanti et al. 2022's
    split of a layer's activations into what tensor parallelism leaves whole on every rank (norms, the
    inputs of the column-parallel q/k/v and gate/up) and what it splits (attention, the MLP's inner width,
    the inputs of the row-parallel o/down)."""
    a = spec.arch
    c = spec.compute_bytes
    r = spec.residual_bytes  # fp32 when fp32 weights meet autocast (bf16 matmul outputs + fp32 residual)
    h, i = a.hidden_size, a.mlp_width  # a mixture: the experts a token goes through
    # an RMSNorm keeps its input (fp32 behind autocast) and, when its weight trains, the normalised output
    outside = a.norms_per_layer * (2 if spec.full_finetune else 1) * r * h
    kv = c * 2 * a.kv_dim  # k and v, saved by the attention kernel
    inside = c * a.q_dim + c * a.q_dim + 4 * a.num_heads  # q, the attention output, its log-sum-exp
    if spec.attn_implementation == "eager":  # fp32 softmax probabilities + their compute-dtype copy: s²
        inside += (4 + c) * a.num_heads * spec.seq_len
    # gate (SiLU's input), up and SiLU(gate) (the product's operands); bitsandbytes' 4/8-bit linears
    # return their input's dtype, so behind fp32 norms (a k-bit-prepared base) these are fp32
    inside += 3 * (r if spec.quant_bits else c) * i
    if spec.full_finetune:
        # a trained linear keeps its input for the weight gradient: q,k,v and gate,up each take their own
        # compute-dtype copy of an fp32 normed input (one shared copy when the stream is already 16-bit),
        # o_proj the attention output, down_proj the MLP product
        outside += (5 if r != c else 2) * c * h
        inside += c * a.q_dim + c * i
    else:
        # a frozen linear keeps nothing of its input (its weight gradient is never needed); LoRA's
        # lora_A keeps its own compute-dtype copy of each adapter input, and dropout a 1-byte mask (counted
        # whole on every tp rank: how an engine shards the adapters of a split linear is not modelled)
        outside += spec.lora_inputs_per_layer * (c + (1 if spec.lora_dropout else 0))
    return outside, inside, kv


def activation_bytes_per_token_layer(spec: RunSpec) -> float:
    """Bytes one rank keeps per token of the micro-batch for one decoder layer, no checkpointing: the terms
    outside the TP region whole, those inside / tp (k/v / min(tp, KV heads)); all / sp under Ulysses,
    whose all-to-all gives each rank the whole sequence for 1/sp of the heads, k/v for at least one KV
    head each (DeepSpeed replicates KV heads when sp exceeds them)."""
    outside, inside, kv = layer_activation_terms(spec)
    tp, sp = max(1, spec.tp), max(1, spec.sp)
    kv_heads = max(1, spec.arch.num_kv_heads // tp)
    return (outside + inside / tp) / sp + kv / tp * max(1 / sp, 1 / kv_heads)


def activations(spec: RunSpec, part: Slice | None = None) -> tuple[float, float]:
    """(activations of the decoder stack, logits path) in bytes one rank holds at its peak: its layers'
    activations times the micro-batches it keeps in flight (one without PP), the logits on the last
    stage. ``part``: the rank's slice (default: all layers, no PP)."""
    a = spec.arch
    part = part or slices(a, spec.tp)[0]
    sp = max(1, spec.sp)
    per_layer = activation_bytes_per_token_layer(spec) * spec.tokens
    boundary = spec.residual_bytes * a.hidden_size * spec.tokens / sp  # a layer's input: what ckpt keeps
    # each stage keeps its input (the embedding output on the first) and the last the final norm's and
    # lm_head's inputs; checkpointing keeps each layer's input and recomputes one layer at a time
    kept = part.layers * (boundary if spec.gradient_checkpointing else per_layer)
    kept += (3 if part.last else 1) * boundary
    stack = part.in_flight * kept + (per_layer if spec.gradient_checkpointing else 0.0)
    stack *= 1 + ACTIVATION_SLACK
    logits = LOGITS_BYTES * a.vocab_size * spec.tokens / sp * part.logits_in_flight  # gathered whole over tp
    return stack, logits


def vision_activations(spec: RunSpec, part: Slice | None = None) -> float:
    """Bytes autograd keeps in a vision-language model's image encoder for one micro-batch: nothing when the
    tower does not train (its input, the pixels, needs no gradient, so no block keeps its input); else per
    patch and layer what a pre-norm ViT block keeps, as the decoder's terms count it: the two norms' inputs
    and outputs, the shared q/k/v input, q, k, v, the attention output and log-sum-exp, o's input, the MLP's
    input, its inner activation before and after the nonlinearity. Patches = image tokens x ``merge``
    (patches per decoder token). With gradient checkpointing: each layer's input plus one layer. Held on
    the first pipeline stage, whole on every tp rank (engines do not split the tower)."""
    v = spec.arch.vision
    if v is None or not spec.vision_trains or not spec.image_tokens or (part is not None and not part.first):
        return 0.0
    c, r = spec.compute_bytes, spec.residual_bytes
    h, i = v.hidden_size, v.intermediate_size
    per_layer = 2 * 2 * r * h + c * (6 * h + 2 * i) + 4 * v.num_heads
    patches = spec.image_tokens * v.merge * spec.micro_batch
    kept = v.num_layers * (r * h if spec.gradient_checkpointing else per_layer)
    kept += per_layer if spec.gradient_checkpointing else 0  # the one layer recomputed at a time
    return kept * patches * (1 + ACTIVATION_SLACK)


def _phase_rows(
    terms: list[tuple[str, float, str]], fwd_bwd: set[str], step: set[str]
) -> tuple[list[Row], float, str]:
    """Rows for every term, marked in_peak when the term is held in the phase that is the peak; the
    in-peak rows sum to the peak by construction."""
    value = dict((name, b) for name, b, _ in terms)
    fb, st = sum(value[k] for k in fwd_bwd), sum(value[k] for k in step)
    phase, held = ("forward/backward", fwd_bwd) if fb >= st else ("optimizer step", step)
    other = "optimizer step" if phase == "forward/backward" else "forward/backward"
    rows = [
        Row(name, b, note if name in held else f"{note} (held in the {other}, not at the peak)", name in held)
        for name, b, note in terms
        if b or name in ("parameters", "gradients", "optimizer states")
    ]
    return rows, max(fb, st), phase


def estimate(spec: RunSpec) -> Estimate:
    """The per-GPU estimate of ``spec`` (see the module docstring for the model): of the heaviest pipeline
    stage under PP, with every stage's in ``stages``.

    DeepSpeed's placement follows its optimizer code (docs/memory.md cites the lines): under
    ``offload_optimizer`` the gradients live on the host (stage 1/2: the fp32 gradient partition, with one
    largest-parameter-sized 16-bit buffer left on the GPU; stage 3: the 16-bit gradient partition
    buffer); without offload stage 3 makes the fp32 gradients one ``sub_group_size`` sub-group at a
    time; ZeRO++ hpZ keeps a secondary copy of the weights sharded within ``zero_hpz_partition_size``
    ranks next to the primary partition. Under tp / sp / pp each rank holds its :class:`Slice` of the
    model, and ZeRO shards it over ``spec.zero_ranks``."""
    s = spec.strategy
    parts = slices(
        spec.arch, spec.tp, spec.pp, s.pipeline_schedule, spec.micro_batches, s.pipeline_chunks, spec.ep
    )
    per_stage = [_estimate_slice(spec, part) for part in parts]
    heaviest = max(per_stage, key=lambda e: e.peak_allocated)
    if len(per_stage) > 1:
        heaviest.stages = per_stage
    return heaviest


def _estimate_slice(spec: RunSpec, part: Slice) -> Estimate:
    """The estimate of one rank holding ``part`` of the model."""
    a, s, n = spec.arch, spec.strategy, spec.zero_ranks
    counts = param_counts(a)
    total_params = part.params
    # adapters live on the decoder layers (whole on every tp rank: their sharding is not modelled)
    trainable = total_params if spec.full_finetune else round(spec.trainable * part.layers / a.num_layers)
    if spec.full_finetune and spec.frozen_params and part.first:  # model.freeze's parts of a VLM
        trainable = max(total_params - spec.frozen_params, 0)
    frozen = total_params - trainable
    ds = s.is_deepspeed
    tp = max(1, spec.tp)

    # bytes per element ---------------------------------------------------------------------------
    if ds:
        # DeepSpeed casts the module to the compute dtype and keeps fp32 masters + moments in its optimizer
        w = spec.compute_bytes
        master = 4 if spec.compute_bytes == 2 else 0
        grad_b = spec.compute_bytes
        opt_b = optimizer_bytes(spec.optimizer, 4)
    else:
        w = spec.weight_bytes
        master = 0
        trainable_w = w if spec.full_finetune else 4  # peft keeps adapter weights in fp32
        grad_b = trainable_w
        opt_b = optimizer_bytes(spec.optimizer, trainable_w)
    quantized = part.linear if spec.quant_bits and not spec.full_finetune else 0
    row_scales = part.layers * sum(o for _, o, _ in a.linears().values()) / tp  # int8: one fp32 per row
    q_bytes = (
        quantized * quantized_bytes_per_param(spec.quant_bits, spec.quant_type, spec.double_quant)
        + (4 * row_scales if spec.quant_bits == 8 else 0)
        if quantized
        else 0.0
    )
    plain_frozen = max(frozen - quantized, 0)
    adapter_w = trainable * (w if spec.full_finetune or ds else 4)

    # sharding of each state over the ranks ----------------------------------------------------
    # DeepSpeed / FSDP by their stage; ddp at stage 1: torch's ZeroRedundancyOptimizer (optimizer states)
    sharded = s.kind not in ("single", "ddp") or (s.kind == "ddp" and s.stage == 1)
    shard_p = n if sharded and s.stage >= 3 else 1
    shard_g = n if sharded and s.stage >= 2 else 1
    shard_o = n if sharded and s.stage >= 1 else 1
    plain_w = 4 if (spec.quant_bits and not ds) else w  # kbit prep casts the rest to fp32
    all_weights = plain_frozen * plain_w + adapter_w
    weights_b = all_weights / shard_p
    q_bytes /= shard_p
    # ZeRO++ hpZ: a secondary copy of the 16-bit weights sharded over the hpZ group, kept next to the
    # primary partition from the first forward until after the optimizer step
    hpz = min(n, s.hpz_partition_size) if ds and s.stage >= 3 and s.hpz_partition_size > 1 else 0
    secondary = all_weights / hpz if hpz else 0.0
    host_weights = 0.0
    if s.offload_param != "none" and s.stage >= 3:
        host_weights = (weights_b + q_bytes + secondary) * spec.num_gpus  # per node
        weights_b, q_bytes, secondary = 0.0, 0.0, 0.0
    # expert parallel: a rank's experts are shared with world / ep of the ranks only (DeepSpeed's
    # expert-data-parallel group), so ZeRO shards their gradients and optimizer states over those
    experts = part.experts if spec.full_finetune and spec.ep > 1 else 0
    spread = max(1, spec.ep)
    shard_ge, shard_oe = (max(1, k // spread) if k > 1 else 1 for k in (shard_g, shard_o))
    partition = (trainable - experts) / shard_o + experts / shard_oe  # trainable elements this rank steps
    grads_b = ((trainable - experts) / shard_g + experts / shard_ge) * grad_b
    opt_states = partition * (opt_b + master)
    host_states, offload_buffer, fp32_grads, step_temp = 0.0, 0.0, 0.0, 0.0
    if s.offload_optimizer != "none":
        host_states = opt_states
        if ds:
            # fp32 gradient partition on the host (stage 1/2: initialize_optimizer_states; stage 3: one
            # buffer per sub-group) + a 16-bit partition buffer (stage 1/2: the bit16 param staging
            # buffer; stage 3: grad_partitions_flat_buffer, allocated on the optimizer's device)
            host_states += partition * (4 + grad_b)
            grads_b = 0.0
            if s.stage in (1, 2):  # temp_grad_buffer_for_gpu_offload: one largest parameter, 16-bit
                offload_buffer = min(part.largest, trainable) * grad_b
        opt_states = 0.0
    elif ds and master:
        if s.stage == 3:  # _prepare_fp32_grad_for_sub_group: one sub-group's fp32 gradients at a time
            sub_group = min(s.sub_group_size or 1e12, partition)
            fp32_grads = 4 * sub_group
            step_temp = grad_b * sub_group  # the 16-bit flatten the fp32 copy is cast from
        else:  # stage 0/1/2: the fp32 copy of the whole gradient partition at the step
            fp32_grads = 4 * partition
    host_offload = host_states * spec.num_gpus + host_weights  # per node
    if "nvme" in (s.offload_optimizer, s.offload_param):
        host_offload = 0.0  # on the NVMe drive, not in RAM
    # loading: every rank materialises the weights on the host (the whole model; under ZeRO-3's
    # zero.Init one module at a time); DeepSpeed's estimators count the same 4 bytes/param
    loaded = largest_param(a) if ds and s.stage >= 3 else counts.total
    host_load = spec.num_gpus * loaded * spec.weight_bytes
    cpu = max(host_load, host_offload)

    # what a sharded stage gathers back transiently (one layer at a time + the largest module)
    gathered = 0.0
    if s.stage >= 3 and s.kind != "single" and (n > 1 or ds):
        gathered = 2 * part.gathered_unit * spec.compute_bytes  # the gathered module + the prefetched one
    elif s.kind == "fsdp" and s.stage == 2 and n > 1:
        gathered = total_params * spec.compute_bytes * (1 - 1 / n)

    # low-precision weight copies autocast keeps for backward (fp32 weights, bf16/fp16 compute)
    casts = 0.0
    head = part.head
    if not ds and spec.compute_bytes == 2 and spec.quant_bits:
        casts = head * 2
    elif not ds and w == 4 and spec.compute_bytes == 2:
        # autocast caches the casts of trainable weights until it exits; casts of frozen weights are kept
        # only as saved tensors, which gradient checkpointing drops
        linear = part.linear if (spec.full_finetune or not spec.gradient_checkpointing) else 0
        casts = (linear + head) * 2

    # buffers -------------------------------------------------------------------------------------
    buffers = 0.0
    note = ""
    if ds:
        rb = min(s.reduce_bucket_size or a.hidden_size**2, trainable)
        ab = min(s.allgather_bucket_size or a.hidden_size**2, trainable)
        if s.stage in (1, 2):
            buffers = (rb * (2 if s.overlap_comm else 1) + ab) * spec.compute_bytes
            note = "reduce (x2 with overlap_comm) + allgather buckets"
        elif s.stage == 3:
            pb = s.prefetch_bucket_size or 0.9 * a.hidden_size**2
            buffers = (rb + min(pb, total_params)) * spec.compute_bytes
            note = "reduce + prefetch buckets"
    elif s.kind == "ddp" and n > 1:
        buffers = trainable * grad_b
        note = "gradient buckets (a second copy of the gradients)"

    stack, logits = activations(spec, part)
    vision = vision_activations(spec, part)
    mb = f"{spec.micro_batch}x{spec.seq_len} tokens" + _split_note(spec, part)
    terms: list[tuple[str, float, str]] = [
        (
            "parameters",
            weights_b,
            (f"{plain_w} B/param" if trainable == total_params else f"{plain_w} B/frozen param")
            + _held_note(spec, part)
            + (f", /{shard_p} shards" if shard_p > 1 else "")
            + (" (offloaded to cpu)" if host_weights else ""),
        ),
        ("hpZ secondary weights", secondary, f"ZeRO++ hpZ: a second copy of the weights, /{hpz} in-node"),
        ("quantized weights", q_bytes, _quant_note(spec) if quantized else ""),
        (
            "gradients",
            grads_b,
            f"{grad_b} B/trainable param"
            + (f", /{shard_g}" if shard_g > 1 else "")
            + (f" (its experts over the {shard_ge} rank(s) holding them)" if experts else "")
            + (" (on the host with the offloaded optimizer)" if ds and s.offload_optimizer != "none" else ""),
        ),
        (
            "offload gradient buffer",
            offload_buffer,
            "one largest-parameter 16-bit buffer (stage 1/2 offload)",
        ),
        (
            "optimizer states",
            opt_states,
            _opt_note(opt_b, master, shard_o, s) + (f" (its experts /{shard_oe})" if experts else ""),
        ),
        (
            "fp32 gradient copy",
            fp32_grads,
            "4 B/param of one sub-group (sub_group_size)" if s.stage == 3 else "4 B/param of the partition",
        ),
        ("step temporaries", step_temp, "16-bit flatten of the sub-group, cast to fp32"),
        ("autocast weight copies", casts, "bf16/fp16 copies of fp32 weights kept for backward"),
        ("gathered params", gathered, "ZeRO-3/FSDP: layers gathered in forward/backward"),
        (
            "activations",
            stack,
            f"{mb}, "
            + ("checkpointed" if spec.gradient_checkpointing else "no checkpointing")
            + f", {spec.attn_implementation}",
        ),
        (
            "logits + loss",
            logits,
            f"vocab {a.vocab_size} x {spec.tokens} tokens x {LOGITS_BYTES} B"
            + (f" /sp {spec.sp}" if spec.sp > 1 else "")
            + (f" x {part.logits_in_flight} in flight" if part.logits_in_flight > 1 else "")
            + (" (on the last stage only)" if part.stages > 1 else ""),
        ),
        (
            "vision activations",
            vision,
            f"{spec.micro_batch} rows x {spec.image_tokens} image tokens x "
            f"{a.vision.merge if a.vision else 1} patches each, {a.vision.num_layers if a.vision else 0} "
            "encoder layers" + (", checkpointed" if spec.gradient_checkpointing else ""),
        ),
        ("buffers", buffers, note or "communication buffers"),
    ]
    always = {
        "parameters",
        "hpZ secondary weights",
        "quantized weights",
        "offload gradient buffer",
        "optimizer states",
        "gathered params",
        "buffers",
    }
    fwd_bwd = always | {"autocast weight copies", "activations", "vision activations", "logits + loss"}
    if ds:  # DeepSpeed keeps its gradient partitions for the whole backward
        fwd_bwd.add("gradients")
    step = always | {"gradients", "fp32 gradient copy", "step temporaries"}
    rows, peak, phase = _phase_rows(terms, fwd_bwd, step)
    model_states = (
        weights_b + q_bytes + secondary + grads_b + offload_buffer + opt_states + fp32_grads + gathered
    )
    if trainable != total_params:
        rows.insert(
            next(i for i, r in enumerate(rows) if r.name == "optimizer states") + 1,
            Row(
                "LoRA/adapter states",
                adapter_w / shard_p + grads_b + opt_states,
                f"{trainable:,} trainable params (included above)",
                in_peak=False,
            ),
        )
    if cpu:
        what = "loading the weights on every rank" if cpu == host_load else "offloaded states"
        rows.append(
            Row("CPU RAM (per node)", cpu, f"the larger of loading and offload: {what}", in_peak=False)
        )
    return Estimate(
        spec, rows, peak, cpu, counts.total, spec.trainable, phase, model_states, host_offload, part
    )


def _quant_note(spec: RunSpec) -> str:
    if spec.quant_bits == 4:
        return f"{spec.quant_type} 4-bit, blocksize 64" + (" + double quant" if spec.double_quant else "")
    return "int8 + per-row fp32 scales"


def _opt_note(opt_b: float, master: int, shard: int, s: StrategyShape) -> str:
    text = f"{opt_b:g} B moments" + (f" + {master} B fp32 master" if master else "") + "/trainable param"
    if s.offload_optimizer != "none":
        return text + f" (offloaded to {s.offload_optimizer})"
    return text + (f", /{shard}" if shard > 1 else "")


def _held_note(spec: RunSpec, part: Slice) -> str:
    """What of the model this rank holds, when it is not all of it."""
    if spec.ep > 1 and spec.tp == 1 and part.stages == 1:
        return f", {part.params / 1e9:.3f} B held (ep {spec.ep}: each layer's experts /{spec.ep})"
    if spec.tp == 1 and part.stages == 1:
        return ""
    where = f"stage {part.stage + 1}/{part.stages}: {part.layers} layers" if part.stages > 1 else ""
    where += " + embedding" if part.stages > 1 and part.first else ""
    where += " + norm + head" if part.stages > 1 and part.last else ""
    split = f"tp {spec.tp}: linears and untied lm_head /{spec.tp}" if spec.tp > 1 else ""
    return f", {part.params / 1e9:.3f} B held ({'; '.join(x for x in (where, split) if x)})"


def _split_note(spec: RunSpec, part: Slice) -> str:
    """How tp / sp / the pipeline schedule divide or multiply the activations."""
    notes = [f"/tp {spec.tp} inside the TP region" if spec.tp > 1 else ""]
    notes.append(f"/sp {spec.sp} (Ulysses)" if spec.sp > 1 else "")
    if part.stages > 1:
        notes.append(f"{part.in_flight:g} micro-batch(es) in flight ({spec.strategy.pipeline_schedule})")
    return "".join(f", {n}" for n in notes if n)
