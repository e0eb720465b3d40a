"""Where a training step's time goes: runs a command (hydratune's ``python -m hydratune ...``, a TRL baseline,
any script whose training goes through ``transformers.Trainer.training_step``) with ``torch.profiler``
around a few of its steps, and writes the operator table (and optionally the Chrome trace) of those steps.

    python bench/profile_steps.py --out bench/profiles/sft_lora_h --steps 4-6 -- -m hydratune model=tiny ...
    python bench/profile_steps.py --out /tmp/trl --steps 4-6 -- bench/trl_baseline.py --spec @spec.json

``--steps A-B`` records from the start of the A-th call of ``training_step`` to the end of the B-th (1-based;
the warm-up before A is not recorded; HF's Trainer steps the optimizer between two calls, so all but the last
step's optimizer step is inside). ``<out>.txt`` gets ``key_averages()`` sorted by self CPU time (the top
``--rows``) with the wall time per recorded step; ``--trace`` also writes ``<out>.json.gz`` (open in https://ui.perfetto.dev).
Nothing of hydratune is changed: the patch lives in this process only.
"""

from __future__ import annotations

import argparse
import gzip
import runpy
import shutil
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="path stem of the table (and trace)")
    parser.add_argument("--steps", default="4-6", help="A-B: the training_step calls to record (1-based)")
    parser.add_argument("--rows", type=int, default=30, help="operators in the table")
    parser.add_argument("--trace", action="store_true", help="also write the Chrome trace (.json.gz)")
    parser.add_argument(
        "target", nargs=argparse.REMAINDER, help="-- then -m module args... or script args..."
    )
    args = parser.parse_args(argv)
    target = [a for a in args.target if a != "--"] if args.target[:1] == ["--"] else args.target
    if not target:
        parser.error("nothing to run: give -- -m hydratune ... or -- script.py ...")
    first, last = (int(x) for x in args.steps.split("-"))
    args.out.parent.mkdir(parents=True, exist_ok=True)

    from torch.profiler import ProfilerActivity, profile
    from transformers import Trainer

    original = Trainer.training_step
    state = {"calls": 0, "prof": None, "t0": 0.0}

    def training_step(self, *a, **kw):
        state["calls"] += 1
        n = state["calls"]
        if n == first:
            state["prof"] = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
            state["prof"].__enter__()
            state["t0"] = time.perf_counter()
        out = original(self, *a, **kw)
        if n == last and state["prof"] is not None:
            prof, seconds = state["prof"], time.perf_counter() - state["t0"]
            prof.__exit__(None, None, None)
            state["prof"] = None
            write(prof, args, (first, last), seconds / (last - first + 1), " ".join(target))
        return out

    Trainer.training_step = training_step
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = target
        sys.path.insert(0, str(Path(target[0]).resolve().parent))
        runpy.run_path(target[0], run_name="__main__")


def write(prof, args: argparse.Namespace, steps: tuple[int, int], step_seconds: float, command: str) -> None:
    """The operator table of the recorded ``steps`` (first, last) and, on request, the trace."""
    first, last = steps
    table = prof.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60
    )
    header = (
        f"command: {command}\n"
        f"recorded: from the start of training_step call {first} to the end of call {last} (forward, loss "
        "and backward of each; the optimizer steps, clipping, callbacks and batch fetches between them)\n"
        f"wall time per recorded step: {step_seconds:.4f} s\n\n"
    )
    Path(f"{args.out}.txt").write_text(header + table + "\n")
    if args.trace:
        raw = Path(f"{args.out}.json")
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(f"{args.out}.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
    print(f"profile: {args.out}.txt ({step_seconds:.3f} s a recorded step)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
