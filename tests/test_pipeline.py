"""Pipeline parallel (``strategy=pipeline``): the stages of every supported family against the whole model,
the split against the memory estimate's, the refusals before load, and real runs on 2 CPU ranks (gloo)
against one process.

The multi-process runs are shared by the module's tests: a single-process reference, a GPipe run, and a 1F1B
run stopped by a real SIGTERM and resumed, 30 optimizer steps each of 2 micro-batches x 4 rows on the tiny
model; and a LoRA pair (one process, 2 stages), 4 steps. Tolerances: a pipeline step's loss is the same
sums in another order, so |Δloss| <= 1e-5 relative per step (seen: ~2e-7) and the final weights within 1e-5
absolute (seen: ~4e-7); the resumed run is bit-exact against the uninterrupted one (same order of sums).
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.config.errors import EXIT_INTERRUPTED, ConfigError
from components.distributed import stages as st
from components.runtime.checks import check_before_load
from components.runtime.run import Components

STEPS = 30
BATCH = ["train.micro_batch_size=4", "train.gradient_accumulation_steps=2", f"train.max_steps={STEPS}"]
QUICK = ["train.log_every=1", "train.eval_every=0", "train.eval_generations=0", "train.write_plots=false"]
PIPELINE = ["strategy=pipeline", "launcher.nproc_per_node=2"]
#: interleaved 1F1B over 4 stages of a 4-layer tiny model, 5 micro-batches: rounds of 2 leave one over
INTERLEAVED_5 = ["strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=2", "strategy.split=[1,2,3]"]
INTERLEAVED_5 += ["model.architecture.num_hidden_layers=4", "train.gradient_accumulation_steps=5"]


# ---- the stages of one model, in one process -----------------------------------------------------------
SMALL = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 64, "head_dim": 16,
}  # fmt: skip
#: per family, the settings that exercise what its stage must reproduce (sliding windows, soft-capping)
FAMILY = {
    "mistral": {"sliding_window": 5},
    "qwen2": {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 2},
    "qwen3": {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 2},
    "gemma2": {"sliding_window": 5, "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 16},
    "gemma3_text": {"sliding_window": 5, "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 16},
}


@pytest.mark.parametrize("family", st.FAMILIES)
def test_every_family_run_stage_by_stage_gives_the_whole_models_logits(family: str) -> None:
    """Each stage a cut copy of the model, run one after the other on 12 tokens (longer than the sliding
    windows): the logits equal the whole model's, and each cut copy holds only its layers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, **SMALL, **FAMILY.get(family, {}))
    impl = "eager" if family.startswith("gemma") else "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()
    ids = torch.randint(0, 300, (2, 12))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    plan = st.plan_stages(model, 3, 3)
    hidden = ids
    for stage in range(3):
        part = copy.deepcopy(model)
        st.keep_stages(part, plan, [stage])
        assert st.held(part) == st.expected(plan, [stage])
        with torch.no_grad():
            hidden = st.Stage(part, plan, stage).eval()(hidden)
    torch.testing.assert_close(hidden, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("model", "pp", "chunks"),
    [
        ("tiny", 2, 1),
        ("smollm2_135m", 2, 1),
        ("smollm2_135m", 4, 2),
        ("qwen2_5_1_5b", 4, 1),
        ("gemma2_2b", 2, 1),
    ],
)
def test_the_run_cuts_the_model_where_the_memory_estimate_does(compose_cfg, model, pp, chunks) -> None:
    """The stages the run builds (the model's own parameter counts, on the meta device) are the estimate's
    (``components/memory/parallel.py``, from the architecture numbers alone): the same layers per stage."""
    from components.memory.parallel import stage_layers
    from components.memory.spec import arch_of_model

    overrides = [f"model={model}", f"strategy.pp_size={pp}", f"strategy.stages_per_rank={chunks}"]
    if chunks > 1:
        overrides.append("strategy.schedule=interleaved_1f1b")
    comps = Components.from_config(compose_cfg(*PIPELINE, *overrides))
    plan = comps.strategy.stage_plan(comps.model.load_config())
    layers = tuple(len(plan.layers(s)) for s in range(plan.num_stages))
    assert layers == stage_layers(arch_of_model(comps.model), pp * chunks)
    assert plan.num_layers == sum(layers) and min(layers) >= 1


