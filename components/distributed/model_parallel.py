"""Tensor and sequence parallelism through the engines that have them, and what they really built.

* **Tensor parallel under DeepSpeed** (AutoTP): the ``tensor_parallel`` block of the generated config; the HF
  Trainer hands it to ``deepspeed.initialize``, which replaces each attention / MLP ``nn.Linear`` with a
  column- or row-parallel shard (Megatron's split) and builds the TP groups. Every rank of a TP group reads
  the same micro-batch (accelerate shards the data over ``world / tp`` replicas).
* **Sequence parallel under DeepSpeed** (Ulysses, ``UlyssesSPAttentionHF``): accelerate's
  ``ParallelismConfig(sp_backend="deepspeed")``; each micro-batch's tokens are split over the SP group and
  attention swaps the split from tokens to heads (all-to-all) around the model's own attention function.
* **Tensor parallel under FSDP2** (transformers ``DistributedConfig``) and **context parallel** (accelerate's
  ``cp_size``, ring attention): GPU only.

:func:`deepspeed_layout` is the live check: after the engine is built it reads the process groups and each
rank's parameter shapes, and refuses to train on anything but what was asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed.mesh import Mesh

#: the modules AutoTP splits in a decoder layer: column-parallel (output split) and row-parallel (input split)
COLUMN_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PROJECTIONS = ("o_proj", "down_proj")


def autotp_block(tp: int) -> dict[str, Any]:
    """DeepSpeed's ``tensor_parallel`` block. The vocabulary-parallel head is off: with a tied embedding
    DeepSpeed would otherwise shard the head over the vocabulary and compute its own distributed loss,
    which through the HF Trainer gave another loss than one process (5.5749 against 6.2843 at the first
    step of the tiny model, measured); the embedding and head stay whole on every rank."""
    return {"autotp_size": tp, "vocab_parallel_lm_head": False}


def ulysses_config(sp: int, dp: int, attention: str | None) -> Any:
    """accelerate's ``ParallelismConfig`` for DeepSpeed Ulysses over ``sp`` ranks, ``dp`` replicas.
    ``attention``: the model's attention implementation, which Ulysses wraps (it must be the one the model
    was built with). accelerate's own check of the handler lists flash attention and sdpa only; hydratune's
    ``varlen_sdpa`` is an attention function of the same kind (registered with transformers), so it is set
    after the handler is built."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True)
    handler.sp_attn_implementation = attention or "sdpa"
    return ParallelismConfig(sp_size=sp, sp_backend="deepspeed", dp_shard_size=dp, sp_handler=handler)


def context_parallel_config(cp: int, dp: int) -> Any:
    """accelerate's ``ParallelismConfig`` for context parallelism (ring attention over ``cp`` ranks) on FSDP2
    over ``dp`` shards: GPU only."""
    from accelerate.parallelism_config import ParallelismConfig

    return ParallelismConfig(cp_size=cp, dp_shard_size=dp)


def distributed_config(tp: int, dp: int) -> Any:
    """transformers' ``DistributedConfig``: the model loads already split over ``tp`` ranks (its
    ``tp_plan``) and sharded with FSDP2 over ``dp`` (GPU only: accelerate refuses a TP model on CPU)."""
    from transformers.distributed import DistributedConfig

    return DistributedConfig(tp_size=tp, fsdp_size=dp)


#: the mixtures whose experts AutoEP splits and ``full_expert_state_dict`` gathers back into the model's own
#: parameters (transformers 5's fused ``gate_up_proj`` [experts, 2 x ffn, hidden] and ``down_proj`` [experts,
#: hidden, ffn]); checked against the weights the model was built with
AUTOEP_MODEL_TYPES = ("qwen3_moe", "mixtral")


def autoep_block(ep: int, device: str) -> dict[str, Any]:
    """DeepSpeed's ``expert_parallel`` block (AutoEP): the experts split over ``ep`` ranks, the preset found
    from the model's type; on CPU the experts run as plain batched matmuls (no grouped-GEMM kernel)."""
    return {"enabled": True, "autoep_size": ep, "use_grouped_mm": device == "cuda"}


def autoep_transformers_compat() -> None:
    """DeepSpeed 0.19.8's AutoEP reads transformers' output-recorder registry as a plain dict
    (``registry.get(name, default)``); transformers 5.23's ``_CanRecordRegistry.get`` takes the model only.
    Make ``get`` take both forms (idempotent); without it ``deepspeed.initialize`` stops with a TypeError."""
    from transformers.utils import output_capturing

    registry = output_capturing._CanRecordRegistry
    if getattr(registry.get, "_hydratune", False):
        return
    original = registry.get

    def get(self: Any, key: Any, default: Any = None) -> Any:
        return dict.get(self, key, default) if isinstance(key, str) else original(self, key)

    get._hydratune = True  # type: ignore[attr-defined]
    registry.get = get


def autoep_layers(model: Any) -> dict[str, Any]:
    """``{name: layer}`` of the mixture blocks AutoEP put in place of the model's own."""
    return {
        name: module
        for name, module in model.named_modules()
        if hasattr(module, "expert_placement_descriptor") and hasattr(module, "experts")
    }


