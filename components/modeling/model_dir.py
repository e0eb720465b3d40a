"""A local model dir checked before anything loads from it: a readable config.json, no code of its own
to run unless ``model.trust_remote_code=true`` was given, and pickle weights that torch's safe unpickler
accepts (the weights are not read: their pickle is, mapped onto the meta device)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from hydratune.components.config.errors import ConfigError

#: the weight files a model dir may hold (one of them: the dir has weights to load)
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.pt", "*.pth")
#: pickle files checked by the weights-only unpickler when the dir has no safetensors weights
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.pkl", "*.ckpt")


def weight_files(path: Path) -> list[str]:
    """The weight files in model dir ``path`` (sorted names; none for a file or a missing dir)."""
    if not path.is_dir():
        return []
    return sorted({f.name for pattern in WEIGHT_PATTERNS for f in path.glob(pattern) if f.is_file()})


def check_model_dir(path: Path, *, key: str, trust_remote_code: bool, flag: str) -> None:
    """ConfigError (``key``; ``flag``: the switch granting remote code) when ``path`` cannot load as it is."""
    try:
        config = json.loads((path / "config.json").read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{path / 'config.json'} cannot be read: {err}",
            key=key,
            hint="point it at a model dir written by save_pretrained (its config.json is a JSON object)",
        ) from None
    if not trust_remote_code:
        check_no_remote_code(path, config, key=flag)
        check_no_remote_tokenizer(path, key=flag)
    check_shards(path, key=key)
    check_pickle_weights(path, key=key)


def check_no_remote_tokenizer(path: Path, *, key: str) -> None:
    """A tokenizer whose ``tokenizer_config.json`` maps ``AutoTokenizer`` to the dir's own classes
    (``auto_map``) and names a ``tokenizer_class`` transformers does not have needs that code run (as
    transformers decides it): refused, naming the files, unless the user grants it (``key``)."""
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):  # none, or unreadable: the tokenizer's loader names it
        return
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    mapped = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else None
    if not mapped:
        return
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    name = config.get("tokenizer_class")
    known = isinstance(name, str) and any(
        tokenizer_class_from_name(n) is not None for n in (name, name.removesuffix("Fast"), f"{name}Fast")
    )
    if known:
        return
    modules = code_files(mapped)
    raise ConfigError(
        f"the tokenizer in {path} needs its own code to load ({', '.join(modules)}): transformers has no "
        f"tokenizer class '{name}'",
        key=key,
        hint=f"read that code, then pass {key}=true on the command line (code in a model dir never runs "
        "unasked), or point model.tokenizer at a tokenizer transformers builds itself",
    )


def check_shards(path: Path, *, key: str) -> None:
    """Every shard a sharded checkpoint's index names (``*.safetensors.index.json`` /
    ``pytorch_model.bin.index.json``: its ``weight_map``) is in the dir: a missing one is named here, not
    after loading began."""
    for index in sorted([*path.glob("*.safetensors.index.json"), *path.glob("*.bin.index.json")]):
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError("no weight_map object")
        except (OSError, ValueError, AttributeError) as err:
            raise ConfigError(
                f"{index} cannot be read as a sharded checkpoint's index: {err}",
                key=key,
                hint="copy the index again from where the model was saved (save_pretrained writes it)",
            ) from None
        shards = sorted({str(name) for name in weight_map.values()})
        missing = [name for name in shards if not (path / name).is_file()]
        if missing:
            shown = ", ".join(missing[:8]) + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else "")
            raise ConfigError(
                f"{path} is missing {len(missing)} of the {len(shards)} weight shards {index.name} names: "
                f"{shown}",
                key=key,
                hint="copy (or finish downloading) the missing shards into the dir, e.g. hf download "
                "<repo> --local-dir <dir>",
            )


def check_no_remote_code(path: Path, config: dict, *, key: str) -> None:
    """A config whose ``model_type`` transformers does not know and whose ``auto_map`` names the dir's own
    classes needs that code run: refused, naming the files, unless the user grants it."""
    auto_map = config.get("auto_map")
    if not auto_map:
        return
    from transformers import CONFIG_MAPPING

    if config.get("model_type") in CONFIG_MAPPING:
        return
    modules = code_files(auto_map)
    raise ConfigError(
        f"{path} needs its own code to load ({', '.join(modules)}): transformers has no "
        f"'{config.get('model_type')}' model",
        key=key,
        hint=f"read that code, then pass {key}=true on the command line (code in a model dir never runs "
        "unasked)",
    )


def check_pickle_weights(path: Path, *, key: str) -> None:
    """Pickle weights (used when there are no safetensors) must pass torch's ``weights_only`` unpickler:
    a pickle that would run code, or is not a checkpoint at all, is named here rather than after load."""
    if any(path.glob("*.safetensors")):
        return
    import pickle

    for file in sorted(p for pattern in PICKLE_WEIGHTS for p in path.glob(pattern)):
        if file.name == "training_args.bin":  # Trainer's settings, never loaded as weights
            continue
        try:
            with warnings.catch_warnings():  # the unpickler's notes on pickle protocols
                warnings.simplefilter("ignore")
                _load_meta(file)
        except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, OSError) as err:
            first = str(err).strip().split(". ")[0] if str(err).strip() else type(err).__name__
            raise ConfigError(
                f"{file} is not a weights-only checkpoint ({first}): loading it would unpickle objects "
                "other than tensors",
                key=key,
                hint="use a model dir with safetensors weights (save_pretrained(safe_serialization=True)), "
                "or remove the file if it is not yours",
            ) from None


def _load_meta(file: Path) -> None:
    """``file``'s pickle through torch's weights-only unpickler, its tensors on the meta device."""
    import torch

    try:
        torch.load(file, map_location="meta", weights_only=True, mmap=True)
    except RuntimeError as err:  # a legacy (not zip) checkpoint cannot be mapped: read it
        if "mmap" not in str(err):
            raise
        torch.load(file, map_location="meta", weights_only=True)


def code_files(auto_map: object) -> list[str]:
    """The ``.py`` files an ``auto_map`` points at (``module.Class`` or ``repo--module.Class``), sorted."""
    return sorted({str(v).split("--")[-1].rsplit(".", 1)[0] + ".py" for v in _flat(auto_map)})


def _flat(node: object) -> list[object]:
    if isinstance(node, dict):
        return [leaf for value in node.values() for leaf in _flat(value)]
    if isinstance(node, (list, tuple)):
        return [leaf for value in node for leaf in _flat(value)]
    return [node] if node else []
