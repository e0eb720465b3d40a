"""Shared fixtures: compose configs with Hydra's API and run recipes in-process on the tiny model; the tiers
(tests/support/tiers.py: markers and timeouts from the folder, seconds per tier, the fast tiers' budget)."""

from __future__ import annotations

import atexit
import copy
import gc
import hashlib
import os
import shutil
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_module
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig

from hydratune import recipes
from hydratune.components.config.resolvers import register_resolvers
from tests.support.cli import Warm
from tests.support.tiers import Tiers

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "2")
# OpenMP threads that sleep while they wait, as the hydratune command sets them (components/runtime/
# threads.py): spinning ones collapse training when anything else runs on the cores (other tests, other
# processes). Set before torch loads: for the runs of this process and the commands the tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# DeepSpeed builds its CPU ops (deepspeed_shm_comm, loaded as every DeepSpeed run starts on CPU) into
# TORCH_EXTENSIONS_DIR: one dir per Python environment, or the checkouts of one machine rebuild it in turn
# whenever another one ran last (their include paths differ): ~90 s in the first DeepSpeed run each time
ENV_ID = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions" / ENV_ID))
# the prepared-data cache of every test, and of every command a test starts, is one temporary dir (never
# ~/.cache), removed when the session ends; tests of the cache itself set data.cache_dir to their own
DATA_CACHE = tempfile.mkdtemp(prefix="hydratune-test-data-")
os.environ["HYDRATUNE_DATA_CACHE"] = DATA_CACHE
atexit.register(shutil.rmtree, DATA_CACHE, True)
register_resolvers()
recipes.register_all()

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Tiers(), "hydratune-tiers")


#: how many modules were imported when the long-lived objects were last frozen
FROZEN_AT = {"modules": 0}


def freeze_long_lived(*, again: bool = False) -> None:
    """Once torch is imported, what is alive goes into the permanent generation (collected first, so no
    garbage is frozen), as the hydratune command does when training starts (components/runtime/startup.py):
    the full collection the HF Trainer runs as each training starts (``accelerator.free_memory``) then scans
    what the tests made since, not the millions of objects the imports made (measured: 45 full collections,
    14.8 of 37 s in three integration files). Frozen objects are freed by reference counting as usual.
    Done when a hundred more modules were imported (TRL, PEFT, DeepSpeed, lm-eval come on first use) or
    ``again``."""
    modules = len(sys.modules)
    if "torch" in sys.modules and (again or modules > FROZEN_AT["modules"] + 100):
        gc.collect()
        gc.freeze()
        FROZEN_AT["modules"] = modules


@pytest.fixture(scope="module", autouse=True)
def long_lived_objects_frozen_per_module() -> None:
    """Again when an in-process command handed the frozen objects back (``startup.run_ends``); asked once a
    module: ``gc.get_freeze_count`` walks every frozen object."""
    freeze_long_lived(again="torch" in sys.modules and gc.get_freeze_count() == 0)


@pytest.fixture(autouse=True)
def long_lived_objects_frozen() -> None:
    """After the imports a test made (see :func:`freeze_long_lived`)."""
    freeze_long_lived()


# Small, fast settings for end-to-end tests on the tiny model: no greedy generations before and after
# training (a test of them asks for train.eval_generations), no plots, every step logged.
FAST = ["train.eval_generations=0", "train.log_every=1", "train.write_plots=false"]


#: the session's compositions by their overrides, the latest 256: Hydra takes ~0.1 s a composition, which
#: was ~40% of the fast tiers' time, and a third of the ~1,070 they ask for repeat one (measured)
COMPOSED: OrderedDict[tuple[str, ...], DictConfig] = OrderedDict()


