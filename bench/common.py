"""Shared pieces of the throughput harness: model shapes, the run spec, step timing, peak memory, the
matmul peak that MFU is measured against. Imported by ``throughput.py``, ``trl_baseline.py`` and
``raw_loop.py`` (each run as ``python bench/<script>.py``), so nothing here imports hydratune.

    python bench/common.py peak --device cuda     # the measured matmul peak (FLOP/s) as one JSON line
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "components" / "assets" / "tiny"

#: Model shapes: overrides on top of the tiny model's config.json (which also gives the tokenizer,
#: pad / eos ids and the rope settings). hydratune gets them as ``+model.architecture.<key>=<value>``,
#: TRL and the raw loop as ``AutoConfig.from_pretrained(TINY)`` + the same keys, so all three train the
#: same random-init architecture.
SHAPES: dict[str, dict[str, Any]] = {
    # Llama-3.2-1B shaped (1.24 B parameters, tied embeddings, GQA 32/8), as in issue 6's reference.
    "llama1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 2048,
        "attention_bias": False,
        "tie_word_embeddings": True,
    },
    # the bundled tiny model as it is (hidden 128, 3 layers, vocab 602): the CPU smoke mode
    "tiny": {"max_position_embeddings": 256},
}


def model_config(arch: dict[str, Any]) -> Any:
    """The benchmark architecture: the tiny config.json with ``arch`` applied."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(TINY)
    for key, value in arch.items():
        setattr(config, key, value)
    return config


def param_count(arch: dict[str, Any], pretrained: str | None = None) -> int:
    """Parameters of the architecture (tied weights once), counted on the meta device; ``pretrained``: a
    checkpoint directory's config instead of the tiny one with ``arch``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(pretrained) if pretrained else model_config(arch)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def benchmark_model(spec: dict[str, Any]) -> Any:
    """The model a baseline trains, fp32 with SDPA: the real checkpoint ``spec["pretrained"]`` (``--real``)
    or the random-init benchmark shape ``spec["arch"]`` (seeded)."""
    import torch
    from transformers import AutoModelForCausalLM

    if spec.get("pretrained"):
        return AutoModelForCausalLM.from_pretrained(
            spec["pretrained"], attn_implementation="sdpa", dtype=torch.float32
        )
    torch.manual_seed(spec.get("seed", 0))
    return AutoModelForCausalLM.from_config(
        model_config(spec["arch"]), attn_implementation="sdpa", dtype=torch.float32
    )


def benchmark_tokenizer(spec: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec.get("pretrained") or TINY)


def peak_memory_gib(device: str) -> float:
    """torch.cuda.max_memory_allocated on GPU (what hydratune reports), peak RSS of this process on CPU."""
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def matmul_peak(device: str, size: int | None = None, iters: int | None = None) -> dict[str, Any]:
    """Measured dense matmul throughput: bf16 8192^3 on GPU, fp32 (default 1024^3) on CPU; best of a few
    timed batches after a warm-up."""
    import torch

    cuda = device == "cuda"
    size = size or (8192 if cuda else 1024)
    iters = iters or (50 if cuda else 5)
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(iters):
            a @ b
        sync(device)
        best = min(best, (time.perf_counter() - start) / iters)
    flops = 2 * size**3 / best
    return {"flops": flops, "dtype": str(dtype).removeprefix("torch."), "size": size}


def device_line(device: str) -> str:
    import platform

    import torch

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
    cores = len(os.sched_getaffinity(0))
    cpu = platform.processor() or platform.machine()
    return f"CPU {cpu}, {cores} cores usable, {torch.get_num_threads()} torch thread(s) per process"


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "bitsandbytes"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


class StepClock:
    """Cumulative (step, tokens, time) marks; throughput over the steps after the first ``warmup``."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, float, float]] = []

    def mark(self, step: int, tokens: float, t: float | None = None) -> None:
        self.marks.append((step, tokens, time.perf_counter() if t is None else t))

    def summary(self, warmup: int) -> dict[str, Any]:
        return window(self.marks, warmup)


def window(marks: list[tuple[int, float, float]], warmup: int) -> dict[str, Any]:
    """tokens/s and step time between the first mark at step >= warmup and the last mark."""
    marks = sorted(marks)
    start = next((m for m in marks if m[0] >= warmup), None)
    end = marks[-1] if marks else None
    if start is None or end is None or end[0] <= start[0]:
        raise ValueError(f"not enough timed steps after a {warmup}-step warm-up: {[m[0] for m in marks]}")
    steps, tokens, seconds = end[0] - start[0], end[1] - start[1], end[2] - start[2]
    return {
        "timed steps": steps,
        "step time (s)": seconds / steps,
        "tokens/s": tokens / seconds if tokens else None,
        "timed tokens": tokens,
    }


def write_result(path: str | Path, result: dict[str, Any]) -> None:
    """The one JSON result line of a benchmark process (also printed)."""
    line = json.dumps(result)
    Path(path).write_text(line + "\n")
    print("RESULT " + line, flush=True)


def load_spec(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True, help="the run spec as JSON, or @file")
    text = parser.parse_args(argv).spec
    return json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["peak"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", type=int)
    args = parser.parse_args()
    peak = matmul_peak(args.device, args.size)
    print(json.dumps({**peak, "device": device_line(args.device)}), file=sys.stdout, flush=True)
