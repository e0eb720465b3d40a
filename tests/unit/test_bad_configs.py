"""A matrix of invalid configurations: each fails before any model is loaded, naming the key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from hydratune.components.config.errors import ConfigError
from hydratune.components.runtime.checks import check_before_load
from hydratune.components.runtime.run import Components

EP = ["strategy=zero1", "strategy.ep_size=2", "launcher.nproc_per_node=2"]


@dataclasses.dataclass
class NotARecipe:
    """Takes recipe=sft's knobs, but is no ``@recipe``."""

    assistant_only_loss: bool = True
    completion_only_loss: bool = True
    loss_type: str = "nll"


@dataclasses.dataclass
class NoKnobs:
    """Takes none of recipe=sft's knobs."""


# (overrides, the key the error must name) — checked by components before a model is built
AFTER_COMPOSE = [
    (["strategy=zero3", "strategy.pp_size=2", "strategy.offload_param=cpu"], "strategy.offload_param"),
    (["strategy=zero2", "strategy.pp_size=2", "strategy.tp_size=2"], "strategy.tp_size"),
    (["strategy=fsdp", "strategy.pp_size=2", "strategy.cpu_offload=true"], "strategy.cpu_offload"),
    (["strategy=pipeline", "strategy.zero_stage=3", "strategy.tp_size=2"], "strategy.tp_size"),
    (
        ["strategy=zero1", "strategy.pp_size=2", "strategy.ep_size=2", "launcher.nproc_per_node=4"],
        "strategy.ep_size",
    ),
    (["strategy=single", "strategy.pp_size=2"], "strategy.pp_size"),  # single trains no stages
    (["strategy=ddp", "strategy.ep_size=2", "launcher.nproc_per_node=2"], "strategy.ep_size"),
    (["strategy=zero1", "strategy.schedule=gpipe"], "strategy.schedule"),  # a pipeline knob, no stages
    (["optimizer.lr=-1e-4"], "optimizer.lr"),
    (["optimizer.lr=0"], "optimizer.lr"),
    (["optimizer.weight_decay=-0.1"], "optimizer.weight_decay"),
    (["optimizer.betas=[0.9]"], "optimizer.betas"),
    (["optimizer.betas=[0.9,1.5]"], "optimizer.betas"),
    (["optimizer=sgd", "optimizer.momentum=0", "optimizer.nesterov=true"], "optimizer.nesterov"),
    (["train.micro_batch_size=0"], "train.micro_batch_size"),
    (["train.gradient_accumulation_steps=0"], "train.gradient_accumulation_steps"),
    (["train.epochs=0", "train.max_steps=-1"], "train.epochs"),
    (["train.keep_last=0"], "train.keep_last"),
    (["train.log_every=0"], "train.log_every"),
    (["train.eval_every=-5"], "train.eval_every"),
    (["train.max_grad_norm=-1"], "train.max_grad_norm"),
    (["scheduler.warmup_ratio=1.5"], "scheduler.warmup_ratio"),
    (["scheduler.warmup_steps=-1"], "scheduler.warmup_steps"),
    (["scheduler.kind=exponential"], "scheduler.kind"),
    (["scheduler.min_lr_ratio=2"], "scheduler.min_lr_ratio"),
    (["precision=fp16"], "precision"),
    (["precision.dtype=fp8"], "precision.dtype"),
    (["precision.tf32=true"], "precision.tf32"),
    (["merge=true"], "merge"),
    (["peft=prefix", "merge=false", "peft.num_virtual_tokens=4", "model.dtype=float8"], "model.dtype"),
    (["model.attn_implementation=flash"], "model.attn_implementation"),
    (["peft._target_=hydratune.components.peft.LoRAX"], "peft._target_"),  # a class path that is not there
    (["recipe._target_=tests.unit.test_bad_configs.NotARecipe", "trust_targets=true"], "recipe._target_"),
    (["recipe._target_=tests.unit.test_bad_configs.NoKnobs", "trust_targets=true"], "recipe._target_"),
    (["model.init=scratch"], "model.init"),
    (["model.name_or_path=/no/such/model"], "model.name_or_path"),
    (["model.padding_side=middle"], "model.padding_side"),
    (["data.path=/nonexistent.jsonl"], "data.path"),
    (["data.eval_path=/nonexistent.jsonl"], "data.eval_path"),
    (["data.path=README.md"], "data.path"),
    (["data.format=yaml"], "data.format"),
    (["data.max_length=0"], "data.max_length"),
    (["data.eval_fraction=1.0"], "data.eval_fraction"),
    (["data.on_error=ignore"], "data.on_error"),
    (["data.on_overlong=cut"], "data.on_overlong"),
    (["data.packing_strategy=ffd"], "data.packing_strategy"),
    (["peft=lora", "peft.target_modules=[nope_proj]"], "peft.target_modules"),
    (["peft=freeze", "peft.modules=[no_such_module]"], "peft.modules"),
    (["strategy.device=tpu"], "strategy.device"),
    (["strategy=ddp", "strategy.backend=carrier_pigeon"], "strategy.backend"),
    (["launcher.nproc_per_node=0"], "launcher.nproc_per_node"),
    (["launcher.nnodes=2", "launcher.node_rank=2"], "launcher.node_rank"),
    (["recipe.loss_type=mse"], "recipe.loss_type"),
    (["mode=deploy"], "mode"),
    (["+optimizer.lrr=1"], "optimizer.lrr"),
    (["+peft.rank=8"], "peft.rank"),
    (["+train.foo=1"], "train.foo"),
    (["recipe=ppo", "recipe.reward=null"], "recipe.reward"),
    (["recipe=grpo", "recipe.reward_funcs=[null]"], "recipe.reward_funcs"),
    (["recipe=grpo", "recipe.reward_funcs=null"], "recipe.reward_funcs"),
    (["recipe=eval", "recipe.tasks=[no_such_lm_eval_task]"], "recipe.tasks"),
    (["recipe=eval", "recipe.include_path=/nonexistent/tasks"], "recipe.include_path"),
    (["data.max_length=1"], "data.max_length"),
    (["data=jsonl_messages"], "data.path"),
    (["model.attn_implementation=flash_attention_2"], "model.attn_implementation"),
    (["train.max_steps=-2"], "train.max_steps"),
    (["optimizer.lr=nan"], "optimizer.lr"),
    (["optimizer.lr=inf"], "optimizer.lr"),
    (["train.max_grad_norm=nan"], "train.max_grad_norm"),
    (["train.max_grad_norm=inf"], "train.max_grad_norm"),
    (
        ["tracker=mlflow", "tracker.mlflow.tracking_uri=http://no-such-host.invalid:5000"],
        "tracker.mlflow.tracking_uri",
    ),
    (
        ["tracker=mlflow", "tracker.mlflow.tracking_uri=http://127.0.0.1:{closed_port}"],
        "tracker.mlflow.tracking_uri",
    ),
    (["model.name_or_path={empty_dir}"], "model.name_or_path"),
    # expert parallel (DeepSpeed AutoEP): only what is verified against one process
    *(
        ([*EP, *extra], key)
        for extra, key in (
            (["model=tiny"], "strategy.ep_size"),  # a dense model: no experts to split
            (["model=tiny_moe", "strategy.ep_size=3", "launcher.nproc_per_node=3"], "strategy.ep_size"),
            (["model=tiny_moe", "strategy=zero3"], "strategy.stage"),
            (["model=tiny_moe", "strategy.tp_size=2"], "strategy.ep_size"),
            (["model=tiny_moe", "peft=lora"], "peft"),
            (["model=tiny_moe", "optimizer=sgd"], "optimizer"),
            (["model=olmoe_1b_7b"], "strategy.ep_size"),  # experts not gathered back for this type
        )
    ),
    # tensor parallel on a mixture of experts: DeepSpeed AutoTP died ~4 min after load (issue 49)
    (
        ["model=tiny_moe", "strategy=zero1", "strategy.tp_size=2", "launcher.nproc_per_node=2"],
        "strategy.tp_size",
    ),
    (["tracker=wandb"], "tracker.wandb.mode"),  # no WANDB_API_KEY, no ~/.netrc, WANDB_MODE unset (see below)
    # resume=<bad path>: test_a_bad_resume_path_fails_before_load (resolved by the CLI after these checks)
]

