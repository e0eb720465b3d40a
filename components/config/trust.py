"""What a shared run dir, experiment file or checkpoint may make hydratune do: by default nothing but data.

- Checkpoints: before DeepSpeed or transformers open one on resume, every pickled file in it must load with
  ``torch.load(weights_only=True)`` allowing only the types such files hold (:func:`allowed_globals`),
  unless ``trust_checkpoints=true``. DeepSpeed unpickles its states with ``weights_only=False``: a planted
  ``__reduce__`` would run code.
- Configs: every ``_target_`` Hydra would instantiate must be hydratune's own (:data:`OWN`) or sit where a
  recipe names a reward function (:data:`REWARD_KNOBS`, as a partial that instantiation does not call),
  unless ``trust_targets=true``. A replayed run dir or an experiment file can set any key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.config.errors import ConfigError, yaml_error

PICKLED = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")  # torch.save / pickle output
# never unpickled on resume: transformers saves the TrainingArguments here but does not load them
NEVER_LOADED = ("training_args.bin",)
OWN = ("components.", "recipes.")  # hydratune's own _target_ namespaces
REWARD_KNOBS = ("recipe.reward", "recipe.reward_funcs")  # user-named reward functions (partials)
HYDRA_PLUGINS = ("hydra._internal.core_plugins.", "hydra_plugins.")  # installed launchers and sweepers


def allowed_globals() -> list[Any]:
    """The non-tensor types checkpoints legitimately hold (found by saving them; torch allows tensors,
    storages and plain containers itself): DeepSpeed ZeRO optimizer states hold the loss scaler (static, or
    dynamic under fp16 — ``CreateLossScaler``), ``ZeroStageEnum`` and ``fragment_address`` (parameter slice
    mappings); transformers' ``rng_state*.pth`` holds numpy's RNG state (transformers allows the same)."""
    import numpy as np

    allowed: list[Any] = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    core = getattr(np, "_core", None) or np.core
    allowed.append(core.multiarray._reconstruct)
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:  # no DeepSpeed: no DeepSpeed checkpoints to resume
        return allowed
    return [*allowed, LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def pickled_files(checkpoint: Path) -> list[Path]:
    """Every file under ``checkpoint`` that something would unpickle on resume."""
    return sorted(
        p for p in checkpoint.rglob("*") if p.is_file() and p.suffix in PICKLED and p.name not in NEVER_LOADED
    )


def load_safely(path: Path, allowed: list[Any]) -> None:
    """Unpickle ``path`` allowing tensors and ``allowed`` only (tensor data memory-mapped, not read)."""
    import torch

    with torch.serialization.safe_globals(allowed):
        try:
            torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err):
                raise
            torch.load(path, weights_only=True, map_location="cpu")  # an old, non-zip torch file


def check_checkpoint(checkpoint: Path, *, trusted: bool) -> None:
    """Refuse a checkpoint whose pickled files hold anything but tensors and :func:`allowed_globals`."""
    if trusted:
        return
    allowed = allowed_globals()
    for path in pickled_files(checkpoint):
        try:
            load_safely(path, allowed)
        except Exception as err:  # UnpicklingError for a forbidden global; anything else: not loadable
            raise ConfigError(
                f"{path} is not a plain checkpoint file: loading it could run code ({reason(err)})",
                key="trust_checkpoints",
                hint="resume only from checkpoints you trust; pass trust_checkpoints=true for your own",
            ) from None


def reason(err: Exception) -> str:
    """The line of torch's long weights-only error that names the refused global."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    return next((line for line in lines if "GLOBAL" in line), lines[0])[:200]


# ---- config targets ---------------------------------------------------------------------------------
def targets(node: Any, prefix: str = "") -> Iterator[tuple[str, str, bool]]:
    """``(key path, _target_, is partial)`` of every node with a ``_target_`` in a plain container."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield prefix or "<root>", str(node["_target_"]), bool(node.get("_partial_", False))
        for key, value in node.items():
            yield from targets(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from targets(value, f"{prefix}[{i}]")


def is_reward_knob(path: str) -> bool:
    return any(path == k or path.startswith((k + ".", k + "[")) for k in REWARD_KNOBS)


def check_targets(config: Any, *, trusted: bool) -> None:
    """Refuse a ``_target_`` outside :data:`OWN` unless it is a reward function partial in a recipe knob."""
    if trusted:
        return
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(config, (DictConfig, ListConfig)):
        config = OmegaConf.to_container(config, resolve=False)
    for path, target, partial in targets(config):
        if target.startswith(OWN) or (partial and is_reward_knob(path)):
            continue
        where = (
            "reward functions must be partials (_partial_: true)"
            if is_reward_knob(path)
            else ("only hydratune's own classes (components.*, recipes.*) and reward functions are built")
        )
        raise ConfigError(
            f"{path}._target_={target} is not one of hydratune's: {where}",
            key=f"{path}._target_",
            hint="if you wrote this config (or trust whoever did), pass trust_targets=true",
        )


def check_file(path: Path, *, trusted: bool) -> None:
    """A config file's ``_target_``s, read without composing: the task part as :func:`check_targets`,
    its ``hydra:`` node (callbacks, launcher, sweeper: built by Hydra before hydratune runs) hydratune's
    own or installed Hydra plugins only."""
    import yaml
    from omegaconf import OmegaConf

    try:
        loaded = OmegaConf.load(path)  # trusted or not: a malformed file is named with its line
    except yaml.YAMLError as err:
        raise yaml_error(err, path) from None
    if trusted:
        return
    config = OmegaConf.to_container(loaded, resolve=False)
    if not isinstance(config, dict):
        return
    hydra = config.pop("hydra", None)
    try:
        check_targets(config, trusted=False)
        for where, target, _ in targets(hydra or {}, "hydra"):
            if not target.startswith((*OWN, *HYDRA_PLUGINS)):
                raise ConfigError(
                    f"{where}._target_={target}: Hydra would build it before any check",
                    key=f"{where}._target_",
                    hint="if you wrote this config (or trust whoever did), pass trust_targets=true",
                )
    except ConfigError as err:
        raise ConfigError(f"{path}: {err.args[0]}", key=err.key, hint=err.hint) from None


def experiment_files(args: list[str]) -> list[Path]:
    """The files ``+experiment=<name>`` (a sweep: ``a,b``) names, in conf/ or a ``--config-dir``."""
    import conf

    dirs = [Path(conf.__file__).parent]
    for i, arg in enumerate(args):
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            dirs.append(Path(args[i + 1]))
        elif arg.startswith("--config-dir="):
            dirs.append(Path(arg.split("=", 1)[1]))
    names = [
        n for a in args if a.lstrip("+").startswith("experiment=") for n in a.split("=", 1)[1].split(",")
    ]
    found = [d.expanduser() / "experiment" / f"{n.strip()}.yaml" for n in names for d in dirs]
    return [f for f in found if f.is_file()]


def check_command(args: list[str]) -> None:
    """The experiment files a command line names (their ``hydra:`` nodes act before composition)."""
    trusted = "trust_targets=true" in args
    for path in experiment_files(args):
        check_file(path, trusted=trusted)
