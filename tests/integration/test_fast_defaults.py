"""Issue 6's fast defaults: bf16 frozen base under adapters, token counts read at log steps only, a
non-finite loss stopping the run by name, dataloader and Liger / compile settings per device."""

from __future__ import annotations

import pytest
import torch

from hydratune.components.config.errors import ConfigError
from hydratune.components.memory.spec import spec_from_config
from hydratune.components.model import CausalLM
from hydratune.components.runtime.run import dataloader_args
from hydratune.components.runtime.trainer_hooks import DeferredTokenCount

SHORT = ["train.max_steps=4", "train.micro_batch_size=8", "data.max_samples=64", "train.eval_generations=0"]


# ---- bf16 frozen base under adapters -------------------------------------------------------------
@pytest.mark.parametrize(
    ("dtype", "precision", "frozen", "expected"),
    [
        ("auto", "bf16", True, "bfloat16"),  # the fast default: adapter on a bf16 base
        ("auto", "bf16", False, "float32"),  # full fine-tune keeps fp32 master weights
        ("auto", "fp32", True, "float32"),
        ("auto", "fp16", True, "float32"),  # not measured as a win; fp16 bases overflow more easily
        ("float32", "bf16", True, "float32"),  # the off switch
        ("bfloat16", "fp32", False, "bfloat16"),  # an explicit dtype always wins
    ],
)
def test_weight_dtype_rule(dtype: str, precision: str, frozen: bool, expected: str) -> None:
    assert CausalLM(name_or_path="x", dtype=dtype).weight_dtype(precision, frozen_base=frozen) == expected


def test_lora_under_bf16_trains_fp32_adapters_on_a_bf16_base(run_recipe) -> None:
    ctx, _ = run_recipe(*SHORT, "peft=lora", "precision=bf16", name="lora_bf16")
    params = dict(ctx.model.named_parameters())
    lora = {k: p for k, p in params.items() if "lora_" in k}
    base = {k: p for k, p in params.items() if "lora_" not in k}
    assert lora and all(p.dtype == torch.float32 and p.requires_grad for p in lora.values())
    assert base and all(p.dtype == torch.bfloat16 and not p.requires_grad for p in base.values())
    assert any(p.abs().sum() > 0 for k, p in lora.items() if "lora_B" in k), "the adapter did not train"
    losses = [r["loss"] for r in ctx.run_dir.read_metrics() if "loss" in r]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    assert "trained float32, frozen bfloat16" in (ctx.run_dir.path / "summary.md").read_text()


def test_estimate_follows_the_weight_dtype_rule(compose_cfg) -> None:
    def weight_bytes(*overrides: str) -> int:
        return spec_from_config(compose_cfg("model=llama3_2_1b", *overrides)).weight_bytes

    assert weight_bytes("peft=lora", "precision=bf16") == 2
    assert weight_bytes("peft=lora", "precision=bf16", "model.dtype=float32") == 4
    assert weight_bytes("peft=lora", "precision=fp32") == 4
    assert weight_bytes("peft=none", "precision=bf16") == 4
    assert weight_bytes("peft=lora", "precision=bf16", "strategy=fsdp") == 4


def test_every_peft_option_gets_the_estimate_and_the_load_the_same_weight_dtype(compose_cfg) -> None:
    """The estimate asks each PEFT option what ``Session`` asks before loading (``base_loads_in_half``): a
    bf16 base exactly under the options that freeze it."""
    from hydra.utils import instantiate

    from hydratune.components.config.options import options

    for name in options("peft"):
        cfg = compose_cfg("model=llama3_2_1b", f"peft={name}", "precision=bf16")
        frozen = instantiate(cfg.peft).freezes_base
        assert spec_from_config(cfg).weight_bytes == (2 if frozen else 4), name
        assert instantiate(cfg.model).weight_dtype("bf16", frozen_base=frozen) == (
            "bfloat16" if frozen else "float32"
        )


# ---- token counting without a per-step sync --------------------------------------------------------
class _State:
    num_input_tokens_seen = 0


class _Accelerator:
    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.reshape(1)


class _Trainer:
    """The slice of HF's Trainer the mixin overrides."""

    def __init__(self, mode: str) -> None:
        self.args = type("Args", (), {"include_num_input_tokens_seen": mode})()
        self.state, self.accelerator = _State(), _Accelerator()
        self.processing_class = type("Tok", (), {"pad_token_id": 0})()
        self.logged: list[int] = []

    def log(self, logs: dict, *args: object) -> None:
        self.logged.append(self.state.num_input_tokens_seen)

    def _save_checkpoint(self, *args: object) -> str:
        return "saved"


