"""Tensor parallel (DeepSpeed AutoTP) and sequence parallel (DeepSpeed Ulysses), each with ZeRO-1, on 2 CPU
ranks over gloo, against one process training the same global batch (micro-batch 36: both layouts have one
data-parallel replica; 936 demo rows are 26 whole micro-batches, so no epoch ends in a partial one, which
accelerate completes with the epoch's first rows when it shards over 2 ranks, as SP's loader does).

One layout = two launches of the real CLI: a run stopped by a real SIGTERM to its launcher after step 4, and
a run resumed from that run's step-3 checkpoint to the end. Checked on them: the losses of every step and
the final weights equal the single process's within tolerance (SGD with momentum and no clipping, so a
gradient off by any factor shows; AdamW and clipping would hide one), the steps both runs trained (4 to the
stop) bit-exact, each rank's parameter shapes (TP: half of every projection) or tokens per row (SP: half of
each row) and its process groups as the live check recorded them, the token count, and the greedy answers
to the eval prompts (tensor parallel generates on both ranks at once). Every command is forked from the tier's
warm server and forks its workers (``launcher.start_method=fork``): the signal comes after step 4, long after
each worker set up its own handlers, and the workers' default start is what the signalled runs of
test_reliability.py and test_multinode.py use.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hydratune.components.config.errors import EXIT_INTERRUPTED
from hydratune.components.runtime.checkpoint import checkpoints_in, verify
from tests.support.cells import FORK, forked, records
from tests.support.cli import Warm, finish, wait_for_step

STEPS = 40
#: a gradient off by any factor changes SGD's step (AdamW and clipping are scale-free and would hide it)
SGD = [
    "optimizer=sgd",
    "optimizer.lr=0.05",
    "scheduler=constant",
    "scheduler.warmup_ratio=0",
    "train.max_grad_norm=0",
]
QUIET = ["train.eval_every=0", "train.eval_generations=0", "train.log_every=1", "train.write_plots=false"]
TRAIN = [
    f"train.max_steps={STEPS}",
    "train.micro_batch_size=36",
    "train.save_every=3",
    "train.keep_last=20",
    *QUIET,
    *SGD,
]
FINISH = ["train.eval_generations=4", "train.max_new_tokens=8", "train.save_every=0"]  # the resumed run
LAYOUTS = {
    "tp": ["strategy=zero1", "strategy.tp_size=2", "launcher.nproc_per_node=2"],
    "sp": ["strategy=zero1", "strategy.sp_size=2", "launcher.nproc_per_node=2"],
}
#: |loss - one process's| at any of the 40 steps, and |weight - one process's| at the end (fp32; measured
#: at most 2e-6 and 4e-7: the ranks sum partial matmuls / attention in another order)
LOSS_TOL, WEIGHT_TOL = 1e-4, 1e-5


def by_step(run: Path) -> dict[int, dict]:
    """The training records of ``metrics.jsonl`` by step."""
    return {r["step"]: r for r in records(run) if "loss" in r}


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> Path:
    """One process, micro-batch 36, the same steps, and the eval answers at the end."""
    run = tmp_path_factory.mktemp("single") / "run"
    forked(warm, run, *TRAIN, *FINISH)
    return run


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> dict:
    """The stopped run and the run resumed from its step-3 checkpoint, for one layout."""
    name, root = request.param, tmp_path_factory.mktemp(request.param)
    proc = warm.start(*TRAIN, *LAYOUTS[name], FORK, cwd=root)
    wait_for_step(root, 4, proc, timeout=600)
    proc.send_signal(signal.SIGTERM)
    err = finish(proc, timeout=600)
    (stopped,) = root.glob("outputs/*/*")
    resumed = root / "resumed"
    checkpoint = stopped / "checkpoints" / "checkpoint-3"
    forked(warm, resumed, *TRAIN, *LAYOUTS[name], *FINISH, f"resume={checkpoint}")
    return {"name": name, "code": proc.returncode, "err": err, "stopped": stopped, "resumed": resumed}


def test_a_signal_stops_both_ranks_at_a_checkpoint(layout: dict) -> None:
    assert layout["code"] == EXIT_INTERRUPTED, layout["err"][-3000:]
    stopped = layout["stopped"]
    last = checkpoints_in(stopped)[-1]
    assert verify(last) is None and 4 <= int(last.name.split("-")[1]) < STEPS
    assert "stopped by SIGTERM" in (stopped / "summary.md").read_text()


def test_losses_and_final_weights_equal_one_process(layout: dict, oracle: Path) -> None:
    stopped, resumed, one = by_step(layout["stopped"]), by_step(layout["resumed"]), by_step(oracle)
    first = min(resumed)
    assert first == 4 and json.loads((layout["resumed"] / "result.json").read_text())["run"][
        "resumed from"
    ].endswith("checkpoint-3")
    # the steps both trained: bit-exact (the checkpoint restored weights, momentum, schedule, data order)
    both = [s for s in stopped if s >= first]
    assert both and [resumed[s]["loss"] for s in both] == [stopped[s]["loss"] for s in both]
    curve = {**{s: r for s, r in stopped.items() if s < first}, **resumed}
    assert sorted(curve) == list(range(1, STEPS + 1))
    worst = max(abs(curve[s]["loss"] - one[s]["loss"]) for s in curve)
    assert worst < LOSS_TOL, f"{layout['name']}: |loss - one process| up to {worst:.2e}"
    assert curve[STEPS]["loss"] < curve[1]["loss"] - 1.0  # it learns
    # every rank of a TP group counts the same tokens: counted once, as one process counts them
    assert [curve[s]["num_input_tokens_seen"] for s in (2, STEPS)] == [
        one[s]["num_input_tokens_seen"] for s in (2, STEPS)
    ]
    final, want = (
        load_file(layout["resumed"] / "final" / "model.safetensors"),
        load_file(oracle / "final" / "model.safetensors"),
    )
    assert final.keys() == want.keys()
    for key in want:  # gathered whole (TP), and equal
        assert final[key].shape == want[key].shape, key
        torch.testing.assert_close(final[key], want[key], atol=WEIGHT_TOL, rtol=0, msg=key)


def test_each_rank_held_its_part(layout: dict) -> None:
    """The live check's record of each rank: TP halves every attention / MLP projection along the right
    dimension; SP halves every row's tokens; both made process groups of 2, and one data-parallel replica."""
    run = layout["resumed"]
    ranks = [json.loads((run / f".rank{r}.layout.json").read_text()) for r in (0, 1)]
    for rank, record in enumerate(ranks):
        assert record["rank"] == rank
        if layout["name"] == "tp":
            assert record["process groups"] == {"tp": 2, "sp": 1, "dp": 1}
            shards = record["shards"]
            assert shards["model.layers.0.self_attn.q_proj"] == {"local": [64, 128], "whole": [128, 128]}
            assert shards["model.layers.0.self_attn.k_proj"] == {"local": [32, 128], "whole": [64, 128]}
            assert shards["model.layers.0.self_attn.o_proj"] == {"local": [128, 64], "whole": [128, 128]}
            assert shards["model.layers.0.mlp.down_proj"] == {"local": [128, 192], "whole": [128, 384]}
        else:
            assert record["process groups"] == {"tp": 1, "sp": 2, "dp": 1}
            assert record["attention"] == "Ulysses around varlen_sdpa"
            split = record["sequence split"]
            assert split["tokens per row on this rank"] * 2 == split["tokens per row"] > 2
    result = json.loads((run / "result.json").read_text())
    assert result["run"]["live strategy"] == "DEEPSPEED, ZeRO stage 1, 2 process(es)"
    tp, sp = (2, 1) if layout["name"] == "tp" else (1, 2)
    assert result["run"]["mesh"] == f"dp 1 x tp {tp} x sp {sp} x pp 1 = 2 processes"


def test_the_eval_answers_are_one_process_answers(layout: dict, oracle: Path) -> None:
    """Greedy generation from the trained model: tensor parallel runs it on both ranks at once (its layers
    all-reduce), sequence parallel on rank 0 alone with Ulysses off in eval; the answers are one process's."""
    mine = json.loads((layout["resumed"] / "result.json").read_text())["eval accuracy (exact match)"]
    theirs = json.loads((oracle / "result.json").read_text())["eval accuracy (exact match)"]
    assert isinstance(mine["after"], float) and mine == theirs
    lines = lambda run: (run / "generations.jsonl").read_text().splitlines()  # noqa: E731
    assert lines(layout["resumed"]) == lines(oracle)
