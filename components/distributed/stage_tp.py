"""Tensor parallel inside pipeline stages (3D: pp x dp x tp): each decoder layer a rank holds has its
attention and MLP projections split Megatron-style over the stage's tensor-parallel ranks with DTensor
(``torch.distributed.tensor.parallel``), as torchtitan does: q / k / v and gate / up by output rows
(column-wise), o and down by input columns (row-wise, the partial sums all-reduced), so each rank computes
``heads / tp`` attention heads and ``intermediate / tp`` of the MLP, and a layer's input and output stay
whole on every rank (what a pipeline stage sends on). The embedding, norms and LM head stay whole: every
tensor-parallel rank computes them alike, from the same inputs.

The families of ``stages.FAMILIES`` name their projections alike and reshape attention by ``-1`` heads, so
a split layer runs as it is; ``mesh.check_model`` has already checked that tp divides the heads, the
key/value heads and the MLP's hidden size.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from hydratune.components.config.errors import ConfigError

#: a decoder layer's projection -> how tensor parallel splits it
LAYER_PLAN = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


def split_layers(layers: Iterable[nn.Module], tp_mesh: Any) -> None:
    """Split every layer of ``layers`` over ``tp_mesh`` (in place: the parameters become DTensors). A layer
    without the plan's projections (another family), or with one that is not a plain Linear, is a
    ConfigError."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for layer in layers:
        names = {name for name, _ in layer.named_modules()}
        missing = [name for name in LAYER_PLAN if name not in names]
        if missing:
            raise ConfigError(
                f"{type(layer).__name__} has no {', '.join(missing)}: its layers cannot be split over "
                "tensor-parallel ranks inside a pipeline stage",
                key="strategy.tp_size",
                hint="strategy.tp_size=1 with strategy=pipeline for this model",
            )
        for name in LAYER_PLAN:
            module = layer.get_submodule(name)
            if not isinstance(module, nn.Linear):  # e.g. an adapter's wrapper
                raise ConfigError(
                    f"{name} of {type(layer).__name__} is a {type(module).__name__}, not a plain Linear: "
                    "tensor parallel inside pipeline stages splits plain projections only",
                    key="strategy.tp_size",
                    hint="full fine-tuning (peft=none) with strategy.tp_size > 1, or strategy.tp_size=1",
                )
        parallelize_module(layer, tp_mesh, {name: styles[style]() for name, style in LAYER_PLAN.items()})
