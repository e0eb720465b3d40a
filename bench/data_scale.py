"""Data at scale (issue 25): what a command costs before its first optimizer step, and its peak memory, as
the chat file grows (10k, 100k, 1M rows), side by side in one run:

* **hydratune cold**: a fresh prepared-data cache (``data.cache_dir``): reads, converts, checks, masks and
  tokenizes every row, writes the entry;
* **hydratune warm**: the same command again: the entry is memory-mapped (a cache hit);
* **hydratune, 100-row file**: the same command on a 100-row file, twice (the second run is the baseline
  a warm run is held to: issue 25 asks for <= 1.2x);
* **hydratune mode=plan**: ``mode=plan`` of the same command on a fresh cache (plan prepares the entry
  that training then reuses);
* **TRL cold / warm**: TRL 1.16 ``SFTTrainer`` with its defaults on ``load_dataset("json")``
  (``bench/trl_baseline.py``), with a fresh ``HF_DATASETS_CACHE``, then again on the same one (datasets'
  fingerprint cache);
* **hydratune DDP, 2 processes, cold**: ``launcher.nproc_per_node=2 strategy=ddp`` on a fresh cache:
  one rank prepares, the other waits and memory-maps (counted from the ranks' lines in the log).

Every run is its own command in a fresh process, measured from outside: the whole command's wall time,
and the peak over the whole process tree (the launcher, its ranks, the preparation's worker processes) of
the summed resident set size, sampled every 0.2 s (and of the proportional set size, which counts pages
shared by forked processes once). "Command to first step" is each run's own record: hydratune's
``summary.md`` (process age at the end of the first optimizer step), TRL's first step end (process age).

The data: ``{"messages": [...]}`` rows, 1-3 user/assistant exchanges, 30 % with a system turn, made
deterministically of short single-token words of the tiny tokenizer so that a row's length under its chat
template is log-normal with a median of about 250 tokens; ``data.max_length=512``, micro-batch 8 for both
trainers (so that the first optimizer step's own cost stays small beside the data's). Files are written into
the work dir (the 1M-row file, ~0.8 GB, is made there on the fly and never committed).

    python bench/data_scale.py --out docs/benchmarks.md                    # 10k, 100k and 1M rows
    python bench/data_scale.py --sizes 10000                               # a quick check (~3 min)
    python bench/data_scale.py --sizes 1000000 --only plan,cold            # some runs of one size
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, TINY, versions

BENCH = Path(__file__).resolve().parent
SIZES = (10_000, 100_000, 1_000_000)
RUNS = ("cold", "warm", "small", "plan", "trl_cold", "trl_warm", "ddp")
MAX_LENGTH = 512
MEDIAN_TOKENS = 250
MICRO_BATCH = 8  # both trainers: the first step's own cost stays small beside the data's
SAMPLE_EVERY = 0.2  # seconds between memory samples


# ---- the data --------------------------------------------------------------------------------------------
@cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY)


@cache
def short_words() -> tuple[str, ...]:
    """Words of at most three letters (with their leading space) that the tiny tokenizer encodes as one
    token: about 3.5 bytes a token, as in the issue's file (79 MB for 100k rows of ~250 tokens)."""
    tok = tokenizer()
    found = []
    for piece in sorted(tok.get_vocab()):
        word = " " + piece[1:]
        short = piece.startswith("Ġ") and piece[1:].isalpha() and len(word) <= 4
        if short and len(tok(word, add_special_tokens=False)["input_ids"]) == 1:
            found.append(word)
    return tuple(found)


