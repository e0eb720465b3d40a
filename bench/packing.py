"""The packing decision by measurement (a bench, not a test): the default demo (``hydratune``, SFT of the tiny
model on two-number addition, 32 epochs) with and without exact packing (``data.packing=true``: bfd, each
conversation attending only to itself), the same seeds, one torch thread, every step logged. Variants:

* ``rows``: the default, one conversation per row (micro-batch 32);
* ``packed``: ``data.packing=true`` at the same micro-batch (32 packs of up to ``data.max_length`` tokens:
  more tokens a step, fewer steps);
* ``packed-matched``: packed, with the micro-batch cut so a step holds about as many tokens as ``rows``'s
  (from the two runs before it): the same tokens per update, the packing alone differs.

Per variant: steps, tokens a step, the training loss at 25 / 50 / 75 / 100 % of the tokens trained (the mean
of the logged losses within ±2.5 % of the tokens around each point, else the nearest step's: TRL's
``num_tokens``, the tokens the model read), the end-of-run eval loss, the exact match of the greedy answers
after training, wall seconds.

    python bench/packing.py [--set k=v ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POINTS = (0.25, 0.5, 0.75, 1.0)
WINDOW = 0.025
COMMON = ("train.log_every=1", "train.write_plots=false", "train.eval_every=0")


def run(name: str, overrides: list[str], root: Path) -> dict:
    """One demo run in its own process; its logged losses and end-of-run numbers."""
    out = root / name
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "hydratune", *COMMON, *overrides, f"hydra.run.dir={out}"]
    subprocess.run(cmd, check=True, env=env, cwd=root, capture_output=True, text=True)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r and "num_tokens" in r]
    final = [r for r in rows if "eval_loss" in r][-1]
    result = json.loads((out / "result.json").read_text())
    total = steps[-1]["num_tokens"]
    at = {}
    for p in POINTS:
        near = [r["loss"] for r in steps if abs(r["num_tokens"] / total - p) <= WINDOW]
        if not near:  # fewer steps than windows: the nearest step
            near = [min(steps, key=lambda r: abs(r["num_tokens"] / total - p))["loss"]]
        at[p] = sum(near) / len(near)
    return {
        "steps": len(steps),
        "tokens": total,
        "tokens_per_step": total / len(steps),
        "loss_at": at,
        "eval_loss": final["eval_loss"],
        "exact_match": result.get("eval accuracy (exact match)", {}).get("after"),
        "wall_s": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", nargs="*", default=[], help="more overrides for every run")
    a = p.parse_args()
    print(f"load: {os.getloadavg()}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-packing-") as tmp:
        root = Path(tmp)
        results["rows"] = run("rows", a.set, root)
        results["packed"] = run("packed", ["data.packing=true", *a.set], root)
        ratio = results["rows"]["tokens_per_step"] / results["packed"]["tokens_per_step"]
        micro = max(1, round(32 * ratio))
        matched = ["data.packing=true", f"train.micro_batch_size={micro}", *a.set]
        results[f"packed-matched (micro-batch {micro})"] = run("matched", matched, root)
    head = " | ".join(f"loss at {int(p * 100)} %" for p in POINTS)
    print(f"| variant | steps | tokens / step | {head} | eval loss | exact match | wall s |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in POINTS) + " | ---: | ---: | ---: |")
    for name, r in results.items():
        losses = " | ".join(f"{r['loss_at'][p]:.4f}" for p in POINTS)
        print(
            f"| {name} | {r['steps']} | {r['tokens_per_step']:.0f} | {losses} | {r['eval_loss']:.4f} | "
            f"{r['exact_match']} | {r['wall_s']:.0f} |"
        )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
