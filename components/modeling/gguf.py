"""GGUF checkpoints (as llama.cpp / Ollama users hold them) as ordinary Hugging Face model dirs.

A ``.gguf`` file is converted ONCE into a plain model dir (config.json, fp32 safetensors, tokenizer
files with the chat template) under ``$HYDRATUNE_CACHE/gguf/<stem>-<size>-<mtime>/`` and reused;
everything downstream (tokenizer, build, quantization, PEFT, checks, save, ``from_run``) then works on
that dir. The weights are dequantized: a Q4 base is the Q4 model's (lossy) weights in fp32, not the
original full-precision checkpoint. The dir is written into a temporary sibling and renamed into place
under a file lock, so a concurrent or interrupted conversion never leaves a half dir that is used; its
manifest (every file's sha256, written last) is checked before a conversion is used, so an edited,
damaged or linked-in file is converted again, never loaded.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.files import file_lock, inside, mismatch, sha256s

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger("hydratune")

#: written last into a conversion: every file's sha256
MANIFEST = "hydratune_files.json"
_VERIFIED: set[Path] = set()
INSTALL_HINT = "pip install 'hydratune[real]' (or: pip install gguf)"
_CONFIGS: dict[Path, PretrainedConfig] = {}  # GGUF file -> its parsed config (a parse reads ~5-10 s)
_ANNOUNCED: set[Path] = set()  # conversions already named in this process's log


def cache_home() -> Path:
    """``$HYDRATUNE_CACHE``, by default ``~/.cache/hydratune``: where hydratune caches what it derives once
    (GGUF conversions here, prepared data in components/data/prepared_cache.py)."""
    return Path(os.environ.get("HYDRATUNE_CACHE") or Path.home() / ".cache" / "hydratune").expanduser()


def cache_root() -> Path:
    """``$HYDRATUNE_CACHE/gguf``, by default ``~/.cache/hydratune/gguf``."""
    return cache_home() / "gguf"


def gguf_path(folder: str, name: str) -> Path:
    """The GGUF file, checked before anything loads: folder and file exist, the ``gguf`` package is
    installed. Raises ``ConfigError`` on ``model.gguf_file`` otherwise."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ConfigError(
            f"model.name_or_path must be the folder holding {name}; {folder} is not a directory",
            key="model.gguf_file",
            hint="set model.name_or_path to the directory of the .gguf file and model.gguf_file to its name",
        )
    path = root / name
    if not path.is_file():
        found = sorted(p.name for p in root.glob("*.gguf"))
        raise ConfigError(
            f"{name} is not in {root} (.gguf files there: {', '.join(found) or 'none'})",
            key="model.gguf_file",
            hint="model.gguf_file is a file name inside model.name_or_path",
        )
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(
            "reading a GGUF checkpoint needs the gguf package, which is not installed",
            key="model.gguf_file",
            hint=INSTALL_HINT,
        )
    return path.resolve()


def converted_dir(path: Path) -> Path:
    """Where ``path``'s conversion lives: named by its stem, size and modification time, so an edited
    or replaced file converts anew."""
    stat = path.stat()
    return cache_root() / f"{path.stem}-{stat.st_size}-{stat.st_mtime_ns}"


def is_converted(path: Path) -> bool:
    """Whether ``path``'s conversion is in the cache and whole (:func:`verified`)."""
    return verified(converted_dir(path))


def verified(out: Path) -> bool:
    """Whether the conversion ``out`` is what was written: its manifest (written last) lists every file
    with its sha256 and each still matches, a plain file inside ``out`` (checked once per process)."""
    if out in _VERIFIED:
        return True
    try:
        digests = json.loads(inside(out, MANIFEST).read_text())["sha256"]
        problem = mismatch(out, digests) if "config.json" in digests else "config.json is not listed"
    except (ValueError, KeyError, TypeError, OSError) as err:
        problem = f"no readable {MANIFEST} ({err})"
    if problem is None:
        _VERIFIED.add(out)
        return True
    if out.exists():
        log.warning("the GGUF conversion %s is not whole (%s): converting again", out, problem)
    return False


def read_config(path: Path) -> PretrainedConfig:
    """The architecture config without dequantizing any weight: from the converted dir when it exists,
    else parsed from the GGUF metadata (once per process; a copy is returned, callers may edit it)."""
    from transformers import AutoConfig

    if is_converted(path):
        return AutoConfig.from_pretrained(converted_dir(path))
    if path not in _CONFIGS:
        try:
            config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        except (ValueError, KeyError, OSError) as err:  # e.g. an architecture transformers cannot read
            raise ConfigError(
                f"transformers cannot read {path.name} as a GGUF checkpoint: {err}",
                key="model.gguf_file",
                hint="use a GGUF of an architecture transformers supports (llama, mistral, qwen2, gemma, …)",
            ) from None
        config.__dict__.pop("quantization_config", None)
        _CONFIGS[path] = config
    return copy.deepcopy(_CONFIGS[path])


def ensure_converted(path: Path) -> Path:
    """The plain HF model dir of GGUF file ``path``: converted now (once, atomically) or from the cache."""
    out = converted_dir(path)
    if verified(out):
        return _announce(out, f"using cached conversion of {path.name}: {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.with_name(out.name + ".lock")):
        if verified(out):  # another process converted it while we waited
            return _announce(out, f"using cached conversion of {path.name}: {out}")
        if out.is_symlink() or out.is_file():
            out.unlink()
        elif out.exists():  # damaged or edited: never used
            shutil.rmtree(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            _convert(path, tmp)
            _write_manifest(tmp)
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return _announce(out, f"converted {path.name} (GGUF, dequantized to float32) once into {out}")


def _write_manifest(out: Path) -> None:
    """Record every file of the finished conversion ``out`` with its sha256 (last: it is whole)."""
    files = sorted(p for p in out.rglob("*") if p.is_file())
    names = [p.relative_to(out).as_posix() for p in files]
    record = {"sha256": dict(zip(names, sha256s(files), strict=True))}
    (out / MANIFEST).write_text(json.dumps(record, indent=1))


def _announce(out: Path, message: str) -> Path:
    """Log ``message`` the first time this process uses ``out``; return ``out``."""
    if out not in _ANNOUNCED:
        _ANNOUNCED.add(out)
        log.info(message)
    return out


def _convert(path: Path, out: Path) -> None:
    """Write ``path`` as config.json + model.safetensors + tokenizer files into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    # a GGUF-loaded model refuses save_pretrained: rebuild it from its config without the quantizer
    config = copy.deepcopy(loaded.config)
    config.__dict__.pop("quantization_config", None)
    config.dtype = torch.float32
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    if config.tie_word_embeddings:
        plain.tie_weights()
    plain.generation_config = loaded.generation_config
    del loaded
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "SOURCE.txt").write_text(
        f"Converted by hydratune from {path} (GGUF; weights dequantized to float32).\n"
    )
