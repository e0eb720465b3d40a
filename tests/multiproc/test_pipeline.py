"""Pipeline parallel (``strategy=pipeline``): the stages of every supported family against the whole model,
the split against the memory estimate's, the refusals before load, and real runs on 2 CPU ranks (gloo)
against one process.

The multi-process runs are shared by the module's tests: a single-process reference, a GPipe run, and a 1F1B
run stopped by a real SIGTERM and resumed, 30 optimizer steps each of 2 micro-batches x 4 rows on the tiny
model; and a LoRA pair (one process, 2 stages), 4 steps. Tolerances: a pipeline step's loss is the same
sums in another order, so |Δloss| <= 1e-5 relative per step (seen: ~2e-7) and the final weights within 1e-5
absolute (seen: ~4e-7); the resumed run is bit-exact against the uninterrupted one (same order of sums).
Every command is forked from the tier's warm server and forks its workers (``launcher.start_method=fork``):
the signal comes after step 5, long after each worker set up its own handlers, and the workers' default
start is what the signalled runs of test_reliability.py and test_multinode.py use.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hydratune.components.config.errors import EXIT_INTERRUPTED
from tests.support.cells import FORK, forked, losses, records, result
from tests.support.cli import Warm, finish, wait_for_step

STEPS = 30
BATCH = ["train.micro_batch_size=4", "train.gradient_accumulation_steps=2", f"train.max_steps={STEPS}"]
QUICK = ["train.log_every=1", "train.eval_every=0", "train.eval_generations=0", "train.write_plots=false"]
PIPELINE = ["strategy=pipeline", "launcher.nproc_per_node=2"]
#: interleaved 1F1B over 4 stages of a 4-layer tiny model, 5 micro-batches: rounds of 2 leave one over
INTERLEAVED_5 = ["strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=2", "strategy.split=[1,2,3]"]
INTERLEAVED_5 += ["model.architecture.num_hidden_layers=4", "train.gradient_accumulation_steps=5"]


# ---- two ranks against one process ------------------------------------------------------------------
def logged(run: Path) -> list[dict]:
    return [r for r in records(run) if "loss" in r]


def final(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "final" / "model.safetensors")


@dataclass
class Runs:
    single: Path  # one process, the same global batch
    gpipe: Path  # 2 ranks, GPipe, uninterrupted
    stopped_run: Path  # 2 ranks, 1F1B, stopped by SIGTERM
    onef1b: Path  # its resumed run, to the end
    stop_err: str  # the stopped launch's stderr
    stop_code: int
    stopped: list[dict]  # each rank's record of where it stopped


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> Runs:
    """The single-process reference and a GPipe run of the same batches, and a 1F1B run stopped by a real
    SIGTERM to its launcher after step 5 and resumed with the command it printed."""
    root = tmp_path_factory.mktemp("pipeline")
    forked(warm, root / "single", *QUICK, *BATCH, "train.save_every=0")
    forked(warm, root / "gpipe", *QUICK, *BATCH, *PIPELINE, "strategy.schedule=gpipe", "train.save_every=0")
    victims = root / "victim"
    victims.mkdir()
    victim = warm.start(
        *QUICK, *BATCH, *PIPELINE, "strategy.schedule=1f1b", "train.save_every=10", FORK, cwd=victims
    )
    wait_for_step(victims, 5, victim, timeout=600)  # start-up on a loaded machine takes minutes
    victim.send_signal(signal.SIGTERM)
    err = finish(victim, timeout=180)
    (run,) = victims.glob("outputs/*/*")
    stopped = [json.loads(p.read_text()) for p in sorted(run.glob(".rank*.stopped.json"))]
    advice = re.search(r"Resume with: hydratune (resume=\S+)", err)
    if victim.returncode == EXIT_INTERRUPTED and advice:  # the printed advice: the run's own config
        forked(warm, root / "resumed", advice.group(1))
    return Runs(root / "single", root / "gpipe", run, root / "resumed", err, victim.returncode, stopped)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_stages_train_like_one_process(runs: Runs, schedule: str) -> None:
    """Every step's loss, the gradient norm and the final weights equal one process's on the same global
    batch; the summary shows the schedule that ran and the bubble beside its theoretical value."""
    run = runs.gpipe if schedule == "gpipe" else runs.onef1b
    got, want = losses(run), losses(runs.single)
    if schedule == "1f1b":  # the steps before the signal, then the resumed run's
        got = losses(runs.stopped_run)[: runs.stopped[0]["step"]] + got
    assert len(got) == len(want) == STEPS
    for step, (a, b) in enumerate(zip(got, want, strict=True), start=1):
        assert a == pytest.approx(b, rel=1e-5), (step, a, b)
    norms = [
        (r["grad_norm"], s["grad_norm"])
        for r, s in zip(logged(run)[::-1], logged(runs.single)[::-1], strict=False)
    ]
    assert all(a == pytest.approx(b, rel=1e-4) for a, b in norms)
    mine, theirs = final(run), final(runs.single)
    assert mine.keys() == theirs.keys()
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], atol=1e-5, rtol=1e-4, msg=name)
    if schedule == "gpipe":  # final/ is a normal model folder: tied again, loadable by transformers
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(run / "final")
        assert model.lm_head.weight is model.model.embed_tokens.weight
    info = result(run)["pipeline"]
    steps = STEPS if schedule == "gpipe" else STEPS - runs.stopped[0]["step"]  # the resumed run's own
    assert info["schedules run"] == f"{schedule}: {steps} steps"
    assert info["bubble (theoretical)"] == pytest.approx(1 / 3, abs=1e-4)  # p = 2, m = 2
    assert 0 < info["bubble (measured)"] < 1
    assert info["mesh"] == "pp 2 x dp 1 = 2 processes"


def test_each_rank_holds_only_its_stage(runs: Runs) -> None:
    """What each rank held (read from its modules, checked live before training) and what it wrote into
    its checkpoint: rank 0 the embedding and layers 0-1, rank 1 layer 2, the norm and the (tied) head."""
    info = result(runs.onef1b)["pipeline"]
    assert info["rank 0 holds"] == "layers 0-1, embed_tokens; 471,552 parameters"
    assert info["rank 1 holds"] == "layers 2, lm_head; 274,432 parameters"
    checkpoint = runs.onef1b / "checkpoints" / f"checkpoint-{STEPS}"
    first = load_file(checkpoint / "stage-0" / "model.safetensors")
    last = load_file(checkpoint / "stage-1" / "model.safetensors")
    layers = lambda names: sorted({int(n.split(".")[2]) for n in names if n.startswith("model.layers.")})  # noqa: E731
    assert layers(first) == [0, 1] and layers(last) == [2]
    assert "model.embed_tokens.weight" in first and "lm_head.weight" not in first
    assert {"lm_head.weight", "model.norm.weight"} <= last.keys() and "model.embed_tokens.weight" not in last
    assert sum(t.numel() for t in first.values()) == 471_552
    assert sum(t.numel() for t in last.values()) == 274_432
    # the two copies of the tied embedding stayed one matrix: summed gradients, the same update
    assert torch.equal(first["model.embed_tokens.weight"], last["lm_head.weight"])


def test_sigterm_stops_both_stages_and_the_resume_is_bit_exact(runs: Runs) -> None:
    """A real SIGTERM to the launcher mid-training: both ranks stop after the same step, one checkpoint,
    exit 75; resumed with the printed command, the run repeats the uninterrupted one bit for bit. The
    uninterrupted reference is the GPipe run: on 2 stages x 2 micro-batches the two schedules accumulate
    the same gradients in the same order (the steps before the signal show it, bit for bit)."""
    assert runs.stop_code == EXIT_INTERRUPTED, runs.stop_err[-3000:]
    assert "Traceback" not in runs.stop_err, runs.stop_err[-3000:]
    first, second = runs.stopped
    assert first == second and first["signum"] == signal.SIGTERM  # both ranks, the same step
    step, stopped, run = first["step"], runs.stopped_run, runs.onef1b
    assert 5 <= step < STEPS and first["checkpoint"] == str(stopped / "checkpoints" / f"checkpoint-{step}")
    assert f"stopped by SIGTERM at step {step}" in (stopped / "summary.md").read_text()
    assert not (stopped / "final").exists()
    reference = losses(runs.gpipe)
    assert losses(stopped) == reference[:step]  # 1F1B and GPipe: the same sums in the same order
    assert losses(run) == reference[step:]  # resumed: the uninterrupted run's steps, bit for bit
    covers = result(run)["run"]["train_loss covers"]
    assert covers.startswith(f"steps {step + 1} to {STEPS} (resumed after step {step}"), covers
    mine, theirs = final(run), final(runs.gpipe)
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert torch.equal(mine[name], theirs[name]), name


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> tuple[Path, Path]:
    """LoRA (dropout 0: with dropout every rank draws its own masks) on one process and on 2 stages."""
    root = tmp_path_factory.mktemp("pipeline_lora")
    lora = [*QUICK, *BATCH, "peft=lora", "peft.dropout=0", "train.max_steps=4", "train.save_every=0"]
    forked(warm, root / "single", *lora)
    forked(warm, root / "stages", *lora, *PIPELINE)
    return root / "single", root / "stages"


def test_lora_trains_through_the_stages_like_one_process(lora_runs: tuple[Path, Path]) -> None:
    """The adapter of each stage's layers trained and gathered into one adapter folder, equal to one
    process's (losses within 1e-5 relative, weights within 1e-5)."""
    single, stages = lora_runs
    assert losses(stages) == pytest.approx(losses(single), rel=1e-5)
    mine = load_file(stages / "final" / "adapter_model.safetensors")
    theirs = load_file(single / "final" / "adapter_model.safetensors")
    assert mine.keys() == theirs.keys() and any("layers.2" in name for name in mine)
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], atol=1e-5, rtol=1e-4, msg=name)
    assert any(float(t.abs().sum()) > 0 for n, t in mine.items() if "lora_B" in n)  # trained


