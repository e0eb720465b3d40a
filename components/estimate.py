"""Memory estimate before launch: what one GPU holds for a run, from the architecture numbers alone.

Pure arithmetic: nothing here imports torch, transformers or Hydra, so ``hydratune estimate`` answers
offline in well under a second and ``bench/memory.py`` can import it on a machine without Hydra.

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
gradients on the host (docs/memory.md cites its code); ``tests/test_estimate.py`` checks all of this
against DeepSpeed's own estimators or its code's allocation.

Activations per layer per token follow what autograd actually saves in a Llama-style block (RMSNorm
in fp32, q/k/v/o projections, RoPE, SDPA/flash attention saving q, k, v, its output and the
log-sum-exp; the gated MLP saving gate, up, SiLU(gate) and their product). ``eager`` attention also
keeps the softmax probabilities: ``heads * seq`` elements per token (the s² term). Gradient
checkpointing keeps each layer's input and recomputes one layer at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

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
#: ASSUMED relative throughput of each strategy (1.0 = DDP): NOT measured. No throughput measurement
#: with provenance backs these numbers (docs/memory.md measures memory only); they encode the usual order
#: single = ddp > zero0 > zero1 > zero2 > fsdp > zero3pp > zero3 > zero2_offload > zero3_offload >
#: zero3_nvme, i.e. less communication and no host round trip first. strategy=auto uses only the order
#: (the fastest rung that fits); the printed "relative speed" values are these assumptions.
SPEED: dict[str, float] = {
    "single": 1.0,
    "ddp": 1.0,
    "zero0": 0.97,
    "zero1": 0.96,
    "zero2": 0.95,
    "fsdp": 0.80,
    "zero3pp": 0.78,
    "zero3": 0.73,
    "zero2_offload": 0.30,
    "zero3_offload": 0.18,
    "zero3_nvme": 0.05,
}
#: Gradient checkpointing recomputes the forward pass: about a third more compute.
CHECKPOINTING_SPEED = 0.75


# ---- architecture -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arch:
    """The numbers of a decoder-only transformer that memory depends on (a config.json subset)."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    norms_per_layer: int = 2

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Arch:
        """From config.json-style keys, with each model type's transformers defaults."""
        model_type = str(d.get("model_type", "llama"))
        h = int(d["hidden_size"])
        heads = int(d["num_attention_heads"])
        head_dim = d.get("head_dim") or h // heads
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            model_type=model_type,
            hidden_size=h,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            vocab_size=int(d["vocab_size"]),
            tie_word_embeddings=bool(
                d.get("tie_word_embeddings", model_type in ("gemma", "gemma2", "gemma3"))
            ),
            qkv_bias=model_type in ("qwen2",) or attention_bias,
            o_bias=attention_bias and model_type not in ("qwen2",),
            mlp_bias=bool(d.get("mlp_bias", False)),
            norms_per_layer=4 if model_type in ("gemma2", "gemma3") else 2,
        )

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def linears(self) -> dict[str, tuple[int, int, bool]]:
        """One decoder layer's linear modules: qualified name -> (in features, out features, has bias)."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "self_attn.q_proj": (h, self.q_dim, self.qkv_bias),
            "self_attn.k_proj": (h, self.kv_dim, self.qkv_bias),
            "self_attn.v_proj": (h, self.kv_dim, self.qkv_bias),
            "self_attn.o_proj": (self.q_dim, h, self.o_bias),
            "mlp.gate_proj": (h, i, self.mlp_bias),
            "mlp.up_proj": (h, i, self.mlp_bias),
            "mlp.down_proj": (i, h, self.mlp_bias),
        }


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by part of the model."""

    embedding: int
    layer: int  # one decoder layer
    layer_linear: int  # of which linear weights (quantizable)
    layer_bias: int  # of which biases
    num_layers: int
    final_norm: int
    lm_head: int  # 0 when tied to the embedding

    @property
    def layers(self) -> int:
        return self.layer * self.num_layers

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.final_norm + self.lm_head

    @property
    def linear(self) -> int:
        """Weights of the decoder's linear layers (what bitsandbytes quantizes; lm_head stays)."""
        return self.layer_linear * self.num_layers


def param_counts(arch: Arch) -> ParamCounts:
    """Exact parameter counts of a Llama / Qwen2 / Mistral / Gemma2-style model."""
    lin = arch.linears()
    weights = sum(i * o for i, o, _ in lin.values())
    biases = sum(o for _, o, b in lin.values() if b)
    norms = arch.norms_per_layer * arch.hidden_size
    embedding = arch.vocab_size * arch.hidden_size
    return ParamCounts(
        embedding=embedding,
        layer=weights + biases + norms,
        layer_linear=weights,
        layer_bias=biases,
        num_layers=arch.num_layers,
        final_norm=arch.hidden_size,
        lm_head=0 if arch.tie_word_embeddings else embedding,
    )


