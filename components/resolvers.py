"""OmegaConf resolvers used in the shipped configs."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from omegaconf import OmegaConf

ASSETS = Path(__file__).resolve().parent / "assets"


def asset(relative: str) -> str:
    """``${asset:demo/sft_train.jsonl}``: a file shipped inside the installed package."""
    return str(ASSETS / relative)


_RUN_TAG = f"{os.getpid() % 100000:05d}{secrets.token_hex(2)}"


def run_tag() -> str:
    """``${run_tag:}``: a per-process suffix, so two runs started in the same second never share a dir."""
    return _RUN_TAG


def register_resolvers() -> None:
    """Register hydratune's resolvers once per process."""
    for name, fn in {"asset": asset, "run_tag": run_tag}.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=True)
