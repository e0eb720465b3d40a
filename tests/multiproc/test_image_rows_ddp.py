"""SFT on image rows with strategy=ddp, zero2 and zero3 on 2 CPU ranks (gloo) equals one process training
the same global batch (docs/vlm.md, "Training on image rows"): each rank's processor collates its own 4 image
rows, the loss is normalised by the tokens of the whole step (transformers'
``average_tokens_across_devices``), so the losses of every step and the final weights match one process's
micro-batch of 8. The 60 rows leave a partial last step of 4 rows: one process trains 4, the ranks those 4
and 4 that accelerate repeats from the epoch's start, masked out of the loss (runtime/trainer_hooks.py
RepeatedRowsOutOfTheLoss; without it all three layouts fail here). SGD without clipping: a gradient off by
any factor (a rank's rows counted twice, the tokens averaged per rank) shows. Every run starts from the same
saved weights (ZeRO-3's ``zero.Init`` draws another random init than a plain build: docs/nd_parallel.md), so
ZeRO-3 loads them partitioned through ``from_pretrained``. Forked from the tier's warm server, its workers
forked from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.learning.test_image_rows_learn import colour_rows
from tests.support.cells import FORK

STEPS = 8
COMMON = [
    "model=tiny_vlm",
    "data.eval_fraction=0",  # 60 train rows: 7 whole steps of 8, then one of 4 (DDP: completed, masked)
    f"train.max_steps={STEPS}",
    "train.eval_every=0",
    "train.eval_generations=0",
    "train.log_every=1",
    "train.write_plots=false",
    "train.save_every=0",
    "optimizer=sgd",
    "optimizer.lr=0.05",
    "scheduler=constant",
    "scheduler.warmup_ratio=0",
    "train.max_grad_norm=0",
]
#: measured: the losses agree to 1e-6 (the ranks sum the loss in another order)
LOSS_TOL, WEIGHT_TOL = 1e-5, 1e-5


def losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    return [r["loss"] for r in rows if "loss" in r and "step" in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, warm) -> dict[str, Path]:
    """One process (micro-batch 8), DDP, ZeRO-2 and ZeRO-3 on 2 ranks (micro-batch 4 each), the same 60 rows
    and the same saved weights."""
    root = tmp_path_factory.mktemp("image_ranks")
    data = colour_rows(root, "train", 60, 0)
    base = saved_tiny_vlm(root / "base")
    two = ["train.micro_batch_size=4", "launcher.nproc_per_node=2", FORK]
    layouts = {
        "one": ["train.micro_batch_size=8"],
        "ddp": [*two, "strategy=ddp"],
        "zero2": [*two, "strategy=zero2"],
        "zero3": [*two, "strategy=zero3"],
    }
    for name, layout in layouts.items():
        proc = warm(
            *COMMON,
            f"model.name_or_path={base}",
            f"data.path={data}",
            *layout,
            f"hydra.run.dir={name}",
            cwd=root,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: root / name for name in layouts}


@pytest.mark.parametrize("layout", ["ddp", "zero2", "zero3"])
def test_two_ranks_on_image_rows_equal_one_process(runs: dict[str, Path], layout: str) -> None:
    """Measured: DDP, ZeRO-2 and ZeRO-3 each within 9.5e-7 of one process's losses, 1.2e-7 of its weights."""
    one, two = losses(runs["one"]), losses(runs[layout])
    assert len(one) == len(two) == STEPS
    assert max(abs(a - b) for a, b in zip(one, two, strict=True)) < LOSS_TOL, (one, two)
    assert one[-1] < one[0] - 1.0  # it trained
    a = load_file(runs["one"] / "final" / "model.safetensors")
    b = load_file(runs[layout] / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < WEIGHT_TOL
    summary = (runs[layout] / "summary.md").read_text()
    assert "| processes | 2 |" in summary and "image tokens trained | 0 |" in summary
    assert "60 train rows do not fill whole batches of 4 on 2 ranks" in summary
    assert "first rows (even_batches), masked out of the loss" in summary
    assert ("ZeRO-2" in summary) == (layout == "zero2") and ("ZeRO-3" in summary) == (layout == "zero3")


def saved_tiny_vlm(out: Path) -> Path:
    """model=tiny_vlm's bundled dir (config, processor, tokenizer) with random weights saved beside them."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from hydratune.components.config.resolvers import asset

    shutil.copytree(asset("tiny_vlm"), out)
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(out)).save_pretrained(out)
    return out