# ---- tensor-parallel stages (3D) ---------------------------------------------------------------------
#: 8 optimizer steps of 2 micro-batches x 4 rows per replica, a checkpoint at step 4
SHORT = ["train.micro_batch_size=4", "train.gradient_accumulation_steps=2", "train.max_steps=8"]
PP_TP = ["strategy=pipeline", "strategy.pp_size=2", "strategy.tp_size=2"]


@dataclass
class ThreeD:
    single: Path  # one process, 8 rows a step (2 micro-batches of 4)
    pp_tp: Path  # pp 2 x tp 2 (4 ranks), 8 rows a step, a checkpoint at step 4
    resumed: Path  # pp_tp resumed from its checkpoint-4
    single_32: Path  # one process, 16 rows a step (2 micro-batches of 8), 4 steps
    pp_dp_tp: Path  # pp 2 x dp 2 x tp 2 (8 ranks), 16 rows a step (2 replicas x 2 x 4)
    zero1: Path  # strategy=zero1 strategy.pp_size=2 (4 ranks: pp 2 x dp 2, ZeRO-1), 16 rows a step
    zero1_resumed: Path  # zero1 resumed from its checkpoint-2
    fsdp: Path  # strategy=fsdp strategy.pp_size=2 (4 ranks: pp 2 x dp 2, FSDP2 on each stage), 16 rows a step
    fsdp_resumed: Path  # fsdp resumed from its checkpoint-2


