"""Checkpoints: finding the one to resume from, and writing the final model."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.files import inside, mismatch, sha256s
from hydratune.components.data.fingerprint import DATA_FINGERPRINT

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_STEP = re.compile(r"checkpoint-(\d+)$")
COMPLETE = "hydratune_complete.json"  # written last: every file's size and sha256, the data fingerprint
log = logging.getLogger("hydratune")


def mark_complete(checkpoint: Path, step: int, run_dir: Path | None = None) -> None:
    """Record that ``checkpoint`` is whole: the size and sha256 of every file in it (read back right after
    they were written, so from the page cache), and the data fingerprint of ``run_dir`` when it has one.
    Called by rank 0 after every rank saved its part (DeepSpeed's ``global_step*`` shards included)."""
    paths = [p for p in sorted(checkpoint.rglob("*")) if p.is_file() and p.name != COMPLETE]
    names = [str(p.relative_to(checkpoint)) for p in paths]
    record: dict[str, Any] = {
        "step": step,
        "time": time.time(),
        "files": {n: p.stat().st_size for n, p in zip(names, paths, strict=True)},
        "sha256": dict(zip(names, sha256s(paths), strict=True)),
    }
    fingerprint = run_dir / DATA_FINGERPRINT if run_dir is not None else None
    if fingerprint is not None and fingerprint.is_file():
        record["data"] = json.loads(fingerprint.read_text())
    tmp = checkpoint / (COMPLETE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(checkpoint / COMPLETE)


def manifest(checkpoint: Path) -> dict[str, Any] | None:
    """What :func:`mark_complete` recorded (None: no marker or an unreadable one)."""
    try:
        record = json.loads((checkpoint / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("files"), dict) else None


def verify(checkpoint: Path, *, content: bool = False) -> str | None:
    """None when ``checkpoint`` is whole, else what is wrong with it: every listed file present with its
    size; ``content``: and its sha256 (a checkpoint written before checksums is checked by size only)."""
    if not (checkpoint / COMPLETE).is_file():
        return "no completion marker (the save did not finish)"
    record = manifest(checkpoint)
    if record is None:
        return "unreadable completion marker"
    for name, size in record["files"].items():
        try:
            path = inside(checkpoint, name)
        except ValueError as err:
            return str(err)
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were written"
    return mismatch(checkpoint, record.get("sha256") or {}) if content else None


def has_checksums(checkpoint: Path) -> bool:
    """Whether the checkpoint's marker records a sha256 per file (checkpoints of older hydratune do not)."""
    return bool((manifest(checkpoint) or {}).get("sha256"))


def checkpoints_in(run_dir: Path, *, warn: bool = False) -> list[Path]:
    """Checkpoints of a run dir whose files are all there with their sizes, oldest step first; broken ones
    are skipped (with a warning). Cheap: the content checks are :func:`newest_whole`'s."""
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


def whole(checkpoint: Path) -> bool:
    """``checkpoint`` passes every check, content included (a warning names what fails; a note says when
    it predates checksums and only sizes could be checked)."""
    problem = verify(checkpoint, content=True)
    if problem is not None:
        log.warning("skipping checkpoint %s: %s; trying the previous one", checkpoint, problem)
        return False
    if not has_checksums(checkpoint):
        log.warning("checkpoint %s predates checksums: only its files' sizes were checked", checkpoint)
    return True


def newest_whole(run_dir: Path) -> Path | None:
    """The newest checkpoint of ``run_dir`` that passes every check (None when none does)."""
    return next((p for p in reversed(checkpoints_in(run_dir, warn=True)) if whole(p)), None)


def resolve_resume(resume: Any) -> str | None:
    """``resume``: false → None; a run dir → its newest whole checkpoint; a checkpoint dir → itself.

    A checkpoint that is incomplete or damaged (a file missing, truncated, or with other bytes than were
    written) is skipped, with a warning naming the file, for the previous whole one of its run.
    ``resume=true`` (which earlier run?) is components/runtime/resume.py's to decide.
    """
    if resume in (False, None, "false", "False"):
        return None
    if resume in (True, "true", "True", "latest"):
        raise ValueError(
            "resume=true names no path: hydratune.components.runtime.resume.resolve picks the run"
        )
    path = Path(str(resume)).expanduser()
    if path.is_dir() and _STEP.search(path.name):
        if whole(path):
            return str(path)
        path = path.parent.parent
    good = newest_whole(path) if path.is_dir() else None
    if good is not None:
        return str(good)
    raise ConfigError(
        f"nothing to resume from at {path}: no whole checkpoint there",
        key="resume",
        hint="pass a run dir (outputs/<date>/<time…>) or one of its checkpoints/checkpoint-N dirs",
    )


def save_final(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out: Path,
    *,
    merge: bool = False,
    state_dict: dict[str, Any] | None = None,
    processor: Any = None,
) -> dict[str, Any]:
    """Write the final model as safetensors (the adapter alone for PEFT) and the tokenizer with its
    chat template (a vision-language model's ``processor`` too); ``merge`` also writes ``merged/``, the
    adapter folded into the base weights.

    Writes into ``<out>.tmp`` and renames, so a crash never leaves a half-written ``final/``.
    """
    from hydratune.components.peft import merge_and_unload

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    from hydratune.components.strategy import ZERO_CHECKPOINT

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
    if processor is not None:
        from hydratune.components.modeling.vision import save_processor

        save_processor(processor, tmp)
    if merge:
        merged = merge_and_unload(model)
        merged.save_pretrained(tmp / "merged", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "merged")
        if processor is not None:
            save_processor(processor, tmp / "merged")
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


# ---- checkpoints of loops we own (PPO) --------------------------------------------------------------
LOOP_STATE = "loop_state.pt"  # the loop's own counters and controllers
ENGINE_TAG = "engine"  # DeepSpeed's engine checkpoint: weights (shards under ZeRO-3) and optimizer state
GATHERED = "gathered.safetensors"  # FSDP2: the trained weights gathered whole, keyed <module>.<parameter>


def rng_state() -> dict[str, Any]:
    """Every random generator a loop draws from: python, numpy, torch (CPU and each GPU)."""
    import random

    import numpy as np
    import torch

    name, key, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = (name, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss)  # no pickled ndarray
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put every random generator back where :func:`rng_state` found it."""
    import random

    import numpy as np
    import torch

    random.setstate(state["python"])
    name, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_module(module: Any, folder: Path, name: str) -> None:
    """``<name>/`` via ``save_pretrained`` (the adapter alone under PEFT), else ``<name>.safetensors``."""
    if hasattr(module, "save_pretrained"):
        module.save_pretrained(folder / name, safe_serialization=True)
        return
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(folder / f"{name}.safetensors"))


def load_module(module: Any, folder: Path, name: str) -> None:
    """Load what :func:`save_module` wrote into ``module`` in place (an adapter into its PeftModel).
    Keys ``save_pretrained`` leaves out must be tied to a loaded weight; anything else missing fails."""
    from safetensors.torch import load_file

    if not (folder / name).is_dir():
        module.load_state_dict(load_file(str(folder / f"{name}.safetensors")))
        return
    state: dict[str, Any] = {}
    for file in sorted((folder / name).glob("*.safetensors")):
        state.update(load_file(str(file)))
    if _is_peft(module):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(module, state)
        if result.unexpected_keys:
            raise ValueError(f"{folder / name}: unexpected adapter keys {result.unexpected_keys[:3]}")
        return
    missing, unexpected = module.load_state_dict(state, strict=False)
    current = module.state_dict()
    loaded = {current[k].data_ptr() for k in state if k in current}
    untied = [k for k in missing if current[k].data_ptr() not in loaded]
    if unexpected or untied:
        raise ValueError(f"{folder / name}: missing {untied[:3]}, unexpected {unexpected[:3]}")


def save_loop_checkpoint(
    run_dir: Any,
    step: int,
    *,
    accelerator: Any,
    modules: dict[str, Any],
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
    keep_last: int,
    engine: Any = None,
) -> Path:
    """``checkpoints/checkpoint-<step>/`` of a loop we own; a collective call (every rank takes part).

    Holds the trained ``modules`` (loadable with ``from_pretrained`` unless ZeRO-3 or FSDP shards them), the
    optimizer (or DeepSpeed's engine checkpoint ``engine/``: weights + optimizer shards; under FSDP2 the
    trainable weights and the optimizer state gathered whole on rank 0), the schedule, the loop's ``state``
    and every rank's RNG states. Written into ``.staging`` and renamed with a completion marker when whole,
    keeping the last ``keep_last`` — the same conventions as the trainers'."""
    import torch

    main = accelerator.is_main_process
    with staged_checkpoint(
        run_dir, step, main=main, barrier=accelerator.wait_for_everyone, keep_last=keep_last
    ) as (staging):
        sharded = engine is not None and engine.zero_optimization_partition_weights()
        if engine is not None:
            engine.save_checkpoint(str(staging), tag=ENGINE_TAG)  # every rank writes its shard
        fsdp_root = _fsdp_root(modules)
        if fsdp_root is not None:
            _save_fsdp(fsdp_root, optimizer, staging, main)
        if main:
            if not sharded and fsdp_root is None:  # every rank holds the whole weights: rank 0 writes them
                for name, module in modules.items():
                    save_module(module, staging, name)
            if engine is None and fsdp_root is None:
                torch.save(optimizer.state_dict(), staging / "optimizer.pt")
            torch.save(scheduler.state_dict(), staging / "scheduler.pt")
            torch.save(state, staging / LOOP_STATE)
    return run_dir.checkpoints / staging.name


@contextlib.contextmanager
def staged_checkpoint(
    run_dir: Any, step: int, *, main: bool, barrier: Callable[[], Any], keep_last: int
) -> Iterator[Path]:
    """``checkpoints/checkpoint-<step>/`` written atomically by every rank of a loop we own: the body writes
    into the staging dir it is given; then each rank's RNG states are added, and rank 0 (``main``) marks the
    checkpoint whole (sizes and sha256 of every file), renames it into place and keeps the last
    ``keep_last``. ``barrier`` syncs the ranks between the phases (a collective call)."""
    import torch

    staging = run_dir.checkpoints / ".staging" / f"checkpoint-{step}"
    if main:
        shutil.rmtree(staging.parent, ignore_errors=True)
        staging.mkdir(parents=True)
    barrier()
    yield staging
    torch.save(rng_state(), staging / f"rng_state_{int(os.environ.get('RANK', 0))}.pt")
    barrier()
    target = run_dir.checkpoints / staging.name
    if main:
        mark_complete(staging, step, run_dir.path)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        shutil.rmtree(staging.parent, ignore_errors=True)
        for old in checkpoints_in(run_dir.path)[:-keep_last]:
            shutil.rmtree(old)
    barrier()


def load_loop_checkpoint(
    checkpoint: Path,
    *,
    modules: dict[str, Any],
    optimizer: Any,
    scheduler: Any,
    engine: Any = None,
) -> dict[str, Any]:
    """Restore what :func:`save_loop_checkpoint` wrote and return the loop's ``state``. Call it on every
    rank right before the loop: it also restores this rank's random generators."""
    import torch

    rng = loop_rng_file(checkpoint)
    fsdp_root = _fsdp_root(modules)
    if engine is not None:
        path, _ = engine.load_checkpoint(
            str(checkpoint), tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if path is None:
            raise ConfigError(f"{checkpoint} holds no DeepSpeed engine checkpoint", key="resume")
    elif fsdp_root is not None:
        _load_fsdp(fsdp_root, optimizer, checkpoint, int(os.environ.get("RANK", 0)))
    else:
        for name, module in modules.items():
            load_module(module, checkpoint, name)
        # read onto the CPU; load_state_dict moves each state tensor to its parameter's device
        saved = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)
        optimizer.load_state_dict(saved)
    return loop_state(checkpoint, scheduler, rng)


def loop_rng_file(checkpoint: Path) -> Path:
    """This rank's RNG file of a loop checkpoint, after checking the checkpoint is one (a ConfigError
    naming the fix otherwise: written by another recipe, or by fewer processes)."""
    if not (checkpoint / LOOP_STATE).is_file():
        raise ConfigError(
            f"{checkpoint} was not written by this recipe's loop (no {LOOP_STATE})",
            key="resume",
            hint="pass resume=<run dir> of a run of the same recipe",
        )
    rank = int(os.environ.get("RANK", 0))
    rng = checkpoint / f"rng_state_{rank}.pt"
    if not rng.is_file():
        raise ConfigError(
            f"{checkpoint} has no RNG state for rank {rank}: it was written by fewer processes",
            key="resume",
            hint="resume with the launcher.nproc_per_node of the run that wrote it",
        )
    return rng


def loop_state(checkpoint: Path, scheduler: Any, rng: Path) -> dict[str, Any]:
    """The schedule and this rank's random generators put back, and the loop's own state (restore last)."""
    import torch

    scheduler.load_state_dict(torch.load(checkpoint / "scheduler.pt", weights_only=True))
    state = torch.load(checkpoint / LOOP_STATE, weights_only=True)  # plain numbers, lists and tensors
    set_rng_state(torch.load(rng, weights_only=True))
    return state


def _fsdp_root(modules: dict[str, Any]) -> Any:
    """The loop's trained modules as one module (names ``<module>.<parameter>``) when FSDP2 shards them."""
    from hydratune.components.distributed import fully_shard

    if not any(fully_shard.is_sharded(m) for m in modules.values()):
        return None
    import torch

    return torch.nn.ModuleDict(modules)


def _save_fsdp(root: Any, optimizer: Any, folder: Path, main: bool) -> None:
    """The trainable weights and the optimizer state, gathered whole (a collective call), by rank 0."""
    import torch
    from safetensors.torch import save_file

    from hydratune.components.distributed import fully_shard

    weights = fully_shard.full_state_dict(root, trainable_only=True)
    optimizer_state = fully_shard.full_optimizer_state(root, optimizer)
    if main:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / GATHERED))
        torch.save(optimizer_state, folder / "optimizer.pt")


def _load_fsdp(root: Any, optimizer: Any, checkpoint: Path, rank: int) -> None:
    """What :func:`_save_fsdp` wrote, read by rank 0 and broadcast into every rank's shards."""
    import torch
    from safetensors.torch import load_file

    from hydratune.components.distributed import fully_shard

    if not (checkpoint / GATHERED).is_file():
        raise ConfigError(
            f"{checkpoint} holds no gathered FSDP weights ({GATHERED})",
            key="resume",
            hint="resume with the strategy of the run that wrote it",
        )
    weights, optimizer_state = {}, {}
    if rank == 0:
        weights = load_file(str(checkpoint / GATHERED))
        optimizer_state = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)
    fully_shard.load_full_state(root, optimizer, weights, optimizer_state)