def arch_of_model(model: Any) -> Arch:
    """The architecture of a ``model`` config node (or CausalLM): its ``architecture`` numbers, over the
    local dir's config.json when ``name_or_path`` is one. No weights, no network, no transformers."""
    arch = dict(_get(model, "architecture", {}) or {})
    name = str(_get(model, "name_or_path", "") or "")
    from_run = _get(model, "from_run", None)
    candidates = [
        Path(str(from_run)).expanduser() / "final",
        Path(str(from_run)).expanduser() / "final/merged",
    ]
    candidates = (candidates if from_run else []) + [Path(name).expanduser()]
    for folder in candidates:
        config = folder / "config.json"
        if config.is_file():
            arch = {**json.loads(config.read_text()), **arch}
            break
    missing = [
        k
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "vocab_size",
        )
        if k not in arch
    ]
    if missing:
        from components.errors import ConfigError

        raise ConfigError(
            f"the estimate needs the architecture numbers of '{name}' and {', '.join(missing)} "
            "are not in model.architecture (and it is not a local dir with config.json)",
            key="model.architecture",
            hint="use a shipped model (conf/model/), or pass model.architecture.<key>=… from its config.json",
        )
    return Arch.from_dict(arch)


# ---- trainable parameters -----------------------------------------------------------------------
#: the PEFT options whose base stays frozen and unsaved (Adapter subclasses in components/peft.py)
ADAPTER_CLASSES = ("LoRA", "DoRA", "IA3", "PrefixTuning", "PTuning")


def _class_name(obj: Any) -> str:
    """A component's class name, from an instance or from its config node's ``_target_``."""
    target = _get(obj, "_target_", None)
    if isinstance(target, str) and target:
        return target.rsplit(".", 1)[-1]
    return type(obj).__name__


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """``obj.key`` for dataclasses, dicts and DictConfigs alike."""
    if obj is None:
        return default
    if isinstance(obj, Mapping) or (hasattr(obj, "keys") and hasattr(obj, "get")):
        try:
            value = obj.get(key, default)
        except Exception:  # an interpolation that cannot resolve offline
            return default
        return default if value is None and default is not None else value
    return getattr(obj, key, default)


def _targeted(arch: Arch, target_modules: Any) -> tuple[list[tuple[int, int]], bool]:
    """(in, out) of every targeted linear in one layer, and whether ``lm_head`` is targeted."""
    lin = arch.linears()
    if target_modules in (None, "all-linear"):
        return [(i, o) for i, o, _ in lin.values()], False
    if isinstance(target_modules, str) and not re.fullmatch(r"\w+", target_modules):  # a regex
        chosen = [v for k, v in lin.items() if re.fullmatch(target_modules, f"model.layers.0.{k}")]
        return [(i, o) for i, o, _ in chosen], bool(re.fullmatch(target_modules, "lm_head"))
    names = [target_modules] if isinstance(target_modules, str) else [str(t) for t in target_modules]
    chosen = [v for k, v in lin.items() if k.rsplit(".", 1)[-1] in names or k in names]
    return [(i, o) for i, o, _ in chosen], "lm_head" in names


def trainable_params(arch: Arch, peft: Any) -> int:
    """Parameters the optimizer updates under a PEFT option (instance or config node; duck-typed)."""
    counts = param_counts(arch)
    kind = _class_name(peft)
    if kind in ("FullFineTune", "NoPeft", "dict", "NoneType"):
        return counts.total
    if kind in ("LoRA", "DoRA"):
        r = int(_get(peft, "r", 16))
        pairs, head = _targeted(arch, _get(peft, "target_modules", "all-linear"))
        dora = kind == "DoRA" or bool(_get(peft, "use_dora", False))
        per_layer = sum(r * (i + o) + (o if dora else 0) for i, o in pairs)
        extra = r * (arch.hidden_size + arch.vocab_size) if head else 0
        return per_layer * arch.num_layers + extra + _modules_to_save(arch, _get(peft, "modules_to_save"))
    if kind == "IA3":
        pairs, _ = _targeted(arch, _get(peft, "target_modules", ["k_proj", "v_proj", "down_proj"]))
        ff = _get(peft, "feedforward_modules", ["down_proj"]) or []
        lin = arch.linears()
        per_layer = sum(
            lin[k][0] if k.rsplit(".", 1)[-1] in ff else lin[k][1]
            for k in lin
            if (lin[k][0], lin[k][1]) in pairs
        )
        return per_layer * arch.num_layers
    if kind in ("PrefixTuning", "PTuning"):
        tokens = int(_get(peft, "num_virtual_tokens", 16))
        if kind == "PrefixTuning":
            return tokens * 2 * arch.num_layers * arch.kv_dim
        enc = int(_get(peft, "encoder_hidden_size", 128))
        return tokens * arch.hidden_size + 2 * arch.hidden_size * enc + enc * enc
    if kind == "Freeze":
        n = min(int(_get(peft, "last_n_layers", 1)), arch.num_layers)
        return n * counts.layer + _modules_to_save(arch, _get(peft, "modules"))
    if kind == "BitFit":
        return counts.layer_bias * arch.num_layers + _modules_to_save(arch, _get(peft, "extra_modules"))
    return counts.total  # unknown option: assume everything trains (the conservative side)


def _modules_to_save(arch: Arch, modules: Iterable[str] | None) -> int:
    """Parameters of extra fully-trained modules named by pattern (lm_head, embed_tokens, norm)."""
    total = 0
    for m in modules or []:
        if "lm_head" in m or "embed" in m:
            total += arch.vocab_size * arch.hidden_size
        elif "norm" in m:
            total += arch.hidden_size
    return total


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


