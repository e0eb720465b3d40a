"""``hydratune export``: a folder transformers loads as is, with the run's logits, template, stop tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from components.errors import ConfigError
from components.export import export
from components.trained import TrainedRun

STEPS = ["train.max_steps=2", "train.eval_generations=0", "train.save_every=0", "train.eval_every=0"]


def as_cli_run(ctx, overrides: list[str]) -> Path:
    """Give an in-process run the ``.hydra/`` files a CLI run has (its config and overrides)."""
    hydra_dir = ctx.run_dir.path / ".hydra"
    hydra_dir.mkdir(exist_ok=True)
    OmegaConf.save(ctx.cfg, hydra_dir / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), hydra_dir / "overrides.yaml")
    return ctx.run_dir.path


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A full SFT run, and a LoRA run on top of its final model (a base that can be rebuilt)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from tests.conftest import _run_in

    root = tmp_path_factory.mktemp("export")
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base=None):

        def run(*overrides: str, name: str) -> Path:
            fn = lambda *o: compose(config_name="config", overrides=list(o))  # noqa: E731
            ctx, _ = _run_in(root, fn, *STEPS, *overrides, name=name)
            return as_cli_run(ctx, list(overrides))

        full = run("optimizer.lr=3e-3", name="full")
        lora = run("peft=lora", f"model.from_run={full}", "peft.init_lora_weights=gaussian", name="lora")
        lora_random = run("peft=lora", name="lora_random")
    GlobalHydra.instance().clear()
    return {"full": full, "lora": lora, "lora_random": lora_random}


def test_export_of_a_full_run_loads_with_its_logits_template_and_stops(runs, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = export(runs["full"], tmp_path / "exported")
    exported = AutoModelForCausalLM.from_pretrained(out)
    final = AutoModelForCausalLM.from_pretrained(runs["full"] / "final")
    ids = torch.randint(0, final.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(logits(exported, ids), logits(final, ids))
    tok, trained_tok = (
        AutoTokenizer.from_pretrained(out),
        AutoTokenizer.from_pretrained(runs["full"] / "final"),
    )
    assert tok.chat_template == trained_tok.chat_template and tok.chat_template
    generation = GenerationConfig.from_pretrained(out)
    stops = (
        generation.eos_token_id if isinstance(generation.eos_token_id, list) else [generation.eos_token_id]
    )
    assert trained_tok.eos_token_id in stops and generation.pad_token_id == trained_tok.pad_token_id
    card = (out / "README.md").read_text()
    assert "hydratune optimizer.lr=3e-3" in card and f"hydratune replay {runs['full']}" in card
    assert "library_name: transformers" in card
    assert not list(tmp_path.glob("*.tmp")), "the staging dir was left behind"


def test_export_merges_an_adapter_into_its_base_with_the_adapters_logits(runs, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    run = TrainedRun.open(runs["lora"])
    assert run.kind == "adapter"
    adapter_model, _ = run.load()  # the adapter on its rebuilt base, not merged
    out = export(runs["lora"], tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    ids = torch.randint(0, merged.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    base = AutoModelForCausalLM.from_pretrained(runs["full"] / "final")
    assert not torch.allclose(logits(adapter_model, ids), logits(base, ids), atol=1e-4), (
        "the adapter did nothing"
    )
    torch.testing.assert_close(logits(merged, ids), logits(adapter_model, ids), atol=1e-4, rtol=1e-4)
    assert f"`{runs['full']}`" in (out / "README.md").read_text()  # the base model is named


def test_export_refusals_come_before_any_weight_is_read(runs, tmp_path, monkeypatch) -> None:
    def no_load(*args, **kwargs):
        raise AssertionError("weights were read before the refusal")

    monkeypatch.setattr(TrainedRun, "load", no_load)
    existing = tmp_path / "taken"
    existing.mkdir()
    cases = [
        (runs["full"], existing, "export.out"),  # never overwrites
        (runs["lora_random"], None, "export"),  # adapter on a random-init base: nothing to merge into
        (tmp_path, None, "export"),  # not a run dir
    ]
    quantized = tmp_path / "qlora"
    (quantized / ".hydra").mkdir(parents=True)
    (quantized / "final").symlink_to(runs["lora"] / "final")
    cfg = OmegaConf.load(runs["lora"] / ".hydra" / "config.yaml")
    cfg.quantization = {"_target_": "components.quantization.BitsAndBytes", "bits": 4}
    OmegaConf.save(cfg, quantized / ".hydra" / "config.yaml")
    cases.append((quantized, None, "export"))
    reward = tmp_path / "reward"
    (reward / ".hydra").mkdir(parents=True)
    (reward / "final").symlink_to(runs["full"] / "final")
    cfg = OmegaConf.load(runs["full"] / ".hydra" / "config.yaml")
    cfg.recipe._target_ = "recipes.reward.Reward"
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


def test_export_cli_writes_the_folder_and_names_errors_with_exit_2(runs, tmp_path) -> None:
    out = tmp_path / "cli"
    ok = subprocess.run(
        [sys.executable, "-m", "recipes", "export", str(runs["full"]), f"out={out}", "dtype=bfloat16"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    bad = subprocess.run(
        [sys.executable, "-m", "recipes", "export", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and "[export]" in bad.stderr and "Traceback" not in bad.stderr