@pytest.fixture(scope="module")
def three_d(tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> ThreeD:
    """PP x TP on 4 ranks against one process (and resumed from its checkpoint), the full 3D, PP x DP x TP
    on 8 ranks, and ``strategy=zero1 strategy.pp_size=2`` (PP x DP with ZeRO-1, resumed too) against one
    process of the same global batch."""
    root = tmp_path_factory.mktemp("pipeline_3d")
    forked(warm, root / "single", *QUICK, *SHORT, "train.save_every=0")
    forked(warm, root / "pp_tp", *QUICK, *SHORT, *PP_TP, "launcher.nproc_per_node=4", "train.save_every=4")
    forked(warm, root / "resumed", f"resume={root / 'pp_tp' / 'checkpoints' / 'checkpoint-4'}")
    wide = [*QUICK, *SHORT, "train.max_steps=4", "train.save_every=0"]
    forked(warm, root / "single_32", *wide, "train.micro_batch_size=8")
    forked(warm, root / "pp_dp_tp", *wide, *PP_TP, "launcher.nproc_per_node=8")
    zero1 = [*wide, "strategy=zero1", "strategy.pp_size=2", "launcher.nproc_per_node=4", "train.save_every=2"]
    forked(warm, root / "zero1", *zero1)
    forked(warm, root / "zero1_resumed", f"resume={root / 'zero1' / 'checkpoints' / 'checkpoint-2'}")
    fsdp = [*wide, "strategy=fsdp", "strategy.pp_size=2", "launcher.nproc_per_node=4", "train.save_every=2"]
    forked(warm, root / "fsdp", *fsdp)
    forked(warm, root / "fsdp_resumed", f"resume={root / 'fsdp' / 'checkpoints' / 'checkpoint-2'}")
    return ThreeD(
        root / "single", root / "pp_tp", root / "resumed", root / "single_32", root / "pp_dp_tp",
        root / "zero1", root / "zero1_resumed", root / "fsdp", root / "fsdp_resumed",
    )  # fmt: skip


@pytest.mark.parametrize("layout", ["pp_tp", "pp_dp_tp", "zero1", "fsdp"])
def test_tensor_parallel_stages_train_like_one_process(three_d: ThreeD, layout: str) -> None:
    """PP 2 x TP 2, PP 2 x DP 2 x TP 2, ZeRO-1's PP 2 x DP 2 (``strategy=zero1 strategy.pp_size=2``, each
    replica holding half of its stage's optimizer states) and FSDP2's (``strategy=fsdp strategy.pp_size=2``,
    each replica holding half of every parameter of its stage, the tied embedding's two copies included):
    every step's loss within 1e-5 relative of one
    process's on the same global batch (seen: ~1e-7), the gradient norm within 1e-4, the final weights within
    1e-5 (seen: ~2e-6); each rank holds its stage's layers with their projections split in two (summary,
    checked live) with tensor parallel."""
    run = getattr(three_d, layout)
    single = three_d.single if layout == "pp_tp" else three_d.single_32
    got, want = logged(run), logged(single)
    assert [r["step"] for r in got] == [r["step"] for r in want] and got
    for a, b in zip(got, want, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), (a, b)
    mine, theirs = final(run), final(single)
    assert mine.keys() == theirs.keys()
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], atol=1e-5, rtol=1e-4, msg=name)
    info = result(run)["pipeline"]
    if layout == "zero1":  # pp 2 x dp 2, each replica keeping the optimizer states of half a stage
        assert info["mesh"] == "pp 2 x dp 2 = 4 processes"
        held = [int(n.replace(",", "")) for n in info["optimizer states per rank"].split(" (")[0].split(", ")]
        for first, stage_params in ((0, 471_552), (2, 274_432)):  # Adam's two moments (+ a step count each)
            pair = held[first : first + 2]
            assert 2 * stage_params <= sum(pair) < 2 * stage_params + 100 and max(pair) < 0.6 * sum(pair), (
                held
            )
        return
    if layout == "fsdp":  # pp 2 x dp 2, each replica a shard of every parameter of its stage (checked live)
        assert info["mesh"] == "pp 2 x dp 2 = 4 processes"
        for rank, (stage_params, here) in enumerate([(471_552, 235_776)] * 2 + [(274_432, 137_216)] * 2):
            assert info[f"rank {rank} holds"].endswith(
                f"{stage_params:,} parameters, {here:,} of them here (FSDP2, ZeRO-3: a 1/2 shard of each "
                "parameter over the data-parallel replicas)"
            ), info
        return
    dp = 1 if layout == "pp_tp" else 2
    assert info["mesh"] == f"pp 2 x dp {dp} x tp 2 = {4 * dp} processes"
    # the stage's parameters (as without tp) and this rank's share: the split projections halved
    assert info["rank 0 holds"].startswith(
        "layers 0-1, embed_tokens; 471,552 parameters, 274,688 of them here"
    )
    last = 2 * dp + 1  # the second tensor-parallel rank of the last stage
    assert info[f"rank {last} holds"].startswith(
        "layers 2, lm_head; 274,432 parameters, 176,000 of them here"
    )
    assert "tensor-parallel rank 1 of 2" in info[f"rank {last} holds"]


