"""The support matrix as data: recipe x strategy x peft x quantization x precision → a verdict.

Each cell is one of: ``cpu`` (passes the pre-load checks on a CPU host and is meant to train there),
``gpu`` (passes them when planned for CUDA, and the checks refuse it on CPU before any model loads), or
``refused`` (the checks refuse it everywhere, naming ``key``). The rows are derived, not listed: every
training recipe (``recipe`` options that are not inference-only) and every strategy option of
conf/strategy/ (``components.strategy.training_options``); a verdict is what the cell's components declare
(the quantization's ``needs_adapter`` / ``sharding_refusal``, ``own_loop_refusal``: the strategy's
``OwnLoop`` hooks, for a recipe that owns its loop; its ``device_refusal`` on CPU).
``tests/unit/test_matrix.py`` walks every cell through the real composition and ``check_before_load`` and
asserts the verdict. Which cells were also *trained* in a test is :data:`RUN_IN_TESTS` (a covering sample;
the rest are checked, not run).
``hydratune matrix --markdown > docs/matrix.md`` renders the table.
"""

from __future__ import annotations

import argparse
import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: the columns shown: the full / adapter, unquantized / 4-bit, and precision choices (a docs choice)
PEFTS = ("none", "lora")
QUANTIZATIONS = ("none", "nf4")
PRECISIONS = ("fp32", "bf16", "fp16")


def strategies() -> dict[str, Any]:
    """Every training strategy option, built, fastest first (the ladder's assumed order), then by name."""
    from components.strategy import training_options

    return training_options()


def recipes() -> dict[str, Any]:
    """Every recipe option that trains (not inference-only), by name: its registered class (the recipes
    register as ``recipes.register_all()`` imports them: the CLI and the tests do)."""
    from components.config.options import options
    from components.config.registry import RECIPES

    return {name: RECIPES[name] for name in options("recipe") if not RECIPES[name].inference_only}


@functools.cache
def _built(group: str, option: str) -> Any:
    from components.config.options import options

    return options(group)[option].build()


@dataclass(frozen=True)
class Cell:
    recipe: str
    strategy: str
    peft: str
    quantization: str
    precision: str

    def overrides(self) -> list[str]:
        """The command-line overrides of this cell: two processes for every multi-process strategy, and the
        knobs a strategy option cannot go without (``Strategy.required_knobs``)."""
        strategy = strategies()[self.strategy]
        world = 1 if strategy.max_processes == 1 else 2
        return [
            f"recipe={self.recipe}",
            f"strategy={self.strategy}",
            f"peft={self.peft}",
            f"quantization={self.quantization}",
            f"precision={self.precision}",
            f"launcher.nproc_per_node={world}",
            *(f"{key}={value}" for key, value in strategy.required_knobs().items()),
        ]


@dataclass(frozen=True)
class Verdict:
    kind: str  # cpu | gpu | refused
    why: str = ""
    key: str | None = None  # refused: the config key the error names


