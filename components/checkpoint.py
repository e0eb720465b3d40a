"""Checkpoints: finding the one to resume from, and writing the final model."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_STEP = re.compile(r"checkpoint-(\d+)$")


def is_complete(checkpoint: Path) -> bool:
    """A checkpoint the trainer finished writing (its trainer state is written last)."""
    return (checkpoint / "trainer_state.json").is_file()


def checkpoints_in(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run dir, oldest step first."""
    found = []
    for path in (run_dir / "checkpoints").glob("checkpoint-*"):
        m = _STEP.search(path.name)
        if m and path.is_dir() and is_complete(path):
            found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


def latest_run_with_checkpoint(outputs_root: Path, exclude: Path) -> Path | None:
    """The most recently modified run dir under ``outputs_root`` (but ``exclude``) with a checkpoint."""
    runs = [
        ckpt.parent.parent
        for ckpt in outputs_root.glob("**/checkpoints/checkpoint-*")
        if ckpt.parent.parent.resolve() != exclude.resolve() and is_complete(ckpt)
    ]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def resolve_resume(resume: Any, run_dir: Path) -> str | None:
    """``resume``: false → None; true → the latest earlier run's last checkpoint; a path → its checkpoint."""
    if resume in (False, None, "false", "False"):
        return None
    if resume in (True, "true", "True", "latest"):
        # run dirs live at <outputs>/<date>/<time…>: look across the whole outputs tree
        root = run_dir.parent.parent
        earlier = latest_run_with_checkpoint(root, exclude=run_dir)
        if earlier is None:
            raise ConfigError(
                f"resume=true but no earlier run under {root} has a complete checkpoint",
                key="resume",
                hint="set train.save_every>0 so runs write checkpoints, or pass resume=<run dir>",
            )
        return str(checkpoints_in(earlier)[-1])
    path = Path(str(resume)).expanduser()
    if path.is_dir() and is_complete(path):
        return str(path)
    if path.is_dir() and checkpoints_in(path):
        return str(checkpoints_in(path)[-1])
    raise ConfigError(
        f"nothing to resume from at {path}: not a complete checkpoint nor a run dir holding one",
        key="resume",
        hint="pass a run dir (outputs/<date>/<time…>) or one of its checkpoints/checkpoint-N dirs",
    )


def save_final(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out: Path,
    *,
    merge: bool = False,
) -> dict[str, Any]:
    """Write the final model as safetensors (the adapter alone for PEFT) and the tokenizer with its
    chat template; ``merge`` also writes ``merged/``, the adapter folded into the base weights.

    Writes into ``<out>.tmp`` and renames, so a crash never leaves a half-written ``final/``.
    """
    from components.peft import merge_and_unload

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    info: dict[str, Any] = {"path": str(out), "adapter_only": _is_peft(model)}
    if merge:
        merged = merge_and_unload(model)
        merged.save_pretrained(tmp / "merged", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "merged")
        info["merged"] = str(out / "merged")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return info


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)