def test_an_explicit_split_is_checked() -> None:
    assert st.check_bounds([3], 8, 2) == (0, 3, 8)
    for split, stages in (([3, 3], 3), ([0], 2), ([8], 2), ([2], 3)):
        with pytest.raises(ConfigError) as err:
            st.check_bounds(split, 8, stages)
        assert err.value.key == "strategy.split"


@pytest.mark.parametrize("peft", ["lora", "bitfit", "freeze"])
def test_adapters_and_frozen_weights_go_with_their_layers(compose_cfg, peft: str) -> None:
    """With an adapter (or part of the model frozen), each stage holds its layers' adapter weights and the
    cut copies together train exactly the whole model's trainable parameters; the logits are unchanged."""
    comps = Components.from_config(compose_cfg(f"peft={peft}"))
    torch.manual_seed(0)
    model = comps.peft.apply(comps.model.build()).eval()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    ids = torch.randint(4, 600, (2, 10))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    plan = st.plan_stages(st.meta_model(comps.model.load_config()), 2, 2)
    held, hidden = set(), ids
    for stage in range(2):
        part = copy.deepcopy(model)
        st.keep_stages(part, plan, [stage])
        assert st.held(part) == st.expected(
            plan, [stage]
        )  # the model's own weights: the adapter's not counted
        held |= {n for n, p in part.named_parameters() if p.requires_grad}
        with torch.no_grad():
            hidden = st.Stage(part, plan, stage).eval()(hidden)
    assert held == trainable and trainable
    torch.testing.assert_close(hidden, want, atol=1e-5, rtol=1e-5)


# ---- refused before load ----------------------------------------------------------------------------
def gpt2_dir(tmp_path: Path) -> Path:
    """A model dir of a family without ``model.layers`` (GPT-2 keeps its blocks in ``transformer.h``)."""
    from transformers import GPT2Config

    folder = tmp_path / "gpt2"
    GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=602).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["launcher.nproc_per_node=3"], "strategy.pp_size", "does not divide the world size 3"),
        (
            ["strategy.pp_size=4", "launcher.nproc_per_node=4"],
            "strategy.pp_size",
            "at least 4 decoder layers",
        ),
        (["strategy.split=[3]"], "strategy.split", "leaves a stage without a decoder layer"),
        (["strategy.split=[1,2]"], "strategy.split", "gives 3 stages"),
        (["strategy.schedule=interleaved_1f1b"], "strategy.stages_per_rank", "several stages per rank"),
        (["strategy.stages_per_rank=2"], "strategy.stages_per_rank", "one stage per rank"),
        (INTERLEAVED_5, "train.gradient_accumulation_steps", "do not divide into them"),
        (["recipe=dpo"], "recipe", "does not train through the pipeline loop"),
        (["peft=prefix"], "peft", "prompt-learning adapters prepend virtual tokens"),
        (["quantization=nf4", "peft=lora"], "quantization", "quantized base"),
        (["data.packing=true"], "data.packing", "packed rows"),
        (["model.compile=true"], "model.compile", "not applied to pipeline stages"),
        (["recipe.loss_type=dft"], "recipe.loss_type", "not computed by the pipeline stages"),
        (["strategy.pp_size=1"], "strategy.pp_size", ">= 2"),
        (
            ["strategy.tp_size=2", "launcher.nproc_per_node=4"],
            "strategy.tp_size",
            "tensor-parallel ranks (3D",
        ),
    ],
)
def test_what_pipeline_stages_cannot_do_is_refused_before_load(compose_cfg, overrides, key, words) -> None:
    cfg = compose_cfg(*PIPELINE, *overrides)
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg), "cpu")
    assert err.value.key == key and words in str(err.value), str(err.value)


