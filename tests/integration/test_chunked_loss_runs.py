"""recipe.loss_impl=chunked (hydratune's chunked LM head + cross-entropy, the SFT default) against
recipe.loss_impl=trl (TRL's fused LM head) on the tiny model: the same loss at every step, the same logged
metrics at log steps, under gradient accumulation (num_items_in_batch), the assistant-only mask and
packed padding-free rows (position_ids); the summary says which loss ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from tests.conftest import FAST, _run_in

STEPS = ["train.max_steps=20", "train.micro_batch_size=4", "train.save_every=0", "train.eval_every=0"]
#: per step (log_every=1): the default chat rows (assistant-only loss), 2 micro-batches a step
EVERY_STEP = [*STEPS, "train.gradient_accumulation_steps=2", "train.log_every=1"]
#: packed padding-free rows (position_ids), logged every 4 steps (the chunked run's metrics: on those only)
PACKED = [*STEPS, "data.packing=true", "train.log_every=4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chunked_loss")
    out = {}
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        fn = lambda *o: compose(config_name="config", overrides=list(o))  # noqa: E731
        for name, overrides in (("every", EVERY_STEP), ("packed", PACKED)):
            for impl in ("chunked", "trl"):
                impl_set = f"recipe.loss_impl={impl}"
                ctx, _ = _run_in(root, fn, *FAST, *overrides, impl_set, name=f"{name}_{impl}")
                out[f"{name}_{impl}"] = ctx.run_dir.path
    GlobalHydra.instance().clear()
    return out


def logged_all(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def logged(run: Path) -> list[dict]:
    return [r for r in logged_all(run) if "loss" in r]


def test_the_chunked_loss_equals_trls_at_every_step_with_the_same_metrics(runs: dict[str, Path]) -> None:
    chunked, trl = logged(runs["every_chunked"]), logged(runs["every_trl"])
    assert [r["step"] for r in chunked] == [r["step"] for r in trl] == list(range(1, 21))
    for a, b in zip(chunked, trl, strict=True):
        for key in ("loss", "entropy", "mean_token_accuracy", "num_tokens"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), (a["step"], key, a[key], b[key])
    assert chunked[-1]["loss"] < 0.8 * chunked[0]["loss"]  # it learns
    # the end-of-run evaluation: every eval batch's loss and metrics
    evals = [[r for r in logged_all(runs[f"every_{i}"]) if "eval_loss" in r] for i in ("chunked", "trl")]
    assert len(evals[0]) == len(evals[1]) == 1
    for key in ("eval_loss", "eval_entropy", "eval_mean_token_accuracy"):
        assert evals[0][0][key] == pytest.approx(evals[1][0][key], abs=1e-5), key


def test_packed_rows_give_the_same_loss_and_metrics_at_log_steps(runs: dict[str, Path]) -> None:
    chunked, trl = logged(runs["packed_chunked"]), logged(runs["packed_trl"])
    assert [r["step"] for r in chunked] == [r["step"] for r in trl] == [1, 4, 8, 12, 16, 20]  # first step too
    for a, b in zip(chunked, trl, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5), (a["step"], a["loss"], b["loss"])
        assert a["entropy"] > 0 and 0 <= a["mean_token_accuracy"] <= 1
    # the first log covers one step in both; later ones: the chunked run's log step, TRL's mean since the last
    for key in ("entropy", "mean_token_accuracy"):
        assert chunked[0][key] == pytest.approx(trl[0][key], abs=1e-5)


def test_the_summary_names_the_loss_that_ran(runs: dict[str, Path]) -> None:
    chunked = json.loads((runs["every_chunked"] / "result.json").read_text())
    trl = json.loads((runs["every_trl"] / "result.json").read_text())
    assert "chunked LM head" in json.dumps(chunked)
    assert "TRL's fused LM head (recipe.loss_impl=trl)" in json.dumps(trl)