def composed(*overrides: str) -> DictConfig:
    """The config Hydra composes from ``overrides`` (in an initialised Hydra), composed once a session and
    handed out as a copy, which a test may change. Nothing else a composition reads changes in a session: the
    files of conf/ and the schemas the components register as they are imported.

    Most compositions differ from an earlier one only in their value overrides (``train.max_steps=3``): those
    are composed as Hydra does, the group overrides' composition (itself composed once) with the value
    overrides put in by Hydra's own ``_apply_overrides_to_config``, the step Hydra ends a composition with
    (``test_composed_equals_hydra``; ``HYDRATUNE_TEST_FULL_COMPOSE=1`` has Hydra compose each whole)."""
    if overrides not in COMPOSED:
        split = None if os.environ.get("HYDRATUNE_TEST_FULL_COMPOSE") else split_overrides(overrides)
        if split is None or not split[1]:
            COMPOSED[overrides] = compose(config_name="config", overrides=list(overrides))
        else:
            cfg = composed(*split[0])
            ConfigLoaderImpl._apply_overrides_to_config(split[1], cfg)
            COMPOSED[overrides] = cfg
        if len(COMPOSED) > 256:
            COMPOSED.popitem(last=False)
    COMPOSED.move_to_end(overrides)
    return copy.deepcopy(COMPOSED[overrides])


def split_overrides(overrides: tuple[str, ...]) -> tuple[tuple[str, ...], list[Override]] | None:
    """``overrides`` as Hydra sorts them: the config-group overrides (as given) and the parsed value
    overrides, in order (``defaults_list.Overrides``: a value is a dict or its key names no group). None when
    Hydra must compose them whole: a ``hydra.`` key, a ``@package``, a sweep."""
    repo = GlobalHydra.instance().hydra.config_loader.repository
    groups, values = [], []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_sweep_override() or override.is_hydra_override() or override.package is not None:
            return None
        if isinstance(override.value(), dict) or not repo.group_exists(override.key_or_group):
            values.append(override)
        else:
            groups.append(override.input_line)
    return tuple(groups), values


@pytest.fixture(scope="session")
def hydratune() -> Iterator[Warm]:
    """``hydratune(*args, cwd=..., env=..., prelude=...)``: the command in a process forked from one warm
    server (tests/support/cli.py); a ``subprocess.CompletedProcess``."""
    warm = Warm()
    yield warm
    warm.close()


@pytest.fixture
def compose_cfg() -> Iterator[Callable[..., DictConfig]]:
    """``compose_cfg("peft=lora", ...)`` → the composed config, as the CLI would build it."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        yield composed
    GlobalHydra.instance().clear()


@pytest.fixture
def run_recipe(compose_cfg: Callable[..., DictConfig], tmp_path: Path) -> Callable[..., Any]:
    """Run a recipe in-process: ``run_recipe("peft=lora", name="a")`` → (ctx, metrics).

    Run dirs are ``tmp_path/outputs/day/<name>``, the layout ``resume=true`` searches.
    """

    def run(*overrides: str, name: str = "run") -> tuple[Any, Any]:
        return _run_in(tmp_path, compose_cfg, *overrides, name=name)

    return run


def _run_in(root: Path, compose_fn: Callable[..., DictConfig], *overrides: str, name: str) -> tuple[Any, Any]:
    """Compose ``FAST + overrides``, check, and run the recipe in ``root/outputs/day/<name>``."""
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.resume import pin
    from hydratune.components.runtime.run import Components, RunContext
    from hydratune.components.runtime.rundir import RunDir

    cfg = compose_fn(*FAST, *overrides)
    comps = Components.from_config(cfg)
    device = check_before_load(cfg, comps)
    run_dir = RunDir(root / "outputs" / "day" / name)
    save_like_hydra(run_dir.path, cfg, [*FAST, *overrides])
    cfg = pin(cfg, run_dir.path)  # as the CLI does before anything loads
    ctx = RunContext(cfg, comps, run_dir, device)
    return ctx, comps.recipe.run(ctx)


def save_like_hydra(run_dir: Path, cfg: DictConfig, overrides: list[str]) -> None:
    """``<run dir>/.hydra/config.yaml`` and ``overrides.yaml``, as Hydra writes them (``resume`` compares)."""
    from omegaconf import OmegaConf

    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), run_dir / ".hydra" / "overrides.yaml")


@pytest.fixture(scope="session")
def partial_sft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir of the default SFT stopped at 500 steps (~0.39 greedy exact match on the eval
    sums), trained once per session for the RL chain tests (GRPO and PPO start from it)."""
    root = tmp_path_factory.mktemp("partial_sft")
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        ctx, _ = _run_in(
            root,
            lambda *overrides: compose(config_name="config", overrides=list(overrides)),
            *("train.max_steps=500", "train.eval_generations=0", "train.save_every=0"),
            name="sft",
        )
    GlobalHydra.instance().clear()
    return ctx.run_dir.path