# the eval split is computed when the data is read (before the model loads): checked by prepare_data
EMPTY_EVAL = [
    (["data.path={one_row}", "data.eval_fraction=0.05"], "data.eval_fraction"),
    (["data.eval_path=null", "data.eval_fraction=0", "train.eval_every=10"], "train.eval_every"),
]

# rejected by Hydra while composing: misspelt keys, wrong types, unknown options
AT_COMPOSE = [
    (["optimizer.lrr=1"], "lrr"),
    (["train.micro_batch_size=big"], "micro_batch_size"),
    (["train.seed=1.5"], "seed"),
    (["trian.seed=1"], "trian"),
    (["peft.r=8"], "r"),  # peft=none has no rank
    (["model=nope"], "model"),
    (["peft=qlora_xl"], "peft"),
]


@pytest.mark.parametrize(
    ("overrides", "key"), AFTER_COMPOSE, ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_invalid_config_fails_before_model_load(
    compose_cfg, no_model_load, places, overrides: list[str], key: str
) -> None:
    cfg = compose_cfg(*(o.format(**places) for o in overrides))
    with pytest.raises(ConfigError) as info:
        check_before_load(cfg, Components.from_config(cfg))
    assert info.value.key == key, str(info.value)
    assert info.value.hint or "one of" in str(info.value) or key in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "key"), EMPTY_EVAL, ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_an_empty_eval_split_fails_when_the_data_is_read(
    compose_cfg, no_model_load, places, overrides: list[str], key: str
) -> None:
    from hydratune.components.data.prepare import eval_every, prepare_data

    cfg = compose_cfg(*(o.format(**places) for o in overrides))
    comps = Components.from_config(cfg)
    check_before_load(cfg, comps)
    with pytest.raises(ConfigError) as info:
        prepare_data(comps.data, None, 0, eval_every(comps, cfg.train))
    assert info.value.key == key and info.value.hint, str(info.value)


