"""One prepared GPU call (issue 38): hydratune beside TRL on one GPU, the estimate against the measured peak,
the GPU test tier; everything into ``$OUT``. Started by ``bench/gpu/run.sh`` (which installs the carried
wheels); ``--dry-run`` runs the same code on CPU with the tiny shape and 2 steps a row, each process forked
from this one once it has imported what they import (``throughput.preload``: ~7 s less a process; the GPU
call starts fresh ones, whose memory it measures), so tests/cli's test_gpu_bench.py runs it in CI and this
script cannot rot before a GPU comes.

Rows, each a fresh process per implementation (bench/throughput.py's harness: random-init Llama-3.2-1B
shape, bf16, 2048-token packed rows, micro-batch 4, tokens/s over the steps after the warm-up):

- ``sft_full``, ``sft_lora`` (r16), ``dpo`` (full): hydratune and TRL's ``SFTTrainer`` / ``DPOTrainer`` as a
  competent user runs them on this GPU: bf16, SDPA, packing on for SFT, no gradient checkpointing (the
  1B model fits without it, and hydratune runs without it), everything else TRL's default;
- ``zero3`` (DeepSpeed ZeRO-3 on one GPU) and ``fsdp`` (FSDP2): hydratune alone (paths that never ran).

For every hydratune row: tokens/s, peak ``torch.cuda.max_memory_allocated`` (the run's own record), the
estimate of the same command (``hydratune.components.memory``: ``peak_allocated``) and its error in %. Then
``pytest tests/gpu``. Files in ``$OUT`` (at most 8): results.json, results.md, gpu_tests.txt, gpu_tests.xml,
nvidia-smi.txt. The results are rewritten after every row: a call cut short keeps what it measured. A
row is skipped, saying so, when the time left (``--budget``) cannot hold it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
REPO = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO)]

import throughput  # noqa: E402  (bench/throughput.py: the harness)
from common import SHAPES, param_count, versions  # noqa: E402
from throughput import Variant  # noqa: E402

#: TRL as a competent user runs it on one 80 GB GPU (on top of bench/trl_baseline.py's bf16 and SDPA)
TRL_SFT = {"packing": True, "gradient_checkpointing": False}
TRL_DPO = {"gradient_checkpointing": False}


@dataclass(frozen=True)
class Row:
    variant: Variant
    trl: dict[str, Any] = field(default_factory=dict)
    goal: str = ""
    seconds: int = 90  # what the row needs on the H100 (start-ups included): skipped when less is left


ROWS = [
    Row(Variant("sft_full", "packed"), TRL_SFT, "≥ 1.30 x TRL tokens/s at ≤ TRL's peak memory", 100),
    Row(Variant("sft_lora", "packed", peft=True), TRL_SFT, "≥ 1.2 x TRL tokens/s", 90),
    Row(Variant("dpo", "pairs", recipe="dpo"), TRL_DPO, "≥ 1.25 x TRL tokens/s", 120),
    Row(Variant("zero3", "packed", zero=3, impls=("hydratune",)), {}, "≤ 15 % slower than sft_full", 60),
    Row(
        Variant("fsdp", "packed", impls=("hydratune",), hydratune_overrides=("strategy=fsdp",)),
        {},
        "runs (FSDP2 on one GPU)",
        50,
    ),
]
#: the estimate's error must stay within this (in %) of the measured peak
ESTIMATE_TOLERANCE = 15.0


def estimated_peak(command: str) -> float:
    """The estimate's ``peak_allocated`` (bytes) for the overrides of a ``python -m hydratune ...`` command,
    on one GPU; neither torch nor a GPU is needed."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from hydratune import recipes
    from hydratune.components.config.resolvers import register_resolvers
    from hydratune.components.memory.estimate import estimate
    from hydratune.components.memory.spec import spec_from_config

    overrides = shlex.split(command)[3:]  # after "python -m hydratune"
    register_resolvers()
    recipes.register_all()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="hydratune.conf", version_base=None):
            cfg = compose(config_name="config", overrides=[*overrides, "estimate.num_gpus=1"])
    finally:
        GlobalHydra.instance().clear()
    return estimate(spec_from_config(cfg)).peak_allocated


