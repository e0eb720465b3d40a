"""Validate the memory estimate on a GPU: measured peak vs ``hydratune.components.memory.estimate``, for many
configurations.

    python bench/memory.py --out docs/memory.md            # every configuration (~5 min on an H100)
    python bench/memory.py --only full_bf16,lora_bf16      # a subset
    python bench/memory.py --list                          # the configurations, no GPU needed

Each configuration runs in a fresh subprocess (so one peak never leaks into the next): a Llama-shaped
random-init model (~0.5 B parameters) trains ``--steps`` optimizer steps on random tokens and reports
``torch.cuda.max_memory_allocated()``; the parent compares it with the estimate's ``peak_allocated`` (the
allocator's peak, without the CUDA context and fragmentation that ``total`` adds) and writes a markdown
table. The loop is hand-written, NOT a hydratune run (``bench/hydratune_memory.py`` measures hydratune
itself); it approximates what the recipes do: fp32 weights + autocast (or
DeepSpeed's engine, which casts to bf16/fp16 and keeps fp32 masters), the model's own cross-entropy
loss, torch AdamW, peft LoRA, bitsandbytes 4-bit NF4 + double quant + ``prepare_model_for_kbit_training``
for QLoRA. One known difference: its LoRA rows keep an fp32 base where hydratune (``model.dtype=auto``,
bf16) loads a bf16 one (only ``lora_bf16_base_bf16_s2048`` matches hydratune's choice).
DeepSpeed / bitsandbytes configurations are skipped (said in the table) when the package is missing.
The estimate side needs neither torch nor a GPU: ``estimate_for`` is covered by the CPU tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hydratune.components.memory.arch import Arch, lora_params, param_counts  # noqa: E402 - repo root on the path first
from hydratune.components.memory.estimate import Estimate, GiB, RunSpec, estimate  # noqa: E402
from hydratune.components.memory.shapes import StrategyShape  # noqa: E402

#: Llama-shaped, ~0.5 B parameters (GQA 16/8 heads, untied 32k vocab).
ARCH = {
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}
LORA = {"r": 16, "target_modules": "all-linear", "dropout": 0.05}  # as peft=lora's defaults
#: the shapes of the strategies measured here (what the strategy options' components declare)
SHAPES = {
    "single": StrategyShape("single"),
    **{f"zero{stage}": StrategyShape("deepspeed", stage=stage) for stage in (0, 1, 2, 3)},
}


@dataclass(frozen=True)
class BenchConfig:
    """One measured configuration."""

    name: str
    peft: str = "full"  # full | lora | qlora
    precision: str = "bf16"  # bf16 | fp16
    strategy: str = "single"  # single | zero0 | zero2 | zero3
    gradient_checkpointing: bool = False
    micro_batch: int = 4
    seq_len: int = 1024
    weight_dtype: str = "float32"  # model.dtype: float32 (fp32 masters + autocast) | bfloat16
    attn: str = "sdpa"

    @property
    def needs(self) -> str | None:
        """The optional package this configuration needs."""
        if self.strategy.startswith("zero"):
            return "deepspeed"
        return "bitsandbytes" if self.peft == "qlora" else None


CONFIGS: list[BenchConfig] = [
    BenchConfig("full_bf16"),
    BenchConfig("full_bf16_gc", gradient_checkpointing=True),
    BenchConfig("full_fp16", precision="fp16"),
    BenchConfig("full_bf16_eager_s2048", attn="eager", micro_batch=1, seq_len=2048),
    BenchConfig("lora_bf16", peft="lora"),
    BenchConfig("lora_bf16_gc", peft="lora", gradient_checkpointing=True),
    BenchConfig("lora_fp16", peft="lora", precision="fp16"),
    BenchConfig(
        "lora_bf16_base_bf16_s2048", peft="lora", weight_dtype="bfloat16", micro_batch=2, seq_len=2048
    ),
    BenchConfig("qlora_bf16", peft="qlora"),
    BenchConfig("qlora_bf16_gc", peft="qlora", gradient_checkpointing=True),
    BenchConfig("full_bf16_zero0", strategy="zero0"),
    BenchConfig("full_bf16_zero2", strategy="zero2"),
    BenchConfig("full_bf16_zero2_gc", strategy="zero2", gradient_checkpointing=True),
    BenchConfig("full_fp16_zero2", strategy="zero2", precision="fp16"),
    BenchConfig("full_bf16_zero3", strategy="zero3"),
    BenchConfig("lora_bf16_zero2", peft="lora", strategy="zero2"),
]


def spec_for(cfg: BenchConfig) -> RunSpec:
    """The RunSpec the estimator sees for a bench configuration (the same numbers hydratune would pass)."""
    arch = Arch.from_dict(ARCH)
    full = cfg.peft == "full"
    trainable = param_counts(arch).total if full else lora_params(arch, LORA["r"], LORA["target_modules"])
    lin = arch.linears()
    return RunSpec(
        arch=arch,
        trainable=trainable,
        full_finetune=full,
        weight_bytes=4 if cfg.weight_dtype == "float32" else 2,
        compute_bytes=2,
        optimizer="adamw",
        quant_bits=4 if cfg.peft == "qlora" else None,
        quant_type="nf4",
        double_quant=True,
        micro_batch=cfg.micro_batch,
        seq_len=cfg.seq_len,
        gradient_checkpointing=cfg.gradient_checkpointing,
        attn_implementation=cfg.attn,
        strategy=SHAPES[cfg.strategy],
        num_gpus=1,
        lora_inputs_per_layer=0 if full else sum(i for i, _, _ in lin.values()),
        lora_dropout=not full,
    )


def estimate_for(cfg: BenchConfig) -> Estimate:
    return estimate(spec_for(cfg))


# ---- the measured side (runs in a child process on the GPU) -------------------------------------
def worker(cfg: BenchConfig, steps: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]
    arch = {k: v for k, v in ARCH.items() if k != "model_type"}
    config = LlamaConfig(**arch, use_cache=False)
    wdtype = getattr(torch, cfg.weight_dtype)
    if cfg.peft == "qlora":
        import tempfile

        from peft import prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig

        with tempfile.TemporaryDirectory() as tmp:
            AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp)
            bnb = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=dtype,
            )
            model = AutoModelForCausalLM.from_pretrained(
                tmp,
                quantization_config=bnb,
                dtype=torch.bfloat16,
                device_map={"": 0},
                attn_implementation=cfg.attn,
            )
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=wdtype, attn_implementation=cfg.attn)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.peft in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"
        )
        model = get_peft_model(model, lora)
        if cfg.gradient_checkpointing:
            model.enable_input_require_grads()
    model.train()  # from_pretrained returns an eval-mode model: no dropout, no checkpointing
    params = [p for p in model.parameters() if p.requires_grad]
    ids = torch.randint(0, ARCH["vocab_size"], (cfg.micro_batch, cfg.seq_len), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    if cfg.strategy.startswith("zero"):
        import deepspeed

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        h = ARCH["hidden_size"]
        zero = {
            "stage": int(cfg.strategy[-1]),
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": h * h,
            "allgather_bucket_size": h * h,
            "stage3_prefetch_bucket_size": int(0.9 * h * h),
            "stage3_param_persistence_threshold": 10 * h,
        }
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.micro_batch,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0,
            "bf16": {"enabled": cfg.precision == "bf16"},
            "fp16": {"enabled": cfg.precision == "fp16", "initial_scale_power": 16},
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,
        }
        optimizer = torch.optim.AdamW(params, lr=1e-5)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        for _ in range(steps):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
    else:
        model.to("cuda")
        optimizer = torch.optim.AdamW(params, lr=1e-5, fused=True)
        scaler = torch.amp.GradScaler("cuda", enabled=cfg.precision == "fp16")
        for _ in range(steps):
            with torch.autocast("cuda", dtype=dtype):
                loss = model(input_ids=ids, labels=ids).loss
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return {
        "peak": float(torch.cuda.max_memory_allocated()),
        "reserved": float(torch.cuda.max_memory_reserved()),
        "loss": float(loss.detach().float().item()),
    }


# ---- the parent -------------------------------------------------------------------------------
def available(package: str | None) -> bool:
    if package is None:
        return True
    probe = f"import {package}"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=300).returncode == 0


def run_one(cfg: BenchConfig, steps: int, timeout: int) -> dict[str, Any] | str:
    """Measure one configuration in a child process: its result, or why there is none."""
    cmd = [sys.executable, __file__, "--worker", json.dumps(asdict(cfg)), "--steps", str(steps)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    if any("OutOfMemoryError" in t or "out of memory" in t for t in tail):
        return "OOM"
    return "failed: " + " | ".join(t.strip()[:160] for t in tail)


def table(rows: list[tuple[BenchConfig, Estimate, dict[str, Any] | str]], device: str) -> str:
    """The markdown table (and a one-line summary) for docs/memory.md."""
    head = (
        "| config | peft | precision | strategy | ckpt | batch x seq | estimate GiB | measured GiB "
        "| error |\n"
        "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |"
    )
    lines, errors, unknown = [head], [], 0
    for cfg, est, result in rows:
        e = est.peak_allocated / GiB
        if isinstance(result, dict):
            m = result["peak"] / GiB
            err = 100 * (e - m) / m
            dagger = str(result.get("provenance", "")).startswith("unknown")
            unknown += dagger
            if not dagger:
                errors.append(abs(err))
            measured, error = f"{m:.2f}{' †' if dagger else ''}", f"{err:+.1f} %"
        else:
            measured, error = result, "—"
        ckpt = "on" if cfg.gradient_checkpointing else "off"
        peft = cfg.peft + ("" if cfg.weight_dtype == "float32" or cfg.peft == "qlora" else " (bf16 base)")
        lines.append(
            f"| {cfg.name} | {peft} | {cfg.precision} | {cfg.strategy} | {ckpt} | {cfg.micro_batch} x "
            f"{cfg.seq_len}{' eager' if cfg.attn == 'eager' else ''} | {e:.2f} | {measured} | {error} |"
        )
    summary = (
        f"\n{len(errors)} configurations measured on {device} with the harness's full record; largest "
        f"|error| {max(errors):.1f} %, mean {sum(errors) / len(errors):.1f} %."
        if errors
        else "\nnot yet measured"
    )
    if unknown:
        summary += (
            f" † {unknown} entries of unknown provenance (docs/memory.json says why), shown but not counted."
        )
    return "\n".join(lines) + "\n" + summary + "\n"


def write_doc(path: Path, body: str) -> None:
    """Replace the table between the markers in ``path`` (the rest of the page is kept)."""
    start, end = "<!-- bench:start -->", "<!-- bench:end -->"
    text = path.read_text() if path.is_file() else f"# Memory estimate vs measured\n\n{start}\n{end}\n"
    if start not in text:
        text += f"\n{start}\n{end}\n"
    before, rest = text.split(start, 1)
    after = rest.split(end, 1)[1] if end in rest else ""
    path.write_text(f"{before}{start}\n{body}{end}{after}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="markdown file whose bench table is (re)written")
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per configuration")
    ap.add_argument("--list", action="store_true", help="print the configurations and their estimates")
    ap.add_argument("--save", type=Path, help="write the measurements (JSON) here, after each configuration")
    ap.add_argument("--load", type=Path, help="reuse these measurements (JSON); measure only the others")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        result = worker(BenchConfig(**json.loads(args.worker)), args.steps)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    chosen = [c for c in CONFIGS if not args.only or c.name in args.only.split(",")]
    if args.list:
        for c in chosen:
            print(
                f"{c.name:<28} estimate {estimate_for(c).peak_allocated / GiB:6.2f} GiB  "
                f"needs {c.needs or '-'}"
            )
        return 0
    saved = json.loads(args.load.read_text()) if args.load and args.load.is_file() else {}
    measured: dict[str, dict[str, Any] | str] = dict(saved.get("results", {}))
    device = saved.get("device", "")
    todo = [c for c in chosen if not isinstance(measured.get(c.name), dict)]
    if todo:
        import torch

        if not torch.cuda.is_available():
            print("bench/memory.py needs a CUDA GPU (--list shows the configurations)", file=sys.stderr)
            return 2
        device = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    have = {p: available(p) for p in {c.needs for c in todo if c.needs}}
    start = time.time()
    for c in todo:
        if c.needs and not have[c.needs]:
            measured[c.name] = f"skipped: no {c.needs}"
            continue
        t0 = time.time()
        measured[c.name] = run_one(c, args.steps, args.timeout)
        if isinstance(measured[c.name], dict):  # date, GPU, versions, commit, command of the measurement
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from hydratune_memory import provenance

            measured[c.name]["provenance"] = provenance([sys.executable, __file__, "--only", c.name])
        print(f"{c.name}: {measured[c.name]} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        if args.save:
            args.save.write_text(
                json.dumps({**saved, "device": device, "results": measured}, indent=1) + "\n"
            )
    rows = [(c, estimate_for(c), measured.get(c.name, "not measured")) for c in chosen]
    body = table(rows, device)
    print(body)
    print(f"# {time.time() - start:.0f} s", file=sys.stderr)
    if args.out:
        write_doc(args.out, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