@pytest.fixture
def no_model_load(monkeypatch) -> None:
    from hydratune.components.model import CausalLM

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(CausalLM, "build", no_load)


@pytest.fixture
def places(tmp_path: Path, monkeypatch) -> dict[str, str]:
    """Paths the cases name, and an environment without W&B credentials or offline mode."""
    import socket

    for var in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no.netrc"))
    (tmp_path / "empty").mkdir()
    one_row = tmp_path / "one.jsonl"
    row = {"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]}
    one_row.write_text(json.dumps(row) + "\n")
    with socket.socket() as probe:  # a port nothing listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return {"empty_dir": str(tmp_path / "empty"), "one_row": str(one_row), "closed_port": str(port)}


def test_wandb_with_a_key_or_offline_passes(compose_cfg, places, monkeypatch) -> None:
    for env in ({"WANDB_MODE": "offline"}, {"WANDB_API_KEY": "x" * 40}):
        with monkeypatch.context() as m:
            for name, value in env.items():
                m.setenv(name, value)
            Components.from_config(compose_cfg("tracker=wandb")).tracker.validate()
    Components.from_config(compose_cfg("tracker=wandb", "tracker.wandb.mode=offline")).tracker.validate()


def test_a_bad_resume_path_fails_before_load(compose_cfg, no_model_load, tmp_path: Path) -> None:
    """The CLI's last step before loading (train mode): resume= resolved and checked."""
    from hydratune.components.runtime.resume import resolve

    cfg = compose_cfg("resume=/nonexistent/run")
    check_before_load(cfg, Components.from_config(cfg))
    with pytest.raises(ConfigError) as info:
        resolve(cfg, tmp_path / "outputs" / "day" / "run")
    assert info.value.key == "resume" and info.value.hint, str(info.value)


@pytest.mark.parametrize(
    ("overrides", "needle"), AT_COMPOSE, ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_invalid_config_fails_at_compose(compose_cfg, overrides: list[str], needle: str) -> None:
    with pytest.raises((ConfigCompositionException, MissingConfigException)) as info:
        compose_cfg(*overrides)
    text = f"{info.value} {info.value.__cause__}"
    assert needle in text


def test_matrix_has_at_least_thirty_cases() -> None:
    assert len(AFTER_COMPOSE) + len(EMPTY_EVAL) + len(AT_COMPOSE) >= 30


def test_fp16_on_a_model_trained_in_bf16_is_warned(compose_cfg, monkeypatch) -> None:
    from transformers import LlamaConfig

    from hydratune.components.runtime.checks import warnings_for

    cfg = compose_cfg("precision=fp16")
    comps = Components.from_config(cfg)
    monkeypatch.setattr(type(comps.model), "load_config", lambda self: LlamaConfig(dtype="bfloat16"))
    assert any("trained in bf16" in note for note in warnings_for(cfg, comps, "cuda"))
    monkeypatch.setattr(type(comps.model), "load_config", lambda self: LlamaConfig(dtype="float32"))
    assert not any("trained in bf16" in note for note in warnings_for(cfg, comps, "cuda"))