#: the steps of the session's short runs (sft_runs)
SHORT = ["train.max_steps=2", "train.eval_generations=0", "train.save_every=0", "train.eval_every=0"]


@pytest.fixture(scope="session")
def sft_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Short SFT runs with a CLI run's files, trained once per session for the tests of what comes after
    training (export, generate, eval, chat): a full run, a LoRA run on top of its final model (a base that
    can be rebuilt) and a LoRA run on the random-init base."""
    from tests.support.runs import as_cli_run

    root = tmp_path_factory.mktemp("sft_runs")
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):

        def run(*overrides: str, name: str) -> Path:
            fn = lambda *o: compose(config_name="config", overrides=list(o))  # noqa: E731
            ctx, _ = _run_in(root, fn, *SHORT, *overrides, name=name)
            return as_cli_run(ctx, list(overrides))

        full = run("optimizer.lr=1e-5", name="full")  # barely trained: answers are not all an instant EOS
        lora = run("peft=lora", f"model.from_run={full}", "peft.init_lora_weights=gaussian", name="lora")
        lora_random = run("peft=lora", name="lora_random")
    GlobalHydra.instance().clear()
    return {"full": full, "lora": lora, "lora_random": lora_random}


#: the reward model's few steps: 16 pairs, no eval split
REWARD = [
    "recipe=reward", "peft=lora", "data.max_samples=16", "data.eval_path=null", "data.eval_fraction=0",
    "train.micro_batch_size=4",
]  # fmt: skip


@pytest.fixture(scope="session")
def reward_lora(sft_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA reward run (2 steps) on the session's full SFT run, with a CLI run's files (issue 48: its base
    is the full run's final model, so PPO puts it on the policy's base)."""
    from tests.support.runs import as_cli_run

    root = tmp_path_factory.mktemp("reward_lora")
    overrides = [*SHORT, *REWARD, f"model.from_run={sft_runs['full']}"]
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        fn = lambda *o: compose(config_name="config", overrides=list(o))  # noqa: E731
        ctx, _ = _run_in(root, fn, *overrides, name="rm")
        path = as_cli_run(ctx, overrides)
    GlobalHydra.instance().clear()
    final = path / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "config.json").exists()
    return path


#: recipe=generate's short settings (the tests of sft_runs' generations)
GENERATE = ["recipe=generate", "recipe.max_new_tokens=6", "recipe.batch_size=5"]


@pytest.fixture(scope="session")
def greedy_one_process(
    hydratune: Warm, sft_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> list[dict]:
    """Greedy generations of the full run over the demo prompts, one process (the CLI, forked from the warm
    server: how it starts is not the point)."""
    from tests.support.runs import read_jsonl

    cwd = tmp_path_factory.mktemp("gen1")
    proc = hydratune(*GENERATE, f"model.from_run={sft_runs['full']}", "hydra.run.dir=out", cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_jsonl(cwd / "out" / "generations.jsonl")


def group_options() -> list[tuple[str, str]]:
    """Every (group, option) shipped in conf/ — new options are covered automatically."""
    return sorted(
        (group.name, option.stem)
        for group in CONF.iterdir()
        if group.is_dir() and not group.name.startswith("_")
        for option in group.glob("*.yaml")
    )
