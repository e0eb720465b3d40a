"""``hydratune export <run dir>``: a folder that transformers and serving engines load as is.

Merged safetensors (an adapter folded into its full-precision base; refused for a quantized base, whose
rounding the merge would bake in), the tokenizer with its chat template, a ``generation_config.json`` that
stops at the template's end-of-turn token, and a model card (``README.md``) with the base model, data,
recipe, metrics, the resolved config and the command that reproduces the run.

Fit for a hub: the card's ``base_model:`` is the hub id the run started from (through ``model.from_run``
chains; for a local dir or a GGUF the id its metadata records, if any); no local path appears in it (a
path is shown as ``<local>/<name>``); ``tokenizer_config.json`` drops the loading flags of this machine
(``local_files_only``, ``is_local``); every file is world-readable as the umask allows (0644 under 022).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from hydratune.components.config.errors import ConfigError
from hydratune.components.modeling.trained import TrainedRun

DTYPES = ("float32", "bfloat16", "float16")
USAGE = (
    "hydratune export <run dir> [out=<dir>] [dtype=float32|bfloat16|float16] [model.trust_remote_code=true]"
)


def parse_args(args: list[str]) -> tuple[Path, Path | None, str]:
    """``<run dir> [out=…] [dtype=…]`` → (run dir, out dir or None, dtype)."""
    if not args or "=" in args[0]:
        raise ConfigError("export needs a run dir", key="export", hint=USAGE)
    options = dict(arg.split("=", 1) for arg in args[1:] if "=" in arg)
    known = ("out", "dtype", "model.trust_remote_code")
    unknown = [arg for arg in args[1:] if "=" not in arg] + [k for k in options if k not in known]
    if unknown:
        raise ConfigError(f"unknown argument '{unknown[0]}'", key="export", hint=USAGE)
    dtype = options.get("dtype", "float32")
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype '{dtype}'", key="export.dtype", hint=f"one of {DTYPES}")
    out = Path(options["out"]).expanduser() if "out" in options else None
    return Path(args[0]), out, dtype


def check(run: TrainedRun, out: Path) -> None:
    """Everything that can be refused before a weight is read."""
    if out.exists():
        raise ConfigError(
            f"{out} exists: export never overwrites", key="export.out", hint="pass out=<a new dir>"
        )
    if not run.produces_causal_lm:
        from hydratune.components.config.registry import RECIPES

        policies = ", ".join(name for name, cls in sorted(RECIPES.items()) if cls.produces_causal_lm)
        raise ConfigError(
            f"{run.path} is a {run.recipe} run: export writes causal language models",
            key="export",
            hint=f"export a policy run ({policies}); a reward model loads from final/ as it is",
        )
    if run.kind == "adapter" and run.quantized:
        raise ConfigError(
            f"{run.path} trained its adapter on a quantized base: merging it into the quantized weights "
            "bakes their rounding into every merged weight (precision loss)",
            key="export",
            hint="serve the adapter on the quantized base (final/ holds it), or retrain with "
            "quantization=none to export a merged model",
        )
    if run.kind == "adapter":
        run.base_component()  # a random-init base cannot be rebuilt: refused here, before loading


def export(run_dir: Path, out: Path | None = None, dtype: str = "float32", remote_code: bool = False) -> Path:
    """Write the export folder (atomically: into ``<out>.tmp``, then renamed) and return it; ``remote_code``:
    the command line granted ``model.trust_remote_code=true`` (an adapter's base may load its dir's code)."""
    import torch

    run = TrainedRun.open(run_dir, key="export", trust_remote_code=remote_code)
    out = (out or run.path / "export").resolve()
    check(run, out)
    model, tokenizer = run.load(merge=True)
    model = model.to(getattr(torch, dtype))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.generation_config = generation_config(model, tokenizer)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    processor = run.processor(tokenizer)  # a vision-language model's: AutoProcessor loads the export
    if processor is not None:
        from hydratune.components.modeling.vision import save_processor

        save_processor(processor, tmp)
    drop_machine_keys(tmp / "tokenizer_config.json")
    (tmp / "README.md").write_text(model_card(run, model, dtype))
    publish_modes(tmp)
    tmp.rename(out)
    return out


#: loading flags of the machine that exported, which transformers writes into tokenizer_config.json
MACHINE_KEYS = ("local_files_only", "is_local", "cache_dir", "name_or_path", "_name_or_path")


def drop_machine_keys(path: Path) -> None:
    """Remove :data:`MACHINE_KEYS` from a saved JSON config (a hub user's load would inherit them)."""
    if not path.is_file():
        return
    config = json.loads(path.read_text())
    kept = {k: v for k, v in config.items() if k not in MACHINE_KEYS}
    if kept != config:
        path.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n")


def publish_modes(folder: Path) -> None:
    """Every file readable as a plain ``open(…, "w")`` makes it (0644 under umask 022): some writers
    (safetensors' shard writer) create private 0600 temporary files and rename them into place."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


def generation_config(model: Any, tokenizer: Any) -> Any:
    """The model's generation config, stopping at EOS and at the chat template's end-of-turn tokens,
    padding with the tokenizer's pad token (greedy by default, as the run evaluated)."""
    from transformers import GenerationConfig

    from hydratune.components.text.masking import stop_token_ids

    config = GenerationConfig.from_model_config(model.config)
    stops = sorted(stop_token_ids(tokenizer))
    config.eos_token_id = stops[0] if len(stops) == 1 else stops
    config.pad_token_id = tokenizer.pad_token_id
    if tokenizer.bos_token_id is not None:
        config.bos_token_id = tokenizer.bos_token_id
    return config


def model_card(run: TrainedRun, model: Any, dtype: str) -> str:
    """``README.md`` with Hugging Face metadata: what the model is, how it was trained, how to redo it."""
    report = _report(run.path)
    what = "full model" if run.kind == "full" else "adapter merged into the base"
    base = base_model_id(run) or local_name(_base_name(run))
    params = sum(p.numel() for p in model.parameters())
    overrides = run.overrides()
    overrides = [
        f"{k}={local_name(v)}" if "=" in o else o for o in overrides for k, _, v in [o.partition("=")]
    ]
    command = "hydratune " + " ".join(shlex.quote(o) for o in overrides) if overrides else "hydratune"
    front: dict[str, Any] = {"library_name": "transformers", "tags": ["hydratune", run.recipe]}
    hub_id = base_model_id(run)
    if hub_id:
        front["base_model"] = hub_id
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).strip(),
        "---",
        "",
        f"# {run.path.name}",
        "",
        f"A {run.recipe.upper()} fine-tune of `{base}` made with hydratune "
        f"({params:,} parameters, {dtype}, {what}).",
        "",
        "## Training",
        "",
        "| | |",
        "| --- | --- |",
    ]
    run_info = report.get("run", {})
    facts = {
        "recipe": run.recipe,
        "base model": base,
        "method": run_info.get("peft", run.cfg.peft.get("_target_", "").rsplit(".", 1)[-1]),
        "data": local_name(run.cfg.data.get("path"))
        or ", ".join(local_name(e["path"]) for e in run.cfg.data.get("mixture") or []),
        "data format": report.get("data", {}).get("format"),
        "train rows": report.get("data", {}).get("train rows"),
        "precision": run_info.get("precision"),
        "global batch": run_info.get("global batch"),
    }
    lines += [f"| {k} | {v} |" for k, v in facts.items() if v is not None]
    metrics = {
        **report.get("final metrics", {}),
        **{
            f"eval exact match ({when})": v
            for when, v in report.get("eval accuracy (exact match)", {}).items()
            if isinstance(v, (int, float))
        },
    }
    if metrics:
        lines += ["", "## Metrics", "", "| metric | value |", "| --- | --- |"]
        lines += [
            f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in metrics.items()
        ]
    lines += [
        "",
        "## Reproduce",
        "",
        "```bash",
        command,
        f"hydratune replay <run dir>/{run.path.name}   # the exact resolved config below, from the run dir",
        "```",
        "",
        "## Use",
        "",
        "```python",
        *(VISION_USE if getattr(getattr(model, "config", None), "vision_config", None) else TEXT_USE),
        "```",
        "",
        "## Config",
        "",
        "```yaml",
        yaml.safe_dump(
            without_paths(OmegaConf.to_container(run.cfg, resolve=False)), sort_keys=False
        ).strip(),
        "```",
        "",
    ]
    return "\n".join(lines)


