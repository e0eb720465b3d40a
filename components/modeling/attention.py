"""``varlen_sdpa``: boundary-safe attention for padding-free / packed rows, plain SDPA otherwise.

Registered with transformers' ``AttentionInterface`` (the attention call) and ``AttentionMaskInterface``
(the mask builder), so ``attn_implementation="varlen_sdpa"`` works for every model that dispatches
through them (Llama, Qwen2, Mistral, ...):

* **Packed rows** (several documents in one row, told apart by ``position_ids`` restarting, as TRL's
  padding-free collator and BFD packing produce): exact causal attention inside each document, none
  across documents, and no dense ``[N, N]`` block mask (the mask builder returns ``None``). CUDA:
  ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention on ``cu_seqlens``), else
  ``flash_attn_varlen_func`` if installed; elsewhere (CPU, fp32, dropout) the documents are regrouped
  into a right-padded ``[docs, max_len]`` batch and run through SDPA with ``is_causal`` (padding at
  the end of a causal row is never seen by the real queries, so no mask is needed).
* **Ordinary rows** (one document per row, with or without a padding mask): exactly transformers'
  ``sdpa`` path, same mask, same call.

Sliding-window and soft-capped attention are not supported: ``fallback_for`` names the implementation
to use instead (``model.attn_implementation=auto`` falls back on its own, saying why once).
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref
from dataclasses import dataclass
from typing import Any

import torch

NAME = "varlen_sdpa"
#: attention-call keyword arguments that change the maths in a way this function does not implement
UNSUPPORTED_KWARGS = ("sliding_window", "softcap", "s_aux", "position_bias")

log = logging.getLogger("hydratune")


# ---- what a model needs --------------------------------------------------------------------------------
def fallback_for(config: Any) -> tuple[str, str] | None:
    """``(implementation, reason)`` when ``config``'s attention needs features ``varlen_sdpa`` lacks,
    else ``None``. Soft-capping needs ``eager`` (SDPA cannot do it either); sliding windows ``sdpa``."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "attn_logit_softcapping", None) is not None:
        return "eager", f"{text.model_type} soft-caps attention logits"
    layer_types = getattr(text, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        kinds = sorted({t for t in layer_types if t != "full_attention"})
        return "sdpa", f"{text.model_type} has {', '.join(kinds)} layers"
    window = getattr(text, "sliding_window", None)
    if window is not None and not layer_types and getattr(text, "use_sliding_window", True):
        return "sdpa", f"{text.model_type} uses sliding-window attention ({window} tokens)"
    return None


@functools.cache
def _say_once(message: str) -> None:
    log.warning(message)


def resolve(requested: str, config: Any) -> str:
    """The implementation to build with: ``auto`` is ``varlen_sdpa`` unless the model needs something
    it lacks (then the fallback, said once); anything else is returned as is."""
    if requested != "auto":
        return requested
    fallback = fallback_for(config)
    if fallback is None:
        register()
        return NAME
    impl, reason = fallback
    _say_once(f"model.attn_implementation=auto: {reason}, which {NAME} cannot do; using {impl}")
    return impl


# ---- registration ----------------------------------------------------------------------------------------
def register() -> None:
    """Register the attention function and its mask builder with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, varlen_sdpa_forward)
    AttentionMaskInterface.register(NAME, varlen_mask)


def varlen_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    use_vmap: bool = False,
    **kwargs: Any,
) -> torch.Tensor | None:
    """No mask when the pattern is causal (plain or packed; the attention call reads ``position_ids``);
    otherwise (padding, a cache offset, a custom mask function) exactly what ``sdpa`` gets."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    no_padding = attention_mask is None or (
        attention_mask.shape[-1] == kv_length and bool(attention_mask.all())
    )
    plain = isinstance(q_offset, int) and isinstance(kv_offset, int) and q_offset == kv_offset == 0
    if no_padding and plain and not use_vmap and q_length == kv_length:
        return None
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function or causal_mask_function,
        attention_mask=attention_mask,
        use_vmap=use_vmap,
        **kwargs,
    )


