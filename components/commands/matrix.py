"""The support matrix as data: recipe x strategy x peft x quantization x precision → a verdict.

Each cell is one of: ``cpu`` (passes the pre-load checks on a CPU host and is meant to train there),
``gpu`` (passes them when planned for CUDA, and the checks refuse it on CPU before any model loads), or
``refused`` (the checks refuse it everywhere, naming ``key``). The rows are derived, not listed: every
training recipe (``recipe`` options that are not inference-only) and every strategy option of
conf/strategy/ (``hydratune.components.strategy.training_options``); a verdict is what the cell's components
declare (the quantization's ``needs_adapter`` / ``sharding_refusal``, the split table's refusals for the
option's axes (``runtime/split_checks.py``), ``own_loop_refusal``: the strategy's ``OwnLoop`` hooks, for a
recipe that owns its loop; its ``device_refusal`` on CPU).
``tests/unit/test_matrix.py`` walks every cell through the real composition and ``check_before_load`` and
asserts the verdict. Which
cells were also *trained* in a test is :data:`RUN_IN_TESTS` (a covering sample; the rest are checked, not
run); for the multi-process cells it is also how ``tests/multiproc/test_cells.py`` launches each (once) and
what it asserts on the run.
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
    from hydratune.components.strategy import training_options

    return training_options()


def recipes() -> dict[str, Any]:
    """Every recipe option that trains (not inference-only), by name: its registered class (the recipes
    register as ``hydratune.recipes.register_all()`` imports them: the CLI and the tests do)."""
    from hydratune.components.config.options import options
    from hydratune.components.config.registry import RECIPES

    return {name: RECIPES[name] for name in options("recipe") if not RECIPES[name].inference_only}


@functools.cache
def _built(group: str, option: str) -> Any:
    from hydratune.components.config.options import options

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
    from types import SimpleNamespace

    from hydratune.components.runtime import split_checks
    from hydratune.components.strategy import own_loop_refusal

    recipe, strategy = recipes()[cell.recipe], strategies()[cell.strategy]
    peft, quant = _built("peft", cell.peft), _built("quantization", cell.quantization)
    dtype = cell.precision
    if quant.needs_adapter and not peft.is_adapter:
        return Verdict("refused", "a quantized base trains only through an adapter (QLoRA)", "peft")
    run = SimpleNamespace(recipe=recipe, peft=peft, quantization=quant, data=None, model=None, optimizer=None)
    refusal = split_checks.refusal(run, strategy.parallel.mesh(1), dtype)  # a split model: its axes' table
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


@dataclass(frozen=True)
class Trained:
    """How a test trains a cell end to end. ``test``: the file (and test) that does it. A multi-process cell
    is launched once by :data:`CELLS_TEST` and every test of it reads that one run dir: ``overrides`` are
    what the launch adds to the cell's own (steps, batch, saves; ``{root}`` is the cell's own folder,
    ``{reward_model}`` a run of :data:`REWARD_MODEL`), ``shows`` what its tests assert on the run (one test
    each), ``resume`` the step of the checkpoint a second launch resumes from, to end like the first
    (None: no second launch), ``one_process`` the overrides of a one-process run of the same batches (the
    cell's strategy replaced by ``single``) that the run is compared with (None: none)."""

    test: str
    overrides: tuple[str, ...] = ()
    shows: tuple[str, ...] = ()
    resume: int | None = None
    one_process: tuple[str, ...] | None = None

    def launches(self) -> int:
        """How many times the cell's test launches ``hydratune`` for it (0: another test's own runs)."""
        if not self.shows:
            return 0
        return 1 + (self.resume is not None) + (self.one_process is not None)


#: the multi-process cells' test: one launch per cell, one test per thing the cell shows
CELLS_TEST = "tests/multiproc/test_cells.py"
#: overrides of every launch of a cell: no eval, no generations, no plots; a record per step
QUIET = ("train.eval_every=0", "train.eval_generations=0", "train.log_every=1", "train.write_plots=false")
#: the reward model a PPO cell scores with (``{reward_model}``): one process, 2 steps of recipe=reward
REWARD_MODEL = ("recipe=reward", "train.max_steps=2", "train.save_every=0")
#: what every PPO cell's launch shares: 2 ranks x 8 rollouts of 16 prompts, 2 mini-batches of 8, scored by
#: the brevity reward of tests/support/rewards.py (an EOS not required)
PPO = (
    "train.micro_batch_size=8",
    "recipe.rollout_batch_size=16",
    "recipe.mini_batch_size=8",
    "recipe.reward._target_=tests.support.rewards.brevity",
    "recipe.missing_eos_penalty=0",
)
#: a DeepSpeed SFT cell: 6 steps (the loss falls by then), checkpoints at 3 and 6; resumed from 3 the run
#: repeats steps 4-6
ZERO_SFT = ("train.micro_batch_size=8", "train.max_steps=6", "train.save_every=3", "train.keep_last=2")
ZERO_SHOWS = (
    "live strategy",
    "ZeRO stage in deepspeed.json",
    "loss falls",
    "DeepSpeed's sharded optimizer state",
    "non-empty weights",
    "exact resume",
)
PPO_SHOWS = ("live strategy", "one record per iteration", "policy moved", "final weights")
#: a sharded PPO cell (ZeRO-3, FSDP2): 6 iterations, checkpoints at 3 and 6, resumed from 3
PPO_SHARDED = ("recipe.num_iterations=6", "train.save_every=3")
PPO_SHARDED_SHOWS = (*PPO_SHOWS, "KL 0 at step 1", "value head trained")


def _cell(recipe: str, strategy: str, peft: str = "none") -> Cell:
    return Cell(recipe, strategy, peft, "none", "fp32")


#: a PPO cell whose ranks hold whole replicas (DDP, ZeRO-2). 6 iterations: the cosine reaches 0 at the last
#: (stepped once per process, it would end at 3 and climb back) and the policy is past KL 0.1
PPO_REPLICATED = Trained(
    CELLS_TEST,
    (*PPO, "recipe.num_iterations=6"),
    (*PPO_SHOWS, "identical ranks", "response lengths", "lr decays to 0"),
)


#: cells trained end to end by a test (the covering sample); the multi-process ones with their launch
RUN_IN_TESTS: dict[Cell, Trained] = {
    _cell("sft", "single"): Trained("tests/integration/test_sft.py"),
    Cell("sft", "single", "lora", "nf4", "fp32"): Trained(
        "tests/integration/test_sft.py::test_qlora_trains_only_the_adapter_on_cpu"
    ),
    # the reference of tests/multiproc/test_multinode.py's static rendezvous and of test_reliability.py's
    # signal to the launcher (the same overrides, stopped and resumed): 30 steps leave room to stop after
    # step 5
    _cell("sft", "ddp"): Trained(
        CELLS_TEST,
        (
            "train.micro_batch_size=8",
            "train.max_steps=30",
            "train.save_every=0",
            "data.cache_dir={root}/data",
        ),
        (
            "live strategy",
            "data prepared once",
            "one run dir",
            "identical ranks",
            "equal to one process",
        ),
        one_process=("train.micro_batch_size=16",),
    ),
    _cell("sft", "zero1"): Trained(CELLS_TEST, ZERO_SFT, ZERO_SHOWS, resume=3),
    # also test_multinode.py's reference (c10d, hostfile) and test_reliability.py's planted pickle
    _cell("sft", "zero2"): Trained(CELLS_TEST, ZERO_SFT, ZERO_SHOWS, resume=3),
    # ZeRO-3 + LoRA: the adapter must be gathered, not saved as empty shards
    _cell("sft", "zero3", "lora"): Trained(
        CELLS_TEST,
        ZERO_SFT,
        (*ZERO_SHOWS[:4], "zero.Init: rank 0 held half", "adapter gathered and trained", "exact resume"),
        resume=3,
    ),
    _cell("sft", "zero2_offload"): Trained(CELLS_TEST, ZERO_SFT, ZERO_SHOWS, resume=3),
    _cell("sft", "zero3_offload"): Trained(
        CELLS_TEST, ZERO_SFT, (*ZERO_SHOWS, "zero.Init: rank 0 held half"), resume=3
    ),
    _cell("reward", "single"): Trained("tests/integration/test_preference.py"),
    _cell("dpo", "single"): Trained("tests/integration/test_preference.py"),
    _cell("dpo", "single", "lora"): Trained("tests/integration/test_preference.py"),
    # ZeRO-3 partitions the policy as it loads: the reference is loaded again into its own engine; 3 steps:
    # step 1 has lr 0 (warm-up), so the policy moved by step 3
    _cell("dpo", "zero3"): Trained(
        CELLS_TEST,
        ("train.micro_batch_size=4", "train.max_steps=3", "train.save_every=0"),
        ("live strategy", "rewards 0 at step 1", "pairs probe after training", "non-empty weights"),
    ),
    _cell("kto", "single"): Trained("tests/unit/test_unpaired_reference_free.py"),
    _cell("orpo", "single"): Trained("tests/unit/test_unpaired_reference_free.py"),
    _cell("simpo", "single"): Trained("tests/unit/test_unpaired_reference_free.py"),
    _cell("grpo", "single"): Trained("tests/integration/test_grpo.py"),
    # a KL term: the random-init policy is saved (gathered first) for TRL to load as the reference
    _cell("grpo", "zero3"): Trained(
        CELLS_TEST,
        (
            "recipe.beta=0.1",
            "recipe.reward_funcs=[tests.support.rewards.brevity]",
            "data.eval_path=null",
            "train.micro_batch_size=8",
            "recipe.num_generations=4",
            "train.max_steps=2",
            "train.save_every=0",
        ),
        ("live strategy", "reference gathered", "KL 0 at step 1"),
    ),
    _cell("ppo", "single"): Trained("tests/integration/test_ppo.py"),
    _cell("distill", "single"): Trained("tests/integration/test_distill.py"),
    _cell("ppo", "ddp"): PPO_REPLICATED,
    _cell("ppo", "zero2"): PPO_REPLICATED,
    _cell("ppo", "zero3"): Trained(
        CELLS_TEST,
        (*PPO, *PPO_SHARDED),
        (*PPO_SHARDED_SHOWS, "the engine's sharded optimizer state", "exact resume"),
        resume=3,
    ),
    # the reward model the second (inference) ZeRO-3 engine: scores real-valued, the reference the
    # adapter-free policy
    _cell("ppo", "zero3", "lora"): Trained(
        CELLS_TEST,
        (
            *(o for o in PPO if "reward._target_" not in o),
            "recipe.reward.model={reward_model}",
            "recipe.num_iterations=3",
        ),
        (
            "live strategy",
            "one record per iteration",
            "KL 0 at step 1",
            "reward model scores",
            "adapter gathered and trained",
        ),
    ),
    _cell("ppo", "fsdp"): Trained(
        CELLS_TEST,
        (*PPO, *PPO_SHARDED),
        (*PPO_SHARDED_SHOWS, "policy sharded", "FSDP checkpoint gathered", "exact resume"),
        resume=3,
    ),
    # the reference is the sharded policy with its adapter disabled; the critic a second sharded model
    _cell("ppo", "fsdp", "lora"): Trained(
        CELLS_TEST,
        (*PPO, "recipe.value_model=separate", "recipe.num_iterations=4", "train.save_every=2"),
        (
            "live strategy",
            "one record per iteration",
            "KL 0 at step 1",
            "policy sharded",
            "adapter gathered and trained",
            "critic saved whole",
            "exact resume",
        ),
        resume=2,
    ),
    _cell("sft", "pipeline"): Trained(
        "tests/multiproc/test_pipeline.py::test_two_stages_train_like_one_process"
    ),
}


@dataclass(frozen=True)
class Split:
    """A split model (``strategy.tp_size`` / ``strategy.sp_size``, tensor-parallel pipeline stages) of
    recipe=sft on ``processes`` processes: its overrides, the verdict the pre-load checks give
    (``tests/unit/test_matrix.py`` walks each), and where it was trained and compared with one process."""

    overrides: tuple[str, ...]
    kind: str  # cpu | gpu | refused
    key: str | None = None  # refused: the config key the error names
    trained: str = "checked, not run"
    processes: int = 2

    @property
    def command(self) -> tuple[str, ...]:
        """The overrides with the process count when it is not 2."""
        more = () if self.processes == 2 else (f"launcher.nproc_per_node={self.processes}",)
        return (*self.overrides, *more)


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
        ("strategy=pipeline", "strategy.tp_size=2"),
        "cpu",
        None,
        f"test_pipeline.py (pp 2 x tp 2, {ONE_PROCESS}; resumed bit-exact)",
        processes=4,
    ),
    Split(
        ("strategy=pipeline", "strategy.tp_size=2"),
        "cpu",
        None,
        f"test_pipeline.py (pp 2 x dp 2 x tp 2, {ONE_PROCESS})",
        processes=8,
    ),
    Split(("strategy=pipeline", "strategy.tp_size=2", "peft=lora"), "refused", "peft", processes=4),
    Split(
        ("strategy=zero1", "strategy.pp_size=2"),
        "cpu",
        None,
        f"test_pipeline.py (pp 2 x dp 2 with ZeRO-1, {ONE_PROCESS}; resumed bit-exact)",
        processes=4,
    ),
    Split(("strategy=ddp", "strategy.pp_size=2"), "cpu", processes=4),
    Split(
        ("strategy=fsdp", "strategy.pp_size=2"),
        "cpu",
        None,
        f"test_pipeline.py (pp 2 x dp 2 with FSDP2 on each stage, {ONE_PROCESS}; resumed bit-exact)",
        processes=4,
    ),
    Split(("strategy=zero3", "strategy.pp_size=2"), "cpu", processes=4),
    Split(
        ("strategy=zero3", "strategy.pp_size=2", "strategy.offload_param=cpu"),
        "refused",
        "strategy.offload_param",
        processes=4,
    ),
    Split(
        ("strategy=zero1", "strategy.pp_size=2", "strategy.tp_size=2"),
        "refused",
        "strategy.tp_size",
        processes=8,
    ),
    Split(
        ("strategy=fsdp", "strategy.sp_size=2", "model.attn_implementation=sdpa"),
        "gpu",
        None,
        "tests/gpu/nd_parallel.py (not run yet)",
    ),
)