def verdict(cell: Cell) -> Verdict:
    """What the cell's components declare, in the order the pre-load checks ask."""
    from components.strategy import own_loop_refusal

    recipe, strategy = recipes()[cell.recipe], strategies()[cell.strategy]
    peft, quant = _built("peft", cell.peft), _built("quantization", cell.quantization)
    dtype = cell.precision
    if quant.needs_adapter and not peft.is_adapter:
        return Verdict("refused", "a quantized base trains only through an adapter (QLoRA)", "peft")
    refusal = strategy.combination_refusal(recipe, peft, quant, dtype)
    if refusal is None and strategy.shards_parameters:
        refusal = quant.sharding_refusal(dtype, strategy.label)
    if refusal is None and recipe.owns_loop:
        refusal = own_loop_refusal(strategy, recipe, dtype)
    if refusal is not None:
        return Verdict("refused", refusal.args[0], refusal.key)
    if dtype == "fp16":
        return Verdict("gpu", "fp16 loss scaling needs a GPU")
    refusal = strategy.device_refusal("cpu", dtype, recipe.owns_loop)
    return Verdict("gpu", refusal.args[0]) if refusal is not None else Verdict("cpu")


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
    Cell("kto", "single", "none", "none", "fp32"): "test_unpaired_reference_free.py",
    Cell("orpo", "single", "none", "none", "fp32"): "test_unpaired_reference_free.py",
    Cell("simpo", "single", "none", "none", "fp32"): "test_unpaired_reference_free.py",
    Cell("grpo", "single", "none", "none", "fp32"): "test_grpo.py",
    Cell("grpo", "zero3", "none", "none", "fp32"): "test_distributed.py::test_grpo_under_zero3_…",
    Cell("ppo", "single", "none", "none", "fp32"): "test_ppo.py",
    Cell("ppo", "ddp", "none", "none", "fp32"): "test_distributed.py::test_ppo_on_two_processes",
    Cell("ppo", "zero2", "none", "none", "fp32"): "test_distributed.py::test_ppo_on_two_processes",
    Cell("ppo", "zero3", "none", "none", "fp32"): "test_distributed.py::test_ppo_under_zero3_…",
    Cell("ppo", "zero3", "lora", "none", "fp32"): "test_distributed.py::test_ppo_with_lora_under_zero3_…",
    Cell("ppo", "fsdp", "none", "none", "fp32"): "test_distributed.py::test_ppo_under_fsdp_…",
    Cell("ppo", "fsdp", "lora", "none", "fp32"): "test_distributed.py::test_ppo_under_fsdp_with_lora_…",
    Cell("sft", "pipeline", "none", "none", "fp32"): "test_pipeline.py::test_two_stages_train_like_one_…",
}


@dataclass(frozen=True)
class Split:
    """A split model (``strategy.tp_size`` / ``strategy.sp_size``) of recipe=sft on 2 processes: its
    overrides, the verdict the pre-load checks give (``tests/unit/test_matrix.py`` walks each), and where it
    was trained and compared with one process."""

    overrides: tuple[str, ...]
    kind: str  # cpu | gpu | refused
    key: str | None = None  # refused: the config key the error names
    trained: str = "checked, not run"


ONE_PROCESS = "equal to one process"
#: the split layouts documented in docs/matrix.md (the knobs are not options: each layout is listed)
SPLITS: tuple[Split, ...] = (
    Split(("strategy=zero1", "strategy.tp_size=2"), "cpu", None, f"test_nd_parallel.py ({ONE_PROCESS})"),
    Split(("strategy=zero1", "strategy.sp_size=2"), "cpu", None, f"test_nd_parallel.py ({ONE_PROCESS})"),
    Split(("strategy=zero0", "strategy.tp_size=2"), "cpu"),
    Split(("strategy=zero2", "strategy.tp_size=2"), "cpu"),
    Split(("strategy=zero2", "strategy.sp_size=2"), "cpu"),
    Split(
        ("strategy=zero3", "strategy.tp_size=2"),
        "cpu",
        None,
        "by hand, 5 SGD steps: losses equal to ZeRO-3 on one process (docs/nd_parallel.md)",
    ),
    Split(("strategy=zero3", "strategy.sp_size=2"), "refused", "strategy.stage"),
    Split(("strategy=zero2_offload", "strategy.tp_size=2"), "refused", "strategy.offload_optimizer"),
    Split(("strategy=zero1", "strategy.sp_size=2", "peft=lora"), "cpu"),
    Split(("strategy=zero1", "strategy.tp_size=2", "peft=lora"), "refused", "peft"),
    Split(("strategy=zero1", "strategy.sp_size=2", "data.packing=true"), "cpu"),
    Split(
        ("strategy=zero1", "strategy.sp_size=2", "data.packing=true", "model.attn_implementation=sdpa"),
        "refused",
        "data.packing",
    ),
    Split(("strategy=fsdp", "strategy.tp_size=2"), "gpu", None, "tests/gpu/nd_parallel.py (not run yet)"),
    Split(
        ("strategy=fsdp", "strategy.sp_size=2", "model.attn_implementation=sdpa"),
        "gpu",
        None,
        "tests/gpu/nd_parallel.py (not run yet)",
    ),
)


def cells() -> Iterator[Cell]:
    for combo in itertools.product(recipes(), strategies(), PEFTS, QUANTIZATIONS, PRECISIONS):
        yield Cell(*combo)


