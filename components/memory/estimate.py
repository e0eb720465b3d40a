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
against DeepSpeed's own estimators or its code's allocation. ``states.py`` places these states on a rank.

Activations per layer per token follow what autograd actually saves in a Llama-style block (RMSNorm
in fp32, q/k/v/o projections, RoPE, SDPA/flash attention saving q, k, v, its output and the
log-sum-exp; the gated MLP saving gate, up, SiLU(gate) and their product). ``eager`` attention also
keeps the softmax probabilities: ``heads * seq`` elements per token (the s² term). Gradient
checkpointing keeps each layer's input and recomputes one layer at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hydratune.components.memory.arch import param_counts
from hydratune.components.memory.parallel import Slice, bubble_fraction, slices
from hydratune.components.memory.shapes import RunSpec, StrategyShape
from hydratune.components.memory.states import (
    ElementBytes,
    HeldWeights,
    TrainingStates,
    element_bytes,
    held_weights,
    host_ram,
    model_state_bytes,  # noqa: F401 - the state formulas' old home: callers import them from here
    optimizer_bytes,
    quantized_bytes_per_param,  # noqa: F401
    shards,
    trainable_of,
    training_states,
)

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
    positions = spec.tokens / sp
    if spec.logits_chunk:  # one chunk's logits at a time, and a log-normaliser per position
        positions = min(positions, spec.logits_chunk)
    logits = LOGITS_BYTES * a.vocab_size * positions * part.logits_in_flight  # gathered whole over tp
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
    terms: list[tuple[str, float, str]], fwd_bwd: set[str], step: set[str], generation: set[str] | None = None
) -> tuple[list[Row], float, str]:
    """Rows for every term, marked in_peak when the term is held in the phase that is the peak (of the
    forward/backward, the optimizer step and, for a recipe that generates, the generation); the in-peak rows
    sum to the peak by construction."""
    value = dict((name, b) for name, b, _ in terms)
    phases = {"forward/backward": fwd_bwd, "optimizer step": step, "generation": generation or set()}
    sums = {name: sum(value[k] for k in held) for name, held in phases.items()}
    phase = max(phases, key=lambda name: sums[name])  # the first of equal sums: forward/backward
    held = phases[phase]

    def where(name: str) -> str:
        return " and the ".join(p for p, rows in phases.items() if name in rows and p != phase) or "?"

    rows = [
        Row(
            name,
            b,
            note if name in held else f"{note} (held in the {where(name)}, not at the peak)",
            name in held,
        )
        for name, b, note in terms
        if b or name in ("parameters", "gradients", "optimizer states")
    ]
    return rows, sums[phase], phase


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
    """The estimate of one rank holding ``part`` of the model: what it trains, the bytes of each element, its
    weights and its training states placed (sharded, offloaded), the host's RAM, the transient copies and
    buffers, then the rows of both phases (the larger is the peak)."""
    trainable = trainable_of(spec, part)
    per = element_bytes(spec)
    weights = held_weights(spec, part, trainable, per)
    states = training_states(spec, part, trainable, per)
    host_offload, host_load, cpu = host_ram(spec, weights, states)
    gathered = _gathered(spec, part)
    terms = _state_terms(spec, part, trainable, per, weights, states)
    terms += _transient_terms(spec, part, trainable, per, gathered)
    terms.append(_kv_cache_term(spec, part))
    rows, peak, phase = _phase_rows(terms, *_phases(spec.strategy.is_deepspeed), _generation_phase(spec))
    model_states = (
        weights.gpu
        + weights.quantized
        + weights.secondary
        + states.gradients
        + states.offload_buffer
        + states.optimizer
        + states.fp32_grads
        + gathered
    )
    if trainable != part.params:
        rows.insert(
            next(i for i, r in enumerate(rows) if r.name == "optimizer states") + 1,
            Row(
                "LoRA/adapter states",
                weights.adapter / weights.shards + states.gradients + states.optimizer,
                f"{trainable:,} trainable params (included above)",
                in_peak=False,
            ),
        )
    if cpu:
        what = "loading the weights on every rank" if cpu == host_load else "offloaded states"
        rows.append(
            Row("CPU RAM (per node)", cpu, f"the larger of loading and offload: {what}", in_peak=False)
        )
    total = param_counts(spec.arch).total
    return Estimate(spec, rows, peak, cpu, total, spec.trainable, phase, model_states, host_offload, part)


