"""PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) for loops we own (PPO).

accelerate's FSDP plugin cannot run on CPU (with ``cpu=True`` it silently becomes DDP), but ``fully_shard``
itself works over gloo as over nccl: loops shard their modules with it directly, so the same code path
runs on CPU (tested) and GPU. Parameters become DTensors (each rank holds a shard): modules are sharded
before the optimizer is built, and full state dicts are gathered with ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from hydratune.components.config.errors import ConfigError

PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: heads called on their own, outside their model's forward (``ppo.critic_values`` applies a critic's score
#: head to every position): each its own unit, which gathers its weights when called
HEADS_CALLED_ALONE = ("score",)


def mesh(device: str) -> Any:
    """A 1-D device mesh over every process (the process group is made here when none exists yet:
    a single-process run, where accelerate does not make one)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return init_device_mesh(device, (dist.get_world_size(),))


def root_of(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose forward every call goes through: the transformers model under a PEFT wrapper
    (``PeftModel.generate`` calls the base model's ``generate``, not the wrapper's forward)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def layer_class_names(model: torch.nn.Module, configured: Iterable[str] | None) -> set[str]:
    """The classes sharded one unit each in a transformers model: ``configured`` or the model's
    ``_no_split_modules``; none in other modules (a value head is one unit)."""
    root = root_of(model)
    if not hasattr(root, "_no_split_modules"):
        return set()
    return set(configured or root._no_split_modules or ())


def shard(
    model: torch.nn.Module,
    *,
    device: str,
    layer_classes: set[str],
    reshard_after_forward: bool,
    cpu_offload: bool,
    mixed_precision: str,
) -> torch.nn.Module:
    """``fully_shard`` one unit per layer of ``layer_classes``, then the root (embeddings, norm, head: a
    module called alone, e.g. ``generate`` or a value head, gathers what it needs). Returns ``model``,
    sharded in place."""
    from torch.distributed.fsdp import fully_shard

    root = root_of(model)
    layers = [m for m in root.modules() if type(m).__name__ in layer_classes]
    if layer_classes and not layers:  # before any collective: a config mistake, said as one
        raise ConfigError(
            f"no module of {type(root).__name__} is one of {sorted(layer_classes)}",
            key="strategy.transformer_layer_cls_to_wrap",
            hint="the decoder layer's class name (e.g. LlamaDecoderLayer), or null for _no_split_modules",
        )
    heads = [
        getattr(root, n) for n in HEADS_CALLED_ALONE if isinstance(getattr(root, n, None), torch.nn.Module)
    ]
    kwargs = shard_options(device, reshard_after_forward, cpu_offload, mixed_precision)
    for unit in [*layers, *heads, root]:
        fully_shard(unit, **kwargs)
    return model


def shard_options(device: str, reshard_after_forward: bool, cpu_offload: bool, mixed_precision: str) -> dict:
    """``fully_shard``'s keyword arguments: the mesh over every process, offload and precision policies."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    param_dtype = PARAM_DTYPES.get(mixed_precision)
    return {
        "mesh": mesh(device),
        "reshard_after_forward": reshard_after_forward,
        "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy(),
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        if param_dtype
        else MixedPrecisionPolicy(),
    }


def units(model: torch.nn.Module) -> list[Any]:
    """The FSDP2 units in ``model`` (the root and each sharded layer)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: torch.nn.Module) -> bool:
    """``model``'s root really is an FSDP2 unit (no silent fallback to whole weights)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(root_of(model), FSDPModule)


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(elements of ``model``'s parameters held by this rank, elements of the whole parameters)."""
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    return local, sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def gathered(model: torch.nn.Module, reshard_after_forward: bool) -> Iterator[None]:
    """Keep the layers' parameters gathered across forward passes (generation: one all-gather per
    layer instead of one per layer per token), resharded when done."""
    layers = [m for m in units(model) if m is not root_of(model)]
    for unit in layers:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in layers:
            unit.set_reshard_after_forward(reshard_after_forward, recurse=False)
        for unit in units(model):
            unit.reshard()


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_state_dict(model: torch.nn.Module, *, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The whole weights on rank 0's CPU (empty elsewhere); a collective call on every rank."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    options = _options(cpu_offload=True, ignore_frozen_params=trainable_only)
    return get_model_state_dict(model, options=options)


def full_optimizer_state(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name, whole, on rank 0's CPU; a collective call."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))


def load_full_state(
    model: torch.nn.Module, optimizer: Any, weights: dict[str, Any], optimizer_state: dict[str, Any]
) -> None:
    """Put what :func:`full_state_dict` (trainable only) and :func:`full_optimizer_state` gathered back
    into the shards; rank 0 passes the state, the others empty dicts (it is broadcast)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    result = set_model_state_dict(model, weights, options=_options(broadcast_from_rank0=True, strict=False))
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    wrong = [k for k in result.missing_keys if k not in frozen] + list(result.unexpected_keys)
    if wrong:
        raise ValueError(f"the checkpoint's weights do not fit the model: {wrong[:3]}")
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=_options(broadcast_from_rank0=True))