def optimizer_kind(optimizer: Any) -> str:
    """adamw | adamw_8bit | adafactor | sgd | sgd_momentum, from a component or node (duck-typed)."""
    name = _class_name(optimizer).lower()
    target = str(_get(optimizer, "_target_", "") or "").lower()
    bits = _get(optimizer, "bits", None) if name.startswith("bnb") else _get(optimizer, "optim_bits", None)
    if "8bit" in name or "8bit" in target or (bits is not None and int(bits) == 8):
        return "adamw_8bit"
    if "adafactor" in name:
        return "adafactor"
    if "sgd" in name:
        return "sgd_momentum" if float(_get(optimizer, "momentum", 0.0) or 0.0) > 0 else "sgd"
    return "adamw"


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


# ---- strategies ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StrategyShape:
    """What a strategy does to memory, independent of its class: where states live, how they shard."""

    kind: str  # single | ddp | fsdp | deepspeed
    stage: int = 0  # ZeRO stage (FSDP ≈ 3 with resharding, 2 without)
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
    speed: float = 1.0

    @property
    def is_deepspeed(self) -> bool:
        return self.kind == "deepspeed"


#: Every strategy option name -> its memory shape, so the comparison table and the auto ladder need no
#: composition (the option YAMLs in conf/strategy/ carry the same values).
STRATEGY_SHAPES: dict[str, StrategyShape] = {
    "single": StrategyShape("single", speed=SPEED["single"]),
    "ddp": StrategyShape("ddp", speed=SPEED["ddp"]),
    "fsdp": StrategyShape("fsdp", stage=3, speed=SPEED["fsdp"]),
    "zero0": StrategyShape("deepspeed", stage=0, speed=SPEED["zero0"]),
    "zero1": StrategyShape("deepspeed", stage=1, speed=SPEED["zero1"]),
    "zero2": StrategyShape("deepspeed", stage=2, speed=SPEED["zero2"]),
    "zero3": StrategyShape("deepspeed", stage=3, speed=SPEED["zero3"]),
    "zero2_offload": StrategyShape(
        "deepspeed", stage=2, offload_optimizer="cpu", speed=SPEED["zero2_offload"]
    ),
    "zero3_offload": StrategyShape(
        "deepspeed", stage=3, offload_optimizer="cpu", offload_param="cpu", speed=SPEED["zero3_offload"]
    ),
    "zero3_nvme": StrategyShape(
        "deepspeed", stage=3, offload_optimizer="nvme", offload_param="nvme", speed=SPEED["zero3_nvme"]
    ),
    "zero3pp": StrategyShape(
        "deepspeed", stage=3, quantized_weights=True, hpz_partition_size=8, speed=SPEED["zero3pp"]
    ),
}


def shape_of(strategy: Any) -> StrategyShape:
    """The memory shape of a strategy component or config node (duck-typed: class name + fields)."""
    kind = _class_name(strategy)
    if kind == "Single":
        return STRATEGY_SHAPES["single"]
    if kind == "DDP":
        return STRATEGY_SHAPES["ddp"]
    if kind == "FSDP":
        reshard = bool(_get(strategy, "reshard_after_forward", True))
        off = "cpu" if _get(strategy, "cpu_offload", False) else "none"
        return StrategyShape(
            "fsdp",
            stage=3 if reshard else 2,
            offload_optimizer=off,
            offload_param=off,
            speed=SPEED["fsdp"] * (0.25 if off == "cpu" else 1.0),
        )
    if kind == "DeepSpeed" or _get(strategy, "stage", None) is not None:
        stage = int(_get(strategy, "stage", 0))
        opt, par = (
            str(_get(strategy, "offload_optimizer", "none")),
            str(_get(strategy, "offload_param", "none")),
        )
        name = {0: "zero0", 1: "zero1", 2: "zero2", 3: "zero3"}.get(stage, "zero3")
        if opt == "nvme" or par == "nvme":
            name = "zero3_nvme"
        elif opt == "cpu":
            name = "zero3_offload" if stage == 3 else "zero2_offload"
        quant = bool(_get(strategy, "zero_quantized_weights", False))
        # null = GPUs per node: the estimate assumes 8-GPU nodes (like STRATEGY_SHAPES["zero3pp"])
        hpz = int(_get(strategy, "zero_hpz_partition_size", 1) or (8 if stage == 3 else 1))
        if stage == 3 and (quant or hpz > 1) and name == "zero3":
            name = "zero3pp"
        return StrategyShape(
            "deepspeed",
            stage=stage,
            offload_optimizer=opt,
            offload_param=par,
            reduce_bucket_size=_bucket(_get(strategy, "reduce_bucket_size", 0)),
            allgather_bucket_size=_bucket(_get(strategy, "allgather_bucket_size", 0)),
            prefetch_bucket_size=_bucket(_get(strategy, "stage3_prefetch_bucket_size", 0)),
            max_live_parameters=_bucket(_get(strategy, "stage3_max_live_parameters", 1e9)) or 1e9,
            overlap_comm=bool(_get(strategy, "overlap_comm", True)),
            quantized_weights=quant,
            hpz_partition_size=hpz,
            sub_group_size=_bucket(_get(strategy, "sub_group_size", 1e9)) or 1e9,
            speed=SPEED.get(name, 0.5),
        )
    return STRATEGY_SHAPES["single"]


