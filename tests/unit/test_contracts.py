"""ARCHITECTURE.md's contract tables are read from the classes (components/commands/contracts.py): every
member of an interface is in its table, a member added to a class reaches it, and ``hydratune docs --check``
fails on a table that differs from the code."""

from __future__ import annotations

import shutil
import sys
import typing
from pathlib import Path

import pytest

from hydratune.components.commands import contracts, docs
from hydratune.components.recipe import Recipe
from hydratune.components.strategy.core import ModelSplit, OwnLoop, Strategy

REPO = Path(__file__).resolve().parents[2]


def public(cls: type) -> set[str]:
    """What ``cls`` itself defines that a table must show: its ClassVars, properties and methods."""
    hints = vars(cls).get("__annotations__", {})
    class_vars = {n for n, a in hints.items() if str(a).startswith("ClassVar") and not n.startswith("_")}
    callables = {n for n, v in vars(cls).items() if callable(v) or isinstance(v, property | classmethod)}
    return class_vars | {n for n in callables if not n.startswith("_")}


@pytest.mark.parametrize(
    ("group", "classes"), [("recipe", [Recipe]), ("strategy", [Strategy, ModelSplit, OwnLoop])]
)
def test_every_member_of_an_interface_is_in_its_table(group: str, classes: list[type]) -> None:
    """Recipe's 13+ class variables and its methods, Strategy's and its extensions' members (``axes``,
    ``axis_refusal``...), the parallel keys (``ep_size``...): each has its row, described by its ``#:``
    comment or docstring."""
    table = contracts.member_table(group)
    assert set(classes) <= set(contracts.interface(group)), contracts.interface(group)
    for cls in classes:
        assert f"| **`{cls.__name__}`** |" in table
        for name in public(cls):
            assert f"`{name}`" in table or f"`{name}(" in table, f"{cls.__name__}.{name} not in the table"


def test_the_tables_show_what_the_hand_kept_ones_missed() -> None:
    strategy, recipe = contracts.member_table("strategy"), contracts.member_table("recipe")
    assert "| `axis_refusal(device, dtype)` |" in strategy
    assert "| `ep_size` | expert parallel ranks" in strategy
    assert "| `streams_data` | trains on `data.streaming`'s rows as they are read" in recipe
    assert "| `check_data(comps, splits, tokenizer)` |" in recipe


def test_every_component_group_has_its_capabilities_listed() -> None:
    from hydratune.components.config.options import defaults

    page = (REPO / "ARCHITECTURE.md").read_text()
    for group in defaults():
        assert f"<!-- contract:{group} -->" in page or f"\n| {group} | `" in page, group


PROBE = '''
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Sizes:
    """A description the core holds. Not listed further."""

    #: ranks along the first axis
    first: int = 1
    second: int = 1


class Extra:
    """Extension: what some options add."""

    #: each option says
    extra_flag: ClassVar[bool] = False

    def extra(self, x: int, *rest: int, key: str = "", **more: int) -> None:
        """Does the extra thing. Then more."""


@dataclass(frozen=True)
class Core:
    """The core of every option."""

    knob: int = 0  # a field: the option's knob, not a capability
    #: the first fact,
    #: on two lines
    fact: ClassVar[bool] = False
    other: ClassVar[int] = 1

    shape: ClassVar[Sizes] = Sizes()
    _hidden: ClassVar[int] = 0

    @property
    def label(self) -> str:
        """How it is named."""
        return ""

    @classmethod
    def make(cls, name: str) -> Core:
        """Makes one."""
        return cls()

    @staticmethod
    def pure(a: int, b: int) -> int:
        return a + b

    def _private(self) -> None:
        pass


@dataclass(frozen=True)
class One(Extra, Core):
    pass


@dataclass(frozen=True)
class Two(Core):
    pass
'''


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> typing.Any:
    """A module of interface classes (a core, an extension, a description) and two options, as the
    group ``probe``."""
    import importlib.util

    path = tmp_path / "probe_interfaces.py"
    path.write_text(PROBE)
    name = "hydratune.components.probe_interfaces"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(contracts, "options_of", lambda group: [module.One, module.Two])
    return module


def test_the_members_are_read_from_the_class_and_its_comments(probe: typing.Any) -> None:
    """Class variables with their ``#:`` comments (one shared by the variable right below), properties,
    methods with their signatures and first sentences; private ones and fields left out."""
    assert [(m.names, m.kind, m.doc) for m in contracts.members(probe.Core)] == [
        (["fact", "other"], "class variable", "the first fact, on two lines"),
        (["shape"], "class variable", ""),
        (["label"], "property", "How it is named."),
        (["make(name)"], "method", "Makes one."),
        (["pure(a, b)"], "method", ""),
    ]
    assert [m.names for m in contracts.members(probe.Extra)] == [
        ["extra_flag"],
        ["extra(x, *rest, key, **more)"],
    ]
    assert [m.names for m in contracts.members(probe.Sizes, fields=True)] == [["first", "second"]]


def test_an_interface_is_found_from_its_options(probe: typing.Any) -> None:
    """The base every option shares, the extension beside it, the description a class variable holds; the
    options themselves are not part of it."""
    assert contracts.interface("probe") == [probe.Core, probe.Extra, probe.Sizes]
    table = contracts.member_table("probe")
    assert table.splitlines()[2:5] == [
        "| **`Core`** | The core of every option. |",
        "| `fact`, `other` | the first fact, on two lines |",
        "| `shape` |  |",
    ]
    assert "| `extra(x, *rest, key, **more)` | Does the extra thing. |" in table
    assert "| `first`, `second` | ranks along the first axis |" in table  # a description's fields
    assert "knob" not in table  # a core's fields are knobs
    assert contracts.capability_table(["probe"]).splitlines()[2:] == [
        "| probe | `Core` | `fact`, `other`, `shape`, `label`; `make(name)`, `pure(a, b)` |",
        "| probe | `Extra` | `extra_flag`; `extra(x, *rest, key, **more)` |",
        "| probe | `Sizes` |  |",
    ]


def test_docs_check_fails_on_a_contract_table_that_differs_from_the_code(tmp_path: Path) -> None:
    """A row deleted by hand (or a member added to the class without regenerating): ``--check`` exits 1,
    ``hydratune docs`` writes the table back."""
    (tmp_path / "docs").mkdir()
    for page in docs.MARKED:
        shutil.copy(REPO / page, tmp_path / page)
    architecture = tmp_path / "ARCHITECTURE.md"
    text = architecture.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `ep_size` |"))
    architecture.write_text(text.replace(row + "\n", ""))
    assert docs.cli(["--check", str(tmp_path)]) == 1
    assert docs.cli([str(tmp_path)]) == 0
    assert architecture.read_text() == (REPO / "ARCHITECTURE.md").read_text()