def _gathered(spec: RunSpec, part: Slice) -> float:
    """What a sharded stage gathers back transiently (one layer at a time + the largest module)."""
    s, n = spec.strategy, spec.zero_ranks
    gathered = 0.0
    if s.stage >= 3 and s.kind != "single" and (n > 1 or s.is_deepspeed):
        gathered = 2 * part.gathered_unit * spec.compute_bytes  # the gathered module + the prefetched one
    elif s.kind == "fsdp" and s.stage == 2 and n > 1:
        gathered = part.params * spec.compute_bytes * (1 - 1 / n)
    return gathered


def _autocast_copies(spec: RunSpec, part: Slice, w: int) -> float:
    """Low-precision weight copies autocast keeps for backward (fp32 weights, bf16/fp16 compute)."""
    ds = spec.strategy.is_deepspeed
    casts = 0.0
    head = part.head
    if not ds and spec.compute_bytes == 2 and spec.quant_bits:
        casts = head * 2
    elif not ds and w == 4 and spec.compute_bytes == 2:
        # autocast caches the casts of trainable weights until it exits; casts of frozen weights are kept
        # only as saved tensors, which gradient checkpointing drops
        linear = part.linear if (spec.full_finetune or not spec.gradient_checkpointing) else 0
        casts = (linear + head) * 2
    return casts


def _buffers(spec: RunSpec, part: Slice, trainable: int, grad_b: int) -> tuple[float, str]:
    """Communication buffers (bytes, what they are): DeepSpeed's buckets, DDP's gradient buckets."""
    a, s, n = spec.arch, spec.strategy, spec.zero_ranks
    buffers = 0.0
    note = ""
    if s.is_deepspeed:
        rb = min(s.reduce_bucket_size or a.hidden_size**2, trainable)
        ab = min(s.allgather_bucket_size or a.hidden_size**2, trainable)
        if s.stage in (1, 2):
            buffers = (rb * (2 if s.overlap_comm else 1) + ab) * spec.compute_bytes
            note = "reduce (x2 with overlap_comm) + allgather buckets"
        elif s.stage == 3:
            pb = s.prefetch_bucket_size or 0.9 * a.hidden_size**2
            buffers = (rb + min(pb, part.params)) * spec.compute_bytes
            note = "reduce + prefetch buckets"
    elif s.kind == "ddp" and n > 1:
        buffers = trainable * grad_b
        note = "gradient buckets (a second copy of the gradients)"
    return buffers, note


Terms = list[tuple[str, float, str]]


def _state_terms(
    spec: RunSpec,
    part: Slice,
    trainable: int,
    per: ElementBytes,
    weights: HeldWeights,
    states: TrainingStates,
) -> Terms:
    """The table's rows of the model states: (name, bytes, note)."""
    s, ds = spec.strategy, spec.strategy.is_deepspeed
    experts = states.experts
    return [
        (
            "parameters",
            weights.gpu,
            (
                f"{weights.plain_bytes} B/param"
                if trainable == part.params
                else f"{weights.plain_bytes} B/frozen param"
            )
            + _held_note(spec, part)
            + (f", /{weights.shards} shards" if weights.shards > 1 else "")
            + (" (offloaded to cpu)" if weights.host else ""),
        ),
        (
            "hpZ secondary weights",
            weights.secondary,
            f"ZeRO++ hpZ: a second copy of the weights, /{weights.hpz} in-node",
        ),
        ("quantized weights", weights.quantized, _quant_note(spec) if weights.quantized_params else ""),
        (
            "gradients",
            states.gradients,
            f"{per.grads} B/trainable param"
            + (f", /{states.grad_shards}" if states.grad_shards > 1 else "")
            + (f" (its experts over the {states.expert_grad_shards} rank(s) holding them)" if experts else "")
            + (" (on the host with the offloaded optimizer)" if ds and s.offload_optimizer != "none" else ""),
        ),
        (
            "offload gradient buffer",
            states.offload_buffer,
            "one largest-parameter 16-bit buffer (stage 1/2 offload)",
        ),
        (
            "optimizer states",
            states.optimizer,
            _opt_note(per.optimizer, per.master, states.state_shards, s)
            + (f" (its experts /{states.expert_state_shards})" if experts else ""),
        ),
        (
            "fp32 gradient copy",
            states.fp32_grads,
            "4 B/param of one sub-group (sub_group_size)" if s.stage == 3 else "4 B/param of the partition",
        ),
        ("step temporaries", states.step_temp, "16-bit flatten of the sub-group, cast to fp32"),
        _teacher_term(spec),
        _reward_term(spec),
        _value_term(spec),
    ]


