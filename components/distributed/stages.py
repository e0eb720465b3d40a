"""A decoder-only transformers model cut into pipeline stages: which layers each stage holds, and the stage
as a module that runs them.

The families whose decoder layers sit in one ``ModuleList`` (``model.layers``) between an embedding and a
final norm + LM head (Llama, Mistral, Qwen2/3, Gemma 1-3, SmolLM): stage 0 holds the embedding and the first
layers, the last stage the last layers, the norm and the head; a middle stage only layers. The stage's
forward is the family's own model forward restricted to its layers (causal mask per layer type: full or
sliding window; rotary embeddings, per layer type where the family has several; Gemma's final logit
soft-cap), checked against the whole model's logits family by family (``tests/multiproc/test_pipeline.py``).

Pure model arithmetic and module surgery; the process groups and schedules are ``pp_schedule.py``'s.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hydratune.components.config.errors import ConfigError

#: model_type -> the families built stage by stage here (each checked against the whole model in a test)
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
FULL, SLIDING = "full_attention", "sliding_attention"


def refusal(config: Any) -> str | None:
    """Why a model of ``config`` cannot be cut into stages here (None: it can)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        return (
            f"model_type '{model_type}' is not one of the decoder-only families whose layers sit in one "
            f"model.layers list that pipeline stages are built for ({', '.join(FAMILIES)})"
        )
    if getattr(config, "use_bidirectional_attention", False):
        return f"{model_type} with use_bidirectional_attention attends both ways, not causally"
    return None