def with_estimate(result: dict[str, Any]) -> dict[str, Any]:
    """A hydratune result with its estimate (GiB) and the estimate's error against the measured peak (%)."""
    if "command" not in result:
        return result
    try:
        gib = estimated_peak(result["command"]) / 2**30
    except Exception as failed:  # said in the table, the other rows go on
        return {**result, "estimate error": f"{type(failed).__name__}: {failed}"[:300]}
    measured = result.get("peak memory (GiB)")
    error = 100 * (gib - measured) / measured if measured else None
    return {**result, "estimate (GiB)": round(gib, 2), "estimate error (%)": error}


def judged(rows: list[dict[str, Any]]) -> None:
    """Each row's ratio and verdict against its goal (issue 38)."""
    by = {r["variant"]: r for r in rows}
    for row in rows:
        h, t = row.get("hydratune") or {}, row.get("trl") or {}
        tps, ttps = h.get("tokens/s"), t.get("tokens/s")
        row["h/trl"] = tps / ttps if tps and ttps else None
        goal, met = row["goal"], None
        if row["variant"] == "sft_full" and row["h/trl"] is not None:
            met = row["h/trl"] >= 1.30 and (h.get("peak memory (GiB)") or 0) <= (
                t.get("peak memory (GiB)") or 0
            )
        elif row["variant"] == "sft_lora" and row["h/trl"] is not None:
            met = row["h/trl"] >= 1.2
        elif row["variant"] == "dpo" and row["h/trl"] is not None:
            met = row["h/trl"] >= 1.25
        elif row["variant"] == "zero3":
            base = ((by.get("sft_full") or {}).get("hydratune") or {}).get("tokens/s")
            row["vs sft_full"] = tps / base if tps and base else None
            met = row["vs sft_full"] >= 0.85 if row["vs sft_full"] is not None else None
        elif row["variant"] == "fsdp":
            met = bool(tps) if "error" not in h else False
        error = h.get("estimate error (%)")
        row["estimate within ±15 %"] = abs(error) <= ESTIMATE_TOLERANCE if error is not None else None
        row["verdict"] = {True: "met", False: "MISSED", None: "not measured"}[met] + f" ({goal})"


