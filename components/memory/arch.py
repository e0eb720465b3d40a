"""The numbers of a decoder-only transformer that memory depends on, and its parameter counts.

Pure arithmetic over config.json keys: no torch, no Hydra. The PEFT components count their own trainable
parameters with the helpers here (``Peft.trainable_params`` in ``components/peft.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


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


def largest_param(arch: Arch) -> int:
    """Elements of the largest single parameter (the embedding or lm_head, else an MLP matrix): the size of
    DeepSpeed's per-parameter offload buffers and of ZeRO-3's largest gathered module."""
    lin = arch.linears().values()
    return max(arch.vocab_size * arch.hidden_size, *(i * o + (o if b else 0) for i, o, b in lin))


# ---- what PEFT methods train (their components call these) --------------------------------------
def targeted_linears(arch: Arch, target_modules: Any) -> tuple[list[tuple[int, int]], bool]:
    """(in, out) of every linear of one layer that ``target_modules`` names (``all-linear``, a list of
    names, or a regex over full module names), and whether ``lm_head`` is named too."""
    lin = arch.linears()
    if target_modules in (None, "all-linear"):
        return [(i, o) for i, o, _ in lin.values()], False
    if isinstance(target_modules, str) and not re.fullmatch(r"\w+", target_modules):  # a regex
        chosen = [v for k, v in lin.items() if re.fullmatch(target_modules, f"model.layers.0.{k}")]
        return [(i, o) for i, o, _ in chosen], bool(re.fullmatch(target_modules, "lm_head"))
    names = [target_modules] if isinstance(target_modules, str) else [str(t) for t in target_modules]
    chosen = [v for k, v in lin.items() if k.rsplit(".", 1)[-1] in names or k in names]
    return [(i, o) for i, o, _ in chosen], "lm_head" in names


def extra_module_params(arch: Arch, modules: Iterable[str] | None) -> int:
    """Parameters of extra fully-trained modules named by pattern (lm_head, embed_tokens, norm)."""
    total = 0
    for m in modules or []:
        if "lm_head" in m or "embed" in m:
            total += arch.vocab_size * arch.hidden_size
        elif "norm" in m:
            total += arch.hidden_size
    return total


def lora_params(
    arch: Arch,
    r: int = 16,
    target_modules: Any = "all-linear",
    *,
    dora: bool = False,
    modules_to_save: Iterable[str] | None = None,
) -> int:
    """LoRA's trainable parameters: ``r x (in + out)`` per targeted linear (DoRA adds a magnitude per
    output feature), lm_head's when targeted, and the fully trained ``modules_to_save``."""
    pairs, head = targeted_linears(arch, target_modules)
    per_layer = sum(r * (i + o) + (o if dora else 0) for i, o in pairs)
    extra = r * (arch.hidden_size + arch.vocab_size) if head else 0
    return per_layer * arch.num_layers + extra + extra_module_params(arch, modules_to_save)


def lora_inputs(arch: Arch, target_modules: Any = "all-linear") -> int:
    """Input features summed over one layer's LoRA-targeted linears (what lora_A keeps for backward)."""
    return sum(i for i, _ in targeted_linears(arch, target_modules)[0])
