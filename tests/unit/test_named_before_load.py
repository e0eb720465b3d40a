"""The last tracebacks of issue 37, each now an error before load naming the key and the fix: an override
Hydra's grammar cannot read (with a quoting that reads back as the value meant), a model dir that needs
its own code, pickle weights that would run code, a misspelt reward function given as a ``_target_``."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from hydratune.components.commands.argv import compose_error, override_value
from hydratune.components.config.errors import ConfigError
from hydratune.components.modeling.model_dir import check_model_dir
from hydratune.components.runtime.run import Components


@pytest.mark.parametrize("value", ["/tmp/é/x.jsonl", '/tmp/a"b.jsonl', "/tmp/a#b'c.jsonl"])
def test_an_unreadable_value_is_named_with_a_quoting_that_reads_back(value: str) -> None:
    override = f"data.path={value}"
    with pytest.raises(OverrideParseException) as raised:
        OverridesParser.create().parse_overrides([override])
    err = compose_error(raised.value)
    assert err.key == "data.path" and override in str(err)
    suggested = re.search(r"'(data\.path=.*)'$", err.hint).group(1)  # what the hint says to type
    assert override_value(suggested) == value


def test_an_unclosed_list_is_named() -> None:
    with pytest.raises(OverrideParseException) as raised:
        OverridesParser.create().parse_overrides(["optimizer.lr=["])
    err = compose_error(raised.value)
    assert err.key == "optimizer.lr" and "close the list" in err.hint


class Planted:
    def __reduce__(self):  # unpickling this runs a command
        import os

        return (os.system, ("echo planted",))


def model_dir(tmp_path: Path, config: dict, weights: object | None = None, legacy: bool = False) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if weights is not None:
        with open(folder / "pytorch_model.bin", "wb") as f:
            if isinstance(weights, Planted):
                pickle.dump({"w": weights}, f)
            else:
                torch.save(weights, f, _use_new_zipfile_serialization=not legacy)
    return folder


def test_a_model_dir_with_its_own_code_needs_it_granted(tmp_path: Path) -> None:
    auto_map = {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XModel"}
    folder = model_dir(tmp_path, {"model_type": "x_custom", "auto_map": auto_map})
    with pytest.raises(ConfigError) as err:
        check_model_dir(
            folder, key="model.name_or_path", trust_remote_code=False, flag="model.trust_remote_code"
        )
    assert err.value.key == "model.trust_remote_code" and "configuration_x.py, modeling_x.py" in str(
        err.value
    )
    check_model_dir(folder, key="model.name_or_path", trust_remote_code=True, flag="model.trust_remote_code")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": auto_map}))
    check_model_dir(folder, key="k", trust_remote_code=False, flag="f")  # transformers has its own class


def test_remote_code_is_refused_in_plan_and_chat(tmp_path: Path, compose_cfg) -> None:
    from hydratune.components.commands.chat import load

    folder = model_dir(tmp_path, {"model_type": "x_custom", "auto_map": {"AutoConfig": "c.C"}})
    from hydratune.components.runtime.checks import check_before_load

    cfg = compose_cfg(f"model.name_or_path={folder}", "mode=plan")
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg))
    assert err.value.key == "model.trust_remote_code"
    with pytest.raises(ConfigError, match="needs its own code"):
        load(folder)


@pytest.mark.parametrize("legacy", [False, True])
def test_pickle_weights_are_checked_without_loading(tmp_path: Path, legacy: bool) -> None:
    good = model_dir(tmp_path, {"model_type": "llama"}, {"w": torch.ones(2)}, legacy=legacy)
    check_model_dir(good, key="k", trust_remote_code=False, flag="f")


def test_pickle_weights_that_would_run_code_are_named(tmp_path: Path, capfd) -> None:
    folder = model_dir(tmp_path, {"model_type": "llama"}, Planted())
    with pytest.raises(ConfigError) as err:
        check_model_dir(folder, key="model.from_run", trust_remote_code=False, flag="f")
    assert err.value.key == "model.from_run" and "pytorch_model.bin is not a weights-only" in str(err.value)
    assert "planted" not in capfd.readouterr().out  # never unpickled
    (folder / "model.safetensors").write_bytes(b"")  # safetensors present: the pickle is never read
    check_model_dir(folder, key="k", trust_remote_code=False, flag="f")


def test_a_misspelt_reward_target_is_named_at_its_key(compose_cfg) -> None:
    cfg = compose_cfg(
        "recipe=grpo",
        "recipe.reward_funcs=[{_target_: hydratune.components.rewards.exact_matchh, _partial_: true}]",
    )
    with pytest.raises(ConfigError) as err:
        Components.from_config(cfg)
    assert err.value.key == "recipe.reward_funcs[0]._target_"
    assert "did you mean exact_match" in str(err.value)


def test_missing_shards_of_a_sharded_checkpoint_are_named_before_load(tmp_path: Path, compose_cfg) -> None:
    """Issue 49: half the shards gone was named only after loading began; the index (written by the hub
    library's own sharded save, as save_pretrained writes it) is checked against the files present, in
    plan and chat alike."""
    import shutil

    from huggingface_hub import save_torch_state_dict

    from hydratune.components.commands.chat import load
    from tests.support.data import TINY

    folder = tmp_path / "sharded"
    shutil.copytree(TINY, folder)  # config.json + the tokenizer
    save_torch_state_dict({f"w{i}": torch.zeros(4096) for i in range(6)}, folder, max_shard_size="20KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) == 6 and (folder / "model.safetensors.index.json").is_file()
    check_model_dir(folder, key="model.name_or_path", trust_remote_code=False, flag="f")
    gone = shards[::2]
    for shard in gone:
        shard.unlink()
    model = Components.from_config(compose_cfg(f"model.name_or_path={folder}")).model
    with pytest.raises(ConfigError) as err:
        model.validate()
    assert err.value.key == "model.name_or_path"
    assert "missing 3 of the 6 weight shards model.safetensors.index.json names" in str(err.value)
    assert all(shard.name in str(err.value) for shard in gone)
    with pytest.raises(ConfigError, match="weight shards"):
        load(folder)
    for file in folder.glob("model*.safetensors*"):  # no weights at all: chat names that too
        file.unlink()
    with pytest.raises(ConfigError, match="holds no weight file") as err:
        load(folder)
    assert err.value.key == "chat"


def test_a_tokenizer_needing_its_own_code_is_refused_naming_trust_remote_code(
    tmp_path: Path, compose_cfg
) -> None:
    """Issue 49: a tokenizer_config.json whose auto_map names the dir's own tokenizer ended in transformers'
    ValueError (train, plan, chat); now a ConfigError naming model.trust_remote_code and the file, and the
    file never runs unasked."""
    import shutil

    from hydratune.components.commands.chat import load
    from hydratune.components.text.tokenizer import build_tokenizer
    from tests.support.data import TINY

    folder, marker = tmp_path / "custom_tok", tmp_path / "ran"
    shutil.copytree(TINY, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(
        auto_map={"AutoTokenizer": ["tokenization_x.XTokenizer", None]}, tokenizer_class="XTokenizer"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_x.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    for overrides in ([f"model.name_or_path={folder}", "model.init=random"], [f"model.tokenizer={folder}"]):
        model = Components.from_config(compose_cfg(*overrides)).model
        with pytest.raises(ConfigError) as err:
            model.validate()
        assert err.value.key == "model.trust_remote_code" and "(tokenization_x.py)" in str(err.value)
    with pytest.raises(ConfigError, match=r"tokenization_x\.py"):
        load(folder)
    with pytest.raises(ConfigError) as err:  # a hub id's (no dir to read first): transformers' own refusal
        build_tokenizer(str(folder))
    assert err.value.key == "model.trust_remote_code"
    assert not marker.exists()
