"""Where each byte of one rank's model states lives: the bytes per element (weights, fp32 masters,
gradients, optimizer moments; a quantized base's), the closed-form ZeRO sum, and a rank's weights,
gradients and optimizer states placed over the ranks (ZeRO / FSDP shards, expert parallel, ZeRO++ hpZ) or
offloaded to the host. Pure arithmetic, read by ``estimate.py``; docs/memory.md cites DeepSpeed's code
for each placement."""

from __future__ import annotations

from dataclasses import dataclass

from hydratune.components.memory.arch import largest_param, param_counts
from hydratune.components.memory.parallel import Slice
from hydratune.components.memory.shapes import RunSpec

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


def trainable_of(spec: RunSpec, part: Slice) -> int:
    """The parameters of ``part`` the optimizer updates."""
    total_params = part.params
    # adapters live on the decoder layers (whole on every tp rank: their sharding is not modelled)
    trainable = (
        total_params if spec.full_finetune else round(spec.trainable * part.layers / spec.arch.num_layers)
    )
    if spec.full_finetune and spec.frozen_params and part.first:  # model.freeze's parts of a VLM
        trainable = max(total_params - spec.frozen_params, 0)
    return trainable


@dataclass(frozen=True)
class ElementBytes:
    """Bytes per element of a rank's states: weights, the fp32 master copy, gradients, optimizer moments."""

    weights: int
    master: int
    grads: int
    optimizer: float


def element_bytes(spec: RunSpec) -> ElementBytes:
    """What each element of the weights and training states costs under this strategy and precision."""
    if spec.strategy.is_deepspeed:
        # DeepSpeed casts the module to the compute dtype and keeps fp32 masters + moments in its optimizer
        master = 4 if spec.compute_bytes == 2 else 0
        return ElementBytes(
            spec.compute_bytes, master, spec.compute_bytes, optimizer_bytes(spec.optimizer, 4)
        )
    trainable_w = spec.weight_bytes if spec.full_finetune else 4  # peft keeps adapter weights in fp32
    return ElementBytes(spec.weight_bytes, 0, trainable_w, optimizer_bytes(spec.optimizer, trainable_w))


def shards(spec: RunSpec) -> tuple[int, int, int]:
    """The ranks the (weights, gradients, optimizer states) are sharded over: DeepSpeed / FSDP by their
    stage; ddp at stage 1: torch's ZeroRedundancyOptimizer (optimizer states)."""
    s, n = spec.strategy, spec.zero_ranks
    sharded = s.kind not in ("single", "ddp") or (s.kind == "ddp" and s.stage == 1)
    shard_p = n if sharded and s.stage >= 3 else 1
    shard_g = n if sharded and s.stage >= 2 else 1
    shard_o = n if sharded and s.stage >= 1 else 1
    return shard_p, shard_g, shard_o


@dataclass(frozen=True)
class HeldWeights:
    """Where one rank's weights are: GPU bytes of the plain, quantized and hpZ copies, and the host's."""

    plain_bytes: int  # per plain (not quantized) element
    shards: int  # ranks the weights are sharded over
    adapter: float  # bytes of the trainable weights, unsharded
    quantized_params: int  # elements stored quantized
    gpu: float
    quantized: float
    secondary: float  # ZeRO++ hpZ's copy
    hpz: int  # the hpZ group (0: none)
    host: float  # offloaded to the host, per node


