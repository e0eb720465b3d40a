"""Measure hydratune itself on a GPU: `torch.cuda.max_memory_allocated` of real runs vs the estimate.

    python bench/hydratune_memory.py --save docs/memory.json          # every configuration, needs CUDA
    python bench/hydratune_memory.py --only full_bf16,zero3_offload    # a subset
    python bench/hydratune_memory.py --list                            # configurations + estimates, no GPU

Unlike ``bench/memory.py`` (a hand-written loop), each configuration here is a ``python -m hydratune`` run in
a fresh process: the bench's 0.5 B Llama shape as ``model=tiny`` with ``model.architecture`` numbers and
random init, the bundled demo SFT data packed to ``data.max_length``, ``train.max_steps`` a few steps. The
peak is the run's own record (``result.json`` -> cost -> peak memory, read from
``torch.cuda.max_memory_allocated`` by components/runtime/run.py), and the estimate is
``spec_from_config`` of the same composed config. Every entry written to ``docs/memory.json`` carries its
provenance: date, GPU, torch / transformers / deepspeed versions, the commit and the command. Without a CUDA
GPU it says so and exits 0.

Status: written for issue 16 item 3 and checked on CPU only (composition, estimates, the skip path);
it has NOT been run on a GPU yet, so docs/memory.json holds no entry from it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: the bench's Llama-shaped ~0.5 B model (bench/memory.py ARCH) as model.architecture overrides
ARCH = (
    "+model.architecture.model_type=llama",
    "+model.architecture.hidden_size=1024",
    "+model.architecture.intermediate_size=4096",
    "+model.architecture.num_hidden_layers=28",
    "+model.architecture.num_attention_heads=16",
    "+model.architecture.num_key_value_heads=8",
    "+model.architecture.head_dim=64",
    "+model.architecture.vocab_size=32000",
    "+model.architecture.tie_word_embeddings=false",
)
COMMON = ("model=tiny", "model.init=random", "data.packing=true", "train.eval_generations=0")
COMMON += ("train.write_plots=false", "train.eval_every=100000", "train.save_every=100000")

#: name -> hydratune overrides: the 16 configurations of docs/memory.md plus zero2_offload / zero3_offload
CONFIGS: dict[str, tuple[str, ...]] = {
    "full_bf16": ("precision=bf16",),
    "full_bf16_gc": ("precision=bf16", "model.gradient_checkpointing=true"),
    "full_fp16": ("precision=fp16",),
    "full_bf16_eager_s2048": (
        "precision=bf16",
        "model.attn_implementation=eager",
        "train.micro_batch_size=1",
        "data.max_length=2048",
    ),
    "lora_bf16": ("precision=bf16", "peft=lora"),
    "lora_bf16_gc": ("precision=bf16", "peft=lora", "model.gradient_checkpointing=true"),
    "lora_fp16": ("precision=fp16", "peft=lora"),
    "lora_bf16_base_bf16_s2048": (
        "precision=bf16",
        "peft=lora",
        "model.dtype=bfloat16",
        "train.micro_batch_size=2",
        "data.max_length=2048",
    ),
    "qlora_bf16": ("precision=bf16", "peft=lora", "quantization=nf4"),
    "qlora_bf16_gc": ("precision=bf16", "peft=lora", "quantization=nf4", "model.gradient_checkpointing=true"),
    "full_bf16_zero0": ("precision=bf16", "strategy=zero0"),
    "full_bf16_zero2": ("precision=bf16", "strategy=zero2"),
    "full_bf16_zero2_gc": ("precision=bf16", "strategy=zero2", "model.gradient_checkpointing=true"),
    "full_fp16_zero2": ("precision=fp16", "strategy=zero2"),
    "full_bf16_zero3": ("precision=bf16", "strategy=zero3"),
    "lora_bf16_zero2": ("precision=bf16", "peft=lora", "strategy=zero2"),
    "full_bf16_zero2_offload": ("precision=bf16", "strategy=zero2_offload"),
    "full_bf16_zero3_offload": ("precision=bf16", "strategy=zero3_offload"),
}


def overrides(name: str, steps: int = 3) -> list[str]:
    """The full override list of one configuration (4 x 1024 tokens unless the configuration says)."""
    base = [*COMMON, *ARCH, "train.micro_batch_size=4", "data.max_length=1024", f"train.max_steps={steps}"]
    return base + list(CONFIGS[name])


def estimated_peak(name: str) -> float:
    """The estimate's ``peak_allocated`` (bytes) for the composed configuration; no torch, no GPU."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from hydratune import recipes
    from hydratune.components.config.resolvers import register_resolvers
    from hydratune.components.memory.estimate import estimate as estimate_spec
    from hydratune.components.memory.spec import spec_from_config

    register_resolvers()
    recipes.register_all()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        cfg = compose(config_name="config", overrides=[*overrides(name), "estimate.num_gpus=1"])
    GlobalHydra.instance().clear()
    return estimate_spec(spec_from_config(cfg)).peak_allocated


def provenance(command: list[str]) -> dict[str, str]:
    """Date, GPU, versions and commit of a measurement."""
    import importlib.metadata as md

    import torch

    def version(pkg: str) -> str:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed"

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=REPO).stdout
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "deepspeed": version("deepspeed"),
        "commit": commit.strip() + (" (dirty)" if dirty.strip() else ""),
        "harness": "bench/hydratune_memory.py",
        "command": " ".join(command),
    }


def measure(name: str, steps: int, timeout: int) -> dict[str, object]:
    """Run hydratune once; the run's recorded peak, or why there is none."""
    with tempfile.TemporaryDirectory(prefix="hydratune-mem-") as tmp:
        cmd = [sys.executable, "-m", "hydratune", *overrides(name, steps), f"hydra.run.dir={tmp}/run"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s"}
        result = Path(tmp) / "run" / "result.json"
        if proc.returncode != 0 or not result.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"error": f"rc {proc.returncode}: " + " | ".join(t[:160] for t in tail)}
        gib = json.loads(result.read_text())["cost"]["peak memory (GiB)"]
        return {"peak": float(gib) * 2**30, "provenance": provenance(cmd)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per configuration")
    ap.add_argument("--list", action="store_true", help="the configurations and their estimates (no GPU)")
    ap.add_argument("--save", type=Path, help="JSON file whose 'hydratune' entries are (re)written")
    args = ap.parse_args(argv)
    names = [n for n in CONFIGS if not args.only or n in args.only.split(",")]
    if args.list:
        for n in names:
            print(f"{n:<28} estimate {estimated_peak(n) / 2**30:6.2f} GiB")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench/hydratune_memory.py: no CUDA GPU, nothing measured (--list works without one)")
        return 0
    doc = json.loads(args.save.read_text()) if args.save and args.save.is_file() else {}
    entries = doc.setdefault("hydratune", {})
    for n in names:
        entry = {**measure(n, args.steps, args.timeout), "estimate": estimated_peak(n)}
        entries[n] = entry
        print(n, json.dumps(entry), flush=True)
        if args.save:
            args.save.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
