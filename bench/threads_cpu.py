"""OpenMP's wait policy on this CPU: ``OMP_WAIT_POLICY=PASSIVE``, ``ACTIVE`` (spinning threads), libgomp's
default (a bounded spin) and a spin of ``GOMP_SPINCOUNT`` rounds, a training step (forward, backward, AdamW)
of the bundled tiny model and of a random SmolLM2-135M-shaped model, each setting in a fresh process (the
runtime reads the variable when torch loads), the settings alternated, the load average noted before every
run; ``--neighbours N`` keeps N busy processes running beside them (a shared machine's other jobs).

    python bench/threads_cpu.py                     # 3 rounds of both shapes, PASSIVE vs ACTIVE
    python bench/threads_cpu.py --rounds 5 --only tiny --settings PASSIVE,ACTIVE,DEFAULT,SPIN10k
    python bench/threads_cpu.py --only tiny --settings PASSIVE,SPIN10k --neighbours 1   # one core taken

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


def child(shape: str, timed: int | None = None) -> None:
    import torch
    from common import model_config
    from transformers import AutoModelForCausalLM

    arch, batch, seq, steps = SHAPES[shape]
    steps = timed or steps
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


#: a wait setting -> the environment it runs under (libgomp, torch's OpenMP on Linux): PASSIVE sleeps at
#: once, ACTIVE spins (practically) forever, DEFAULT (unset) spins 300,000 rounds, SPIN<N> spins N rounds
#: (``GOMP_SPINCOUNT``) before sleeping
def wait_env(setting: str) -> dict[str, str]:
    if setting in ("PASSIVE", "ACTIVE"):
        return {"OMP_WAIT_POLICY": setting}
    if setting == "DEFAULT":
        return {}
    if setting.startswith("SPIN"):
        return {"GOMP_SPINCOUNT": setting[4:].lower().replace("k", "000")}
    raise SystemExit(f"unknown wait setting {setting!r}: PASSIVE, ACTIVE, DEFAULT or SPIN<N> (e.g. SPIN10k)")


def neighbours(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each keep one core busy (a shared machine's other jobs)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(SHAPES))
    parser.add_argument("--settings", default="PASSIVE,ACTIVE", help="wait settings, alternated (wait_env)")
    parser.add_argument("--neighbours", type=int, default=0, help="busy processes running beside each step")
    parser.add_argument("--steps", type=int, help="timed steps a process (default: the shape's, SHAPES)")
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.steps)
    threads = str(len(os.sched_getaffinity(0)))
    settings = args.settings.split(",")
    rows = []
    steps = ["--steps", str(args.steps)] if args.steps else []
    busy = neighbours(args.neighbours)
    try:
        for shape in args.only.split(","):
            for r in range(args.rounds):
                order = settings if r % 2 == 0 else settings[::-1]
                for setting in order:
                    env = {
                        k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                    }
                    env.update(OMP_NUM_THREADS=threads, **wait_env(setting))
                    load = os.getloadavg()[0]
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", shape, *steps], env=env, capture_output=True,
                        text=True, check=True,
                    )  # fmt: skip
                    row = {"shape": shape, "setting": setting, "round": r, "loadavg": load}
                    row.update(json.loads(out.stdout.strip().splitlines()[-1]))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        for proc in busy:
            proc.kill()
    base = settings[0]
    print(
        f"\n{args.neighbours} busy neighbour process(es); median s/step of each setting, its ratio to {base}"
    )
    print("| shape | load avg | " + " | ".join(f"{s} s/step" for s in settings) + " | "
          + " | ".join(f"{s} ÷ {base}" for s in settings[1:]) + " |")  # fmt: skip
    print(
        "| --- | ---: | "
        + " | ".join("---:" for _ in settings)
        + " | "
        + " | ".join("---:" for _ in settings[1:])
        + " |"
    )
    for shape in args.only.split(","):
        mine = [x for x in rows if x["shape"] == shape]
        med = {s: statistics.median(x["step s"] for x in mine if x["setting"] == s) for s in settings}
        load = f"{min(x['loadavg'] for x in mine):.2f}-{max(x['loadavg'] for x in mine):.2f}"
        print(f"| {shape} | {load} | " + " | ".join(f"{med[s]:.4f}" for s in settings) + " | "
              + " | ".join(f"{med[s] / med[base]:.2f}" for s in settings[1:]) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
