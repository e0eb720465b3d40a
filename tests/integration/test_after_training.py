"""After training: `hydratune export` (a folder transformers loads as is) and recipe=generate (batched
generation over a file, data parallel), both from run dirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from hydratune.components.commands.export import export
from hydratune.components.config.errors import ConfigError
from hydratune.components.modeling.trained import TrainedRun
from tests.conftest import GENERATE
from tests.support.data import ASSETS
from tests.support.runs import read_jsonl

STEPS = ["train.max_steps=2", "train.eval_generations=0", "train.save_every=0", "train.eval_every=0"]


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_export_of_a_full_run_loads_with_its_logits_template_and_stops(sft_runs, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = export(sft_runs["full"], tmp_path / "exported")
    exported = AutoModelForCausalLM.from_pretrained(out)
    final = AutoModelForCausalLM.from_pretrained(sft_runs["full"] / "final")
    ids = torch.randint(0, final.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(logits(exported, ids), logits(final, ids))
    tok, trained_tok = (
        AutoTokenizer.from_pretrained(out),
        AutoTokenizer.from_pretrained(sft_runs["full"] / "final"),
    )
    assert tok.chat_template == trained_tok.chat_template and tok.chat_template
    generation = GenerationConfig.from_pretrained(out)
    stops = (
        generation.eos_token_id if isinstance(generation.eos_token_id, list) else [generation.eos_token_id]
    )
    assert trained_tok.eos_token_id in stops and generation.pad_token_id == trained_tok.pad_token_id
    card = (out / "README.md").read_text()
    assert "hydratune optimizer.lr=1e-5" in card and "hydratune replay <run dir>/full" in card
    assert "library_name: transformers" in card
    assert not list(tmp_path.glob("*.tmp")), "the staging dir was left behind"


def test_export_merges_an_adapter_into_its_base_with_the_adapters_logits(sft_runs, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    run = TrainedRun.open(sft_runs["lora"])
    assert run.kind == "adapter"
    adapter_model, _ = run.load()  # the adapter on its rebuilt base, not merged
    out = export(sft_runs["lora"], tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    ids = torch.randint(0, merged.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    base = AutoModelForCausalLM.from_pretrained(sft_runs["full"] / "final")
    assert not torch.allclose(logits(adapter_model, ids), logits(base, ids), atol=1e-4), (
        "the adapter did nothing"
    )
    torch.testing.assert_close(logits(merged, ids), logits(adapter_model, ids), atol=1e-4, rtol=1e-4)
    card = (out / "README.md").read_text()
    assert "`<local>/full`" in card and str(sft_runs["full"]) not in card  # the base is named, not its path


def copy_run(source: Path, to: Path, **model: str | None) -> Path:
    """A run dir whose model node differs from ``source``'s by ``model`` (its final/ linked, not copied)."""
    (to / ".hydra").mkdir(parents=True)
    (to / "final").symlink_to(source / "final")
    cfg = OmegaConf.load(source / ".hydra" / "config.yaml")
    cfg.model.update(model)
    OmegaConf.save(cfg, to / ".hydra" / "config.yaml")
    return to


