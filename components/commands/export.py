"""``hydratune export <run dir>``: a folder that transformers and serving engines load as is.

Merged safetensors (an adapter folded into its full-precision base; refused for a quantized base, whose
rounding the merge would bake in), the tokenizer with its chat template, a ``generation_config.json`` that
stops at the template's end-of-turn token, and a model card (``README.md``) with the base model, data,
recipe, metrics, the resolved config and the command that reproduces the run.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from components.config.errors import ConfigError
from components.modeling.trained import TrainedRun

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
        from components.config.registry import RECIPES

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
    (tmp / "README.md").write_text(model_card(run, model, dtype))
    tmp.rename(out)
    return out


def generation_config(model: Any, tokenizer: Any) -> Any:
    """The model's generation config, stopping at EOS and at the chat template's end-of-turn tokens,
    padding with the tokenizer's pad token (greedy by default, as the run evaluated)."""
    from transformers import GenerationConfig

    from components.text.masking import stop_token_ids

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
    base = _base_name(run)
    params = sum(p.numel() for p in model.parameters())
    overrides = run.overrides()
    command = "hydratune " + " ".join(shlex.quote(o) for o in overrides) if overrides else "hydratune"
    front = {"library_name": "transformers", "tags": ["hydratune", run.recipe]}
    if not Path(base).is_absolute():
        front["base_model"] = base
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
        "data": run.cfg.data.get("path"),
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
        f"hydratune replay {run.path}   # the exact resolved config below, from the run dir",
        "```",
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
        'tokenizer = AutoTokenizer.from_pretrained("<this folder>")',
        "```",
        "",
        "## Config",
        "",
        "```yaml",
        OmegaConf.to_yaml(run.cfg).strip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def _report(path: Path) -> dict[str, Any]:
    result = path / "result.json"
    return json.loads(result.read_text()) if result.is_file() else {}


def _base_name(run: TrainedRun) -> str:
    model = run.cfg.model
    return str(model.get("from_run") or model.get("name_or_path"))


def cli(args: list[str]) -> int:
    """Entry of ``hydratune export``; errors are ConfigErrors the caller prints (exit 2)."""
    from components.config.trust import grants

    run_dir, out, dtype = parse_args(args)
    written = export(run_dir, out, dtype, grants(args).allows("model.trust_remote_code"))
    print(f"exported {run_dir} to {written} (load with AutoModelForCausalLM.from_pretrained)")
    return 0