TEXT_USE = (
    "from transformers import AutoModelForCausalLM, AutoTokenizer",
    'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
    'tokenizer = AutoTokenizer.from_pretrained("<this folder>")',
)
#: a vision-language model: the processor (image processor + tokenizer) is saved beside the weights
VISION_USE = (
    "from transformers import AutoModelForImageTextToText, AutoProcessor",
    'model = AutoModelForImageTextToText.from_pretrained("<this folder>")',
    'processor = AutoProcessor.from_pretrained("<this folder>")',
)


def _report(path: Path) -> dict[str, Any]:
    result = path / "result.json"
    return json.loads(result.read_text()) if result.is_file() else {}


def is_local_path(value: Any) -> bool:
    """A string naming a file or folder of this machine (absolute, home-relative, or one that exists)."""
    if not isinstance(value, str) or not value or "${" in value:
        return False
    return value.startswith(("/", "~", "./", "../")) or re.match(r"^[A-Za-z]:[\\/]", value) is not None


def local_name(value: Any) -> Any:
    """``<local>/<name>`` for a local path (its folder stays on this machine), else ``value``."""
    return f"<local>/{Path(value).expanduser().name}" if is_local_path(value) else value


def without_paths(node: Any) -> Any:
    """A config container with every local path shown as :func:`local_name`."""
    if isinstance(node, dict):
        return {k: without_paths(v) for k, v in node.items()}
    if isinstance(node, list):
        return [without_paths(v) for v in node]
    return local_name(node)


