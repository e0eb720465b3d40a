"""Expert parallel (DeepSpeed AutoEP, ``strategy=zero1 strategy.ep_size=2``) on the tiny mixture of experts (8
experts per layer) on 2 CPU ranks over gloo, against the same two ranks without expert parallel (ZeRO-1: the
exact oracle, each rank's micro-batch the same) and one process training the same global batch (micro-batch
32, 2 accumulation steps: the router's load-balancing loss sees other micro-batches, so within a tolerance).

Four launches of the real CLI share the checks: the expert-parallel run stopped by a real SIGTERM after step
4, the run resumed from its step-3 checkpoint to the end (bit for bit the uninterrupted run's), the
uninterrupted run and the ZeRO-1 oracle; plus one process. Checked:
each rank held its half of every layer's experts; the losses and the final weights (every expert gathered
back whole into the model's own parameters) equal ZeRO-1's; a checkpoint's model weights are whole too; the
summary's expert-load table; another ep_size on resume is refused naming both. AdamW without clipping
(DeepSpeed builds the optimizer under expert parallel), 8 steps.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hydratune.components.config.errors import EXIT_INTERRUPTED
from tests.support.cells import FORK, forked, records
from tests.support.cli import Warm, finish, wait_for_step

STEPS = 8
QUIET = ["train.eval_every=0", "train.log_every=1", "train.write_plots=false", "train.eval_generations=0"]
TRAIN = ["model=tiny_moe", f"train.max_steps={STEPS}", "train.max_grad_norm=0", *QUIET]
RANKS = ["strategy=zero1", "launcher.nproc_per_node=2"]
EP = [*RANKS, "strategy.ep_size=2"]
#: ZeRO-1 on the same ranks: measured 6e-8 on the weights (the all-to-all sums in another order)
EXACT = 1e-6
#: one process: its micro-batches are not the ranks' (the load-balancing loss is per forward): measured
#: 2e-3 on a loss and 3.2e-4 on a weight over 20 steps
LOSS_TOL, WEIGHT_TOL = 5e-3, 2e-3


def by_step(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run) if "loss" in r}


def rates(run: Path) -> dict[int, float]:
    return {r["step"]: r["learning_rate"] for r in records(run) if "learning_rate" in r}


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> dict:
    root = tmp_path_factory.mktemp("ep")
    proc = warm.start(*TRAIN, *EP, FORK, "train.save_every=3", "train.keep_last=5", cwd=root)
    wait_for_step(root, 4, proc, timeout=600)
    proc.send_signal(signal.SIGTERM)
    err = finish(proc, timeout=600)
    (stopped,) = root.glob("outputs/*/*")
    checkpoint = stopped / "checkpoints" / "checkpoint-3"
    forked(warm, root / "resumed", *TRAIN, *EP, "train.save_every=0", f"resume={checkpoint}")
    forked(warm, root / "zero1", *TRAIN, *RANKS, "train.save_every=0")
    forked(warm, root / "ep", *TRAIN, *EP, "train.save_every=0")  # uninterrupted
    one = ["train.micro_batch_size=32", "train.gradient_accumulation_steps=2", "train.save_every=0"]
    forked(warm, root / "one", *TRAIN, *one)
    named = {name: root / name for name in ("resumed", "zero1", "one", "ep")}
    return {"code": proc.returncode, "err": err, "stopped": stopped, "checkpoint": checkpoint, **named}


def test_each_rank_holds_half_the_experts(runs: dict) -> None:
    assert runs["code"] == EXIT_INTERRUPTED, runs["err"][-3000:]
    for rank, held in ((0, "[0, 1, 2, 3]"), (1, "[4, 5, 6, 7]")):
        record = json.loads((runs["resumed"] / f".rank{rank}.layout.json").read_text())["experts"]
        assert record["blocks split"] == 2 and record["expert parallel group"] == 2
        assert record["model.layers.0.mlp experts held"] == f"{held} of 8 ((4, 32, 64) w1)"
    result = json.loads((runs["resumed"] / "result.json").read_text())
    assert "experts split over ep 2" in result["run"]["mesh"]


def test_losses_and_weights_equal_the_same_ranks_without_expert_parallel(runs: dict) -> None:
    stopped, resumed, zero1 = by_step(runs["stopped"]), by_step(runs["resumed"]), by_step(runs["zero1"])
    curve = {**{s: v for s, v in stopped.items() if s < 4}, **resumed}
    assert sorted(curve) == list(range(1, STEPS + 1)) and min(resumed) == 4
    assert max(abs(curve[s] - zero1[s]) for s in curve) < EXACT
    assert curve[STEPS] < curve[1] - 0.5  # it learns
    final, want = weights(runs["resumed"]), weights(runs["zero1"])
    assert final.keys() == want.keys() and "model.layers.0.mlp.experts.7.up_proj.weight" in final
    for key in want:  # every expert gathered whole, in its place
        assert final[key].shape == want[key].shape, key
        torch.testing.assert_close(final[key], want[key], atol=EXACT, rtol=0, msg=key)


def test_the_resumed_run_repeats_the_uninterrupted_one_bit_for_bit(runs: dict) -> None:
    """SIGTERM after step 4, resumed from step 3's checkpoint: steps 4-8 and the final weights are the
    uninterrupted expert-parallel run's, bit for bit."""
    resumed, straight = by_step(runs["resumed"]), by_step(runs["ep"])
    assert resumed == {s: straight[s] for s in resumed} and min(resumed) == 4
    final, want = weights(runs["resumed"]), weights(runs["ep"])
    assert final.keys() == want.keys() and all(torch.equal(final[k], want[k]) for k in want)


def test_it_trains_like_one_process(runs: dict) -> None:
    mine, one = by_step(runs["zero1"]), by_step(runs["one"])
    assert max(abs(mine[s] - one[s]) for s in one) < LOSS_TOL
    # the rate logged for each step is the one it trained with (DeepSpeed's engine steps the scheduler
    # under expert parallel: it was logged one step ahead, runtime/trainer_hooks.py LearningRateOfTheStep)
    assert rates(runs["ep"]) == rates(runs["one"]) and len(rates(runs["one"])) == STEPS
    final, want = weights(runs["resumed"]), weights(runs["one"])
    assert max((final[k] - want[k]).abs().max().item() for k in want) < WEIGHT_TOL


def test_a_checkpoint_holds_every_expert_under_the_models_names(runs: dict) -> None:
    """The model weights of an expert-parallel checkpoint load as the model: not rank 0's half of the
    experts under DeepSpeed's names (the Trainer's own save)."""
    saved = load_file(runs["checkpoint"] / "model.safetensors")  # the checkpoint format: one key per expert
    assert {k for k in saved if ".mlp." in k} == {k for k in weights(runs["zero1"]) if ".mlp." in k}
    assert saved["model.layers.1.mlp.experts.7.gate_proj.weight"].shape == (32, 64)


def test_the_summary_shows_the_expert_load(runs: dict) -> None:
    table = json.loads((runs["resumed"] / "result.json").read_text())["expert load"]
    assert set(table) == {"layer 0", "layer 1"}
    assert all("assignments; share min" in row for row in table.values())


def test_another_ep_size_on_resume_is_refused(runs: dict, warm: Warm, tmp_path: Path) -> None:
    proc = warm(*TRAIN, *RANKS, FORK, "strategy.ep_size=1", f"resume={runs['checkpoint']}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "strategy.ep_size: 2 → 1" in proc.stderr and "strategy.ep_size=2" in proc.stderr
