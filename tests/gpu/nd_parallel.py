"""GPU check of the split-model layouts (``strategy.tp_size`` / ``strategy.sp_size``) against one GPU: each
layout trains the same global batch (micro-batch 8, one data-parallel replica) for 10 steps with SGD and no
clipping on a random-init ~30M Llama; its losses must equal the single-GPU run's within ``--tol``, and its
live check must have recorded the split (``.rank0.layout.json``). Needs 2 GPUs; prints "skipped" without CUDA
or with fewer GPUs (exit 0), so it can sit in any job.

    python tests/gpu/nd_parallel.py                          # all layouts, ~5 min on 2 H100s
    python tests/gpu/nd_parallel.py --only fsdp_tp,fsdp_cp
    python tests/gpu/nd_parallel.py --only pipeline_tp,zero1_pp      # 4 GPUs: not run yet
    python tests/gpu/nd_parallel.py --only zero1_ep                  # expert parallel: not run yet

Layouts: DeepSpeed AutoTP and Ulysses under ZeRO-1 and ZeRO-3 (also tested on CPU), FSDP2 x TP
(transformers' DistributedConfig at load) and context parallel (accelerate cp_size, ring attention,
SDPA): the last two are GPU-only and have not been run by the tests on CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: run as a script
from tests.gpu.strategies import hydratune
from tests.multiproc.test_nd_parallel import QUIET, SGD

ARCH = [
    "+model.architecture.hidden_size=512",
    "+model.architecture.intermediate_size=1536",
    "+model.architecture.num_hidden_layers=4",
    "+model.architecture.num_attention_heads=8",
    "+model.architecture.num_key_value_heads=4",
    "+model.architecture.head_dim=64",
]
COMMON = [
    *ARCH,
    "precision=bf16",
    "train.micro_batch_size=8",
    "train.max_steps=10",
    "train.save_every=0",
    *QUIET,
    *SGD,
]
TWO = "launcher.nproc_per_node=2"
FOUR = "launcher.nproc_per_node=4"
#: name -> (overrides, the single-GPU run it must equal: same engine, so the same init)
LAYOUTS: dict[str, tuple[list[str], list[str]]] = {
    "zero1_tp": (["strategy=zero1", "strategy.tp_size=2", TWO], ["strategy=zero1"]),
    "zero1_sp": (["strategy=zero1", "strategy.sp_size=2", TWO], ["strategy=zero1"]),
    "zero3_tp": (["strategy=zero3", "strategy.tp_size=2", TWO], ["strategy=zero3"]),
    "zero3_sp": (
        ["strategy=zero3", "strategy.sp_size=2", "strategy.reduce_scatter=false", TWO],
        ["strategy=zero3"],
    ),
    "fsdp_tp": (["strategy=fsdp", "strategy.tp_size=2", TWO], ["strategy=fsdp"]),
    "fsdp_cp": (
        ["strategy=fsdp", "strategy.sp_size=2", "model.attn_implementation=sdpa", TWO],
        ["strategy=fsdp", "model.attn_implementation=sdpa"],
    ),
    # pipeline stages (tested on CPU: tests/multiproc/test_pipeline.py): PP x TP, and PP x DP with ZeRO-1
    "pipeline_tp": (
        [
            "strategy=pipeline",
            "strategy.pp_size=2",
            "strategy.tp_size=2",
            FOUR,
            "train.gradient_accumulation_steps=2",
        ],
        ["train.gradient_accumulation_steps=2"],
    ),
    "zero1_pp": (
        [
            "strategy=zero1",
            "strategy.pp_size=2",
            FOUR,
            "train.micro_batch_size=4",
            "train.gradient_accumulation_steps=2",
        ],
        ["train.gradient_accumulation_steps=2"],
    ),
}
#: the GPUs a layout needs (2 unless named)
GPUS = {"pipeline_tp": 4, "zero1_pp": 4}
#: expert parallel (DeepSpeed AutoEP) on the tiny mixture of experts, against ZeRO-1 on the same 2 GPUs (the
#: exact oracle of tests/multiproc/test_expert_parallel.py): its own base, the MoE's architecture as shipped
MOE_COMMON = ["model=tiny_moe", "precision=bf16", "train.max_steps=10", "train.save_every=0", *QUIET]
LAYOUTS["zero1_ep"] = (["strategy=zero1", "strategy.ep_size=2", TWO], ["strategy=zero1", TWO])
BASES = {"zero1_ep": MOE_COMMON}


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").open()) if "loss" in r]


def read_result(run: Path) -> dict:
    return json.loads((run / "result.json").read_text())


def check(name: str, tol: float, root: Path) -> dict:
    split, single = LAYOUTS[name]
    base = BASES.get(name, COMMON)
    code, _, tail = hydratune([*base, *single], root / f"{name}_one")
    if code:
        return {"layout": name, "status": f"single-GPU run failed: {tail[-400:]}"}
    code, _, tail = hydratune([*base, *split], root / name)
    if code:
        return {"layout": name, "status": f"FAILED rc={code}: {tail[-600:]}"}
    want, got = losses(root / f"{name}_one"), losses(root / name)
    worst = max(abs(a - b) for a, b in zip(want, got, strict=True))
    live = root / name / ".rank0.layout.json"  # the engines' live check; the pipeline's is in result.json
    layout = json.loads(live.read_text()) if live.is_file() else read_result(root / name).get("pipeline")
    status = "ok" if worst <= tol else f"losses differ by {worst:.2e} > {tol:g}"
    return {"layout": name, "status": status, "max |dloss|": worst, "rank 0": layout}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="comma-separated layout names")
    parser.add_argument(
        "--tol", type=float, default=2e-2, help="bf16: the ranks add partial sums in another order"
    )
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        print(f"skipped: needs 2 CUDA GPUs, found {found}")
        return
    names = [n for n in LAYOUTS if not args.only or n in args.only.split(",")]
    for name in [n for n in names if GPUS.get(n, 2) > torch.cuda.device_count()]:
        print(json.dumps({"layout": name, "status": f"skipped: needs {GPUS[name]} GPUs"}), flush=True)
        names.remove(name)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            row = check(name, args.tol, Path(tmp))
            failed += row["status"] != "ok"
            print(json.dumps(row, default=str), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
