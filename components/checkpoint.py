"""Checkpoints: finding the one to resume from, and writing the final model."""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_STEP = re.compile(r"checkpoint-(\d+)$")
COMPLETE = "hydratune_complete.json"  # written last, lists every file with its size
log = logging.getLogger("hydratune")


def mark_complete(checkpoint: Path, step: int) -> None:
    """Record that ``checkpoint`` is whole: the size of every file in it."""
    files = {
        str(p.relative_to(checkpoint)): p.stat().st_size
        for p in sorted(checkpoint.rglob("*"))
        if p.is_file() and p.name != COMPLETE
    }
    tmp = checkpoint / (COMPLETE + ".tmp")
    tmp.write_text(json.dumps({"step": step, "time": time.time(), "files": files}, indent=1))
    tmp.replace(checkpoint / COMPLETE)


def verify(checkpoint: Path) -> str | None:
    """None when ``checkpoint`` is whole, else what is wrong with it."""
    marker = checkpoint / COMPLETE
    if not marker.is_file():
        return "no completion marker (the save did not finish)"
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError):
        return "unreadable completion marker"
    for name, size in files.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were written"
    return None


def checkpoints_in(run_dir: Path, *, warn: bool = False) -> list[Path]:
    """Whole checkpoints of a run dir, oldest step first; broken ones are skipped (with a warning)."""
    found = []
    for path in (run_dir / "checkpoints").glob("checkpoint-*"):
        m = _STEP.search(path.name)
        if not (m and path.is_dir()):
            continue
        problem = verify(path)
        if problem is None:
            found.append((int(m.group(1)), path))
        elif warn:
            log.warning("skipping checkpoint %s: %s", path, problem)
    return [p for _, p in sorted(found)]


def latest_run_with_checkpoint(outputs_root: Path, exclude: Path) -> Path | None:
    """The most recently modified run dir under ``outputs_root`` (but ``exclude``) with a whole checkpoint."""
    runs = {
        ckpt.parent.parent
        for ckpt in outputs_root.glob("**/checkpoints/checkpoint-*")
        if ckpt.parent.parent.resolve() != exclude.resolve()
    }
    good = [run for run in runs if checkpoints_in(run)]
    return max(good, key=lambda p: p.stat().st_mtime) if good else None


def resolve_resume(resume: Any, run_dir: Path) -> str | None:
    """``resume``: false → None; true → the latest earlier run's last checkpoint; a path → its checkpoint.

    A checkpoint that is incomplete or damaged is skipped, with a warning, for the previous whole one.
    """
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
        return str(checkpoints_in(earlier, warn=True)[-1])
    path = Path(str(resume)).expanduser()
    if path.is_dir() and _STEP.search(path.name):
        problem = verify(path)
        if problem is None:
            return str(path)
        log.warning("skipping checkpoint %s: %s", path, problem)
        path = path.parent.parent
    good = checkpoints_in(path, warn=True) if path.is_dir() else []
    if good:
        return str(good[-1])
    raise ConfigError(
        f"nothing to resume from at {path}: no complete checkpoint there",
        key="resume",
        hint="pass a run dir (outputs/<date>/<time…>) or one of its checkpoints/checkpoint-N dirs",
    )


class AtomicCheckpoints:
    """Trainer mixin: each checkpoint is written into ``checkpoints/.staging`` and renamed into place
    only when whole, with a completion marker; keep-last-K then only ever counts whole checkpoints."""

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        from transformers.trainer_utils import rotate_checkpoints

        root = Path(self.args.output_dir)
        staging = root / ".staging"
        name = f"checkpoint-{self.state.global_step}"
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        self.args.output_dir = str(staging)
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
        finally:
            self.args.output_dir = str(root)
        self.accelerator.wait_for_everyone()  # every rank's shards are written
        if self.args.should_save:
            mark_complete(staging / name, self.state.global_step)
            target = root / name
            if target.exists():
                shutil.rmtree(target)
            (staging / name).rename(target)
            shutil.rmtree(staging, ignore_errors=True)
            rotate_checkpoints(
                output_dir=str(root), save_total_limit=self.args.save_total_limit, use_mtime=True
            )
        self.accelerator.wait_for_everyone()


def save_final(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out: Path,
    *,
    merge: bool = False,
    state_dict: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the final model as safetensors (the adapter alone for PEFT) and the tokenizer with its
    chat template; ``merge`` also writes ``merged/``, the adapter folded into the base weights.

    Writes into ``<out>.tmp`` and renames, so a crash never leaves a half-written ``final/``.
    """
    from components.peft import merge_and_unload

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    from components.strategy import ZERO_CHECKPOINT

    info: dict[str, Any] = {"path": str(out), "adapter_only": _is_peft(model)}
    if state_dict and ZERO_CHECKPOINT in state_dict:  # ZeRO-3 without gathering: consolidate offline
        zero = state_dict[ZERO_CHECKPOINT]
        command = f"python -m deepspeed.utils.zero_to_fp32 {zero} {out} --safe_serialization"
        tmp.mkdir(parents=True)
        model.config.save_pretrained(tmp)
        (tmp / "CONSOLIDATE.txt").write_text(
            f"The weights are in the DeepSpeed checkpoint {zero}:\n{command}\n"
        )
        info["consolidate with"] = command
    else:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)  # gathered if sharded
    tokenizer.save_pretrained(tmp)
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