class _Counting(DeferredTokenCount, _Trainer):
    pass


def test_token_count_is_read_only_at_log_and_save_steps() -> None:
    trainer = _Counting("non_padding")
    padded = {
        "input_ids": torch.tensor([[5, 6, 7], [5, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
    }
    padding_free = {
        "input_ids": torch.tensor([[5, 6, 7, 8, 9]]),
        "position_ids": torch.tensor([[0, 1, 2, 0, 1]]),
    }
    no_mask = {"input_ids": torch.tensor([[5, 6, 0, 0]])}
    for batch in (padded, padding_free, no_mask):
        trainer._track_num_input_tokens(batch)
    assert trainer.state.num_input_tokens_seen == 0  # nothing read back yet
    trainer.log({})
    assert trainer.logged == [4 + 5 + 2]
    trainer._track_num_input_tokens(padded)
    assert trainer._save_checkpoint() == "saved"
    assert trainer.state.num_input_tokens_seen == 15  # the checkpointed state includes every step


def test_token_count_all_tokens_and_off() -> None:
    batch = {"input_ids": torch.tensor([[5, 0, 0]]), "attention_mask": torch.tensor([[1, 0, 0]])}
    every = _Counting("all")
    every._track_num_input_tokens(batch)
    every.log({})
    off = _Counting("no")
    off._track_num_input_tokens(batch)
    off.log({})
    assert (every.state.num_input_tokens_seen, off.state.num_input_tokens_seen) == (3, 0)


def test_tokens_seen_reach_the_metrics(run_recipe) -> None:
    ctx, _ = run_recipe(*SHORT, "train.max_steps=3", name="tokens")
    seen = [r["num_input_tokens_seen"] for r in ctx.run_dir.read_metrics() if "loss" in r]
    assert len(seen) == 3 and 0 < seen[0] < seen[1] < seen[2]  # counted every step, reported per log


def test_count_tokens_false_holds_under_padding_free_batches(run_recipe) -> None:
    ctx, _ = run_recipe(*SHORT, "train.max_steps=2", "train.count_tokens=false", name="no_tokens")
    assert ctx.cfg.data.padding_free
    assert not any("num_input_tokens_seen" in r for r in ctx.run_dir.read_metrics())


# ---- non-finite loss -------------------------------------------------------------------------------
def test_a_nan_loss_stops_the_run_naming_the_key_before_saving(run_recipe, tmp_path) -> None:
    with pytest.raises(ConfigError, match="diverged") as err:
        run_recipe(*SHORT, "train.max_steps=12", "optimizer.lr=1e12", "train.save_every=1", name="nan")
    assert err.value.key == "optimizer.lr" and "lower optimizer.lr (it is 1e+12)" in str(err.value)
    step = err.value.step  # type: ignore[attr-defined]
    assert 1 <= step < 12
    saved = {p.name for p in (tmp_path / "outputs" / "day" / "nan" / "checkpoints").glob("checkpoint-*")}
    assert f"checkpoint-{step}" not in saved  # the diverged weights were never written


def test_skip_nonfinite_loss_restores_hfs_filter(compose_cfg, tmp_path) -> None:
    from hydratune.components.runtime.run import Components, RunContext
    from hydratune.components.runtime.rundir import RunDir

    for value, expected in (("false", False), ("true", True)):
        cfg = compose_cfg(f"train.skip_nonfinite_loss={value}")
        ctx = RunContext(cfg, Components.from_config(cfg), RunDir(tmp_path / value), "cpu")
        assert ctx.training_args()["logging_nan_inf_filter"] is expected


# ---- dataloader, Liger, compile per device --------------------------------------------------------
def test_dataloader_defaults_per_device() -> None:
    assert dataloader_args(None, "cpu") == {
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
        "dataloader_persistent_workers": False,
    }
    assert dataloader_args(None, "cuda") == {
        "dataloader_num_workers": 2,
        "dataloader_pin_memory": True,
        "dataloader_persistent_workers": True,
    }
    assert dataloader_args(0, "cuda")["dataloader_num_workers"] == 0


def test_liger_is_auto_on_cuda_only_and_explicit_requests_are_checked(monkeypatch) -> None:
    import importlib.util

    model = CausalLM(name_or_path="x")
    installed = importlib.util.find_spec("liger_kernel") is not None
    assert model.training_args("cpu")["use_liger_kernel"] is False
    assert model.training_args("cuda")["use_liger_kernel"] is installed
    with pytest.raises(ConfigError, match="Triton GPU kernels") as err:
        CausalLM(name_or_path="x", liger=True).use_liger("cpu")
    assert err.value.key == "model.liger"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match="not installed") as err:
        CausalLM(name_or_path="x", liger=True).use_liger("cuda")
    assert "hydratune[liger]" in str(err.value)
    assert CausalLM(name_or_path="x", liger=False).use_liger("cuda") is False


def test_compile_settings_reach_the_trainer_and_bad_modes_fail() -> None:
    assert CausalLM(name_or_path="x").training_args("cuda")["torch_compile"] is False
    args = CausalLM(name_or_path="x", compile=True, compile_mode="max-autotune").training_args("cuda")
    assert args["torch_compile"] is True and args["torch_compile_mode"] == "max-autotune"
    with pytest.raises(ConfigError, match="compile_mode") as err:
        CausalLM(name_or_path="x", compile_mode="fastest").validate()
    assert "reduce-overhead" in str(err.value)


@pytest.mark.parametrize("on", [False, True])
def test_gradient_checkpointing_follows_the_model_config(run_recipe, on: bool) -> None:
    """TRL's configs default to checkpointing on; hydratune must do what model.gradient_checkpointing says."""
    ctx, _ = run_recipe(*SHORT, "train.max_steps=1", f"model.gradient_checkpointing={on}", name=f"gc_{on}")
    assert ctx.model.is_gradient_checkpointing is on


# ---- start-up: no full garbage collections while importing and building ---------------------------
def test_collector_pause_freeze_and_hand_back(monkeypatch) -> None:
    import gc

    from hydratune.components.runtime import startup

    gc.unfreeze()  # the collector as a process starts it (not as tests/conftest.py leaves it)
    monkeypatch.setenv("HYDRATUNE_PAUSE_GC", "0")  # the off switch
    startup.pause_gc()
    assert gc.isenabled()
    monkeypatch.delenv("HYDRATUNE_PAUSE_GC")

    assert gc.isenabled()
    startup.training_starts()  # never paused (a notebook, a test): nothing happens
    assert gc.isenabled() and gc.get_freeze_count() == 0
    try:
        startup.pause_gc()
        assert not gc.isenabled()
        startup.training_starts()
        assert gc.isenabled() and gc.get_freeze_count() > 0  # survivors of start-up in the permanent gen
    finally:
        startup.run_ends()
    assert gc.isenabled() and gc.get_freeze_count() == 0  # collectable again: a sweep's next job


def test_the_cli_runs_no_full_collection_before_training(tmp_path, monkeypatch) -> None:
    """The CLI pauses the collector until training starts (importing torch & co. otherwise triggers full
    sweeps of ~0.2 s each), then freezes the survivors so the Trainer's own gc.collect is cheap, and
    leaves collection on and nothing frozen when the run is over."""
    import gc

    import hydratune.components.runtime.startup
    from hydratune.recipes.cli import main

    full, seen = [], {}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append("before training" if "frozen" not in seen else "training")

    def training_starts() -> None:
        seen["enabled before"] = gc.isenabled()
        original()
        seen["frozen"] = gc.get_freeze_count()

    original = hydratune.components.runtime.startup.training_starts
    monkeypatch.setattr(hydratune.components.runtime.startup, "training_starts", training_starts)
    gc.unfreeze()  # the collector as a process starts it (not as tests/conftest.py leaves it)
    gc.callbacks.append(on_gc)
    try:
        main([*SHORT, "train.write_plots=false", f"hydra.run.dir={tmp_path / 'run'}"])
    finally:
        gc.callbacks.remove(on_gc)
    assert seen["enabled before"] is False and seen["frozen"] > 0
    assert full.count("before training") == 1  # only the deliberate one, as training starts
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert (tmp_path / "run" / "final").is_dir()
    with pytest.raises(SystemExit):  # a bad key: the collector is back on all the same
        main(["optimizer.lr=-1", f"hydra.run.dir={tmp_path / 'bad'}"])
    assert gc.isenabled()