def _bucket(value: Any) -> float:
    """DeepSpeed bucket sizes: a number of elements, or "auto" (0 here: hidden² at estimate time)."""
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
    optimizer: str = "adamw"  # see optimizer_kind()
    quant_bits: int | None = None  # 4 / 8 for bitsandbytes bases
    quant_type: str = "nf4"
    double_quant: bool = False
    micro_batch: int = 1
    seq_len: int = 1024
    gradient_checkpointing: bool = False
    attn_implementation: str = "sdpa"
    strategy: StrategyShape = field(default_factory=lambda: STRATEGY_SHAPES["single"])
    lora_inputs_per_layer: int = 0  # input features summed over one layer's LoRA-targeted linears
    lora_dropout: bool = False  # LoRA dropout keeps a mask per adapter input
    num_gpus: int = 1  # per node
    num_nodes: int = 1

    @property
    def world_size(self) -> int:
        return max(1, self.num_gpus) * max(1, self.num_nodes)

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

    @property
    def total(self) -> float:
        """GPU memory the run needs: allocator peak + fragmentation + CUDA context."""
        return self.peak_allocated * (1 + FRAGMENTATION) + CUDA_CONTEXT_BYTES

    def fits(self, gpu_memory: float, margin: float = 0.1) -> bool:
        """True when ``total`` stays below ``gpu_memory`` bytes less a safety ``margin`` fraction."""
        return self.total <= gpu_memory * (1 - margin)

    def row(self, name: str) -> float:
        return sum(r.bytes for r in self.rows if r.name == name)


def activation_bytes_per_token_layer(spec: RunSpec) -> float:
    """Bytes autograd keeps per token for one decoder layer, no checkpointing (see the module doc)."""
    a = spec.arch
    c = spec.compute_bytes
    r = spec.residual_bytes  # fp32 when fp32 weights meet autocast (bf16 matmul outputs + fp32 residual)
    h, i = a.hidden_size, a.intermediate_size
    # an RMSNorm keeps its input (fp32 behind autocast) and, when its weight trains, the normalised output
    norms = a.norms_per_layer * (2 if spec.full_finetune else 1) * r * h
    attention = c * (a.q_dim + 2 * a.kv_dim) + c * a.q_dim + 4 * a.num_heads  # q,k,v, output, lse
    if spec.attn_implementation == "eager":  # fp32 softmax probabilities + their compute-dtype copy: s²
        attention += (4 + c) * a.num_heads * spec.seq_len
    # gate (SiLU's input), up and SiLU(gate) (the product's operands); bitsandbytes' 4/8-bit linears
    # return their input's dtype, so behind fp32 norms (a k-bit-prepared base) these are fp32
    mlp = 3 * (r if spec.quant_bits else c) * i
    if spec.full_finetune:
        # a trained linear keeps its input for the weight gradient: q,k,v and gate,up each take their own
        # compute-dtype copy of an fp32 normed input (one shared copy when the stream is already 16-bit),
        # o_proj the attention output, down_proj the MLP product
        casts = 5 if r != c else 2
        linear_inputs = casts * c * h + c * a.q_dim + c * i
        lora = 0.0
    else:
        # a frozen linear keeps nothing of its input (its weight gradient is never needed); LoRA's
        # lora_A keeps its own compute-dtype copy of each adapter input, and dropout a 1-byte mask
        linear_inputs = 0
        lora = spec.lora_inputs_per_layer * (c + (1 if spec.lora_dropout else 0))
    return norms + linear_inputs + attention + mlp + lora


def activations(spec: RunSpec) -> tuple[float, float]:
    """(activations of the decoder stack, logits path) in bytes for one micro-batch."""
    a = spec.arch
    per_layer = activation_bytes_per_token_layer(spec) * spec.tokens
    r = spec.residual_bytes
    boundary = r * a.hidden_size * spec.tokens  # a layer's input (what checkpointing keeps)
    # checkpointing keeps each layer's input, and recomputes one layer at a time during backward
    stack = a.num_layers * boundary + per_layer if spec.gradient_checkpointing else a.num_layers * per_layer
    stack += 3 * boundary  # embedding output, final norm, lm_head input
    stack *= 1 + ACTIVATION_SLACK
    logits = LOGITS_BYTES * a.vocab_size * spec.tokens
    return stack, logits