def test_zero1_pipeline_resumes_bit_exact_from_each_replicas_partition(three_d: ThreeD) -> None:
    """``strategy=zero1 strategy.pp_size=2`` ran as the staged engine with ZeRO-1 (its summary says so; its
    saved config is the option as typed, which a replay trains the same way); each replica wrote its own
    partition of the optimizer states, and the run resumed from step 2 repeats steps 3-4 bit for bit."""
    saved = (three_d.zero1 / ".hydra" / "config.yaml").read_text()
    assert "_target_: hydratune.components.strategy.DeepSpeed" in saved and "pp_size: 2" in saved
    strategy = json.loads((three_d.zero1 / "result.json").read_text())["run"]["strategy"]
    assert strategy == "Pipeline (pp 2, 1f1b, ZeRO-1 over the replicas)"
    stage = three_d.zero1 / "checkpoints" / "checkpoint-2" / "stage-1"
    assert {p.name for p in stage.iterdir()} == {"model.safetensors", "optimizer-dp0.pt", "optimizer-dp1.pt"}
    assert losses(three_d.zero1_resumed) == losses(three_d.zero1)[2:]
    mine, theirs = final(three_d.zero1_resumed), final(three_d.zero1)
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)


def test_fsdp_pipeline_resumes_bit_exact_from_each_replicas_shards(three_d: ThreeD) -> None:
    """``strategy=fsdp strategy.pp_size=2`` ran as the staged engine with FSDP2 on each stage (its summary
    says so; its saved config is the option as typed); each stage's weights were gathered whole, each replica
    wrote its shard of the optimizer states, and the run resumed from step 2 repeats steps 3-4 bit for bit."""
    saved = (three_d.fsdp / ".hydra" / "config.yaml").read_text()
    assert "_target_: hydratune.components.strategy.FSDP" in saved and "pp_size: 2" in saved
    strategy = json.loads((three_d.fsdp / "result.json").read_text())["run"]["strategy"]
    assert strategy == "Pipeline (pp 2, 1f1b, FSDP2 (ZeRO-3) over the replicas)"
    stage = three_d.fsdp / "checkpoints" / "checkpoint-2" / "stage-0"
    assert {p.name for p in stage.iterdir()} == {"model.safetensors", "optimizer-dp0.pt", "optimizer-dp1.pt"}
    assert load_file(stage / "model.safetensors")["model.embed_tokens.weight"].shape == (602, 128)  # whole
    assert losses(three_d.fsdp_resumed) == losses(three_d.fsdp)[2:]
    mine, theirs = final(three_d.fsdp_resumed), final(three_d.fsdp)
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)


def test_tensor_parallel_stages_resume_bit_exact(three_d: ThreeD) -> None:
    """Resumed from step 4's checkpoint (the weights saved whole, each tensor-parallel rank's optimizer
    shards in its own file), the run repeats steps 5-8 bit for bit."""
    checkpoint = three_d.pp_tp / "checkpoints" / "checkpoint-4"
    assert {p.name for p in (checkpoint / "stage-0").iterdir()} == {
        "model.safetensors", "optimizer-tp0.pt", "optimizer-tp1.pt"
    }  # fmt: skip
    assert json.loads((checkpoint / "pipeline.json").read_text())["tp"] == 2
    assert losses(three_d.resumed) == losses(three_d.pp_tp)[4:]
    mine, theirs = final(three_d.resumed), final(three_d.pp_tp)
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)
