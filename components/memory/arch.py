"""The numbers of a decoder-only transformer that memory depends on, and its parameter counts.

Pure arithmetic over config.json keys: no torch, no Hydra. The PEFT components count their own trainable
parameters with the helpers here (``Peft.trainable_params`` in ``components/peft/``). A vision-language
model (a config with ``vision_config``) is its decoder (``text_config``) plus a :class:`VisionArch`: the
image encoder and the projector into the decoder, counted exactly per family (tests/unit/test_vlm.py
checks every shipped option against transformers' meta-device model).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

#: a vision-language model's family -> the architecture its decoder is (for the rules below)
VLM_TEXT_TYPES = {
    "idefics3": "llama",
    "smolvlm": "llama",
    "llava": "llama",
    "gemma3": "gemma3",
    "qwen2_5_vl": "qwen2",
    "qwen3_vl": "qwen3",
}
#: families whose vision tower is not modelled -> their decoder's architecture (estimated alone, said so)
VLM_DECODER_ONLY = {"qwen2_vl": "qwen2"}


@dataclass(frozen=True)
class VisionArch:
    """A vision-language model's image encoder and projector: the numbers memory depends on."""

    family: str  # the VLM's model_type
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    patch_size: int
    image_size: int  # the tower's input side (Qwen's dynamic resolution: 448, the default assumed)
    merge: int  # patches per image token in the decoder (pixel shuffle / spatial merge squared)
    tower: int  # parameters of the encoder
    projector: int  # parameters of what maps its features into the decoder

    @property
    def params(self) -> int:
        return self.tower + self.projector

    @property
    def default_image_tokens(self) -> int:
        """Decoder tokens of one image of ``image_size`` (Gemma 3 pools to 256 whatever the tower sees)."""
        if self.family == "gemma3":
            return 256
        return (self.image_size // self.patch_size) ** 2 // self.merge

    @classmethod
    def from_dict(
        cls, family: str, v: Mapping[str, Any], top: Mapping[str, Any], text_hidden: int
    ) -> VisionArch:
        """From a VLM config's ``vision_config`` (``v``) and top-level keys, counted as transformers 5
        builds each family; a family not modelled is a ValueError."""
        if family not in VLM_TEXT_TYPES:
            raise ValueError(f"the vision tower of {family} is not modelled")
        qwen = family.startswith("qwen")
        h = int(v.get("hidden_size") or v.get("embed_dim"))
        i = int(v["intermediate_size"])
        layers = int(v.get("depth") or v.get("num_hidden_layers"))
        heads = int(v.get("num_heads") or v.get("num_attention_heads"))
        p, c = int(v.get("patch_size", 14)), int(v.get("in_channels") or v.get("num_channels") or 3)
        size = 448 if qwen else int(v.get("image_size", 224))
        patches = (size // p) ** 2
        attention = 4 * (h * h + h)  # q, k, v, o (Qwen: one fused qkv), all with biases
        if family == "qwen2_5_vl":  # RMSNorms, a gated MLP with biases, Conv3d patches without bias
            m = int(v.get("spatial_merge_size", 2))
            t = int(v.get("temporal_patch_size", 2))
            layer = 2 * h + attention + 2 * (h * i + i) + i * h + h
            tower = c * t * p * p * h + layers * layer
            wide, out = h * m * m, int(v.get("out_hidden_size", text_hidden))
            projector = h + wide * wide + wide + wide * out + out  # merger: ln_q + 2-layer MLP
            return cls(family, h, i, layers, heads, p, size, m * m, tower, projector)
        layer = 4 * h + attention + h * i + i + i * h + h  # two LayerNorms, fc1, fc2
        if family == "qwen3_vl":  # Conv3d with bias, learned positions, DeepStack mergers
            m = int(v.get("spatial_merge_size", 2))
            t = int(v.get("temporal_patch_size", 2))
            tower = c * t * p * p * h + h + int(v.get("num_position_embeddings", 2304)) * h + layers * layer
            wide, out = h * m * m, int(v.get("out_hidden_size", text_hidden))
            merger = wide * wide + wide + wide * out + out
            deepstack = len(v.get("deepstack_visual_indexes") or [])
            projector = (2 * h + merger) + deepstack * (2 * wide + merger)  # LayerNorm before / after shuffle
            return cls(family, h, i, layers, heads, p, size, m * m, tower, projector)
        if family == "llava":  # CLIP: class token, pre- and post-LayerNorm, patch conv without bias
            tower = h + c * p * p * h + (patches + 1) * h + 4 * h + layers * layer
            heads_in = (
                h * len(top["vision_feature_layer"])
                if isinstance(top.get("vision_feature_layer"), list)
                else h
            )
            bias = bool(top.get("multimodal_projector_bias", True))
            projector = heads_in * text_hidden + text_hidden * text_hidden + (2 * text_hidden if bias else 0)
            return cls(family, h, i, layers, heads, p, size, 1, tower, projector)
        # SigLIP (Idefics3 / SmolVLM, Gemma 3): patch conv with bias, learned positions, post-LayerNorm
        tower = c * p * p * h + h + patches * h + layers * layer + 2 * h
        if family == "gemma3" and v.get("vision_use_head", True):  # SigLIP's attention-pooling head
            tower += h + 4 * h * h + 4 * h + 2 * h + h * i + i + i * h + h
        if family == "gemma3":  # RMSNorm + projection matrix (no bias); 256 pooled tokens per image
            return cls(family, h, i, layers, heads, p, size, patches // 256, tower, h + h * text_hidden)
        scale = int(top.get("scale_factor", 2))
        projector = h * scale * scale * text_hidden  # the connector's one linear, no bias
        return cls(family, h, i, layers, heads, p, size, scale * scale, tower, projector)


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
    qk_norm: int = 0  # parameters of a layer's q/k norms (Qwen3, OLMoE)
    sinks: int = 0  # a layer's attention-sink logits (gpt-oss: one per head)
    # a mixture of experts (every decoder layer's MLP; 0 experts: a dense model)
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    expert_bias: bool = False  # gpt-oss: biases on the experts and the router
    vision: VisionArch | None = None  # a vision-language model's image encoder and projector
    #: what the estimate does not model of this model, said in plan and estimate (it goes on without)
    unmodelled: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Arch:
        """From config.json-style keys, with each model type's transformers defaults; a vision-language
        model's (a ``vision_config``): its decoder (``text_config``, over legacy top-level keys) + vision.
        What is not modelled (a VLM family's tower, a mixture's dense layers) is named in ``unmodelled``."""
        if d.get("vision_config") is not None:
            family = str(d.get("model_type", ""))
            skip = ("vision_config", "text_config", "model_type")
            text = {k: v for k, v in d.items() if k not in skip}
            text.update(d.get("text_config") or {})
            decoder_type = VLM_TEXT_TYPES.get(family) or VLM_DECODER_ONLY.get(family)
            text["model_type"] = decoder_type or str(text.get("model_type") or "llama")
            decoder = cls.from_dict(text)
            if family not in VLM_TEXT_TYPES:
                note = (
                    f"the vision tower and projector of the vision-language model type {family!r} are not "
                    f"modelled: the estimate counts its decoder ({text['model_type']}) alone"
                )
                return replace(decoder, unmodelled=(*decoder.unmodelled, note))
            vision = VisionArch.from_dict(family, d["vision_config"], d, decoder.hidden_size)
            return replace(decoder, vision=vision)
        model_type = str(d.get("model_type", "llama"))
        h = int(d["hidden_size"])
        heads = int(d["num_attention_heads"])
        head_dim = d.get("head_dim") or h // heads
        attention_bias = bool(d.get("attention_bias", model_type == "gpt_oss"))
        experts = int(d.get("num_experts") or d.get("num_local_experts") or 0)
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
            qk_norm=_qk_norm(model_type, int(head_dim), heads, int(d.get("num_key_value_heads") or heads)),
            sinks=heads if model_type == "gpt_oss" else 0,
            num_experts=experts,
            experts_per_token=int(d.get("num_experts_per_tok") or d.get("experts_per_token") or 0),
            expert_intermediate_size=int(d.get("moe_intermediate_size") or d["intermediate_size"]),
            expert_bias=model_type == "gpt_oss",
            unmodelled=_dense_between(d, experts),
        )

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def mlp_width(self) -> int:
        """The MLP's inner width one token goes through: the dense MLP's, or its experts' together."""
        return (
            self.experts_per_token * self.expert_intermediate_size if self.is_moe else self.intermediate_size
        )

    def linears(self) -> dict[str, tuple[int, int, bool]]:
        """One decoder layer's ``nn.Linear`` modules: qualified name -> (in features, out features, has bias).
        A mixture of experts keeps its router and experts as plain parameters (transformers' fused
        ``experts.gate_up_proj`` / ``down_proj``): :meth:`expert_params`, not here."""
        h, i = self.hidden_size, self.intermediate_size
        attention = {
            "self_attn.q_proj": (h, self.q_dim, self.qkv_bias),
            "self_attn.k_proj": (h, self.kv_dim, self.qkv_bias),
            "self_attn.v_proj": (h, self.kv_dim, self.qkv_bias),
            "self_attn.o_proj": (self.q_dim, h, self.o_bias),
        }
        if self.is_moe:
            return attention
        return {
            **attention,
            "mlp.gate_proj": (h, i, self.mlp_bias),
            "mlp.up_proj": (h, i, self.mlp_bias),
            "mlp.down_proj": (i, h, self.mlp_bias),
        }

    def expert_params(self, experts: int | None = None) -> int:
        """Parameters of ``experts`` experts of one layer (all: None): gate, up, down (gpt-oss: biases)."""
        n = self.num_experts if experts is None else experts
        h, i = self.hidden_size, self.expert_intermediate_size
        return n * (3 * h * i + ((2 * i + h) if self.expert_bias else 0))

    @property
    def fused_expert_param(self) -> int:
        """Elements of a layer's largest expert parameter, ``experts.gate_up_proj`` (0 when dense)."""
        return self.num_experts * 2 * self.expert_intermediate_size * self.hidden_size

    @property
    def router_params(self) -> int:
        return self.num_experts * (self.hidden_size + (1 if self.expert_bias else 0))


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
    layer_experts: int = 0  # of ``layer``: every expert of a mixture (router not included)
    layer_active_experts: int = 0  # of those: the ones a token goes through
    vision: int = 0  # a vision-language model's image encoder + projector (held with the embedding)

    @property
    def layers(self) -> int:
        return self.layer * self.num_layers

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.final_norm + self.lm_head + self.vision

    @property
    def active(self) -> int:
        """Parameters one token goes through (a mixture's experts per token; = ``total`` when dense)."""
        return self.total - self.num_layers * (self.layer_experts - self.layer_active_experts)

    @property
    def linear(self) -> int:
        """Weights of the decoder's linear layers (what bitsandbytes quantizes; lm_head stays)."""
        return self.layer_linear * self.num_layers


def param_counts(arch: Arch) -> ParamCounts:
    """Exact parameter counts of a Llama / Qwen2 / Mistral / Gemma2-style model."""
    lin = arch.linears()
    weights = sum(i * o for i, o, _ in lin.values())
    biases = sum(o for _, o, b in lin.values() if b)
    norms = arch.norms_per_layer * arch.hidden_size + arch.qk_norm + arch.sinks
    embedding = arch.vocab_size * arch.hidden_size
    experts = arch.expert_params() if arch.is_moe else 0
    return ParamCounts(
        embedding=embedding,
        layer=weights + biases + norms + experts + (arch.router_params if arch.is_moe else 0),
        layer_linear=weights,
        layer_bias=biases,
        num_layers=arch.num_layers,
        final_norm=arch.hidden_size,
        lm_head=0 if arch.tie_word_embeddings else embedding,
        layer_experts=experts,
        layer_active_experts=arch.expert_params(arch.experts_per_token) if arch.is_moe else 0,
        vision=arch.vision.params if arch.vision else 0,
    )


def _dense_between(d: Mapping[str, Any], experts: int) -> tuple[str, ...]:
    """The note on a mixture with dense MLP layers between its sparse ones (Qwen-MoE's ``mlp_only_layers``,
    ``decoder_sparse_step`` > 1): the estimate counts every layer as a mixture layer."""
    step = int(d.get("decoder_sparse_step") or 1)
    only = list(d.get("mlp_only_layers") or [])
    if not experts or (not only and step == 1):
        return ()
    layers = int(d["num_hidden_layers"])
    dense = sorted({*only, *(i for i in range(layers) if step > 1 and (i + 1) % step)})
    return (
        f"{len(dense)} of the {layers} layers are dense MLPs between the mixture's (mlp_only_layers="
        f"{only}, decoder_sparse_step={step}): not modelled, the estimate counts every layer as a mixture "
        f"layer of {experts} experts",
    )


def _qk_norm(model_type: str, head_dim: int, heads: int, kv_heads: int) -> int:
    """Parameters of one layer's q/k norms: per head (Qwen3, Gemma3) or over the projections (OLMoE)."""
    if model_type in ("qwen3", "qwen3_moe", "gemma3"):
        return 2 * head_dim
    if model_type == "olmoe":
        return (heads + kv_heads) * head_dim
    return 0


def largest_param(arch: Arch) -> int:
    """Elements of the largest single parameter (the embedding or lm_head, else an MLP matrix): the size of
    DeepSpeed's per-parameter offload buffers and of ZeRO-3's largest gathered module."""
    lin = arch.linears().values()
    fused = arch.fused_expert_param
    return max(arch.vocab_size * arch.hidden_size, fused, *(i * o + (o if b else 0) for i, o, b in lin))


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


def expert_lora_params(arch: Arch, r: int, target_modules: Any, target_parameters: Iterable[str]) -> int:
    """One layer's LoRA parameters on a mixture's router and fused expert weights, as peft 0.21 places
    them: ``all-linear`` reaches the router (r x (h + experts)) and every expert (``gate_up_proj`` as two
    r·experts adapters, ``down_proj`` one); otherwise each parameter named in ``target_parameters`` (experts x
    out x in) gets ``lora_A`` (r·experts x in) and ``lora_B`` (out x r·experts), and a router named in
    ``target_modules`` (``gate`` / ``router``) its own adapter."""
    if not arch.is_moe:
        return 0
    h, i, e = arch.hidden_size, arch.expert_intermediate_size, arch.num_experts
    router = r * (h + e)
    if target_modules in (None, "all-linear"):
        return router + 2 * r * e * (h + 2 * i) + r * e * (i + h)
    sizes = {"gate_up_proj": h + 2 * i, "down_proj": i + h, "gate_proj": h + i, "up_proj": h + i}
    names = [target_modules] if isinstance(target_modules, str) else list(target_modules or [])
    routed = router if any(n in ("gate", "router") for n in names) else 0
    return routed + sum(r * e * sizes.get(name.rsplit(".", 1)[-1], 0) for name in target_parameters)


def lora_inputs(arch: Arch, target_modules: Any = "all-linear") -> int:
    """Input features summed over one layer's LoRA-targeted linears (what lora_A keeps for backward)."""
    return sum(i for i, _ in targeted_linears(arch, target_modules)[0])