def test_an_export_is_fit_for_a_hub(sft_runs, tmp_path) -> None:
    import os

    out = export(sft_runs["full"], tmp_path / "hub")
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert set(modes.values()) == {0o666 & ~umask}, modes  # 0644 under umask 022, weights included
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert not {"local_files_only", "is_local"} & set(tokenizer_config), tokenizer_config
    card = (out / "README.md").read_text()
    front = card.split("---")[1]
    assert "base_model" not in front  # a random-init local model has no hub id
    for local in (str(sft_runs["full"].parent), str(Path(__file__).resolve().parents[2])):
        assert local not in card, local
    from hydratune.components.commands.export import base_model_id, gguf_repo_id, model_card

    hub_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    hub = copy_run(sft_runs["full"], tmp_path / "from_hub", name_or_path=hub_id, init="pretrained")
    child = copy_run(sft_runs["full"], tmp_path / "child", from_run=str(hub))  # through model.from_run
    local = tmp_path / "downloaded"
    local.mkdir()
    (local / "README.md").write_text(f"---\nbase_model:\n- {hub_id}\nlicense: mit\n---\n# a card\n")
    from_local = copy_run(
        sft_runs["full"], tmp_path / "from_local", name_or_path=str(local), init="pretrained"
    )
    for run_dir in (hub, child, from_local):
        assert base_model_id(TrainedRun.open(run_dir)) == hub_id
    card = model_card(TrainedRun.open(child), torch.nn.Linear(2, 2), "float32")
    assert f"base_model: {hub_id}" in card.split("---")[1] and str(tmp_path) not in card
    from gguf import GGUFWriter

    gguf = tmp_path / "model.gguf"
    writer = GGUFWriter(str(gguf), "llama")
    writer.add_string("general.base_model.0.repo_url", f"https://huggingface.co/{hub_id}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_repo_id(gguf) == hub_id


def test_export_refusals_come_before_any_weight_is_read(sft_runs, tmp_path, monkeypatch) -> None:
    def no_load(*args, **kwargs):
        raise AssertionError("weights were read before the refusal")

    monkeypatch.setattr(TrainedRun, "load", no_load)
    existing = tmp_path / "taken"
    existing.mkdir()
    cases = [
        (sft_runs["full"], existing, "export.out"),  # never overwrites
        (sft_runs["lora_random"], None, "export"),  # adapter on a random-init base: nothing to merge into
        (tmp_path, None, "export"),  # not a run dir
    ]
    quantized = tmp_path / "qlora"
    (quantized / ".hydra").mkdir(parents=True)
    (quantized / "final").symlink_to(sft_runs["lora"] / "final")
    cfg = OmegaConf.load(sft_runs["lora"] / ".hydra" / "config.yaml")
    cfg.quantization = {"_target_": "hydratune.components.quantization.BitsAndBytes", "bits": 4}
    OmegaConf.save(cfg, quantized / ".hydra" / "config.yaml")
    cases.append((quantized, None, "export"))
    reward = tmp_path / "reward"
    (reward / ".hydra").mkdir(parents=True)
    (reward / "final").symlink_to(sft_runs["full"] / "final")
    cfg = OmegaConf.load(sft_runs["full"] / ".hydra" / "config.yaml")
    cfg.recipe._target_ = "hydratune.recipes.reward.Reward"
    OmegaConf.save(cfg, reward / ".hydra" / "config.yaml")
    cases.append((reward, None, "export"))
    messages = []
    for run_dir, out, key in cases:
        with pytest.raises(ConfigError) as err:
            export(run_dir, out)
        assert err.value.key == key, str(err.value)
        messages.append(str(err.value))
    assert "quantized base" in messages[3] and "precision" in messages[3]
    assert "randomly initialised" in messages[1]


# ---- recipe=generate ------------------------------------------------------------------------------------


def test_generate_from_an_adapter_run_uses_the_adapter_unmerged_and_samples(sft_runs, run_recipe) -> None:
    from peft import PeftModel

    from hydratune.components.runtime.inference import load_model

    ctx, metrics = run_recipe(
        *GENERATE,
        f"model.from_run={sft_runs['lora']}",
        "recipe.temperature=1.0",
        "recipe.num_return_sequences=3",
        "data.max_samples=7",
        name="gen_lora",
    )
    assert isinstance(load_model(ctx.components, "cpu"), PeftModel)
    out = read_jsonl(ctx.run_dir.path / "generations.jsonl")
    assert [(r["index"], r["sample"]) for r in out] == [(i, k) for i in range(7) for k in range(3)]
    assert len({r["completion"] for r in out}) > 7, "sampling drew the same completion for every sample"
    assert metrics["completions"] == 21


def test_generate_refuses_what_it_cannot_do_before_load(compose_cfg, sft_runs) -> None:
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    cases = [
        (["peft=lora"], "peft"),
        (["strategy=zero3"], "strategy"),
        (["recipe.num_return_sequences=2"], "recipe.num_return_sequences"),
        (["recipe.top_p=0"], "recipe.top_p"),
        (["recipe.output=../x.jsonl"], "recipe.output"),
    ]
    for overrides, key in cases:
        cfg = compose_cfg(*GENERATE, f"model.from_run={sft_runs['full']}", *overrides)
        with pytest.raises(ConfigError) as err:
            check_before_load(cfg, Components.from_config(cfg))
        assert err.value.key == key, str(err.value)
    cfg = compose_cfg("recipe=dpo", f"model.from_run={sft_runs['lora']}")  # training needs a whole model
    with pytest.raises(ConfigError, match="hydratune export") as err:
        check_before_load(cfg, Components.from_config(cfg))
    assert err.value.key == "model.from_run"


# ---- recipe=best_of_n -----------------------------------------------------------------------------------
def test_best_of_n_keeps_the_highest_reward_sample_and_writes_data_sft_and_dpo_read(
    sft_runs, run_recipe, compose_cfg
) -> None:
    from hydratune.components.rewards import length_penalty
    from hydratune.components.runtime.run import Components

    ctx, metrics = run_recipe(
        "recipe=best_of_n",
        f"model.from_run={sft_runs['full']}",
        "recipe.max_new_tokens=6",
        "recipe.num_return_sequences=4",
        "recipe.reward._target_=hydratune.components.rewards.length_penalty",
        "recipe.pairs=true",
        "data.max_samples=12",
        name="bon",
    )
    run = ctx.run_dir.path
    samples, best = read_jsonl(run / "samples.jsonl"), read_jsonl(run / "best_of_n.jsonl")
    prompts = read_jsonl(ASSETS / "demo/prompts_eval.jsonl")[:12]
    assert len(samples) == 48 and [s["sample"] for s in samples[:4]] == [0, 1, 2, 3]
    assert len(best) == 12 - metrics["prompts with only empty samples (no row)"] >= 6
    for row in best:
        i = next(i for i, p in enumerate(prompts) if p["prompt"] == row["messages"][:-1])
        mine = [s for s in samples if s["index"] == i]
        rewards = length_penalty(None, [s["completion"] for s in mine])  # scored again, independently
        assert [s["reward"] for s in mine] == pytest.approx(rewards)
        usable = [r for s, r in zip(mine, rewards, strict=True) if s["completion"].strip()]
        assert row["reward"] == pytest.approx(max(usable))
        winners = {s["completion"] for s, r in zip(mine, rewards, strict=True) if r == max(usable)}
        assert row["messages"][-1] == {"role": "assistant", "content": row["messages"][-1]["content"]}
        assert row["messages"][-1]["content"] in winners
    assert metrics["mean reward, best of 4"] > metrics["mean reward, first sample"]
    sft = Components.from_config(compose_cfg("data=jsonl_messages", f"data.path={run / 'best_of_n.jsonl'}"))
    assert len(sft.data.load()["train"]) + len(sft.data.load()["eval"]) == len(best)
    dpo = Components.from_config(compose_cfg("recipe=dpo", f"data.path={run / 'pairs.jsonl'}"))
    pairs = dpo.data.load()
    assert 0 < len(pairs["train"]) + len(pairs["eval"]) <= 12
    assert pairs.info["format"].startswith("explicit")


# ---- recipe=eval (lm-evaluation-harness) ----------------------------------------------------------------
EVAL = ["recipe=eval"]


def test_eval_scores_each_row_as_the_models_greedy_answer_and_writes_results_table_and_metrics(
    run_recipe, tmp_path
) -> None:
    """On a model that answers every sum 36 (SFT on the demo's train prompts, each answered 36, which the tiny
    model learns in a few steps where the sums take hundreds): 2 of the 64 eval sums right, the rest wrong.
    lm-eval's exact match per row is hydratune's own greedy answer (recipe=generate, unbatched) compared with
    the reference, so a broken filter, template, stop sequence or model (the base instead of the run's)
    changes the score."""
    from hydratune.components.generation.evaluation import normalise

    prompts = [r["messages"][0] for r in read_jsonl(ASSETS / "demo" / "sft_train.jsonl")[:64]]
    rows = [{"messages": [p, {"role": "assistant", "content": "36"}]} for p in prompts]
    (tmp_path / "36.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # 20 steps at lr 1e-2: measured, every answer "36" from 14 on (at 8 it has not learnt to stop yet)
    trained, _ = run_recipe(
        "data=jsonl_messages", f"data.path={tmp_path / '36.jsonl'}", "data.eval_size=4", "train.max_steps=20",
        "train.micro_batch_size=8", "optimizer.lr=1e-2", "scheduler=constant", "train.eval_every=0",
        "train.eval_generations=0", "train.save_every=0", name="answers_36",
    )  # fmt: skip
    ctx, scores = run_recipe(*EVAL, f"model.from_run={trained.run_dir.path}", "tracker=jsonl", name="eval")
    gen, _ = run_recipe(
        "recipe=generate",
        f"model.from_run={trained.run_dir.path}",
        "recipe.max_new_tokens=32",
        "recipe.batch_size=1",
        name="eval_gen",
    )
    run = ctx.run_dir.path
    answers = read_jsonl(gen.run_dir.path / "generations.jsonl")
    samples = sorted(read_jsonl(run / "lm_eval_samples.jsonl"), key=lambda s: s["doc_id"])
    assert [s["doc_id"] for s in samples] == list(range(64)) and len(answers) == 64
    for sample, answer in zip(samples, answers, strict=True):
        assert (
            sample["doc"]["prompt"][-1]["content"] == answer["prompt"]
            and sample["target"] == answer["reference"]
        )
        assert sample["filtered_resps"] == [answer["completion"].split("\n")[0].strip()], answer
        right = normalise(answer["completion"]) == normalise(answer["reference"])
        assert sample["exact_match"] == float(right), (sample, answer)
    score = sum(s["exact_match"] for s in samples) / 64
    assert 0 < score < 1, "the model answering 36 should get some sums right and some wrong"
    key = "lm_eval/hydratune_prompts/exact_match/strip"
    assert scores == {key: pytest.approx(score)}
    results = json.loads((run / "lm_eval_results.json").read_text())
    assert results["results"]["hydratune_prompts"]["exact_match,strip"] == pytest.approx(score)
    assert results["n-samples"]["hydratune_prompts"]["effective"] == 64
    summary = (run / "summary.md").read_text()
    assert f"| hydratune_prompts | exact_match | strip | {score:.4g} |" in summary
    logged = [r for r in read_jsonl(run / "metrics.jsonl") if key in r]
    tracked = [r for r in read_jsonl(run / "tracker.jsonl") if key in r]
    assert [r[key] for r in logged] == [r[key] for r in tracked] == [pytest.approx(score)]


def test_eval_before_training_and_from_an_adapter_run(sft_runs, run_recipe) -> None:
    """``model=`` alone scores the configured model (the untrained tiny model: no sum right); an adapter run
    is scored as trained (adapter on its rebuilt base, unmerged); ``recipe.limit`` caps the rows."""
    from peft import PeftModel

    from hydratune.components.runtime.inference import load_model

    _, before = run_recipe(*EVAL, "recipe.limit=8", name="eval_base")
    assert before == {"lm_eval/hydratune_prompts/exact_match/strip": 0.0}
    ctx, _ = run_recipe(*EVAL, f"model.from_run={sft_runs['lora']}", "recipe.limit=0.0625", name="eval_lora")
    assert isinstance(load_model(ctx.components, "cpu"), PeftModel)
    results = json.loads((ctx.run_dir.path / "lm_eval_results.json").read_text())
    assert results["n-samples"]["hydratune_prompts"] == {"original": 64, "effective": 4}
