"""What every config group offers: the one place hydratune learns which options exist.

An option is a YAML file ``conf/<group>/<name>.yaml`` or, for a recipe module that ships none, the node its
``@recipe`` decorator stores (``components/recipe.py``). Everything that lists options derives from here:
the estimate's every-strategy table and ``strategy=auto``'s ladder
(``hydratune.components.strategy.training_options``), the support matrix, ``hydratune ls`` / ``--help``, and
the tests that hold the README and docs to them.

:func:`node` composes an option as Hydra does (its schema's defaults under the YAML's keys, interpolations
left as written) without starting Hydra: a few milliseconds for a group, so ``hydratune estimate`` stays
fast. ``tests/unit/test_options.py`` checks it against Hydra's own composition for every option of every
group.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


def conf_dir() -> Path:
    """The ``conf`` package's folder (the source tree's, or the installed wheel's), found without importing
    anything from it."""
    spec = importlib.util.find_spec("hydratune.conf")
    assert spec is not None and spec.submodule_search_locations, "the conf package is not importable"
    return Path(next(iter(spec.submodule_search_locations)))


#: ``conf/`` — a module global, so a test can point the derivations at a copy with one option more
CONF = conf_dir()
#: groups whose options are listed to users but are not a component of the run (``+experiment=``)
NOT_COMPONENTS = ("experiment",)


@dataclass(frozen=True)
class Option:
    """One option of a config group: where it comes from and the line that describes it."""

    group: str
    name: str
    path: Path | None  # conf/<group>/<name>.yaml; None when a recipe module's decorator stored it
    description: str

    @property
    def node(self) -> DictConfig:
        """The option's node as Hydra composes it for ``<group>=<name>`` (unresolved)."""
        return node(self.group, self.name, self.path.parent.parent if self.path else None)

    @property
    def target(self) -> str:
        """The ``_target_`` the option instantiates ('' for experiments)."""
        return str(self.node.get("_target_", "") or "")

    def build(self) -> Any:
        """The option's component, instantiated from its node alone. For groups whose options do not
        interpolate other groups' keys (strategy, peft, optimizer, ...); a data option reads
        ``${train.seed}`` and builds inside a composed config only."""
        from hydra.utils import instantiate

        return instantiate(self.node, _convert_="all")


def groups(conf: Path | None = None) -> list[str]:
    """Every group folder of ``conf`` (sorted)."""
    root = conf or CONF
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def options(group: str, conf: Path | None = None) -> dict[str, Option]:
    """``{name: Option}`` of ``group``, sorted by name: its YAML files, then the options a recipe module
    registered without one."""
    return dict(_options(group, conf or CONF))


@functools.cache
def _options(group: str, conf: Path) -> tuple[tuple[str, Option], ...]:
    found = {p.stem: Option(group, p.stem, p, describe(p)) for p in (conf / group).glob("*.yaml")}
    for name, registered in _stored(group).items():
        found.setdefault(name, Option(group, name, None, registered))
    return tuple(sorted(found.items()))


def _stored(group: str) -> dict[str, str]:
    """Options stored in Hydra's ConfigStore for ``group`` by the registry (not the ``schema/`` nodes),
    with their description (the ``__doc__`` line the decorator recorded)."""
    from hydratune.components.config.registry import STORED_OPTIONS

    return dict(STORED_OPTIONS.get(group, {}))


def defaults(conf: Path | None = None) -> dict[str, str]:
    """``{group: option}`` the primary config (conf/config.yaml) picks when the command line names none;
    ``data: demo_${recipe}`` resolved for the default recipe."""
    raw = OmegaConf.to_container(OmegaConf.load((conf or CONF) / "config.yaml"), resolve=False)
    assert isinstance(raw, dict)
    picked = {
        str(g): str(o)
        for entry in raw.get("defaults", [])
        if isinstance(entry, dict)
        for g, o in entry.items()
    }
    return {group: option.replace("${recipe}", picked.get("recipe", "")) for group, option in picked.items()}


def describe(option: Path) -> str:
    """The first comment line of an option's YAML (skipping ``@package`` directives)."""
    for line in option.read_text().splitlines():
        text = line.lstrip("# ").rstrip()
        if line.startswith("#") and text and not text.startswith("@package"):
            return text
        if line and not line.startswith("#"):
            break
    return ""


def node(group: str, name: str, conf: Path | None = None) -> DictConfig:
    """``<group>=<name>`` composed the way Hydra composes it: each defaults entry in order (the schema
    ``/schema/<group>/<Class>@_here_``, another option of the same group, ``_self_``), later ones merged
    over earlier ones."""
    path = (conf or CONF) / group / f"{name}.yaml"
    raw = OmegaConf.load(path) if path.is_file() else _config_store_node(f"{group}/{name}")
    assert isinstance(raw, DictConfig)
    defaults = [str(d) for d in (raw.pop("defaults", None) or [])]
    if "_self_" not in defaults:
        defaults.append("_self_")
    parts: list[Any] = []
    for entry in defaults:
        if entry == "_self_":
            parts.append(raw)
        elif entry.startswith("/"):  # an absolute config, e.g. /schema/strategy/DeepSpeed@_here_
            parts.append(_config_store_node(entry[1:].split("@", 1)[0]))
        else:  # another option of this group
            parts.append(node(group, entry.split("@", 1)[0], conf))
    merged = OmegaConf.merge(*parts)
    assert isinstance(merged, DictConfig)
    return merged


def _config_store_node(path: str) -> DictConfig:
    """A copy of a node in Hydra's ConfigStore (a schema, or an option a decorator stored)."""
    from hydra.core.config_store import ConfigStore

    stored = ConfigStore.instance().load(f"{path}.yaml").node
    copy = OmegaConf.merge(stored)
    assert isinstance(copy, DictConfig)
    return copy
