"""No secret in clear in a file a run writes: the configs Hydra saves (``.hydra/hydra.yaml``,
``overrides.yaml``, a sweep's ``multirun.yaml``) pass through :func:`redacted` first.

``hydra.job.env_copy=[WANDB_API_KEY]`` copies the key's value into ``hydra.job.env_set``, and
``hydra.job.env_set.HF_TOKEN=…`` on the command line is an override: Hydra would write both into the run
dir. What is redacted (:data:`~hydratune.components.config.trust.REDACTED`): ``env_set`` entries whose
variable is a secret (:func:`~hydratune.components.config.trust.is_secret`), overrides whose key's last word
names a secret, and, in any text of the config, the value of every environment variable whose name says it is
a secret. The config in memory keeps its values (Hydra sets ``env_set`` from it); only what is written
changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hydratune.components.config.trust import REDACTED, is_secret, secret_name

SHORTEST = 6  # a secret's value shorter than this is not searched for in other text (it would match words)


def secret_values() -> list[str]:
    """The values of this process's environment variables named like secrets, longest first."""
    values = {v for k, v in os.environ.items() if secret_name(k) and len(v) >= SHORTEST}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, values: list[str]) -> str:
    for value in values:
        text = text.replace(value, REDACTED)
    return text


def redact_override(text: str, values: list[str]) -> str:
    """``key=value`` with the value redacted when the key's last word names a secret."""
    key, sep, value = text.partition("=")
    name = key.lstrip("+~").rsplit(".", 1)[-1]
    if sep and value and secret_name(name):
        return f"{key}={REDACTED}"
    return redact_text(text, values)


def redact_node(node: Any, values: list[str], path: str = "") -> Any:
    """A plain container with every secret redacted (see the module's docstring)."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            inner = f"{path}.{key}" if path else str(key)
            if path.endswith("env_set") and isinstance(value, str) and is_secret(str(key), value):
                out[key] = REDACTED
            else:
                out[key] = redact_node(value, values, inner)
        return out
    if isinstance(node, list):
        overrides = path.endswith(("overrides.task", "overrides.hydra")) or path == ""
        return [
            redact_override(v, values) if overrides and isinstance(v, str) else redact_node(v, values, path)
            for v in node
        ]
    if isinstance(node, str):
        return redact_text(node, values)
    return node


def redacted(cfg: Any) -> Any:
    """``cfg`` (a DictConfig, a ListConfig such as ``overrides.yaml``, or a plain container) as it may be
    written: a new config with every secret redacted, interpolations kept."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if not isinstance(cfg, (DictConfig, ListConfig)):
        return redact_node(cfg, secret_values())
    plain = OmegaConf.to_container(cfg, resolve=False)
    return OmegaConf.create(redact_node(plain, secret_values()), flags={"allow_objects": True})


@contextmanager
def redacted_saves() -> Iterator[None]:
    """Every config saved in this block writes :func:`redacted` configs: Hydra's ``.hydra/*.yaml`` (its
    ``_save_config``), a sweep's ``multirun.yaml`` and hydratune's own (``OmegaConf.save``)."""
    import hydra.core.utils as hydra_utils
    from omegaconf import OmegaConf

    original = OmegaConf.__dict__["save"]  # the staticmethod itself
    save_config = hydra_utils._save_config

    def save(config: Any, f: Any, resolve: bool = False) -> None:
        original.__func__(redacted(config), f, resolve=resolve)

    def hydra_save(cfg: Any, filename: str, output_dir: Any) -> None:
        save_config(redacted(cfg), filename, output_dir)

    OmegaConf.save = staticmethod(save)  # type: ignore[method-assign,assignment]
    hydra_utils._save_config = hydra_save
    try:
        yield
    finally:
        OmegaConf.save = original  # type: ignore[method-assign]
        hydra_utils._save_config = save_config