def _teacher_term(spec: RunSpec) -> tuple[str, float, str]:
    """recipe=distill's frozen teacher: its weights only (no gradient, no optimizer state), sharded over the
    ZeRO ranks under stage 3 (an inference engine, as TRL prepares it), whole on every rank otherwise."""
    s = spec.strategy
    shards = spec.zero_ranks if s.stage >= 3 and s.kind != "single" else 1
    held = spec.teacher_params * spec.teacher_bytes / shards
    note = f"{spec.teacher_params:,} frozen params x {spec.teacher_bytes:.3g} B"
    note += f", /{shards}" if shards > 1 else ""
    return ("teacher (frozen)", held, note)


def _reward_term(spec: RunSpec) -> tuple[str, float, str]:
    """recipe=ppo's frozen reward model: a separate model's weights (sharded under ZeRO-3, as the teacher),
    or only its LoRA adapter and score head where it shares the policy's base (one base, many adapters)."""
    s = spec.strategy
    shards = spec.zero_ranks if s.stage >= 3 and s.kind != "single" and not spec.reward_shared else 1
    held = spec.reward_params * spec.reward_bytes / shards
    where = "an adapter + score head on the policy's base" if spec.reward_shared else "a separate model"
    note = f"{where}: {spec.reward_params:,} frozen params x {spec.reward_bytes} B"
    note += f", /{shards}" if shards > 1 else ""
    return ("reward model (frozen)", held, note)


def kv_cache_bytes(spec: RunSpec, part: Slice) -> float:
    """The keys and values a generation holds: ``generation_tokens`` x this rank's layers x 2 (k and v) x
    the KV width (/ tp, at least one KV head a rank) x the compute dtype's bytes."""
    a = spec.arch
    kv = a.kv_dim / min(max(1, spec.tp), a.num_kv_heads)
    return spec.generation_tokens * part.layers * 2 * kv * spec.compute_bytes


def _kv_cache_term(spec: RunSpec, part: Slice) -> tuple[str, float, str]:
    note = (
        f"{spec.generation_tokens:,} tokens (the generation batch x prompt + episode) x {part.layers} layers "
        f"x k,v x {spec.arch.kv_dim} x {spec.compute_bytes} B"
    )
    return ("KV cache (generation)", kv_cache_bytes(spec, part), note)


def _generation_phase(spec: RunSpec) -> set[str] | None:
    """What a recipe that generates holds while it does: the weights and states (the gradients freed since
    the last step, but DeepSpeed's partitions) and the KV cache; None when it does not generate."""
    if not spec.generation_tokens:
        return None
    fwd_bwd, _ = _phases(spec.strategy.is_deepspeed)
    kept = {"gradients"} if spec.strategy.is_deepspeed else set()
    transient = {"autocast weight copies", "activations", "vision activations", "logits + loss", "gradients"}
    return (fwd_bwd - transient) | kept | {"KV cache (generation)"}