def full_expert_state_dict(model: Any) -> dict[str, Any]:
    """The model's state dict under its own names, every expert whole: each AutoEP block's local experts
    (``w1`` gate, ``w3`` up, ``w2`` down, [local experts, ...]) gathered from the ranks of its expert-parallel
    group and put back as ``gate_up_proj`` / ``down_proj`` over all experts, its router as ``gate.weight``.
    A collective: every rank calls it (the answer is the same on every rank)."""
    import torch
    import torch.distributed as dist
    from deepspeed.checkpoint.autoep_affine import autoep_experts_for_rank

    state = model.state_dict()
    for name, layer in autoep_layers(model).items():
        prefix = f"{name}."
        for key in [k for k in state if k.startswith(prefix)]:
            del state[key]
        ranks = dist.get_world_size(layer.ep_group)
        owned = [list(autoep_experts_for_rank(layer.expert_placement_descriptor, r)) for r in range(ranks)]
        whole = {}
        for part in ("w1", "w2", "w3"):
            local = getattr(layer.experts, part).detach().contiguous()
            pieces = [torch.empty_like(local) for _ in range(ranks)]
            dist.all_gather(pieces, local, group=layer.ep_group)
            full = torch.empty((layer.num_experts, *local.shape[1:]), dtype=local.dtype, device=local.device)
            for experts, piece in zip(owned, pieces, strict=True):
                full[experts] = piece
            whole[part] = full
        state[f"{prefix}gate.weight"] = layer.router.gate.weight.detach()
        state[f"{prefix}experts.gate_up_proj"] = torch.cat([whole["w1"], whole["w3"]], dim=1)
        state[f"{prefix}experts.down_proj"] = whole["w2"]
    return state


def expert_layout(model: Any) -> dict[str, Any]:
    """Which experts this rank holds of the first AutoEP block, out of how many, and its group's size."""
    import torch.distributed as dist
    from deepspeed.checkpoint.autoep_affine import autoep_experts_for_rank

    layers = autoep_layers(model)
    if not layers:
        raise ConfigError(
            "asked for expert parallel but DeepSpeed left every mixture block whole (AutoEP found none)",
            key="strategy.ep_size",
            hint=f"a model of a type AutoEP splits ({', '.join(AUTOEP_MODEL_TYPES)}), or strategy.ep_size=1",
        )
    name, layer = next(iter(layers.items()))
    held = list(autoep_experts_for_rank(layer.expert_placement_descriptor, layer.ep_rank))
    return {
        "blocks split": len(layers),
        "expert parallel group": dist.get_world_size(layer.ep_group),
        f"{name} experts held": f"{held} of {layer.num_experts} ({tuple(layer.experts.w1.shape)} w1)",
    }


def deepspeed_layout(model: Any, mesh: Mesh) -> dict[str, Any]:
    """What DeepSpeed built, read back after ``deepspeed.initialize``: the sizes of its TP, SP and data
    parallel groups, and this rank's shape of each split projection next to its whole shape. A ConfigError
    when any differs from ``mesh`` (a silent fallback: weights left whole, a group of the wrong size)."""
    import torch.distributed as dist

    layout: dict[str, Any] = {"rank": dist.get_rank() if dist.is_initialized() else 0}
    groups = _group_sizes(mesh)
    layout["process groups"] = groups
    wrong = {dim: size for dim, size in groups.items() if size != getattr(mesh, dim)}
    if wrong:
        raise ConfigError(
            f"asked for {mesh.describe()} but DeepSpeed built process groups of "
            + ", ".join(f"{dim} {size}" for dim, size in groups.items()),
            key="strategy.tp_size" if "tp" in wrong else "strategy.sp_size",
            hint="check launcher.nproc_per_node / WORLD_SIZE against tp_size x sp_size",
        )
    if mesh.tp > 1:
        layout["shards"] = tensor_parallel_shards(model, mesh.tp)
    if mesh.sp > 1:
        layout["attention"] = ulysses_attention(model)
    return layout


def _group_sizes(mesh: Mesh) -> dict[str, int]:
    """The sizes of the process groups DeepSpeed made (1 where a dimension is off)."""
    from deepspeed.utils import groups

    sizes = {"tp": 1, "sp": 1, "dp": mesh.world}
    if mesh.tp > 1:
        sizes["tp"] = groups.get_tensor_model_parallel_world_size()
        sizes["dp"] = groups.get_data_parallel_world_size()
    if mesh.sp > 1:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp

        sizes["sp"] = parallel_state_sp.get_sequence_parallel_world_size()
        sizes["dp"] = parallel_state_sp.get_sequence_data_parallel_world_size() // sizes["sp"]
    return sizes


