"""GPU check of every strategy that fits one GPU x precision x {full, nf4 + LoRA}: 20 steps each of SFT on
a ~0.45B Llama-shaped random-init model (hidden 1024, 24 layers) on packed 1024-token rows.

For each run: loss falls (mean of the last 5 logged losses < first logged loss), the live strategy
(distributed type, ZeRO stage) matches the request, peak GPU memory and tokens/s. A few strategies also
save at step 10 and resume to step 20 in a new run dir. Writes a markdown table (``--out``): into the
``<!-- bench:strategies -->`` markers of a page that has them (docs/strategies.md), else the whole file.

    python tests/gpu/strategies.py --out docs/strategies.md          # ~10 min on one H100
    python tests/gpu/strategies.py --only zero3,fsdp --quick          # a subset, 10 steps
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

ARCH = [
    "+model.architecture.hidden_size=1024",
    "+model.architecture.intermediate_size=4096",
    "+model.architecture.num_hidden_layers=24",
    "+model.architecture.num_attention_heads=16",
    "+model.architecture.num_key_value_heads=8",
    "+model.architecture.vocab_size=32000",
    "+model.architecture.max_position_embeddings=2048",
]
COMMON = [
    *ARCH,
    "data.packing=true",
    "data.max_length=1024",
    "train.micro_batch_size=4",
    "train.eval_every=0",
    "train.eval_generations=0",
    "train.save_every=0",
    "train.log_every=1",
    "train.write_plots=false",
    "optimizer.lr=3e-4",
    "scheduler.warmup_ratio=0.0",
]
QLORA = ["quantization=nf4", "peft=lora"]

# (name, overrides, check resume)
MATRIX: list[tuple[str, list[str], bool]] = [
    *[
        (f"{s} bf16", [f"strategy={s}", "precision=bf16"], s in ("zero2", "zero3", "fsdp"))
        for s in ("single", "fsdp", "zero0", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload")
    ],
    ("zero3pp bf16", ["strategy=zero3pp", "precision=bf16", "strategy.zero_hpz_partition_size=1"], False),
    *[
        (f"{s} fp16", [f"strategy={s}", "precision=fp16"], False)
        for s in ("single", "zero2", "zero3", "fsdp")
    ],
    ("single bf16 nf4+lora", ["strategy=single", "precision=bf16", *QLORA], False),
    ("single fp16 nf4+lora", ["strategy=single", "precision=fp16", *QLORA], False),
    ("zero2 bf16 nf4+lora", ["strategy=zero2", "precision=bf16", *QLORA], False),
    (
        "zero3 bf16 nf4+lora",
        ["strategy=zero3", "precision=bf16", *QLORA, "quantization.quant_storage=bf16"],
        False,
    ),
]


def hydratune(args: list[str], run_dir: Path, timeout: int = 300) -> tuple[int, float, str]:
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "hydratune", *args, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return proc.returncode, time.time() - start, (proc.stdout + proc.stderr)[-1500:]


def summarise(run_dir: Path) -> dict:
    result = json.loads((run_dir / "result.json").read_text())
    losses = [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if "loss" in r]
    return {
        "first loss": losses[0],
        "last loss": sum(losses[-5:]) / len(losses[-5:]),
        "falls": sum(losses[-5:]) / len(losses[-5:]) < losses[0],
        "live": result["run"].get("live strategy", "?"),
        "peak GiB": result["cost"]["peak memory (GiB)"],
        "tokens/s": result["cost"].get("tokens/s (train, non-pad)"),
    }


def check_resume(overrides: list[str], root: Path, steps: int) -> str:
    first, second = root / "resume_a", root / "resume_b"
    half = steps // 2
    rc, _, tail = hydratune([*overrides, f"train.max_steps={half}", f"train.save_every={half}"], first)
    if rc:
        return f"first half failed: {tail[-300:]}"
    rc, _, tail = hydratune([*overrides, f"train.max_steps={steps}", f"resume={first}"], second)
    if rc:
        return f"resume failed: {tail[-300:]}"
    result = json.loads((second / "result.json").read_text())
    return "ok" if "resumed from" in result["run"] else "did not resume"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", default="", help="comma-separated substrings of config names")
    parser.add_argument("--quick", action="store_true", help="10 steps, no resume checks")
    parser.add_argument("--budget", type=float, default=540, help="stop starting runs after this many s")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to do")
        return
    steps = 10 if args.quick else 20
    wanted = [m for m in MATRIX if not args.only or any(o in m[0] for o in args.only.split(","))]
    rows, begin = [], time.time()
    for name, overrides, resume in wanted:
        if time.time() - begin > args.budget:
            rows.append({"config": name, "status": "not run (time budget)"})
            continue
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            full = [*COMMON, *overrides, f"train.max_steps={steps}"]
            rc, wall, tail = hydratune(full, run_dir)
            row: dict = {"config": name, "wall s": round(wall, 1)}
            if rc:
                errors = [ln for ln in tail.splitlines() if "Error" in ln or "error:" in ln] or [tail.strip()]
                row["status"] = f"FAILED rc={rc}: " + errors[-1][:200]
                print(tail, file=sys.stderr)
            else:
                row.update(summarise(run_dir), status="ok")
                if resume and not args.quick:
                    row["resume"] = check_resume([*COMMON, *overrides], Path(tmp), steps)
        rows.append(row)
        print(json.dumps(row), flush=True)
    table = render(rows, torch.cuda.get_device_name(), steps)
    print(table)
    if args.out:
        write(args.out, table)


def write(path: Path, table: str) -> None:
    """``table`` between the page's ``<!-- bench:strategies -->`` markers (without its title), or as the
    whole file when the page has none."""
    begin, end = "<!-- bench:strategies -->", "<!-- /bench:strategies -->"
    text = path.read_text() if path.is_file() else ""
    if begin not in text or end not in text:
        path.write_text(table)
        return
    before, rest = text.split(begin, 1)
    body = table.split("\n\n", 1)[1]  # without "# Strategies on one GPU"
    path.write_text(f"{before}{begin}\n{body}{end}{rest.split(end, 1)[1]}")


def render(rows: list[dict], device: str, steps: int) -> str:
    import accelerate
    import torch
    import transformers

    head = (
        "# Strategies on one GPU\n\n"
        f"Measured by `python tests/gpu/strategies.py --out docs/strategies.md` on {device}, torch "
        f"{torch.__version__}, transformers {transformers.__version__}, accelerate {accelerate.__version__}"
        f", {time.strftime('%Y-%m-%d')}. SFT of a random-init Llama-shaped model (hidden 1024, 24 layers, "
        f"vocab 32000, ~0.45B parameters) on packed 1024-token rows, micro-batch 4, {steps} steps, "
        "AdamW lr 3e-4. *falls*: mean of the last 5 logged losses below the first. *live*: what "
        "accelerate prepared, checked by hydratune before training. *resume*: save at step "
        f"{steps // 2}, resume in a new run dir, finish at step {steps}.\n\n"
    )
    cols = [
        "config",
        "status",
        "live",
        "first loss",
        "last loss",
        "falls",
        "peak GiB",
        "tokens/s",
        "resume",
        "wall s",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for row in rows:
        cells = []
        for col in cols:
            value = row.get(col, "")
            cells.append(f"{value:.3f}" if isinstance(value, float) and col.endswith("loss") else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