def fmt(value: Any, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    lines = [
        f"Run of {meta['date']} on {meta['device']} (driver {meta['driver']}), commit {meta['commit']}; "
        f"{meta['shape']} shape ({meta['params'] / 1e9:.2f} B parameters), {meta['seq_len']}-token rows, "
        f"micro-batch {meta['micro_batch']}, {meta['steps']} steps ({meta['warmup']} warm-up); "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + f". `{meta['command']}`"
        + (" **Dry run on CPU: the numbers are not comparable.**" if meta["dry_run"] else ""),
        "",
        "| row | hydratune tok/s | TRL tok/s | h/TRL | hydratune peak GiB | TRL peak GiB | estimate GiB "
        "| estimate error | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in doc["rows"]:
        h, t = row.get("hydratune") or {}, row.get("trl") or {}
        if row.get("skipped"):
            lines.append(f"| {row['variant']} | skipped: {row['skipped']} |||||||||")
            continue
        error = h.get("estimate error (%)")
        lines.append(
            f"| {row['variant']} | {fmt(h.get('tokens/s'), ',.0f')} | {fmt(t.get('tokens/s'), ',.0f')} "
            f"| {fmt(row.get('h/trl') or row.get('vs sft_full'), '.2f')} "
            f"| {fmt(h.get('peak memory (GiB)'), '.1f')} | {fmt(t.get('peak memory (GiB)'), '.1f')} "
            f"| {fmt(h.get('estimate (GiB)'), '.1f')} | {fmt(error, '+.1f')}{'' if error is None else ' %'} "
            f"| {row.get('verdict', '')} |"
        )
        for impl in ("hydratune", "trl"):
            if (row.get(impl) or {}).get("error"):
                lines.append(f"|  ↳ {impl} failed: {throughput.error_line(row[impl]['error'])} |||||||||")
    if doc.get("tests"):
        lines += ["", f"tests/gpu: {doc['tests']}"]
    return "\n".join(lines) + "\n"


def write(out: Path, doc: dict[str, Any]) -> None:
    for name, text in (
        ("results.json", json.dumps(doc, indent=1, default=str)),
        ("results.md", markdown(doc)),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)


def driver() -> tuple[str, str]:
    """The driver's version and nvidia-smi's page."""
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        line = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
        return line or "unknown", smi.stdout
    except (OSError, subprocess.SubprocessError):
        return "none (no nvidia-smi)", ""


def gpu_tests(out: Path, seconds: float) -> str:
    """``pytest tests/gpu`` within ``seconds``: its summary line (skips say why, -rs)."""
    if seconds < 20:
        return f"not run: {seconds:.0f} s left"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/gpu"]
    cmd += [f"--junitxml={out / 'gpu_tests.xml'}", "-o", "addopts="]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds, cwd=REPO)
        text, summary = proc.stdout + proc.stderr, (proc.stdout.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired as late:
        text, summary = str(late.stdout or ""), f"timed out after {seconds:.0f} s"
    (out / "gpu_tests.txt").write_text(text)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, 2 steps a row")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole call")
    ap.add_argument("--only", default="", help="comma-separated row names")
    ap.add_argument("--steps", type=int, help="steps a row (GPU 30, dry run 2)")
    args = ap.parse_args(argv)
    begin = time.time()
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("bench/gpu/run.py: no CUDA GPU here (--dry-run runs the same path on CPU)", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (2 if args.dry_run else 30)
    mode = throughput.mode_for(args.dry_run, steps, 1 if args.dry_run else 8)
    mode.timeout = 240 if args.dry_run else 200  # one process at most
    if args.dry_run:  # its numbers are not compared: each row's processes are forked, imports paid once
        throughput.preload(mode.env)
    drv, smi = driver()
    if smi:
        (out / "nvidia-smi.txt").write_text(smi)
    peak = throughput.measure_peak(mode)
    doc: dict[str, Any] = {
        "meta": {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device": peak["device"],
            "driver": drv,
            "commit": os.environ.get("COMMIT", "unknown"),
            "versions": {"python": sys.version.split()[0], **versions()},
            "command": "bash bench/gpu/run.sh " + shlex.join(argv if argv is not None else sys.argv[1:]),
            "dry_run": args.dry_run,
            "shape": mode.shape,
            "params": param_count(SHAPES[mode.shape]),
            "seq_len": mode.seq_len,
            "micro_batch": mode.micro_batch,
            "steps": mode.steps,
            "warmup": mode.warmup,
            "matmul peak (TFLOP/s)": round(peak["flops"] / 1e12, 1),
            "trl options": {"sft": TRL_SFT, "dpo": TRL_DPO, "always": "bf16 (GPU), SDPA, TRL defaults"},
        },
        "rows": [],
    }
    wanted = [r for r in ROWS if not args.only or r.variant.name in args.only.split(",")]
    with tempfile.TemporaryDirectory(prefix="hydratune-gpu-") as work:
        for row in wanted:
            left = args.budget - (time.time() - begin)
            entry: dict[str, Any] = {
                "variant": row.variant.name,
                "regime": row.variant.regime,
                "goal": row.goal,
            }
            if not args.dry_run and left < row.seconds:
                entry["skipped"] = f"{left:.0f} s left, the row needs ~{row.seconds} s"
            else:
                impls = [i for i in ("hydratune", "trl") if i in row.variant.impls]
                if not args.dry_run:  # each process of the row within the time left
                    mode.timeout = int(max(30, min(200, (left - 15) / len(impls))))
                result = throughput.run_variant(row.variant, mode, Path(work), ("hydratune", "trl"), row.trl)
                entry.update({k: v for k, v in result.items() if k in ("hydratune", "trl")})
                if "hydratune" in entry:
                    entry["hydratune"] = with_estimate(entry["hydratune"])
            doc["rows"].append(entry)
            judged(doc["rows"])
            write(out, doc)
    doc["tests"] = gpu_tests(out, args.budget - (time.time() - begin) - 5)
    doc["meta"]["wall (s)"] = round(time.time() - begin, 1)
    write(out, doc)
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
