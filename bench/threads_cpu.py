"""OpenMP's wait policy on this CPU: ``OMP_WAIT_POLICY=PASSIVE`` (hydratune's default) vs ``ACTIVE`` (torch's
spinning threads), a training step (forward, backward, AdamW) of the bundled tiny model and of a random
SmolLM2-135M-shaped model, each setting in a fresh process (the runtime reads the variable when torch
loads), the settings alternated, the load average noted before every run.

    python bench/threads_cpu.py                     # 3 rounds of both shapes
    python bench/threads_cpu.py --rounds 5 --only tiny

The figures go to docs/benchmarks.md ("OpenMP wait policy on a CPU"); on a shared machine only the ratios
measured side by side mean much.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: shape: (architecture over the tiny config, batch, sequence length, timed steps)
SHAPES = {
    "tiny": ({}, 32, 22, 40),  # the demo's micro-batch: 32 rows of about 22 tokens
    "smollm2_135m": (
        {
            "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
        },
        4, 64, 4,
    ),
}  # fmt: skip


def child(shape: str) -> None:
    import torch
    from common import model_config
    from transformers import AutoModelForCausalLM

    arch, batch, seq, steps = SHAPES[shape]
    torch.manual_seed(0)
    config = model_config({"max_position_embeddings": 256, **arch})
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(4, config.vocab_size, (batch, seq))
    times = []
    for i in range(steps + 2):  # two warm-up steps
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 2:
            times.append(time.perf_counter() - start)
    print(json.dumps({"step s": statistics.median(times), "threads": torch.get_num_threads()}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(SHAPES))
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    threads = str(len(os.sched_getaffinity(0)))
    rows = []
    for shape in args.only.split(","):
        for r in range(args.rounds):
            order = ("PASSIVE", "ACTIVE") if r % 2 == 0 else ("ACTIVE", "PASSIVE")
            for policy in order:
                env = {**os.environ, "OMP_NUM_THREADS": threads, "OMP_WAIT_POLICY": policy}
                load = os.getloadavg()[0]
                out = subprocess.run(
                    [sys.executable, __file__, "--child", shape], env=env, capture_output=True, text=True,
                    check=True,
                )  # fmt: skip
                row = {"shape": shape, "policy": policy, "round": r, "loadavg": load}
                row.update(json.loads(out.stdout.strip().splitlines()[-1]))
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(
        "\n| shape | round | load avg (passive, active) | passive s/step | active s/step | active ÷ passive |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for shape in args.only.split(","):
        for r in range(args.rounds):
            p, a = (next(x for x in rows if x["shape"] == shape and x["round"] == r and x["policy"] == pol)
                    for pol in ("PASSIVE", "ACTIVE"))  # fmt: skip
            print(
                f"| {shape} | {r} | {p['loadavg']:.2f}, {a['loadavg']:.2f} | {p['step s']:.4f} | "
                f"{a['step s']:.4f} | {a['step s'] / p['step s']:.2f} |"
            )


if __name__ == "__main__":
    main()