def make_chats(path: Path, rows: int, seed: int = 0) -> Path:
    """``rows`` chat rows (see the module's docstring), deterministic for a seed; written once."""
    if path.is_file():
        return path
    rng = random.Random(seed)
    words = short_words()
    corpus = "".join(rng.choice(words) for _ in range(400_000))
    starts = [i for i, c in enumerate(corpus) if c == " "]
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for _ in range(rows):
            total = min(4 * MAX_LENGTH, max(24, round(rng.lognormvariate(math.log(MEDIAN_TOKENS), 0.6))))
            exchanges = rng.choice((1, 1, 2, 2, 3))
            messages = (
                [{"role": "system", "content": "You are a helpful assistant."}] if rng.random() < 0.3 else []
            )
            per = max(4, (total - 9 * exchanges) // exchanges)
            for _ in range(exchanges):
                answer = max(1, per // 3)
                for role, n in (("user", per - answer), ("assistant", answer)):
                    k = rng.randrange(len(starts) - n - 1)
                    messages.append({"role": role, "content": corpus[starts[k] : starts[k + n]].strip()})
            f.write(json.dumps({"messages": messages}) + "\n")
    tmp.rename(path)
    return path


def token_lengths(path: Path, n: int = 2000) -> dict[str, float]:
    """The chat-template token counts of the first ``n`` rows."""
    tok = tokenizer()
    with path.open() as f:
        rows = [json.loads(line) for _, line in zip(range(n), f, strict=False)]
    lengths = [len(tok.apply_chat_template(r["messages"], tokenize=True)["input_ids"]) for r in rows]
    over = sum(length > MAX_LENGTH for length in lengths) / len(lengths)
    return {
        "median": statistics.median(lengths),
        "p90": sorted(lengths)[int(0.9 * len(lengths))],
        "over": over,
    }


# ---- measuring a command ---------------------------------------------------------------------------------
def measure(cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> dict[str, Any]:
    """Run ``cmd``; its wall time and the peak summed RSS / PSS of its process tree (psutil samples)."""
    import psutil

    start = time.monotonic()
    with log.open("w") as out:
        proc = psutil.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=REPO)
        rss = pss = 0
        while proc.poll() is None:
            if time.monotonic() - start > timeout:
                for child in proc.children(recursive=True):
                    child.kill()
                proc.kill()
                proc.wait()
                break
            tree = [proc, *_children(proc)]
            rss = max(rss, sum(_memory(p, "rss") for p in tree))
            pss = max(pss, sum(_memory(p, "pss") for p in tree))
            time.sleep(SAMPLE_EVERY)
    wall = time.monotonic() - start
    return {
        "rc": proc.returncode,
        "wall (s)": round(wall, 1),
        "peak RSS (GiB)": round(rss / 2**30, 3),
        "peak PSS (GiB)": round(pss / 2**30, 3),
        "log": str(log),
    }


def _children(proc: Any) -> list[Any]:
    try:
        return proc.children(recursive=True)
    except Exception:  # the process ended while it was asked
        return []


def _memory(proc: Any, kind: str) -> int:
    try:
        return getattr(proc.memory_full_info(), kind) if kind == "pss" else proc.memory_info().rss
    except Exception:  # gone, or not ours to read
        return 0


# ---- the runs --------------------------------------------------------------------------------------------
def hydratune_args(data: Path, cache_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "data=jsonl_messages",
        f"data.path={data}",
        "data.eval_fraction=0",
        f"data.max_length={MAX_LENGTH}",
        f"data.cache_dir={cache_dir}",
        "train.max_steps=2",
        f"train.micro_batch_size={MICRO_BATCH}",
        "train.eval_generations=0",
        "train.eval_every=0",
        "train.save_every=0",
        "train.write_plots=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def run_hydratune(name: str, args: list[str], work: Path, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "hydratune", *args]
    result = measure(cmd, {"PYTHONUNBUFFERED": "1"}, timeout, work / f"{name}.log")
    run_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")))
    summary = run_dir / "result.json"
    if summary.is_file():
        report = json.loads(summary.read_text())
        result["first step (s)"] = report.get("cost", {}).get("command to first step (s)")
        result["data cache"] = report.get("data", {}).get("data cache")
    text = Path(result["log"]).read_text(errors="replace")
    result["prepared"] = text.count(": preparing the data ")
    result["reused"] = text.count(": reusing the prepared data ")
    result["command"] = "python -m hydratune " + " ".join(shlex.quote(a) for a in args)
    return result


def run_trl(name: str, data: Path, hf_cache: Path, work: Path, timeout: float) -> dict[str, Any]:
    spec = {
        "variant": "data_scale",
        "regime": name,
        "recipe": "sft",
        "device": "cpu",
        "arch": {},
        "seq_len": MAX_LENGTH,
        "micro_batch": MICRO_BATCH,
        "steps": 2,
        "warmup": 1,
        "lr": 1e-3,
        "seed": 0,
        "data": str(data),
        "peft": None,
        "quant": False,
        "zero": 0,
        "trl_set": {},
        "result": str(work / f"{name}.json"),
    }
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, str(BENCH / "trl_baseline.py"), "--spec", f"@{spec_path}"]
    result = measure(cmd, {"HF_DATASETS_CACHE": str(hf_cache)}, timeout, work / f"{name}.log")
    out = work / f"{name}.json"
    if out.is_file():
        result["first step (s)"] = json.loads(out.read_text()).get("first step (s)")
    result["command"] = f"python bench/trl_baseline.py --spec '{json.dumps({**spec, 'result': '<file>'})}'"
    return result


def run_size(rows: int, work: Path, only: set[str], timeout: float) -> dict[str, Any]:
    """Every run of one file size, in a fixed order (cold before warm)."""
    data = make_chats(work / f"chats_{rows}.jsonl", rows)
    small = make_chats(work / "chats_100.jsonl", 100)
    out: dict[str, Any] = {
        "rows": rows,
        "file MB": round(data.stat().st_size / 2**20, 1),
        "lengths": token_lengths(data),
    }
    d = work / f"n{rows}"
    d.mkdir(exist_ok=True)

    def want(run: str) -> bool:
        return not only or run in only

    if want("plan"):
        args = hydratune_args(data, d / "cache_plan", d / "plan_run", "mode=plan")
        out["plan"] = run_hydratune(f"{rows}_plan", args, d, timeout)
    if want("cold") or want("warm"):
        out["cold"] = run_hydratune(
            f"{rows}_cold", hydratune_args(data, d / "cache", d / "cold_run"), d, timeout
        )
        out["warm"] = run_hydratune(
            f"{rows}_warm", hydratune_args(data, d / "cache", d / "warm_run"), d, timeout
        )
    if want("small"):
        first = hydratune_args(small, d / "cache_small", d / "small_1")
        run_hydratune(f"{rows}_small_1", first, d, timeout)  # prepares the 100-row entry
        out["small"] = run_hydratune(
            f"{rows}_small", hydratune_args(small, d / "cache_small", d / "small_2"), d, timeout
        )
    if want("trl_cold") or want("trl_warm"):
        out["trl_cold"] = run_trl(f"{rows}_trl_cold", data, d / "hf_cache", d, timeout)
        out["trl_warm"] = run_trl(f"{rows}_trl_warm", data, d / "hf_cache", d, timeout)
    if want("ddp"):
        args = hydratune_args(
            data, d / "cache_ddp", d / "ddp_run", "strategy=ddp", "launcher.nproc_per_node=2"
        )
        out["ddp"] = run_hydratune(f"{rows}_ddp", args, d, timeout)
    print(json.dumps(out, default=str)[:2000], flush=True)
    return out


# ---- the table -------------------------------------------------------------------------------------------
LABELS = {
    "cold": "hydratune, cold cache",
    "warm": "hydratune, warm cache (hit)",
    "small": "hydratune, 100-row file (warm)",
    "plan": "hydratune mode=plan, cold cache",
    "trl_cold": "TRL SFTTrainer, cold",
    "trl_warm": "TRL SFTTrainer, warm (datasets' cache)",
    "ddp": "hydratune DDP 2 processes, cold cache",
}


def ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "—"


def against(run: dict[str, Any], size: dict[str, Any], other: str, what: str) -> str:
    """``run``'s ``what`` as a ratio to the ``other`` run's of the same size."""
    return ratio(run.get(what), (size.get(other) or {}).get(what))


def fmt(value: Any, spec: str = ".1f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "—"


def render(sizes: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"Command: `{meta['command']}` ({meta['date']}, {meta['wall']:.0f} s)",
        "",
        f"Machine: {meta['machine']}. Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
        "",
        "Each row is one command in a fresh process: wall time of the whole command, the run's own time to "
        "its first optimizer step, peak memory of the whole process tree (summed RSS, and PSS: forked pages "
        "counted once). The ratios are against runs of the same size in this same invocation.",
        "",
    ]
    cols = [
        "rows (file)",
        "run",
        "whole command s",
        "to first step s",
        "peak RSS GiB",
        "peak PSS GiB",
        "ratios",
        "notes",
    ]
    lines += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for size in sizes:
        n, lengths = size["rows"], size["lengths"]
        shape = f"median {lengths['median']:.0f} tokens, {lengths['over']:.0%} > {MAX_LENGTH}"
        head = f"{n:,} ({size['file MB']} MB, {shape})"
        for run in RUNS:
            r = size.get(run)
            if not r:
                continue
            ratios, notes = [], []
            if run == "cold":
                ratios.append(f"whole ÷ TRL cold {against(r, size, 'trl_cold', 'wall (s)')}")
                ratios.append(f"RSS ÷ TRL cold {against(r, size, 'trl_cold', 'peak RSS (GiB)')}")
            if run == "warm":
                ratios.append(f"whole ÷ 100-row {against(r, size, 'small', 'wall (s)')}")
                ratios.append(f"whole ÷ TRL warm {against(r, size, 'trl_warm', 'wall (s)')}")
            if run.startswith(("cold", "warm", "small", "plan", "ddp")) and "prepared" in r:
                notes.append(f"prepared {r['prepared']}x, reused {r['reused']}x")
            if r.get("rc"):
                notes.append(f"exit {r['rc']}: see {Path(r['log']).name}")
            lines.append(
                "| "
                + " | ".join(
                    [
                        head,
                        LABELS[run],
                        fmt(r.get("wall (s)")),
                        fmt(r.get("first step (s)")),
                        fmt(r.get("peak RSS (GiB)"), ".2f"),
                        fmt(r.get("peak PSS (GiB)"), ".2f"),
                        "; ".join(ratios),
                        "; ".join(notes),
                    ]
                )
                + " |"
            )
            head = ""
    lines += ["", "Commands of the largest size:", ""]
    last = sizes[-1]
    for run in RUNS:
        if last.get(run, {}).get("command"):
            lines.append(f"- {LABELS[run]}: `{last[run]['command']}`")
    return "\n".join(lines) + "\n"


def machine() -> str:
    import platform

    cores = len(os.sched_getaffinity(0))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()[0]
    cpu = platform.processor() or platform.machine()
    return f"{cpu}, {cores} cores, {memory:.0f} GiB, load {load:.1f} at start"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="rows per file, comma-separated")
    parser.add_argument("--only", default="", help=f"a subset of the runs: {','.join(RUNS)}")
    parser.add_argument("--out", type=Path, help="markdown file whose data section gets the table")
    parser.add_argument("--work", type=Path, help="keep files, caches and logs here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the raw results as JSON")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per command")
    args = parser.parse_args(argv)
    begin = time.time()
    work_ctx = tempfile.TemporaryDirectory(prefix="hydratune_data_scale_") if args.work is None else None
    work = Path(work_ctx.name) if work_ctx else args.work
    work.mkdir(parents=True, exist_ok=True)
    only = {o for o in args.only.split(",") if o}
    try:
        sizes = [run_size(int(n), work, only, args.timeout) for n in args.sizes.split(",")]
    finally:
        if work_ctx:
            work_ctx.cleanup()
    meta = {
        "command": "python bench/data_scale.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "date": time.strftime("%Y-%m-%d"),
        "wall": time.time() - begin,
        "machine": machine(),
        "versions": {**versions(), **_data_versions()},
    }
    table = render(sizes, meta)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "sizes": sizes}, indent=1, default=str))
    if args.out:
        from throughput import update_section

        update_section(args.out, "data", table)
    return sizes


def _data_versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("datasets", "pyarrow", "tokenizers")}


if __name__ == "__main__":
    main()
