"""Where a LoRA reward run loads for PPO and GRPO (issue 48), decided before any model loads: as an
adapter on the policy's own base (components/rl/reward_adapter.py) when it trained a LoRA adapter alone
(``recipe=reward peft=lora``), the policy trains a LoRA adapter too, nothing is sharded or quantized, and the
two bases are the same weights (a digest of their safetensors files, not their names); else as a separate
model. ``mode=plan`` and the estimate say which.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Placement:
    """Where a reward model loads: ``shared`` (an adapter on the policy's base) or a separate model; why."""

    shared: bool
    why: str

    def describe(self, path: str) -> str:
        where = "a LoRA adapter on the policy's base" if self.shared else "a separate model"
        return f"reward model {path}: {where} ({self.why})"


def weights_digest(files: list[Path]) -> str | None:
    """SHA-256 over weight files' bytes (in the order given), None when there are none."""
    if not files:
        return None
    return _digest(tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))


@lru_cache(maxsize=8)
def _digest(files: tuple[tuple[str, int, int], ...]) -> str:
    """The digest of the files' bytes, once per (path, size, mtime) set."""
    sha = hashlib.sha256()
    for name, _, _ in files:
        with open(name, "rb") as handle:
            sha.update(hashlib.file_digest(handle, "sha256").digest())
    return sha.hexdigest()


def adapter_params(final: Path) -> int:
    """The parameters an adapter dir holds (LoRA matrices, saved heads), read from the file's header."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(final / "adapter_model.safetensors"), framework="pt") as handle:
        for name in handle.keys():  # noqa: SIM118 (safe_open is no mapping)
            shape = handle.get_slice(name).get_shape()
            total += math.prod(shape)
    return total


def base_files(model: Any) -> list[Path] | None:
    """The files a model component loads its base weights from: a local dir's ``*.safetensors`` (sorted), or
    its GGUF file; None for a hub id or random init (nothing on disk to compare)."""
    if model.init == "random" or not model.is_local:
        return None
    folder = Path(model.name_or_path).expanduser().resolve()
    if model.gguf_file:
        return [folder / model.gguf_file]
    return sorted(folder.glob("*.safetensors"))


def placement(path: str, comps: Any) -> Placement:
    """Whether the reward run at ``path`` loads as an adapter on the policy's base, and why (no weights read
    but the two bases' weight files, hashed)."""
    import json

    from hydratune.components.rewards import adapter_run

    run = adapter_run(path)
    if run is None:
        return Placement(False, "it is a whole model, not an adapter alone")
    if not comps.peft.lora_adapter:
        return Placement(False, "the policy trains no LoRA adapter (peft=lora shares its base)")
    if json.loads((run.final / "adapter_config.json").read_text()).get("peft_type") != "LORA":
        return Placement(False, "the reward run's adapter is not LoRA")
    if comps.strategy.shards_parameters:
        why = f"under {comps.strategy.label} the base is sharded and its adapters are not switched there"
        return Placement(False, f"{why}; strategy=zero2 or ddp shares it")
    if comps.quantization.enabled or run.quantized:
        return Placement(False, "a quantized base (QLoRA) is not shared")
    base = run.base_component()
    policy_files, reward_files = base_files(comps.model), base_files(base)
    for whose, files in (("the policy's", policy_files), ("the reward run's", reward_files)):
        if not files:
            why = f"{whose} base has no weight files on disk (a hub id or random init): not compared"
            return Placement(False, why)
    mine, theirs = weights_digest(policy_files), weights_digest(reward_files)
    if mine != theirs:
        where = f"{base.name_or_path} vs {comps.model.name_or_path}"
        return Placement(False, f"its base weights differ from the policy's ({where})")
    return Placement(True, f"its base weights are the policy's: sha256 {mine[:12]}")


#: why Best-of-N's scorer loads as a separate model, whatever the run (issue 48)
SEPARATE_WHY = {
    "best_of_n": "it scores once every sample is drawn and the policy is freed: the two are never held "
    "together, so sharing the base would save no memory",
}


def separate(recipe: str, path: str) -> str:
    """The plan's and summary's line for a reward model ``recipe`` loads separately, and why."""
    return Placement(False, SEPARATE_WHY[recipe]).describe(path)