def _value_term(spec: RunSpec) -> tuple[str, float, str]:
    """recipe=ppo's value function, trained beside the policy by the same optimizer: a head or a critic
    adapter + head in fp32 (weights, gradients, optimizer moments), or a separate critic trained whole (its
    weights, gradients and states as a full fine-tuning's, sharded as the policy's are)."""
    if not spec.value_model:
        return ("value model (trained)", 0.0, "")
    n = spec.value_params
    if spec.value_model == "separate":
        w = spec.weight_bytes
        shard_p, shard_g, shard_o = shards(spec)
        held = n * (w / shard_p + w / shard_g + optimizer_bytes(spec.optimizer, w) / shard_o)
        note = f"a separate critic: {n:,} params x ({w} B weights + {w} B grads + optimizer moments)"
        return ("value model (trained)", held, note + (f", /{shard_o}" if shard_o > 1 else ""))
    where = (
        "an adapter + value head on the policy's base" if spec.value_model == "adapter" else "a value head"
    )
    per = 4 + 4 + optimizer_bytes(spec.optimizer, 4)
    return (
        "value model (trained)",
        n * per,
        f"{where}: {n:,} params x {per:g} B (fp32 weights, grads, moments)",
    )


def _value_activations(spec: RunSpec, part: Slice) -> float:
    """recipe=ppo's critic forward beside the policy's (a second pass over the base, kept for backward): the
    critic adapter's as the policy adapter's, a separate critic's as a full fine-tuning's; none for a head
    (it reads the policy's own hidden states)."""
    if spec.value_model == "adapter":
        return activations(spec, part)[0]
    if spec.value_model == "separate":
        return activations(
            replace(spec, full_finetune=True, lora_inputs_per_layer=0, lora_dropout=False), part
        )[0]
    return 0.0


def _transient_terms(spec: RunSpec, part: Slice, trainable: int, per: ElementBytes, gathered: float) -> Terms:
    """The table's rows of what a step holds for a while: weight copies, gathered layers, activations,
    logits, a vision tower's activations, communication buffers."""
    a = spec.arch
    stack, logits = activations(spec, part)
    vision = vision_activations(spec, part)
    buffers, note = _buffers(spec, part, trainable, per.grads)
    mb = f"{spec.micro_batch}x{spec.seq_len} tokens" + _split_note(spec, part)
    return [
        (
            "autocast weight copies",
            _autocast_copies(spec, part, per.weights),
            "bf16/fp16 copies of fp32 weights kept for backward",
        ),
        ("gathered params", gathered, "ZeRO-3/FSDP: layers gathered in forward/backward"),
        (
            "activations",
            stack,
            f"{mb}, "
            + ("checkpointed" if spec.gradient_checkpointing else "no checkpointing")
            + f", {spec.attn_implementation}",
        ),
        (
            "value model activations",
            _value_activations(spec, part),
            "the critic's own forward over the base (recipe.value_model=adapter or separate)",
        ),
        (
            "logits + loss",
            logits,
            (
                f"vocab {a.vocab_size} x {spec.logits_chunk} positions x {LOGITS_BYTES} B (chunked LM head)"
                if spec.logits_chunk and spec.logits_chunk < spec.tokens / max(1, spec.sp)
                else f"vocab {a.vocab_size} x {spec.tokens} tokens x {LOGITS_BYTES} B"
            )
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


def _phases(ds: bool) -> tuple[set[str], set[str]]:
    """The rows held in the forward/backward phase and in the optimizer step."""
    always = {
        "parameters",
        "hpZ secondary weights",
        "quantized weights",
        "offload gradient buffer",
        "optimizer states",
        "gathered params",
        "buffers",
        "teacher (frozen)",
        "reward model (frozen)",
        "value model (trained)",
    }
    fwd_bwd = always | {
        "autocast weight copies",
        "activations",
        "value model activations",
        "vision activations",
        "logits + loss",
    }
    if ds:  # DeepSpeed keeps its gradient partitions for the whole backward
        fwd_bwd.add("gradients")
    step = always | {"gradients", "fp32 gradient copy", "step temporaries"}
    return fwd_bwd, step


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