#: recipe=grpo with tools: TRL's tool loop in every rank's generation (the qwen2_5 template renders the calls;
#: the tiny model's context raised for the schemas); the rows hold for ``recipe.environment`` alike
TOOLS = (
    "recipe=grpo",
    "recipe.tools=[hydratune.components.agent_tools.calculator]",
    "model.chat_template=qwen2_5",
    "data.max_prompt_length=1024",
    "+model.architecture.max_position_embeddings=2048",
)
TOOLS_TEST = "test_grpo_tools_ranks.py (2 steps of a scripted policy, half its episodes calling a tool)"
#: the layouts of recipe=grpo with tools documented in docs/matrix.md, checked as the splits are
TOOL_LAYOUTS: tuple[Split, ...] = (
    Split(("strategy=ddp",), "cpu", None, f"{TOOLS_TEST}: {ONE_PROCESS}"),
    Split(("strategy=zero2",), "cpu", None, f"{TOOLS_TEST}: {ONE_PROCESS}"),
    Split(("strategy=zero3",), "cpu"),
    Split(("strategy=fsdp",), "gpu"),
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
    out += ["", "## Tensor, sequence and pipeline-stage splits (recipe=sft, 2 processes unless named)", ""]
    out += ["| overrides | verdict | trained |", "|---|---|---|"]
    for split in SPLITS:
        mark = "✗ `" + str(split.key) + "`" if split.kind == "refused" else split.kind.upper()
        out.append(f"| `{' '.join(split.command)}` | {mark} | {split.trained} |")
    out += ["", "## Tools in GRPO (2 processes)", ""]
    out += [
        f"`{' '.join(TOOLS)}` (the same with `recipe.environment`): every rank runs",
        'TRL\'s tool loop on its share of each generation batch (docs/agents.md, "Several ranks").',
        "",
        "| overrides | verdict | trained |",
        "|---|---|---|",
    ]
    for layout in TOOL_LAYOUTS:
        mark = "✗ `" + str(layout.key) + "`" if layout.kind == "refused" else layout.kind.upper()
        out.append(f"| `{' '.join(layout.command)}` | {mark} | {layout.trained} |")
    out += ["", "## Trained in tests", ""]
    out += [
        f"Each multi-process cell is launched once by `{CELLS_TEST}` (with `{' '.join(QUIET)}`,",
        "and `launcher.start_method=fork` from a warm interpreter: the start-up is not what these tests",
        "check; the signal, multi-node and pipeline tests start their workers the default way), and one test",
        "per thing it shows reads that run dir; *resumed* is a second launch, from that checkpoint, ending",
        "like the first; *one process* a one-process run of the same batches, its oracle. `<its reward",
        f"model>`: a one-process run of `{' '.join(REWARD_MODEL)}`.",
        "",
    ]
    for cell, trained in RUN_IN_TESTS.items():
        line = f"- `{' '.join(cell.overrides()[:5])}`: `{trained.test}`"
        if trained.shows:
            overrides = (
                o.format(root="<its dir>", reward_model="<its reward model>") for o in trained.overrides
            )
            line += f" (`{' '.join(overrides)}`"
            if trained.resume is not None:
                line += f"; resumed from checkpoint-{trained.resume}"
            if trained.one_process is not None:
                line += f"; one process with `{' '.join(trained.one_process)}`"
            line += "): " + ", ".join(trained.shows)
        out.append(line)
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