def base_model_id(run: TrainedRun, depth: int = 0) -> str | None:
    """The hub id the run's weights descend from: ``model.name_or_path`` when it is one, through
    ``model.from_run`` to the run it continued; for a local dir or a GGUF the id its metadata records."""
    model = run.cfg.model
    if model.get("from_run") and depth < 16:
        try:
            return base_model_id(TrainedRun.open(str(model.from_run)), depth + 1)
        except ConfigError:  # the earlier run dir is gone: nothing recorded here
            return None
    name = str(model.get("name_or_path") or "")
    folder = Path(name).expanduser()
    if model.get("gguf_file"):
        return gguf_repo_id(folder / str(model.gguf_file))
    if is_local_path(name) or folder.exists():
        return recorded_id(folder)
    return name or None


def hub_id(value: Any) -> str | None:
    """``org/name`` of a hub id or a ``https://huggingface.co/org/name`` URL; None for anything else."""
    text = str(value or "").strip().removeprefix("https://huggingface.co/").strip("/")
    return text if re.fullmatch(r"[\w.-]+/[\w.-]+", text) else None


def recorded_id(folder: Path) -> str | None:
    """The hub id a local model dir records: its model card's ``base_model:`` (a hub download or an
    export), else a hub id in ``config.json``'s ``_name_or_path``."""
    card = folder / "README.md"
    if card.is_file():
        match = re.match(r"---\n(.*?)\n---", card.read_text(errors="replace"), re.S)
        front = yaml.safe_load(match.group(1)) if match else None
        base = front.get("base_model") if isinstance(front, dict) else None
        base = base[0] if isinstance(base, list) and base else base
        if hub_id(base):
            return hub_id(base)
    config = folder / "config.json"
    if config.is_file():
        return hub_id(json.loads(config.read_text()).get("_name_or_path"))
    return None


#: GGUF metadata keys that may hold the repository a GGUF was converted from (llama.cpp's convention)
GGUF_ID_KEYS = (
    "general.base_model.0.repo_url",
    "general.source.huggingface.repository",
    "general.source.repo_url",
    "general.repo_url",
)


def gguf_repo_id(path: Path) -> str | None:
    """The hub id a GGUF's metadata records (:data:`GGUF_ID_KEYS`), if any."""
    try:
        from gguf import GGUFReader

        fields = GGUFReader(path).fields
    except Exception:  # no gguf package, or not a readable GGUF: nothing recorded
        return None
    for key in GGUF_ID_KEYS:
        if key in fields and hub_id(fields[key].contents()):
            return hub_id(fields[key].contents())
    return None


def _base_name(run: TrainedRun) -> str:
    model = run.cfg.model
    return str(model.get("from_run") or model.get("name_or_path"))


def cli(args: list[str]) -> int:
    """Entry of ``hydratune export``; errors are ConfigErrors the caller prints (exit 2)."""
    from hydratune.components.config.trust import grants

    run_dir, out, dtype = parse_args(args)
    written = export(run_dir, out, dtype, grants(args).allows("model.trust_remote_code"))
    vision = (written / "processor_config.json").is_file()
    auto = "AutoModelForImageTextToText + AutoProcessor" if vision else "AutoModelForCausalLM"
    print(f"exported {run_dir} to {written} (load with {auto}.from_pretrained)")
    return 0
