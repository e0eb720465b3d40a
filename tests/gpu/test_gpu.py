"""The GPU tier: the scripts of tests/gpu/ as tests. Each skips, saying why, without the GPUs it needs, so CI
(no GPU) reports them skipped; on a GPU machine ``pytest tests/gpu`` runs them. The scripts stay runnable on
their own (``python tests/gpu/strategies.py --out docs/strategies.md`` writes the docs table)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import nd_parallel, strategies


def cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(cuda_devices() < 1, reason=f"needs a CUDA GPU, found {cuda_devices()}")
@pytest.mark.parametrize("name", ["zero3 bf16", "fsdp bf16"])
def test_a_sharded_strategy_trains_on_one_gpu(name: str, tmp_path) -> None:
    """ZeRO-3 and FSDP2 on one GPU (paths the CPU tiers cannot run): the loss falls over 10 steps and the
    live strategy is the one asked for."""
    (overrides,) = [o for n, o, _ in strategies.MATRIX if n == name]
    run = tmp_path / "run"
    rc, _, tail = strategies.hydratune([*strategies.COMMON, *overrides, "train.max_steps=10"], run)
    assert rc == 0, tail
    row = strategies.summarise(run)
    assert row["falls"], row
    want = "ZeRO stage 3" if name.startswith("zero3") else "FSDP"
    assert want in row["live"], row


@pytest.mark.skipif(cuda_devices() < 2, reason=f"needs 2 CUDA GPUs, found {cuda_devices()}")
@pytest.mark.parametrize("layout", list(nd_parallel.LAYOUTS))
def test_a_split_layout_trains_like_one_gpu(layout: str, tmp_path) -> None:
    needs = nd_parallel.GPUS.get(layout, 2)
    if cuda_devices() < needs:
        pytest.skip(f"needs {needs} CUDA GPUs, found {cuda_devices()}")
    row = nd_parallel.check(layout, 2e-2, tmp_path)
    assert row["status"] == "ok", row


def packed_against_documents(device: str, dtype: torch.dtype, heads: int = 8, kv_heads: int = 2) -> dict:
    """One packed row of documents (lengths 300, 17, 700, 1) through hydratune's packed attention, and each
    document alone through causal SDPA: outputs and the gradients of q, k, v, and the backend that ran."""
    from hydratune.components.modeling import attention

    torch.manual_seed(0)
    lengths, dim = [300, 17, 700, 1], 64
    total = sum(lengths)
    q = torch.randn(1, heads, total, dim, device=device, dtype=dtype, requires_grad=True)
    k, v = (
        torch.randn(1, kv_heads, total, dim, device=device, dtype=dtype, requires_grad=True) for _ in "kv"
    )
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    docs = attention.documents_from_positions(positions, 1)
    ran: list[str] = []
    real = attention.select_backend
    attention.select_backend = lambda *a, **kw: ran.append(real(*a, **kw)) or ran[-1]
    try:
        packed = attention._packed_attention(q, k, v, docs, 0.0, None)  # [B, L, H, D]
    finally:
        attention.select_backend = real
    packed.float().square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    outs, start = [], 0
    for n in lengths:
        part = [t[:, :, start : start + n] for t in (q, k, v)]
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(
                *part, is_causal=True, enable_gqa=True
            ).transpose(1, 2)
        )
        start += n
    alone = torch.cat(outs, dim=1)
    alone.float().square().sum().backward()
    return {
        "backend": ran[-1],
        "packed": packed,
        "alone": alone,
        "grads": grads,
        "ref": [t.grad for t in (q, k, v)],
    }


@pytest.mark.skipif(cuda_devices() < 1, reason=f"needs a CUDA GPU, found {cuda_devices()}")
def test_the_real_varlen_kernel_equals_sdpa_per_document() -> None:
    """On an sm80+ GPU in bf16, packed rows run torch's varlen_attn (FlashAttention on cu_seqlens) with the
    documents' boundaries: the same outputs and q/k/v gradients as causal SDPA on each document alone
    (GQA: 8 query heads, 2 key/value heads)."""
    from hydratune.components.modeling import attention

    if attention._varlen_attn() is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn")
    if torch.cuda.get_device_capability(0) < (8, 0):
        pytest.skip(
            f"varlen_attn needs sm80+, found sm{''.join(map(str, torch.cuda.get_device_capability(0)))}"
        )
    got = packed_against_documents("cuda", torch.bfloat16)
    assert got["backend"] == "varlen_attn"
    torch.testing.assert_close(got["packed"], got["alone"], rtol=2e-2, atol=2e-2)
    for mine, ref in zip(got["grads"], got["ref"], strict=True):
        torch.testing.assert_close(mine, ref, rtol=5e-2, atol=5e-2)