def tensor_parallel_shards(model: Any, tp: int) -> dict[str, Any]:
    """The split projections of the first decoder layer as this rank holds them (``local`` shape) next to
    the model's whole shape (from its config), checked: a column-parallel weight holds ``1/tp`` of the
    output rows, a row-parallel one ``1/tp`` of the input columns. A ConfigError names the first module
    left whole or split otherwise (along the wrong dimension, unevenly)."""
    from deepspeed.module_inject.layers import TensorParallel_Layer

    whole = projection_shapes(model.config)
    shards: dict[str, Any] = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in whole or any(n.endswith("." + leaf) for n in shards):
            continue
        local = list(getattr(module.weight, "ds_shape", module.weight.shape))  # ZeRO-3: the TP shard's shape
        dim = 0 if leaf in COLUMN_PROJECTIONS else 1
        expected = list(whole[leaf])
        expected[dim] //= tp
        if not isinstance(module, TensorParallel_Layer) or local != expected:
            raise ConfigError(
                f"tensor parallel did not split {name} as asked: this rank holds {type(module).__name__} "
                f"{local}, expected {expected} ({'output rows' if dim == 0 else 'input columns'} of "
                f"{list(whole[leaf])} over {tp} ranks)",
                key="strategy.tp_size",
                hint="this model's layers are not ones DeepSpeed AutoTP splits; use strategy.tp_size=1",
            )
        shards[name] = {"local": local, "whole": list(whole[leaf])}
    if len(shards) < len(whole):
        missing = sorted(set(whole) - {n.rsplit(".", 1)[-1] for n in shards})
        raise ConfigError(
            f"tensor parallel: the model has no {', '.join(missing)} to split",
            key="strategy.tp_size",
            hint="tensor parallel here knows Llama-style layers (q/k/v/o, gate/up/down): strategy.tp_size=1",
        )
    return shards


def projection_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """Whole ``(out, in)`` weight shapes of a Llama-style decoder layer's projections, from its config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, heads = int(text.hidden_size), int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads) * head_dim
    inter = int(text.intermediate_size)
    return {
        "q_proj": (heads * head_dim, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "o_proj": (hidden, heads * head_dim),
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }


def ulysses_attention(model: Any) -> str:
    """The attention function the model calls is DeepSpeed's Ulysses wrapper around its own (else Ulysses
    was not registered and every rank would attend over its own slice of the tokens only)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    function = ALL_ATTENTION_FUNCTIONS.get(impl) if impl else None
    if function is None or getattr(function, "__name__", "") != "uattn_wrapper":
        raise ConfigError(
            f"sequence parallel: the model's attention ({impl}) is not wrapped by DeepSpeed Ulysses",
            key="strategy.sp_size",
            hint="model.attn_implementation=auto (or sdpa / flash_attention_2)",
        )
    return f"Ulysses around {impl}"


def fast_forward_ulysses(loader: Any, epoch: int, micro_batches: int) -> bool:
    """Put DeepSpeed's Ulysses data loader (``UlyssesSPDataLoaderAdapter``) where an uninterrupted run was
    after ``epoch`` whole epochs and ``micro_batches`` of the next: the Trainer's own skip on resume
    (accelerate's ``skip_first_batches``) cannot take the adapter (it has no ``dataset``), and the adapter
    has no ``set_epoch``. Every rank of the group calls this alike (each refill is collective). False when
    ``loader`` is not that adapter (nothing done)."""
    inner = getattr(loader, "dl", None)
    if inner is None or not hasattr(loader, "refill"):
        return False
    if hasattr(inner, "set_epoch"):
        inner.set_epoch(epoch)  # the wrapped loader's shuffle of that epoch
    loader.iter = iter(inner)
    loader.micro_batches.clear()
    for _ in range(micro_batches):
        next(loader)
    return True


def whole_last_batches(rows: int, micro_batch: int, world: int) -> bool:
    """Whether ``rows`` fill whole batches of ``micro_batch`` in equal numbers on the ``world`` ranks
    accelerate shards them over (else it completes the last ones with the epoch's first rows)."""
    return rows % micro_batch == 0 and (rows // micro_batch) % world == 0


def epoch_rows(rows: int, micro_batch: int, world: int, rank: int, batch: int) -> int:
    """How many of the ``batch``-th micro-batch (of an epoch) that ``rank`` of ``world`` draws are the epoch's
    own rows; the rest of its ``micro_batch`` rows are the epoch's first rows again. accelerate's
    ``BatchSamplerShard`` (``even_batches``, no ``split_batches``) deals the sampler's batches out in turn,
    so that micro-batch is the sampler's batch ``batch * world + rank``, and completes the epoch's last
    round with its first rows, after the rows of a partial batch."""
    return max(0, min(micro_batch, rows - (batch * world + rank) * micro_batch))


def attention_function(name: str | None) -> Any:
    """transformers' attention function registered as ``name`` now (None: not registered)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS.get(name) if name else None


@contextlib.contextmanager
def unwrapped_attention(name: str | None, original: Any) -> Iterator[None]:
    """The model's own attention function back in place of DeepSpeed's Ulysses wrapper while this runs. The
    wrapper drops every attention mask, in eval too (where it skips Ulysses): generation pads prompts on the
    left, so without the mask the answers attended to padding (the demo's exact match 0.45 against 1.0)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    wrapped = attention_function(name)
    if wrapped is None or original is None or wrapped is original:
        yield
        return
    ALL_ATTENTION_FUNCTIONS[name] = original
    try:
        yield
    finally:
        ALL_ATTENTION_FUNCTIONS[name] = wrapped
