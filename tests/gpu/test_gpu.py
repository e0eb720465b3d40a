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
    row = nd_parallel.check(layout, 2e-2, tmp_path)
    assert row["status"] == "ok", row