def largest_param(arch: Arch) -> int:
    """Elements of the largest single parameter (the embedding or lm_head, else an MLP matrix): the size of
    DeepSpeed's per-parameter offload buffers and of ZeRO-3's largest gathered module."""
    lin = arch.linears().values()
    return max(arch.vocab_size * arch.hidden_size, *(i * o + (o if b else 0) for i, o, b in lin))


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
    """The per-GPU estimate of ``spec`` (see the module docstring for the model).

    DeepSpeed's placement follows its optimizer code (docs/memory.md cites the lines): under
    ``offload_optimizer`` the gradients live on the host (stage 1/2: the fp32 gradient partition, with one
    largest-parameter-sized 16-bit buffer left on the GPU; stage 3: the 16-bit gradient partition
    buffer); without offload stage 3 makes the fp32 gradients one ``sub_group_size`` sub-group at a
    time; ZeRO++ hpZ keeps a secondary copy of the weights sharded within ``zero_hpz_partition_size``
    ranks next to the primary partition."""
    a, s, n = spec.arch, spec.strategy, spec.world_size
    counts = param_counts(a)
    total_params, trainable = counts.total, spec.trainable
    frozen = total_params - trainable
    ds = s.is_deepspeed

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
    quantized = counts.linear if spec.quant_bits and not spec.full_finetune else 0
    q_bytes = (
        quantized * quantized_bytes_per_param(spec.quant_bits, spec.quant_type, spec.double_quant)
        + (4 * a.num_layers * sum(o for _, o, _ in a.linears().values()) if spec.quant_bits == 8 else 0)
        if quantized
        else 0.0
    )
    plain_frozen = max(frozen - quantized, 0)
    adapter_w = trainable * (w if spec.full_finetune or ds else 4)

    # sharding of each state over the ranks ----------------------------------------------------
    sharded = s.kind not in ("single", "ddp")
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
    grads_b = trainable * grad_b / shard_g
    opt_states = trainable * (opt_b + master) / shard_o
    host_states, offload_buffer, fp32_grads, step_temp = 0.0, 0.0, 0.0, 0.0
    if s.offload_optimizer != "none":
        host_states = opt_states
        if ds:
            # fp32 gradient partition on the host (stage 1/2: initialize_optimizer_states; stage 3: one
            # buffer per sub-group) + a 16-bit partition buffer (stage 1/2: the bit16 param staging
            # buffer; stage 3: grad_partitions_flat_buffer, allocated on the optimizer's device)
            host_states += trainable / shard_o * (4 + grad_b)
            grads_b = 0.0
            if s.stage in (1, 2):  # temp_grad_buffer_for_gpu_offload: one largest parameter, 16-bit
                offload_buffer = min(largest_param(a), trainable) * grad_b
        opt_states = 0.0
    elif ds and master:
        if s.stage == 3:  # _prepare_fp32_grad_for_sub_group: one sub-group's fp32 gradients at a time
            sub_group = min(s.sub_group_size or 1e12, trainable / shard_o)
            fp32_grads = 4 * sub_group
            step_temp = grad_b * sub_group  # the 16-bit flatten the fp32 copy is cast from
        else:  # stage 0/1/2: the fp32 copy of the whole gradient partition at the step
            fp32_grads = 4 * trainable / shard_o
    host_offload = host_states * spec.num_gpus + host_weights  # per node
    if "nvme" in (s.offload_optimizer, s.offload_param):
        host_offload = 0.0  # on the NVMe drive, not in RAM
    # loading: every rank materialises the weights on the host (the whole model; under ZeRO-3's
    # zero.Init one module at a time); DeepSpeed's estimators count the same 4 bytes/param
    loaded = largest_param(a) if ds and s.stage >= 3 else total_params
    host_load = spec.num_gpus * loaded * spec.weight_bytes
    cpu = max(host_load, host_offload)

    # what a sharded stage gathers back transiently (one layer at a time + the largest module)
    gathered = 0.0
    if s.stage >= 3 and s.kind != "single" and (n > 1 or ds):
        biggest = max(counts.layer, counts.embedding) * spec.compute_bytes
        gathered = 2 * biggest  # the gathered module + the prefetched next one
    elif s.kind == "fsdp" and s.stage == 2 and n > 1:
        gathered = total_params * spec.compute_bytes * (1 - 1 / n)

    # low-precision weight copies autocast keeps for backward (fp32 weights, bf16/fp16 compute)
    casts = 0.0
    head = counts.lm_head + (counts.embedding if a.tie_word_embeddings else 0)
    if not ds and spec.compute_bytes == 2 and spec.quant_bits:
        casts = head * 2
    elif not ds and w == 4 and spec.compute_bytes == 2:
        # autocast caches the casts of trainable weights until it exits; casts of frozen weights are kept
        # only as saved tensors, which gradient checkpointing drops
        linear = counts.linear if (spec.full_finetune or not spec.gradient_checkpointing) else 0
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

    stack, logits = activations(spec)
    mb = f"{spec.micro_batch}x{spec.seq_len} tokens"
    terms: list[tuple[str, float, str]] = [
        (
            "parameters",
            weights_b,
            (f"{plain_w} B/param" if trainable == total_params else f"{plain_w} B/frozen param")
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
            + (" (on the host with the offloaded optimizer)" if ds and s.offload_optimizer != "none" else ""),
        ),
        (
            "offload gradient buffer",
            offload_buffer,
            "one largest-parameter 16-bit buffer (stage 1/2 offload)",
        ),
        ("optimizer states", opt_states, _opt_note(opt_b, master, shard_o, s)),
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
        ("logits + loss", logits, f"vocab {a.vocab_size} x {spec.tokens} tokens x {LOGITS_BYTES} B"),
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
    fwd_bwd = always | {"autocast weight copies", "activations", "logits + loss"}
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
    return Estimate(spec, rows, peak, cpu, total_params, trainable, phase, model_states, host_offload)


def _quant_note(spec: RunSpec) -> str:
    if spec.quant_bits == 4:
        return f"{spec.quant_type} 4-bit, blocksize 64" + (" + double quant" if spec.double_quant else "")
    return "int8 + per-row fp32 scales"


def _opt_note(opt_b: float, master: int, shard: int, s: StrategyShape) -> str:
    text = f"{opt_b:g} B moments" + (f" + {master} B fp32 master" if master else "") + "/trainable param"
    if s.offload_optimizer != "none":
        return text + f" (offloaded to {s.offload_optimizer})"
    return text + (f", /{shard}" if shard > 1 else "")


# ---- from a composed config ---------------------------------------------------------------------
def parse_memory(text: Any) -> float | None:
    """'80GB' / '80 GiB' / '24GiB' / '80' (GiB) / '512MB' -> bytes; 'auto' -> None."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text) * GiB
    s = str(text).strip().replace(" ", "")
    if s.lower() in ("auto", "", "0"):
        return None
    m = re.fullmatch(r"(?i)([0-9]*\.?[0-9]+)([kmgt]?i?b?)?", s)
    if not m:
        from components.errors import ConfigError

        raise ConfigError(
            f"cannot read a memory size from '{text}'",
            key="estimate.gpu_memory",
            hint="e.g. 80GB, 24GiB or 80 (GiB)",
        )
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    # GPU memory is sold in GiB-ish "GB": an "80GB" H100 has 79.6 GiB usable; treat GB as GiB
    scale = {
        "": GiB,
        "k": KiB,
        "kb": KiB,
        "kib": KiB,
        "m": MiB,
        "mb": MiB,
        "mib": MiB,
        "g": GiB,
        "gb": GiB,
        "gib": GiB,
        "t": 1024 * GiB,
        "tb": 1024 * GiB,
        "tib": 1024 * GiB,
    }[unit]
    return value * scale


def detect_gpus() -> tuple[int, float | None]:
    """(visible GPUs, memory of the first) without importing torch when no GPU can be present."""
    import os
    import shutil

    if not shutil.which("nvidia-smi") and not os.path.exists("/proc/driver/nvidia"):
        return 1, None
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count(), float(torch.cuda.get_device_properties(0).total_memory)
    except Exception:
        pass
    return 1, None


def _dtype_bytes(value: Any, default: int) -> int:
    return DTYPE_BYTES.get(str(value), default)


def spec_from_config(cfg: Any, strategy: StrategyShape | None = None, **over: Any) -> RunSpec:
    """A RunSpec from a composed config (DictConfig or nested dict); duck-typed, nothing instantiated."""
    model, peft, quant = _get(cfg, "model"), _get(cfg, "peft"), _get(cfg, "quantization")
    arch = arch_of_model(model)
    est = _get(cfg, "estimate", {}) or {}
    launcher = _get(cfg, "launcher", {}) or {}
    num_gpus = int(_get(est, "num_gpus", 0) or 0)
    if num_gpus <= 0:  # the launcher's processes per node, else the visible GPUs
        nproc = int(_get(launcher, "nproc_per_node", 1) or 1)
        num_gpus = nproc if nproc > 1 else detect_gpus()[0]
    num_nodes = int(_get(est, "num_nodes", 1) or 1)
    if num_nodes == 1:
        num_nodes = int(_get(launcher, "nnodes", 1) or 1)
    precision = str(_get(_get(cfg, "precision"), "dtype", "fp32"))
    compute = {"fp32": 4, "bf16": 2, "fp16": 2, "auto": 2}.get(precision, 2)
    trainable = trainable_params(arch, peft)
    full = trainable == param_counts(arch).total and _class_name(peft) in ("FullFineTune", "dict", "NoneType")
    bits = _get(quant, "bits", None)
    bits = int(bits) if bits else None
    weight = _dtype_bytes(_get(model, "dtype", "auto"), 4)
    shape = strategy or shape_of(_get(cfg, "strategy"))
    if str(_get(model, "dtype", "auto")) == "auto" and precision in ("bf16", "auto"):
        # CausalLM.weight_dtype: a frozen, unquantized base outside FSDP loads in bf16
        adapter = _class_name(peft) in ADAPTER_CLASSES
        weight = 2 if adapter and not (bits or shape.kind == "fsdp") else weight
    data, train = _get(cfg, "data"), _get(cfg, "train")
    lora_inputs = 0
    if _class_name(peft) in ("LoRA", "DoRA"):
        pairs, _ = _targeted(arch, _get(peft, "target_modules", "all-linear"))
        lora_inputs = sum(i for i, _ in pairs)
    spec = RunSpec(
        arch=arch,
        trainable=trainable,
        full_finetune=full,
        weight_bytes=weight,
        compute_bytes=compute,
        optimizer=optimizer_kind(_get(cfg, "optimizer")),
        quant_bits=bits,
        quant_type=str(_get(quant, "quant_type", "nf4") or "nf4"),
        double_quant=bool(_get(quant, "double_quant", False)),
        micro_batch=int(_get(train, "micro_batch_size", 1)),
        seq_len=int(_get(data, "max_length", 1024) or 1024),
        gradient_checkpointing=bool(_get(model, "gradient_checkpointing", False)),
        attn_implementation=str(_get(model, "attn_implementation", "sdpa")),
        strategy=shape,
        num_gpus=num_gpus,
        num_nodes=num_nodes,
        lora_inputs_per_layer=lora_inputs,
        lora_dropout=float(_get(peft, "dropout", 0.0) or 0.0) > 0,
    )
    return replace(spec, **over) if over else spec


def gpu_memory_of(cfg: Any) -> float | None:
    """``estimate.gpu_memory`` in bytes, or the detected GPU's memory, or None (unknown)."""
    value = parse_memory(_get(_get(cfg, "estimate", {}), "gpu_memory", "auto"))
    return value if value is not None else detect_gpus()[1]


def applicable(name: str, world_size: int) -> bool:
    """Whether a strategy option makes sense for this many ranks (single = one rank, ddp = several)."""
    if name == "single":
        return world_size == 1
    if name == "ddp":
        return world_size > 1
    if name == "zero3pp":
        return world_size > 1
    return True


def compare(spec: RunSpec) -> dict[str, Estimate]:
    """The same run under every applicable strategy option."""
    return {
        name: estimate(replace(spec, strategy=shape))
        for name, shape in STRATEGY_SHAPES.items()
        if applicable(name, spec.world_size)
    }


# ---- strategy=auto: the OOM ladder --------------------------------------------------------------
@dataclass
class Decision:
    """What ``strategy=auto`` chose and why."""

    strategy: str | None  # None: nothing fits
    micro_batch: int
    accumulation: int
    gradient_checkpointing: bool
    estimate: Estimate | None
    tried: list[tuple[str, bool, float]]  # (strategy, checkpointing, GiB at micro-batch 1)
    gpu_memory: float
    margin: float

    def explain(self) -> str:
        budget = self.gpu_memory * (1 - self.margin) / GiB
        lines = [
            f"strategy=auto: budget {budget:.1f} GiB per GPU ({self.gpu_memory / GiB:.0f} GiB "
            f"less a {self.margin:.0%} safety margin)"
        ]
        for name, gc, need in self.tried:
            mark = "fits" if need <= budget else "too big"
            lines.append(f"  {name:<14} checkpointing={'on ' if gc else 'off'}  {need:7.1f} GiB  {mark}")
        if self.strategy is None:
            lines.append(
                "  nothing fits: fewer/longer-memory GPUs, more GPUs, a shorter data.max_length, "
                "peft=lora or quantization=nf4"
            )
            return "\n".join(lines)
        speed = SPEED.get(self.strategy, 0.5) * (CHECKPOINTING_SPEED if self.gradient_checkpointing else 1)
        assert self.estimate is not None
        gc_text = str(self.gradient_checkpointing).lower()
        lines.append(
            f"chose strategy={self.strategy} model.gradient_checkpointing={gc_text}"
            f" train.micro_batch_size={self.micro_batch}"
            f" train.gradient_accumulation_steps={self.accumulation}"
            f": the fastest rung that fits (assumed relative speed {speed:.2f}, see SPEED), "
            f"{self.estimate.total / GiB:.1f} GiB of {budget:.1f} GiB, the largest micro-batch keeping the "
            "global batch"
        )
        return "\n".join(lines)


def ladder(world_size: int, gradient_checkpointing: bool) -> list[tuple[str, bool]]:
    """(strategy, checkpointing) rungs, fastest first: relative strategy speed x checkpointing cost."""
    rungs = [
        (n, gc)
        for n in STRATEGY_SHAPES
        if applicable(n, world_size)
        for gc in ((True,) if gradient_checkpointing else (False, True))
    ]
    return sorted(rungs, key=lambda r: -SPEED[r[0]] * (CHECKPOINTING_SPEED if r[1] else 1.0))


def choose(
    spec: RunSpec,
    gpu_memory: float,
    margin: float = 0.1,
    per_gpu_batch: int | None = None,
    candidates: Iterable[str] | None = None,
) -> Decision:
    """Walk the ladder: the fastest (strategy, checkpointing) rung whose micro-batch-1 run fits, then the
    largest micro-batch dividing the per-GPU batch (micro x accumulation) that still fits."""
    batch = per_gpu_batch or spec.micro_batch
    allowed = set(candidates) if candidates else None
    tried: list[tuple[str, bool, float]] = []
    for name, gc in ladder(spec.world_size, spec.gradient_checkpointing):
        if allowed is not None and name not in allowed:
            continue
        base = replace(spec, strategy=STRATEGY_SHAPES[name], gradient_checkpointing=gc)
        first = estimate(replace(base, micro_batch=1))
        tried.append((name, gc, first.total / GiB))
        if not first.fits(gpu_memory, margin):
            continue
        for mb in sorted((d for d in range(1, batch + 1) if batch % d == 0), reverse=True):
            est = estimate(replace(base, micro_batch=mb))
            if est.fits(gpu_memory, margin):
                return Decision(name, mb, batch // mb, gc, est, tried, gpu_memory, margin)
    return Decision(None, 1, batch, spec.gradient_checkpointing, None, tried, gpu_memory, margin)


# ---- rendering ----------------------------------------------------------------------------------
def gib(x: float) -> str:
    return f"{x / GiB:.2f}"


#: Width of the tables when stdout is not a terminal (piped, captured): rich would otherwise assume 80
#: columns and cut the strategy names ("zero2_…").
PIPE_WIDTH = 160


def _console() -> Any:
    """A rich Console for stdout: the terminal's width, or ``PIPE_WIDTH`` when piped (COLUMNS wins)."""
    import os

    from rich.console import Console

    console = Console(highlight=False)
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(highlight=False, width=PIPE_WIDTH)


def render(cfg: Any, console: Any = None) -> bool:
    """Print the per-GPU table, the strategy comparison and the verdict (rich); returns fits."""
    from rich.table import Table

    console = console or _console()
    spec = spec_from_config(cfg)
    est = estimate(spec)
    gpu_memory = gpu_memory_of(cfg)
    margin = float(_get(_get(cfg, "estimate", {}), "safety_margin", 0.1))
    is_auto = _class_name(_get(cfg, "strategy")) == "Auto"
    a = spec.arch
    title = (
        f"{_get(_get(cfg, 'model'), 'name_or_path', '?')}: {est.params_total / 1e9:.3f} B params "
        f"({est.params_trainable:,} trainable), {spec.world_size} GPU(s), micro-batch {spec.micro_batch} x "
        f"{spec.seq_len} tokens, {a.num_layers} layers"
    )
    if not is_auto:
        table = Table(title=f"Memory per GPU — {title}", title_justify="left")
        table.add_column("item", overflow="fold")
        table.add_column("GiB", justify="right", no_wrap=True)
        table.add_column("how", overflow="fold")
        for r in est.rows:
            table.add_row(r.name if r.in_peak else f"[dim]{r.name}[/]", gib(r.bytes), r.note)
        table.add_row(
            "peak allocated",
            gib(est.peak_allocated),
            f"the sum of the rows held in the {est.peak_phase}, the larger phase (dimmed: the other)",
        )
        table.add_row(
            "[bold]total[/]",
            f"[bold]{gib(est.total)}[/]",
            f"+{FRAGMENTATION:.0%} fragmentation + {CUDA_CONTEXT_BYTES / GiB:.2f} GiB CUDA context",
        )
        console.print(table)
    comp = Table(title="Every strategy for the same run (per GPU, GiB)", title_justify="left")
    for col in (
        "strategy",
        "params",
        "grads",
        "optimizer",
        "activations+logits",
        "total",
        "CPU RAM",
        "speed (assumed)",
        "fits",
    ):
        comp.add_column(col, justify="left" if col == "strategy" else "right", overflow="fold")
    for name, e in compare(spec).items():
        ok = "?" if gpu_memory is None else ("yes" if e.fits(gpu_memory, margin) else "no")
        comp.add_row(
            name,
            gib(e.row("parameters") + e.row("quantized weights")),
            gib(e.row("gradients")),
            gib(e.row("optimizer states")),
            gib(e.row("activations") + e.row("logits + loss")),
            gib(e.total),
            gib(e.cpu_bytes),
            f"{STRATEGY_SHAPES[name].speed:.2f}",
            ok,
        )
    console.print(comp)
    if gpu_memory is None:
        console.print(
            f"total {gib(est.total)} GiB per GPU; GPU memory unknown (no GPU detected): pass "
            "estimate.gpu_memory=80GB to get a verdict"
        )
        return True
    if is_auto:
        per_gpu = spec.micro_batch * int(_get(_get(cfg, "train"), "gradient_accumulation_steps", 1))
        decision = choose(
            spec,
            gpu_memory,
            margin,
            per_gpu,
            candidates=_get(_get(cfg, "strategy"), "candidates", None) or None,
        )
        console.print(decision.explain())
        return decision.strategy is not None
    fits = est.fits(gpu_memory, margin)
    verdict = "[bold green]FITS[/]" if fits else "[bold red]DOES NOT FIT[/]"
    console.print(
        f"{verdict}: needs {gib(est.total)} GiB per GPU of {gib(gpu_memory)} GiB "
        f"({margin:.0%} safety margin: budget {gib(gpu_memory * (1 - margin))} GiB)"
    )
    if not fits:
        for hint in hints(spec, gpu_memory, margin):
            console.print(f"  try: {hint}")
    return fits


def hints(spec: RunSpec, gpu_memory: float, margin: float) -> list[str]:
    """Changes that make the run fit: single ones first, then the cheapest combination, then the ladder."""
    steps: list[tuple[str, dict[str, Any]]] = []
    if not spec.gradient_checkpointing:
        steps.append(("model.gradient_checkpointing=true", {"gradient_checkpointing": True}))
    if spec.weight_bytes == 4 and not spec.full_finetune and not spec.quant_bits:
        steps.append(("model.dtype=bfloat16", {"weight_bytes": 2}))
    if spec.micro_batch > 1:
        mb = spec.micro_batch
        steps.append(
            (f"train.micro_batch_size=1 (x{mb} train.gradient_accumulation_steps)", {"micro_batch": 1})
        )
    if not spec.full_finetune and not spec.quant_bits:
        steps.append(("quantization=nf4", {"quant_bits": 4, "double_quant": True}))
    out: list[str] = []
    for text, change in steps:
        e = estimate(replace(spec, **change))
        if e.fits(gpu_memory, margin):
            out.append(f"{text} -> {gib(e.total)} GiB")
    if not out:
        texts: list[str] = []
        current = spec
        for text, change in steps:
            current, texts = replace(current, **change), [*texts, text]
            e = estimate(current)
            if e.fits(gpu_memory, margin):
                out.append(" ".join(texts) + f" -> {gib(e.total)} GiB")
                break
    decision = choose(spec, gpu_memory, margin)
    if decision.strategy and decision.strategy not in ("single", "ddp") and decision.estimate is not None:
        out.append(
            f"strategy={decision.strategy} model.gradient_checkpointing="
            f"{str(decision.gradient_checkpointing).lower()} train.micro_batch_size={decision.micro_batch} "
            f"train.gradient_accumulation_steps={decision.accumulation} "
            f"-> {gib(decision.estimate.total)} GiB (strategy=auto finds it)"
        )
    return out


# ---- command line -------------------------------------------------------------------------------
def cli(args: list[str]) -> int:
    """``hydratune estimate <overrides>`` (or ``hydratune mode=estimate …``): compose, print, no weights.

    Exit code 0 when the run fits (or the GPU memory is unknown), 1 when it does not."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from components.errors import ConfigError

    overrides = [a for a in args if a != "mode=estimate"]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="conf", version_base=None):
            cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"cannot compose the config: {err}", key="estimate") from None
    finally:
        GlobalHydra.instance().clear()
    return 0 if render(cfg) else 1