# ---- documents of a packed batch -------------------------------------------------------------------------
@dataclass
class Documents:
    """The documents of a flattened ``[B * L]`` batch: boundaries and the longest one."""

    cu_seqlens: torch.Tensor  # int32 [docs + 1], document starts and the total
    max_len: int
    rows: int  # rows of the batch (as many documents as rows: nothing is packed)

    @property
    def packed(self) -> bool:
        return self.cu_seqlens.numel() - 1 > self.rows

    @functools.cached_property
    def lengths(self) -> list[int]:
        return self.cu_seqlens.diff().tolist()

    @property
    def padded_work_ratio(self) -> float:
        """Attention work of the regrouped padded batch over that of one call per document."""
        return len(self.lengths) * self.max_len**2 / sum(n * n for n in self.lengths)

    @functools.cached_property
    def regroup(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(``index`` [docs, max_len] into the flat tokens (padding points at token 0), ``valid`` mask)."""
        cu = self.cu_seqlens.long()
        offsets = torch.arange(self.max_len, device=cu.device)
        valid = offsets[None, :] < cu.diff()[:, None]
        index = torch.where(valid, cu[:-1, None] + offsets[None, :], 0)
        return index, valid


def documents_from_positions(position_ids: torch.Tensor, batch_size: int) -> Documents:
    """A new document wherever positions do not continue (+1) and at every row start."""
    pos = position_ids.expand(batch_size, -1)
    step = torch.diff(pos, dim=-1) != 1
    starts = torch.cat([torch.ones_like(pos[:, :1], dtype=torch.bool), step], dim=-1).flatten()
    begin = starts.nonzero().flatten()
    end = torch.tensor([starts.numel()], device=begin.device)
    cu = torch.cat([begin, end]).to(torch.int32)
    return Documents(cu, int(cu.diff().max()), batch_size)


_cache: dict[str, Any] = {"key": None, "docs": None}


@torch.compiler.disable  # data-dependent (host sync, per-forward cache): runs eagerly under torch.compile
def documents(kwargs: dict[str, Any], batch_size: int, length: int) -> Documents | None:
    """The batch's documents, from TRL's ``cu_seq_lens_q`` / ``max_length_q`` (padding-free collator) or
    from ``position_ids``; worked out once per forward pass and reused by every layer. ``None`` without
    either."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None or batch_size != 1 or cu.numel() < 2:
        cu = None
    source = cu if cu is not None else kwargs.get("position_ids")
    if source is None:
        return None
    ref = _cache["key"]
    if ref is not None and ref[0]() is source and ref[1:] == (source._version, batch_size, length):
        return _cache["docs"]
    if cu is not None and int(cu[-1]) == length:
        docs = Documents(cu.to(torch.int32), int(kwargs.get("max_length_q") or cu.diff().max()), 1)
    elif kwargs.get("position_ids") is not None:
        source = kwargs["position_ids"]
        docs = documents_from_positions(source, batch_size)
    else:
        return None
    _cache["key"], _cache["docs"] = (weakref.ref(source), source._version, batch_size, length), docs
    return docs


# ---- kernels ----------------------------------------------------------------------------------------------
@functools.cache
def _varlen_attn() -> Any:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.cache
def _varlen_takes_gqa() -> bool:
    fn = _varlen_attn()
    return fn is not None and "enable_gqa" in inspect.signature(fn).parameters


@functools.cache
def _flash_attn_varlen() -> Any:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


#: CPU: one SDPA call per document only when regrouping would at least double the attention work
#: (measured: the loop wins on long-tailed lengths, loses to the regroup on the demo's similar lengths
#: with 2 threads) and the documents are not so many that the calls cost more than they save
LOOP_MIN_WORK_RATIO = 2.0
LOOP_MAX_DOCS = 256


def select_backend(
    device_type: str,
    dtype: torch.dtype,
    dropout: float,
    head_dim: int,
    num_docs: int,
    *,
    has_varlen: bool,
    has_flash_attn: bool,
    capability: tuple[int, int] = (0, 0),
    work_ratio: float = 1.0,
) -> str:
    """Which kernel runs packed attention: ``varlen_attn`` (torch's FlashAttention on cu_seqlens: CUDA,
    sm80+, fp16/bf16, no dropout, head dim <= 256 and a multiple of 8), else ``flash_attn`` (the
    flash-attn package), else SDPA: one causal call per document on CPU when regrouping would waste at
    least half the attention work (``sdpa_loop``, ``work_ratio`` = padded / per-document work), else
    the documents regrouped into one right-padded causal batch (``sdpa_regroup``)."""
    half = dtype in (torch.float16, torch.bfloat16)
    if device_type == "cuda" and half and head_dim <= 256 and head_dim % 8 == 0:
        if has_varlen and dropout == 0.0 and capability >= (8, 0):
            return "varlen_attn"
        if has_flash_attn:
            return "flash_attn"
    if device_type == "cpu" and num_docs <= LOOP_MAX_DOCS and work_ratio >= LOOP_MIN_WORK_RATIO:
        return "sdpa_loop"
    return "sdpa_regroup"


def _packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    docs: Documents,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """Causal attention per document of ``[B, H, L, D]`` tensors; returns ``[B, L, H, D]``."""
    b, h, length, d = query.shape
    h_kv = key.shape[1]
    device = query.device
    if device.type == "cuda" and query.dtype == torch.float32 and torch.is_autocast_enabled(device.type):
        # fp32 master weights + autocast: RoPE promotes q/k to fp32; SDPA would autocast them back down
        low = torch.get_autocast_dtype(device.type)
        query, key, value = (t.to(low) for t in (query, key, value))
    backend = select_backend(
        device.type,
        query.dtype,
        dropout,
        d,
        docs.cu_seqlens.numel() - 1,
        has_varlen=_varlen_attn() is not None,
        has_flash_attn=_flash_attn_varlen() is not None,
        capability=_cuda_capability(device.index or 0) if device.type == "cuda" else (0, 0),
        work_ratio=docs.padded_work_ratio if device.type == "cpu" else 1.0,  # host lengths: free on CPU
    )
    if backend in ("sdpa_loop", "sdpa_regroup"):
        return _sdpa_documents(query, key, value, docs, dropout, scaling, backend)
    q, k, v = (t.transpose(1, 2).reshape(b * length, t.shape[1], d) for t in (query, key, value))
    cu, max_len = docs.cu_seqlens.to(device), docs.max_len
    if backend == "varlen_attn":
        extra: dict[str, Any] = {}
        if h_kv != h:
            if _varlen_takes_gqa():
                extra["enable_gqa"] = True
            else:
                k, v = (t.repeat_interleave(h // h_kv, dim=1) for t in (k, v))
        out = _varlen_attn()(q, k, v, cu, cu, max_len, max_len, scale=scaling, window_size=(-1, 0), **extra)
    elif backend == "flash_attn":
        out = _flash_attn_varlen()(
            q, k, v, cu, cu, max_len, max_len, dropout_p=dropout, softmax_scale=scaling, causal=True
        )
    return out.reshape(b, length, h, d)


@torch.compiler.disable  # a Python loop over the documents: eager under torch.compile
def _sdpa_documents(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    docs: Documents,
    dropout: float,
    scaling: float | None,
    backend: str,
) -> torch.Tensor:
    """SDPA per document: one causal call each (``sdpa_loop``) or one call on the documents regrouped
    into a right-padded batch (``sdpa_regroup``). ``[B, H, L, D]`` in, ``[B, L, H, D]`` out."""
    b, h, length, d = query.shape
    h_kv = key.shape[1]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if backend == "sdpa_loop":  # slices of [1, H, B * L, D] (a view when B == 1)
        flat = [t.transpose(0, 1).reshape(1, t.shape[1], b * length, d) for t in (query, key, value)]
        if h_kv != h:
            flat[1:] = [t.repeat_interleave(h // h_kv, dim=1) for t in flat[1:]]
        parts = zip(*(t.split(docs.lengths, dim=2) for t in flat), strict=True)
        per_doc = [sdpa(*qkv, dropout_p=dropout, scale=scaling, is_causal=True) for qkv in parts]
        return torch.cat(per_doc, dim=2).reshape(h, b, length, d).permute(1, 2, 0, 3)
    q, k, v = (t.transpose(1, 2).reshape(b * length, t.shape[1], d) for t in (query, key, value))
    if h_kv != h:
        k, v = (t.repeat_interleave(h // h_kv, dim=1) for t in (k, v))
    index, valid = docs.regroup
    if index.device != query.device:
        index, valid = index.to(query.device), valid.to(query.device)
    qd, kd, vd = (t[index].transpose(1, 2) for t in (q, k, v))  # [docs, H, max_len, D]
    od = sdpa(qd, kd, vd, dropout_p=dropout, scale=scaling, is_causal=True)
    return od.transpose(1, 2)[valid].reshape(b, length, h, d)  # tokens in document (= token) order


def varlen_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: per-document causal attention on packed rows, ``sdpa`` otherwise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    used = [name for name in UNSUPPORTED_KWARGS if kwargs.get(name) is not None]
    if used:
        raise NotImplementedError(
            f"{NAME} does not implement {', '.join(used)}; build the model with "
            "model.attn_implementation=auto (it falls back) or sdpa / eager"
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    b, _, length, _ = query.shape
    if attention_mask is None and causal and length == key.shape[2] and length > 1:
        docs = documents(kwargs, b, length)
        if docs is not None and docs.packed:
            out = _packed_attention(query, key, value, docs, dropout, scaling)
            return out, None
    return sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )
