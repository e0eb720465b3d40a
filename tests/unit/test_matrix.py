"""The support matrix (components/commands/matrix.py): every cell through the real composition and the
pre-load checks (no model is loaded) gives the verdict the table says; docs/matrix.md is the rendered
table."""

from __future__ import annotations

import copy
import dataclasses
import logging
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from hydratune.components.commands import matrix
from hydratune.components.config.errors import ConfigError
from hydratune.components.runtime.checks import check_before_load
from hydratune.components.runtime.run import Components

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "matrix.md"


class Composer:
    """Cells composed fast: Hydra composes each recipe x strategy once and each peft / quantization /
    precision option once; a cell is the first with the others' group nodes put in (equal to composing the
    cell whole: ``test_composer_equals_hydra``). The cells of a recipe x strategy share one working copy of
    it, their three nodes put in in turn (the checks only read a config: ``changed`` says so after a walk).
    Its components likewise: ``Components.from_config`` of each recipe x strategy once, each of its peft /
    quantization / precision options instantiated once (no other group node interpolates these three nor
    they another), equal to ``Components.from_config`` of the cell (``test_composer_equals_hydra``).
    Profiled, building the components was ~80% of a cell's time, the checks ~12% (the meta-device model
    builds among them ~3%)."""

    GROUPS = {"peft": matrix.PEFTS, "quantization": matrix.QUANTIZATIONS, "precision": matrix.PRECISIONS}

    def __init__(self, compose_cfg) -> None:
        self.compose = compose_cfg
        self.bases: dict[tuple[str, str], DictConfig] = {}
        self.nodes = {(g, o): compose_cfg(f"{g}={o}")[g] for g, opts in self.GROUPS.items() for o in opts}
        self.working: dict[tuple[str, str], DictConfig] = {}
        self.built: dict[tuple[str, str], Components] = {}
        self.options: dict[tuple[str, str, str, str], object] = {}

    def __call__(self, cell: matrix.Cell) -> DictConfig:
        key = (cell.recipe, cell.strategy)
        if key not in self.bases:
            self.bases[key] = self.compose(
                *(o for o in cell.overrides() if o.split("=")[0] not in self.GROUPS)
            )
            self.working[key] = copy.deepcopy(self.bases[key])
        cfg = self.working[key]
        with open_dict(cfg):
            for group in self.GROUPS:
                cfg[group] = self.nodes[(group, getattr(cell, group))]
        return cfg

    def changed(self) -> list[tuple[str, str]]:
        """The recipe x strategy pairs whose working copy differs from its composition outside the three
        groups (none: nothing a cell's checks did leaked into the next cell)."""

        def rest(cfg: DictConfig) -> str:
            return OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, [k for k in cfg if k not in self.GROUPS]))

        return [key for key, cfg in self.working.items() if rest(cfg) != rest(self.bases[key])]

    def components(self, cell: matrix.Cell, cfg: DictConfig) -> Components:
        """The components of ``cell``, whose config (``self(cell)``) is ``cfg``."""
        key = (cell.recipe, cell.strategy)
        if key not in self.built:
            self.built[key] = Components.from_config(self.bases[key])
        parts = {}
        for group in self.GROUPS:
            option = (*key, group, getattr(cell, group))
            if option not in self.options:  # as Components.from_config instantiates a group
                self.options[option] = instantiate(cfg[group], _convert_="all")
            parts[group] = self.options[option]
        return dataclasses.replace(self.built[key], **parts)


def test_composer_equals_hydra(compose_cfg) -> None:
    composer = Composer(compose_cfg)
    for cell in (  # every peft, quantization and precision option of the walk
        matrix.Cell("dpo", "zero3", "lora", "nf4", "bf16"),
        matrix.Cell("ppo", "fsdp", "none", "none", "fp16"),
        matrix.Cell("reward", "ddp", "lora", "none", "fp32"),
    ):
        cfg = compose_cfg(*cell.overrides())
        assert OmegaConf.to_yaml(composer(cell)) == OmegaConf.to_yaml(cfg)
        # as repr: PPO's reward function is Hydra's partial, which has no __eq__
        assert repr(composer.components(cell, composer(cell))) == repr(Components.from_config(cfg))


def observed(compose_cell, cell: matrix.Cell, components=None) -> matrix.Verdict:
    """What the checks say: passes on CPU → cpu; refused on CPU but passes planned for CUDA → gpu; else
    refused, with the key the GPU-planned error names. Both checks read the same components (``components``
    (cell, cfg), else ``Components.from_config``): frozen dataclasses equal to their config
    (test_components_still_equal_their_config_after_a_run), which the checks only read."""
    cfg = compose_cell(cell)
    comps = components(cell, cfg) if components else Components.from_config(cfg)
    try:
        check_before_load(cfg, comps, "cpu")
        return matrix.Verdict("cpu")
    except ConfigError:
        pass
    try:
        check_before_load(cfg, comps, "cuda")
        return matrix.Verdict("gpu")
    except ConfigError as err:
        return matrix.Verdict("refused", key=err.key)


@pytest.mark.parametrize("recipe", list(matrix.recipes()))
def test_every_cell_gets_the_verdict_the_table_gives(compose_cfg, monkeypatch, recipe: str) -> None:
    import hydratune.components.model

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(hydratune.components.model.CausalLM, "build", no_loading)
    logging.getLogger("hydratune").setLevel(logging.ERROR)  # the lr / dtype notes, once per cell
    wrong, composer = [], Composer(compose_cfg)
    for cell in (c for c in matrix.cells() if c.recipe == recipe):
        want, got = matrix.verdict(cell), observed(composer, cell, composer.components)
        if (want.kind, want.key if want.kind == "refused" else None) != (got.kind, got.key):
            wrong.append(f"{' '.join(cell.overrides())}: table {want.kind} {want.key or ''}, checks {got}")
    assert not wrong, "\n".join(wrong)
    assert not composer.changed()  # the checks changed no config the next cells shared


def test_the_covering_sample_trains_every_recipe_and_strategy_once() -> None:
    run = matrix.RUN_IN_TESTS
    assert {c.recipe for c in run} == set(matrix.recipes())
    assert all(matrix.verdict(c).kind == "cpu" for c in run)  # run in CI here: CPU cells only
    untrained = set(matrix.strategies()) - {c.strategy for c in run}
    # GPU-only strategies on this host: zero3pp (CUDA quantizer); zero0 and zero3_nvme are checked only
    assert untrained == {"zero0", "zero3_nvme", "zero3pp"}, untrained


def test_each_trained_cell_names_a_test_that_exists_and_what_its_launch_shows() -> None:
    """Every test file named exists; the cells test launches every multi-process cell but the pipeline's (its
    own file) and nothing else; a resumed launch is there for the resume check and a one-process run for
    the comparison with one, each only then."""
    for cell, trained in matrix.RUN_IN_TESTS.items():
        assert (REPO / trained.test.split("::")[0]).is_file(), trained.test
        several = matrix.strategies()[cell.strategy].max_processes != 1
        assert (trained.test == matrix.CELLS_TEST) == (several and cell.strategy != "pipeline"), cell
        assert bool(trained.shows) == (trained.test == matrix.CELLS_TEST), cell
        assert (trained.resume is not None) == ("exact resume" in trained.shows), cell
        assert (trained.one_process is not None) == ("equal to one process" in trained.shows), cell
        assert len(set(trained.shows)) == len(trained.shows), cell
        if trained.resume is not None:  # the checkpoint resumed from is one the launch saves
            every = next(o for o in trained.overrides if o.startswith("train.save_every="))
            assert trained.resume % int(every.split("=")[1]) == 0, cell


def test_docs_matrix_is_up_to_date() -> None:
    assert DOCS.read_text() == matrix.markdown(), "run: hydratune matrix --markdown > docs/matrix.md"


def test_every_split_layout_gets_the_verdict_the_table_gives(compose_cfg, monkeypatch) -> None:
    """The tensor / sequence parallel layouts docs/matrix.md lists, and its layouts of GRPO with tools,
    through the same checks."""
    import hydratune.components.model

    monkeypatch.setattr(
        hydratune.components.model.CausalLM, "build", lambda *a, **k: pytest.fail("a model was loaded")
    )
    logging.getLogger("hydratune").setLevel(logging.ERROR)
    wrong = []
    layouts = [((), split) for split in matrix.SPLITS]
    layouts += [(matrix.TOOLS, layout) for layout in matrix.TOOL_LAYOUTS]
    for base, split in layouts:
        cfg = compose_cfg(*base, *split.overrides, f"launcher.nproc_per_node={split.processes}")
        try:  # strategy.pp_size on ddp / zero / fsdp: Components trains it as the staged engine
            got = observed(lambda _, cfg=cfg: copy.deepcopy(cfg), None)
        except ConfigError as err:
            got = matrix.Verdict("refused", key=err.key)
        if (split.kind, split.key) != (got.kind, got.key):
            wrong.append(f"{' '.join(split.command)}: table {split.kind} {split.key}, checks {got}")
    assert not wrong, "\n".join(wrong)