def meta_model(config: Any) -> nn.Module:
    """The causal LM of ``config`` on the meta device (no memory, no weights): its shapes and names."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@dataclass(frozen=True)
class CausalLMParts:
    """Where a causal LM keeps its parts: ``backbone`` holds ``embed_tokens``, ``layers``, ``norm`` and
    ``rotary_emb``; ``lm_head`` sits on the top model."""

    top: nn.Module  # the *ForCausalLM
    backbone: nn.Module  # its .model

    @classmethod
    def of(cls, model: nn.Module) -> CausalLMParts:
        top = model.get_base_model() if hasattr(model, "get_base_model") else model  # under PEFT: the model
        backbone = getattr(top, "model", None)
        missing = [
            name
            for name, holder in (
                ("model.layers", backbone),
                ("model.embed_tokens", backbone),
                ("lm_head", top),
            )
            if holder is None or not hasattr(holder, name.rsplit(".", 1)[-1])
        ]
        if missing:
            raise ConfigError(
                f"{type(top).__name__} has no {', '.join(missing)}: it cannot be cut into pipeline stages",
                key="strategy",
                hint="use strategy=fsdp or a DeepSpeed ZeRO stage for this model",
            )
        return cls(top, backbone)

    @property
    def config(self) -> Any:
        return self.top.config

    @property
    def tied(self) -> bool:
        """The LM head is the embedding matrix (SmolLM2, Gemma): two stages hold a copy each."""
        head, embed = self.top.lm_head, self.backbone.embed_tokens
        return head is not None and embed is not None and head.weight is embed.weight

    def layer_types(self) -> list[str]:
        """Each decoder layer's attention: the config's ``layer_types``, else sliding everywhere when the
        config has a window (Mistral), else full."""
        config, n = self.config, self.config.num_hidden_layers
        types = getattr(config, "layer_types", None)
        if types:
            return list(types)
        return [SLIDING if getattr(config, "sliding_window", None) is not None else FULL] * n


# ---- the split ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StagePlan:
    """``num_stages`` stages over ``num_layers`` decoder layers: stage ``s`` holds layers
    ``bounds[s]`` to ``bounds[s + 1] - 1``; stage 0 also the embedding, the last also norm and head.
    ``ranks`` pipeline ranks hold the stages round-robin (stage ``s`` on rank ``s % ranks``)."""

    bounds: tuple[int, ...]  # num_stages + 1 numbers: 0, first layer of stage 1, ..., num_layers
    ranks: int
    costs: tuple[int, ...] = ()  # parameters of each stage (embedding and head included)

    @property
    def num_stages(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_layers(self) -> int:
        return self.bounds[-1]

    def layers(self, stage: int) -> range:
        return range(self.bounds[stage], self.bounds[stage + 1])

    def stages_of(self, rank: int) -> list[int]:
        """The stages pipeline rank ``rank`` holds (several under an interleaved schedule)."""
        return list(range(rank, self.num_stages, self.ranks))

    def rank_of(self, stage: int) -> int:
        return stage % self.ranks

    def describe(self, stage: int) -> str:
        """``embed_tokens + layers 0-3`` / ``layers 4-7 + norm + lm_head`` (+ its parameter count)."""
        parts = ["embed_tokens"] if stage == 0 else []
        first, last = self.bounds[stage], self.bounds[stage + 1] - 1
        parts.append(f"layer {first}" if first == last else f"layers {first}-{last}")
        if stage == self.num_stages - 1:
            parts.append("norm + lm_head")
        cost = f" ({self.costs[stage]:,} parameters)" if self.costs else ""
        return " + ".join(parts) + cost


def parameter_costs(model: nn.Module) -> tuple[int, list[int], int]:
    """Parameters of the embedding, of each decoder layer and of norm + head (a tied head counts: the last
    stage holds and updates its own copy of the matrix)."""
    layout = CausalLMParts.of(model)
    count = lambda module: sum(p.numel() for p in module.parameters()) if module is not None else 0  # noqa: E731
    layers = [count(layer) for layer in layout.backbone.layers]
    head = count(layout.top.lm_head) + count(layout.backbone.norm)
    return count(layout.backbone.embed_tokens), layers, head


def check_bounds(split: Sequence[int], num_layers: int, stages: int) -> tuple[int, ...]:
    """``strategy.split`` (the first layer of every stage after the first) as bounds, or a ConfigError."""
    split = [int(b) for b in split]
    if len(split) != stages - 1:
        raise ConfigError(
            f"strategy.split={split} gives {len(split) + 1} stages, the schedule runs {stages}",
            key="strategy.split",
            hint=f"{stages - 1} increasing layer indices (the first layer of stages 1 to {stages - 1}), "
            "or [] for the split balanced by parameter count",
        )
    bounds = (0, *split, num_layers)
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ConfigError(
            f"strategy.split={split} leaves a stage without a decoder layer (the model has {num_layers})",
            key="strategy.split",
            hint=f"strictly increasing layer indices between 1 and {num_layers - 1}",
        )
    return bounds


def plan_stages(
    model: nn.Module,
    stages: int,
    ranks: int,
    split: Sequence[int] = (),
    balance: Callable[[list[int], int], list[int]] | None = None,
) -> StagePlan:
    """The split of ``model`` (a meta-device model will do) into ``stages``: ``split`` if given, else
    ``balance(units, stages)`` (group sizes; the units are the layers' parameter counts, the embedding added
    to the first layer's, norm + head to the last one's:
    ``hydratune.components.memory.parallel.balanced_split``, the
    estimate's own split), else equal layer counts."""
    embed, layers, head = parameter_costs(model)
    if stages > len(layers):
        raise ConfigError(
            f"{stages} pipeline stages need at least {stages} decoder layers; the model has {len(layers)}",
            key="strategy.pp_size",
            hint=f"at most {len(layers)} stages (strategy.pp_size x strategy.stages_per_rank)",
        )
    if split:
        bounds = check_bounds(split, len(layers), stages)
    else:
        units = list(layers)
        units[0] += embed
        units[-1] += head
        sizes = balance(units, stages) if balance else [len(units) // stages + (s < len(units) % stages)
                                                        for s in range(stages)]  # fmt: skip
        bounds = (0, *itertools.accumulate(sizes))
    costs = tuple(
        sum(layers[bounds[s] : bounds[s + 1]]) + (embed if s == 0 else 0) + (head if s == stages - 1 else 0)
        for s in range(stages)
    )
    return StagePlan(tuple(bounds), ranks, costs)


# ---- a rank's part of the model ---------------------------------------------------------------------
def keep_stages(model: nn.Module, plan: StagePlan, stages: Sequence[int]) -> None:
    """Cut ``model`` down in place to ``stages``: the other decoder layers dropped, the embedding kept only
    with stage 0, norm and head only with the last. ``model.layers`` becomes a ``ModuleDict`` keyed by the
    layers' own indices, so parameter names stay the whole model's (``model.layers.5.mlp...``)."""
    layout = CausalLMParts.of(model)
    keep = sorted(i for s in stages for i in plan.layers(s))
    layers = layout.backbone.layers
    layout.backbone.layers = nn.ModuleDict({str(i): layers[i] for i in keep})
    if 0 not in stages:
        layout.backbone.embed_tokens = None
    if plan.num_stages - 1 not in stages:
        layout.backbone.norm = None
        layout.top.lm_head = None


def expected(plan: StagePlan, stages: Sequence[int]) -> dict[str, Any]:
    """What a rank holding ``stages`` must hold (the shape of :func:`held`)."""
    return {
        "layers": sorted(i for s in stages for i in plan.layers(s)),
        "embed_tokens": 0 in stages,
        "lm_head": plan.num_stages - 1 in stages,
        "parameters": sum(plan.costs[s] for s in stages) if plan.costs else None,
    }


def held(model: nn.Module) -> dict[str, Any]:
    """What a (cut) model really holds, read from its modules: decoder layer indices, embedding, head, and
    its parameter count (the model's own: an adapter's weights not counted; a tied matrix counted on each
    side that holds it)."""
    layout = CausalLMParts.of(model)
    layers = layout.backbone.layers
    indices = (
        sorted(int(k) for k in layers) if isinstance(layers, nn.ModuleDict) else list(range(len(layers)))
    )
    embed, head = layout.backbone.embed_tokens, layout.top.lm_head
    adapters = tuple(f".{name}." for name in getattr(model, "peft_config", {}))  # an adapter's own weights
    count = sum(p.numel() for n, p in model.named_parameters() if not any(a in n for a in adapters))
    return {
        "layers": indices,
        "embed_tokens": embed is not None,
        "lm_head": head is not None,
        "parameters": count,
    }


class Stage(nn.Module):
    """One pipeline stage of a cut model: stage 0 takes token ids, the others the hidden states of the stage
    before; the last returns logits, the others hidden states. The modules are the cut model's own (shared:
    the optimizer and the checkpoints see the model's parameters by their names)."""

    def __init__(self, model: nn.Module, plan: StagePlan, stage: int, autocast: torch.dtype | None = None):
        super().__init__()
        layout = CausalLMParts.of(model)
        self.config = layout.config
        self.index, self.is_first, self.is_last = stage, stage == 0, stage == plan.num_stages - 1
        self.layer_ids = list(plan.layers(stage))
        self.layers = nn.ModuleList([layout.backbone.layers[str(i)] for i in self.layer_ids])
        self.types = [layout.layer_types()[i] for i in self.layer_ids]
        self.embed_tokens = layout.backbone.embed_tokens if self.is_first else None
        self.norm = layout.backbone.norm if self.is_last else None
        self.lm_head = layout.top.lm_head if self.is_last else None
        self.rotary_emb = layout.backbone.rotary_emb
        self.rotary_by_type = "layer_type" in inspect.signature(self.rotary_emb.forward).parameters
        self.softcap = getattr(self.config, "final_logit_softcapping", None)
        self.autocast = autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.autocast is None:
            return self._forward(x)
        with torch.autocast(x.device.type, dtype=self.autocast):
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        hidden = self.embed_tokens(x) if self.is_first else x
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        kwargs = {
            "config": self.config,
            "inputs_embeds": hidden,
            "attention_mask": None,  # right-padded rows: a causal mask never lets a real token see padding
            "past_key_values": None,
            "position_ids": positions,
        }
        masks = {
            kind: (create_causal_mask if kind == FULL else create_sliding_window_causal_mask)(**kwargs)
            for kind in set(self.types)
        }
        if self.rotary_by_type:
            rotary = {kind: self.rotary_emb(hidden, positions, kind) for kind in set(self.types)}
        else:
            shared = self.rotary_emb(hidden, positions)
            rotary = {kind: shared for kind in set(self.types)}
        for layer, kind in zip(self.layers, self.types, strict=True):
            out = layer(
                hidden,
                attention_mask=masks[kind],
                position_embeddings=rotary[kind],
                position_ids=positions,
                past_key_values=None,
                use_cache=False,
            )
            hidden = out[0] if isinstance(out, tuple) else out
        if not self.is_last:
            return hidden
        logits = self.lm_head(self.norm(hidden))
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
