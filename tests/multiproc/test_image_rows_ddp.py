"""SFT on image rows with strategy=ddp on 2 CPU ranks (gloo) equals one process training the same global
batch (docs/vlm.md, "Training on image rows"): each rank's processor collates its own 4 image rows, the
loss is normalised by the tokens of the whole step (transformers' ``average_tokens_across_devices``), so
the losses of every step and the final weights match one process's micro-batch of 8. SGD without
clipping: a gradient off by any factor (a rank's rows counted twice, the tokens averaged per rank) shows.
Forked from the tier's warm server, its workers forked from it."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from tests.learning.test_image_rows_learn import colour_rows
from tests.support.cells import FORK

STEPS = 8
COMMON = [
    "model=tiny_vlm",
    "data.eval_fraction=0",  # 64 train rows: 8 whole steps of 8 (a partial last batch is completed by DDP)
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


def test_ddp_on_image_rows_equals_one_process(tmp_path: Path, warm) -> None:
    data = colour_rows(tmp_path, "train", 64, 0)
    runs = {}
    for name, layout in (
        ("one", ["train.micro_batch_size=8"]),
        ("two", ["train.micro_batch_size=4", "strategy=ddp", "launcher.nproc_per_node=2", FORK]),
    ):
        proc = warm(*COMMON, f"data.path={data}", *layout, f"hydra.run.dir={name}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = tmp_path / name
    one, two = losses(runs["one"]), losses(runs["two"])
    assert len(one) == len(two) == STEPS
    assert max(abs(a - b) for a, b in zip(one, two, strict=True)) < LOSS_TOL, (one, two)
    assert one[-1] < one[0] - 1.0  # it trained
    a = load_file(runs["one"] / "final" / "model.safetensors")
    b = load_file(runs["two"] / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < WEIGHT_TOL
    summary = (runs["two"] / "summary.md").read_text()
    assert "| processes | 2 |" in summary and "image tokens trained | 0 |" in summary