def _mark(cell: Cell) -> str:
    v = verdict(cell)
    if v.kind == "refused":
        return "✗"
    mark = "CPU" if v.kind == "cpu" else "GPU"
    return f"**{mark}**" if cell in RUN_IN_TESTS else mark


def reasons() -> list[Verdict]:
    """Every distinct reason a cell is GPU-only or refused, in the order first met: one per refused key
    (its first message as the example), one per GPU-only message."""
    found: dict[tuple[str, str], Verdict] = {}
    for cell in cells():
        v = verdict(cell)
        if v.kind != "cpu":
            found.setdefault((v.kind, v.key if v.kind == "refused" else v.why), v)  # type: ignore[arg-type]
    return list(found.values())


def markdown() -> str:
    """docs/matrix.md: one table per recipe (rows: strategy; columns: peft / quantization / precision)."""
    columns = list(itertools.product(PEFTS, QUANTIZATIONS, PRECISIONS))
    required = {
        name: " ".join(f"`{k}={v}`" for k, v in s.required_knobs().items())
        for name, s in strategies().items()
        if s.required_knobs()
    }
    required_text = "; ".join(f"`{name}` with {knobs} (required)" for name, knobs in required.items())
    out = [
        "# Support matrix",
        "",
        "Generated by `hydratune matrix --markdown > docs/matrix.md`: the rows are every",
        "training recipe and every strategy option in `conf/`, each verdict what the cell's components",
        "declare (`components/commands/matrix.py`); `tests/unit/test_matrix.py` walks every cell through the",
        "real Hydra composition and the pre-load checks (`check_before_load`, nothing loaded) and fails when",
        "a verdict changes, and checks that this file is up to date.",
        "",
        "- **CPU**: passes the checks on a CPU host (gloo for several processes).",
        "- **GPU**: passes the checks planned for CUDA; on a CPU host the checks refuse it before loading.",
        "- **✗**: refused by the checks before any model loads (reasons below).",
        "- **bold**: trained end to end by a test (a covering sample: every recipe and every strategy at",
        "  least once); the other CPU/GPU cells are checked, not run. GPU cells are not run in CI here.",
        "",
        "Multi-process strategies are checked with `launcher.nproc_per_node=2`"
        + (f"; {required_text}" if required_text else "")
        + ". `nf4` keeps its default `quant_storage: uint8`.",
        "",
    ]
    header = " | ".join(f"{p}/{q}/{d}" for p, q, d in columns)
    for recipe in recipes():
        out += [f"## recipe={recipe}", "", f"| strategy | {header} |", "|---" * (len(columns) + 1) + "|"]
        for strategy in strategies():
            marks = [_mark(Cell(recipe, strategy, *col)) for col in columns]
            out.append(f"| {strategy} | " + " | ".join(marks) + " |")
        out.append("")
    out += ["## Why", ""]
    for v in reasons():
        label = f"✗ `{v.key}`" if v.kind == "refused" else v.kind.upper()
        out.append(f"- {label}: {v.why}")
    out += ["", "## Tensor and sequence parallel (recipe=sft, 2 processes)", ""]
    out += ["| overrides | verdict | trained |", "|---|---|---|"]
    for split in SPLITS:
        mark = "✗ `" + str(split.key) + "`" if split.kind == "refused" else split.kind.upper()
        out.append(f"| `{' '.join(split.overrides)}` | {mark} | {split.trained} |")
    out += ["", "## Trained in tests", ""]
    for cell, test in RUN_IN_TESTS.items():
        out.append(f"- `{' '.join(cell.overrides()[:5])}`: `{test}`")
    return "\n".join(out) + "\n"


def cli(args: list[str]) -> int:
    """``hydratune matrix [--markdown]``: every cell's verdict, or docs/matrix.md."""
    parser = argparse.ArgumentParser(prog="hydratune matrix", description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print docs/matrix.md")
    if parser.parse_args(args).markdown:
        print(markdown(), end="")
        return 0
    for cell in cells():
        v = verdict(cell)
        print(" ".join(cell.overrides()[:5]), "->", v.kind, v.key or "", v.why)
    return 0