def held_weights(spec: RunSpec, part: Slice, trainable: int, per: ElementBytes) -> HeldWeights:
    """The weights ``part`` holds: plain (fp32 around a quantized base), quantized, trainable; sharded, with
    ZeRO++ hpZ's secondary copy, or offloaded."""
    s, n, ds, w = spec.strategy, spec.zero_ranks, spec.strategy.is_deepspeed, per.weights
    frozen = part.params - trainable
    quantized = part.linear if spec.quant_bits and not spec.full_finetune else 0
    row_scales = part.layers * sum(o for _, o, _ in spec.arch.linears().values()) / max(1, spec.tp)
    q_bytes = (  # int8: one fp32 scale per row
        quantized * quantized_bytes_per_param(spec.quant_bits, spec.quant_type, spec.double_quant)
        + (4 * row_scales if spec.quant_bits == 8 else 0)
        if quantized
        else 0.0
    )
    plain_frozen = max(frozen - quantized, 0)
    adapter_w = trainable * (w if spec.full_finetune or ds else 4)
    shard_p = shards(spec)[0]
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
    return HeldWeights(
        plain_w, shard_p, adapter_w, quantized, weights_b, q_bytes, secondary, hpz, host_weights
    )


@dataclass(frozen=True)
class TrainingStates:
    """One rank's gradients and optimizer states (GPU bytes, and the host's), with how they are sharded."""

    grad_shards: int
    state_shards: int
    experts: int  # trainable expert elements sharded over their own ranks (expert parallel)
    expert_grad_shards: int
    expert_state_shards: int
    gradients: float
    offload_buffer: float  # the 16-bit buffer stage 1/2 offload keeps on the GPU
    optimizer: float
    fp32_grads: float  # the fp32 gradient copy at the step
    step_temp: float  # its 16-bit temporaries
    host: float  # offloaded to the host, per rank


def training_states(spec: RunSpec, part: Slice, trainable: int, per: ElementBytes) -> TrainingStates:
    """The gradients and optimizer states of what ``part`` trains: sharded (a mixture's experts over their
    expert-data-parallel ranks), offloaded with the optimizer, and DeepSpeed's fp32 gradient copy."""
    s, ds, grad_b = spec.strategy, spec.strategy.is_deepspeed, per.grads
    _, shard_g, shard_o = shards(spec)
    # expert parallel: a rank's experts are shared with world / ep of the ranks only (DeepSpeed's
    # expert-data-parallel group), so ZeRO shards their gradients and optimizer states over those
    experts = part.experts if spec.full_finetune and spec.ep > 1 else 0
    spread = max(1, spec.ep)
    shard_ge, shard_oe = (max(1, k // spread) if k > 1 else 1 for k in (shard_g, shard_o))
    partition = (trainable - experts) / shard_o + experts / shard_oe  # trainable elements this rank steps
    grads_b = ((trainable - experts) / shard_g + experts / shard_ge) * grad_b
    opt_states = partition * (per.optimizer + per.master)
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
    elif ds and per.master:
        if s.stage == 3:  # _prepare_fp32_grad_for_sub_group: one sub-group's fp32 gradients at a time
            sub_group = min(s.sub_group_size or 1e12, partition)
            fp32_grads = 4 * sub_group
            step_temp = grad_b * sub_group  # the 16-bit flatten the fp32 copy is cast from
        else:  # stage 0/1/2: the fp32 copy of the whole gradient partition at the step
            fp32_grads = 4 * partition
    return TrainingStates(
        shard_g,
        shard_o,
        experts,
        shard_ge,
        shard_oe,
        grads_b,
        offload_buffer,
        opt_states,
        fp32_grads,
        step_temp,
        host_states,
    )


def host_ram(spec: RunSpec, weights: HeldWeights, states: TrainingStates) -> tuple[float, float, float]:
    """Host RAM per node: (the offloaded states, loading the weights, the larger of the two)."""
    s = spec.strategy
    host_offload = states.host * spec.num_gpus + weights.host  # per node
    if "nvme" in (s.offload_optimizer, s.offload_param):
        host_offload = 0.0  # on the NVMe drive, not in RAM
    # loading: every rank materialises the weights on the host (the whole model; under ZeRO-3's
    # zero.Init one module at a time); DeepSpeed's estimators count the same 4 bytes/param
    loaded = largest_param(spec.arch) if s.is_deepspeed and s.stage >= 3 else param_counts(spec.arch).total
    host_load = spec.num_gpus * loaded * spec.weight_bytes
    return host_offload, host_load, max(host_load, host_offload)
