"""fp32 vs bf16 autocast on this CPU: one forward + backward step of random-init Llama shapes from the
bundled tiny model (0.67 M parameters) to SmolLM2-135M's shape, the two alternated in one process.

    python bench/precision_cpu.py                   # every shape, a JSON line each + a markdown table
    python bench/precision_cpu.py --only tiny,h256  # a subset

What ``precision=auto`` reads on a CPU (components/precision.py: ``CPU_BF16_MIN_PARAMS``) is the smallest
model for which bf16 autocast was faster here. The machine's load is printed with every row: timings
from a shared machine are ratios measured in the same process, alternated, never absolute claims.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import model_config

#: shapes over the tiny config (vocab 602 unless set): hidden, intermediate, layers, heads, kv heads
SHAPES: dict[str, dict[str, int]] = {
    "h32x2": {
        "hidden_size": 32, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
    },
    "h64x2": {
        "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
    },
    "tiny": {},
    "h256": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "head_dim": 64},
    "h384": {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6, "head_dim": 64},
    "h576x8": {
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 8,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    },
    "h576x30": {
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    },
    "smollm2_135m": {
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
    },
}  # fmt: skip


def step_seconds(model, ids, bf16: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one forward + backward."""
    import torch

    start, cpu = time.perf_counter(), time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start, time.process_time() - cpu


def measure(name: str, batch: int, seq: int, reps: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = model_config({"max_position_embeddings": max(256, seq), **SHAPES[name]})
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(4, config.vocab_size, (batch, seq))
    for bf16 in (False, True, False, True):  # warm-up: oneDNN picks its kernels
        step_seconds(model, ids, bf16)
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for i in range(reps):  # alternated, the order flipped every repetition
        for bf16 in (False, True) if i % 2 == 0 else (True, False):
            times[bf16].append(step_seconds(model, ids, bf16))
    fp32, bf16 = (statistics.median(t[0] for t in times[b]) for b in (False, True))
    fp32_cpu, bf16_cpu = (statistics.median(t[1] for t in times[b]) for b in (False, True))
    return {
        "shape": name,
        "params": params,
        "tokens": batch * seq,
        "fp32 s": round(fp32, 4),
        "bf16 s": round(bf16, 4),
        "bf16 / fp32": round(bf16 / fp32, 3),
        "bf16 / fp32 (CPU time)": round(bf16_cpu / fp32_cpu, 3),
        "reps": reps,
        "loadavg": os.getloadavg()[0],
    }


def main() -> None:
    # hydratune's thread policy (components/runtime/threads.py), as a run would have it: a brief spin on a
    # quiet machine, passive waits on a busy one (yours if OMP_NUM_THREADS / a wait setting is given)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hydratune.components.runtime.threads import apply_thread_policy

    apply_thread_policy(1)
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=",".join(SHAPES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--reps", type=int, default=6)
    args = parser.parse_args()
    print(
        f"# torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads, loadavg at start {os.getloadavg()}",
        flush=True,
    )
    rows = []
    for name in args.only.split(","):
        reps = args.reps if SHAPES[name].get("num_hidden_layers", 3) < 30 else max(2, args.reps // 2)
        rows.append(measure(name, args.batch, args.seq, reps))
        print(json.dumps(rows[-1]), flush=True)
    print("\n| shape | parameters | fp32 s/step | bf16 s/step | bf16 ÷ fp32 (wall) | (CPU time) | load avg |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['shape']} | {r['params'] / 1e6:.2f} M | {r['fp32 s']:.4f} | {r['bf16 s']:.4f} | "
            f"{r['bf16 / fp32']:.2f} | {r['bf16 / fp32 (CPU time)']:.2f} | {r['loadavg']:.2f} |"
        )


if __name__ == "__main__":
    main()
