"""One source of truth: every option of every group, composed by Hydra, against every table derived from
conf/ and the components (components/config/options.py).

- ``options.node`` (hydratune's fast composition, no Hydra) equals Hydra's composition of every option;
- every option builds, and a recipe option's ``_target_`` names the recipe registered under that name;
- the estimate's every-strategy table, ``strategy=auto``'s ladder and candidates, the support matrix,
  ``hydratune ls`` and the generated tables of README.md and docs/strategies.md list exactly the options
  Hydra composes (the expected sets below come from composing with Hydra, not from the code under test);
- a strategy option added to a copy of conf/ as one YAML file reaches every derived table.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from hydratune.components.config import options as options_module
from hydratune.components.config.options import groups, options

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
COMPONENT_GROUPS = [g for g in groups() if g not in options_module.NOT_COMPONENTS]


def composed(compose_cfg, group: str, name: str):
    """The option file ``conf/<group>/<name>.yaml`` as Hydra composes it on its own (conf/config.yaml's
    overrides of a group's keys, such as the demo's ``optimizer.lr``, aside); ``compose_cfg`` keeps Hydra
    initialised on conf/."""
    from hydra import compose

    cfg = compose(config_name=f"{group}/{name}")
    return cfg.tracker.get(name, {}) if group == "tracker" else cfg[group]


@pytest.mark.parametrize("group", COMPONENT_GROUPS)
def test_every_option_composes_as_hydra_composes_it(compose_cfg, group: str) -> None:
    found = options(group)
    assert found, group
    on_disk = {p.stem for p in (CONF / group).glob("*.yaml")}
    assert on_disk <= set(found), "a YAML option is missing from options()"
    for name, option in found.items():
        if group == "tracker" and name == "none":
            assert composed(compose_cfg, group, name) == {}
            continue
        want = OmegaConf.to_container(composed(compose_cfg, group, name), resolve=False)
        assert OmegaConf.to_container(option.node, resolve=False) == want, f"{group}={name}"
        assert option.target == want["_target_"]
        assert option.description, f"conf/{group}/{name}.yaml has no description line"


@pytest.mark.parametrize("group", COMPONENT_GROUPS)
def test_an_option_sets_only_what_differs_from_its_defaults(group: str) -> None:
    """``conf/<group>/<option>.yaml`` holds its ``_target_`` and the knobs it changes: the schema (and a
    parent option in its defaults list) gives the rest, so a default is declared once, on the field."""
    for name, option in options(group).items():
        if option.path is None:
            continue
        own = OmegaConf.load(option.path)
        below = [str(d) for d in own.pop("defaults", [])]
        parts = [
            options_module._config_store_node(d[1:].split("@")[0])
            if d.startswith("/")
            else options_module.node(group, d.split("@")[0])
            for d in below[: below.index("_self_") if "_self_" in below else len(below)]
        ]
        base = OmegaConf.merge(*parts) if parts else OmegaConf.create()
        repeated = {
            k
            for k in own
            if k != "_target_"
            and k in base
            and OmegaConf.to_container(OmegaConf.merge(base, {k: own._get_node(k)}), resolve=False)[k]
            == OmegaConf.to_container(base, resolve=False)[k]
        }
        assert not repeated, f"conf/{group}/{name}.yaml repeats its defaults: {repeated}"


def test_every_recipe_option_is_the_recipe_registered_under_its_name(compose_cfg) -> None:
    from hydratune.components.config.registry import RECIPES, recipe_name

    for name in options("recipe"):
        recipe = instantiate(compose_cfg(f"recipe={name}").recipe)
        assert recipe.name == name and RECIPES[name] is type(recipe)
        assert recipe_name(compose_cfg(f"recipe={name}").recipe._target_) == name
        assert recipe.title and recipe.data_kinds
        data = instantiate(compose_cfg(f"recipe={name}").data)  # its demo data, composed by default
        assert data.kind in recipe.data_kinds, name


# ---- the tables derived from the options ---------------------------------------------------------
def hydra_strategies(compose_cfg) -> dict[str, object]:
    """Every strategy option that trains, composed by Hydra and built (the expected rows)."""
    from hydratune.components.strategy import Strategy

    built = {name: instantiate(composed(compose_cfg, "strategy", name)) for name in options("strategy")}
    return {name: s for name, s in built.items() if isinstance(s, Strategy)}


@pytest.mark.parametrize("world", [1, 8])
def test_the_estimate_and_auto_list_every_strategy_option(compose_cfg, world: int) -> None:
    from rich.console import Console

    from hydratune.components.auto import Auto
    from hydratune.components.commands.estimate_tables import render
    from hydratune.components.memory.ladder import ladder
    from hydratune.components.memory.spec import strategy_shapes

    want = {name for name, s in hydra_strategies(compose_cfg).items() if s.applicable(world)}
    assert set(strategy_shapes(world)) == want
    assert {name for name, _ in ladder(strategy_shapes(world), False)} == want
    buf = io.StringIO()
    cfg = compose_cfg("model=llama3_8b", f"estimate.num_gpus={world}", "estimate.gpu_memory=80GB")
    render(cfg, Console(file=buf, width=220))
    rows = {line.split("│")[1].strip() for line in buf.getvalue().splitlines() if line.count("│") == 10}
    assert rows - {"strategy"} == want  # the every-strategy table
    for name in want:
        Auto(candidates=[name]).validate()  # every option is a candidate auto accepts


def test_the_matrix_ls_and_readme_list_every_option(compose_cfg) -> None:
    from hydratune.components.commands import docs, matrix
    from hydratune.components.commands.catalog import render

    strategies = hydra_strategies(compose_cfg)
    assert list(matrix.strategies()) == sorted(
        strategies, key=lambda n: (-strategies[n].memory_shape().speed, n)
    )
    trains = {
        n for n in options("recipe") if not instantiate(compose_cfg(f"recipe={n}").recipe).inference_only
    }
    assert set(matrix.recipes()) == trains
    listing = "\n" + render()
    readme = (REPO / "README.md").read_text()
    for group in groups():
        names = {p.stem for p in (CONF / group).glob("*.yaml")} | set(options(group))
        assert names == set(options(group))
        section = listing.split(f"\n{group}:", 1)[1].split("\n\n", 1)[0]  # from ls's group heading
        assert {line.split()[0] for line in section.splitlines()[1:]} == names, group
        assert f"<!-- options:{group} -->{docs.option_list(group)}<!-- /options -->" in readme, (
            f"README.md's {group} options are out of date: run hydratune docs"
        )
    page = (REPO / "docs" / "strategies.md").read_text()
    assert docs.strategy_table() in page, (
        "docs/strategies.md's strategy table is out of date: run hydratune docs"
    )
    for name in options("strategy"):
        assert f"| `{name}` |" in docs.strategy_table()


def test_the_generated_docs_are_up_to_date() -> None:
    """README.md's, docs/strategies.md's and ARCHITECTURE.md's generated parts and docs/matrix.md as
    ``hydratune docs`` writes them (a hand-deleted row, an option added without regenerating, a member added
    to an interface class, fails here)."""
    from hydratune.components.commands.docs import generated

    stale = [str(path) for path, text in generated(REPO).items() if path.read_text() != text]
    assert not stale, f"out of date: {stale}: run hydratune docs"


# ---- a new strategy option is one YAML file ------------------------------------------------------
ZERO1_OFFLOAD = """\
# DeepSpeed ZeRO-1 with the optimizer states and step on CPU (ZeRO-Offload for stage 1).
defaults:
  - /schema/strategy/DeepSpeed@_here_
  - _self_
