"""The support matrix as data: recipe x strategy x peft x quantization x precision → a verdict.

Each cell is one of: ``cpu`` (passes the pre-load checks on a CPU host and is meant to train there),
``gpu`` (passes them when planned for CUDA, and the checks refuse it on CPU before any model loads), or
``refused`` (the checks refuse it everywhere, naming ``key``). The verdicts come from :data:`RULES`, first
match wins; ``tests/test_matrix.py`` walks every cell through the real composition and
``check_before_load`` and asserts the verdict. Which cells were also *trained* in a test is
:data:`RUN_IN_TESTS` (a covering sample: each recipe and each strategy at least once; the rest are
checked, not run). ``python -m components.matrix --markdown > docs/matrix.md`` renders the table.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

RECIPES = ("sft", "reward", "dpo", "grpo", "ppo")
STRATEGIES = (
    "single",
    "ddp",
    "fsdp",
    "zero0",
    "zero1",
    "zero2",
    "zero3",
    "zero2_offload",
    "zero3_offload",
    "zero3_nvme",
    "zero3pp",
)
PEFTS = ("none", "lora")
QUANTIZATIONS = ("none", "nf4")
PRECISIONS = ("fp32", "bf16", "fp16")

DEEPSPEED = {s for s in STRATEGIES if s.startswith("zero")}
SHARDED = {"fsdp", "zero3", "zero3_offload", "zero3_nvme", "zero3pp"}  # parameters split over ranks
#: knobs a strategy cannot go without (zero3_nvme has no default swap dir)
REQUIRED = {"zero3_nvme": ["strategy.nvme_path=/local_nvme"]}


@dataclass(frozen=True)
class Cell:
    recipe: str
    strategy: str
    peft: str
    quantization: str
    precision: str

    def overrides(self) -> list[str]:
        """The command-line overrides of this cell (two processes for every multi-process strategy)."""
        world = 1 if self.strategy == "single" else 2
        return [
            f"recipe={self.recipe}",
            f"strategy={self.strategy}",
            f"peft={self.peft}",
            f"quantization={self.quantization}",
            f"precision={self.precision}",
            f"launcher.nproc_per_node={world}",
            *REQUIRED.get(self.strategy, []),
        ]


@dataclass(frozen=True)
class Verdict:
    kind: str  # cpu | gpu | refused
    why: str = ""
    key: str | None = None  # refused: the config key the error names


Rule = tuple[Callable[[Cell], bool], Verdict]

#: first match wins; a cell no rule matches runs on CPU
RULES: list[Rule] = [
    (
        lambda c: c.quantization == "nf4" and c.peft == "none",
        Verdict("refused", "a quantized base trains only through an adapter (QLoRA)", "peft"),
    ),
    (
        lambda c: c.quantization == "nf4" and c.strategy in SHARDED,
        Verdict(
            "refused",
            "sharding 4-bit weights needs quantization.quant_storage = the training dtype (default uint8)",
            "quantization.quant_storage",
        ),
    ),
    (
        lambda c: c.recipe == "ppo" and c.strategy == "fsdp" and c.precision == "fp16",
        Verdict("refused", "PPO's own FSDP2 loop has no sharded fp16 loss scaling", "precision"),
    ),
    (lambda c: c.precision == "fp16", Verdict("gpu", "fp16 loss scaling needs a GPU")),
    (
        lambda c: c.strategy == "fsdp" and c.recipe != "ppo",
        Verdict("gpu", "accelerate runs FSDP on GPUs only (PPO shards with fully_shard itself)"),
    ),
    (lambda c: c.strategy == "zero3pp", Verdict("gpu", "ZeRO++ qwZ/qgZ use DeepSpeed's CUDA quantizer")),
    (
        lambda c: c.strategy in DEEPSPEED and c.precision != "fp32",
        Verdict("gpu", "DeepSpeed on CPU trains in fp32 only"),
    ),
]

#: cells trained end to end by a test (the covering sample), with the test that does it
RUN_IN_TESTS: dict[Cell, str] = {
    Cell("sft", "single", "none", "none", "fp32"): "test_sft.py",
    Cell(
        "sft", "single", "lora", "nf4", "fp32"
    ): "test_strategies.py::test_qlora_trains_only_the_adapter_on_cpu",
    Cell(
        "sft", "ddp", "none", "none", "fp32"
    ): "test_distributed.py::test_ddp_two_processes_match_one_process",
    Cell("sft", "zero1", "none", "none", "fp32"): "test_distributed.py::test_deepspeed_two_processes_…",
    Cell("sft", "zero2", "none", "none", "fp32"): "test_distributed.py::test_deepspeed_two_processes_…",
    Cell("sft", "zero3", "lora", "none", "fp32"): "test_distributed.py::test_deepspeed_two_processes_…",
    Cell(
        "sft", "zero2_offload", "none", "none", "fp32"
    ): "test_distributed.py::test_deepspeed_two_processes_…",
    Cell(
        "sft", "zero3_offload", "none", "none", "fp32"
    ): "test_distributed.py::test_deepspeed_two_processes_…",
    Cell("reward", "single", "none", "none", "fp32"): "test_preference.py",
    Cell("dpo", "single", "none", "none", "fp32"): "test_preference.py",
    Cell("dpo", "single", "lora", "none", "fp32"): "test_preference.py",
    Cell(
        "dpo", "zero3", "none", "none", "fp32"
    ): "test_distributed.py::test_dpo_under_zero3_loads_its_own_reference",
    Cell("grpo", "single", "none", "none", "fp32"): "test_grpo.py",
    Cell("grpo", "zero3", "none", "none", "fp32"): "test_distributed.py::test_grpo_under_zero3_…",
    Cell("ppo", "single", "none", "none", "fp32"): "test_ppo.py",
    Cell("ppo", "ddp", "none", "none", "fp32"): "test_distributed.py::test_ppo_on_two_processes",
    Cell("ppo", "zero2", "none", "none", "fp32"): "test_distributed.py::test_ppo_on_two_processes",
    Cell("ppo", "zero3", "none", "none", "fp32"): "test_distributed.py::test_ppo_under_zero3_…",
    Cell("ppo", "zero3", "lora", "none", "fp32"): "test_distributed.py::test_ppo_with_lora_under_zero3_…",
    Cell("ppo", "fsdp", "none", "none", "fp32"): "test_distributed.py::test_ppo_under_fsdp_…",
    Cell("ppo", "fsdp", "lora", "none", "fp32"): "test_distributed.py::test_ppo_under_fsdp_with_lora_…",
}


def cells() -> Iterator[Cell]:
    for combo in itertools.product(RECIPES, STRATEGIES, PEFTS, QUANTIZATIONS, PRECISIONS):
        yield Cell(*combo)


def verdict(cell: Cell) -> Verdict:
    for matches, result in RULES:
        if matches(cell):
            return result
    return Verdict("cpu")


def _mark(cell: Cell) -> str:
    v = verdict(cell)
    if v.kind == "refused":
        return "✗"
    mark = "CPU" if v.kind == "cpu" else "GPU"
    return f"**{mark}**" if cell in RUN_IN_TESTS else mark


def markdown() -> str:
    """docs/matrix.md: one table per recipe (rows: strategy; columns: peft / quantization / precision)."""
    columns = list(itertools.product(PEFTS, QUANTIZATIONS, PRECISIONS))
    out = [
        "# Support matrix",
        "",
        "Generated by `python -m components.matrix --markdown > docs/matrix.md` from the table in",
        "`components/matrix.py`; `tests/test_matrix.py` walks every cell through the real Hydra composition",
        "and the pre-load checks (`check_before_load`, nothing loaded) and fails when a verdict changes, and",
        "checks that this file is up to date.",
        "",
        "- **CPU**: passes the checks on a CPU host (gloo for several processes).",
        "- **GPU**: passes the checks planned for CUDA; on a CPU host the checks refuse it before loading.",
        "- **✗**: refused by the checks before any model loads (reasons below).",
        "- **bold**: trained end to end by a test (a covering sample: every recipe and every strategy at",
        "  least once); the other CPU/GPU cells are checked, not run. GPU cells are not run in CI here.",
        "",
        "Multi-process strategies are checked with `launcher.nproc_per_node=2`; `zero3_nvme` with",
        "`strategy.nvme_path=/local_nvme` (required). `nf4` keeps its default `quant_storage: uint8`.",
        "",
    ]
    header = " | ".join(f"{p}/{q}/{d}" for p, q, d in columns)
    for recipe in RECIPES:
        out += [f"## recipe={recipe}", "", f"| strategy | {header} |", "|---" * (len(columns) + 1) + "|"]
        for strategy in STRATEGIES:
            marks = [_mark(Cell(recipe, strategy, *col)) for col in columns]
            out.append(f"| {strategy} | " + " | ".join(marks) + " |")
        out.append("")
    out += ["## Why (first matching rule)", ""]
    for _, v in RULES:
        label = f"✗ `{v.key}`" if v.kind == "refused" else v.kind.upper()
        out.append(f"- {label}: {v.why}")
    out += ["", "## Trained in tests", ""]
    for cell, test in RUN_IN_TESTS.items():
        out.append(f"- `{' '.join(cell.overrides()[:5])}`: `{test}`")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print docs/matrix.md")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(), end="")
    else:
        for cell in cells():
            v = verdict(cell)
            print(" ".join(cell.overrides()[:5]), "->", v.kind, v.key or "", v.why)


if __name__ == "__main__":
    main()