def test_a_model_without_a_layer_list_is_refused_with_the_fix(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg(*PIPELINE, f"model.name_or_path={gpt2_dir(tmp_path)}")
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg), "cpu")
    assert err.value.key == "strategy" and "model_type 'gpt2'" in str(err.value)
    assert "strategy=fsdp" in err.value.hint


def test_fp16_is_refused_even_planned_for_a_gpu(compose_cfg) -> None:
    cfg = compose_cfg(*PIPELINE, "precision=fp16")
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg), "cuda")
    assert err.value.key == "precision"


def test_plan_prints_the_mesh_the_stages_and_the_batch_arithmetic(capsys) -> None:
    from recipes.cli import main

    main([*PIPELINE, "mode=plan", "launcher.nproc_per_node=4", *BATCH])
    out = capsys.readouterr().out
    assert "dp 2 x tp 1 x sp 1 x pp 2 = 4 processes" in out
    assert "global_batch_size: 4 x 2 x 2 (data-parallel replicas) = 16" in out
    assert "stage 0 (pipeline rank 0): embed_tokens + layers 0-1 (471,552 parameters)" in out
    assert "stage 1 (pipeline rank 1): layer 2 + norm + lm_head (274,432 parameters)" in out
    assert "micro-batches per step: 2 (train.gradient_accumulation_steps)" in out
    assert "bubble (theoretical): 0.3333" in out  # (p - 1) / (m + p - 1) = 1 / 3


# ---- two ranks against one process ------------------------------------------------------------------
def hydratune(run_dir: Path, *overrides: str) -> None:
    from recipes.cli import main

    os.environ["OMP_NUM_THREADS"] = "1"
    main([*QUICK, *BATCH, *overrides, f"hydra.run.dir={run_dir}"])


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").open()]


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in records(run) if "loss" in r]


def logged(run: Path) -> list[dict]:
    return [r for r in records(run) if "loss" in r]


def result(run: Path) -> dict:
    return json.loads((run / "result.json").read_text())


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
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The single-process reference and a GPipe run of the same batches, and a 1F1B run stopped by a real
    SIGTERM to its launcher after step 5 and resumed with the command it printed."""
    from recipes.cli import main
    from tests.test_reliability import finish, start, wait_for_step

    root = tmp_path_factory.mktemp("pipeline")
    hydratune(root / "single", "train.save_every=0")
    hydratune(root / "gpipe", *PIPELINE, "strategy.schedule=gpipe", "train.save_every=0")
    victims = root / "victim"
    victims.mkdir()
    victim = start(victims, *QUICK, *BATCH, *PIPELINE, "strategy.schedule=1f1b", "train.save_every=10")
    wait_for_step(victims, 5, victim, timeout=600)  # start-up on a loaded machine takes minutes
    victim.send_signal(signal.SIGTERM)
    err = finish(victim, timeout=180)
    (run,) = victims.glob("outputs/*/*")
    stopped = [json.loads(p.read_text()) for p in sorted(run.glob(".rank*.stopped.json"))]
    advice = re.search(r"Resume with: hydratune (resume=\S+)", err)
    if victim.returncode == EXIT_INTERRUPTED and advice:  # the printed advice: the run's own config
        main([advice.group(1), f"hydra.run.dir={root / 'resumed'}"])
    return Runs(root / "single", root / "gpipe", run, root / "resumed", err, victim.returncode, stopped)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
def lora_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """LoRA (dropout 0: with dropout every rank draws its own masks) on one process and on 2 stages."""
    root = tmp_path_factory.mktemp("pipeline_lora")
    lora = ["peft=lora", "peft.dropout=0", "train.max_steps=4", "train.save_every=0"]
    hydratune(root / "single", *lora)
    hydratune(root / "stages", *lora, *PIPELINE)
    return root / "single", root / "stages"


@pytest.mark.slow
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