_target_: hydratune.components.strategy.DeepSpeed
stage: 1
offload_optimizer: cpu
"""


@pytest.fixture
def conf_with_zero1_offload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of conf/ with ``strategy/zero1_offload.yaml`` added, as the options' source."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "strategy" / "zero1_offload.yaml").write_text(ZERO1_OFFLOAD)
    monkeypatch.setattr(options_module, "CONF", conf)
    return conf


def test_a_new_strategy_option_reaches_every_derived_table(
    conf_with_zero1_offload: Path, tmp_path: Path
) -> None:
    from hydratune.components.commands import catalog, docs, matrix
    from hydratune.components.config.options import node
    from hydratune.components.memory.ladder import ladder
    from hydratune.components.memory.spec import strategy_shapes
    from hydratune.components.strategy import training_options

    built = training_options()["zero1_offload"]
    shape = built.memory_shape()
    assert (shape.stage, shape.offload_optimizer, node("strategy", "zero1_offload").stage) == (1, "cpu", 1)
    assert "zero1_offload" in strategy_shapes(1) and "zero1_offload" in strategy_shapes(8)
    assert ("zero1_offload", False) in ladder(strategy_shapes(8), False)
    assert shape.speed < strategy_shapes(8)["zero1"].speed  # an offload rung: after its stage's
    assert "zero1_offload" in matrix.strategies()
    assert matrix.verdict(matrix.Cell("sft", "zero1_offload", "none", "none", "fp32")).kind == "cpu"
    assert "zero1_offload" in catalog.render(conf_with_zero1_offload)
    assert "`zero1_offload`" in docs.option_list("strategy")
    assert "| `zero1_offload` | DeepSpeed ZeRO-1 with the optimizer states" in docs.strategy_table()
    readme, page = tmp_path / "README.md", tmp_path / "docs" / "strategies.md"
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / "README.md", readme)
    shutil.copy(REPO / "docs" / "strategies.md", page)
    shutil.copy(REPO / "ARCHITECTURE.md", tmp_path / "ARCHITECTURE.md")
    assert docs.cli(["--check", str(tmp_path)]) == 1  # the committed docs do not list it yet
    assert docs.cli([str(tmp_path)]) == 0 and "`zero1_offload`" in readme.read_text()
    assert "| `zero1_offload` | DeepSpeed ZeRO-1 with the optimizer states" in page.read_text()
    assert "| zero1_offload |" in (tmp_path / "docs" / "matrix.md").read_text()
