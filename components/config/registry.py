"""Register component dataclasses as Hydra structured-config schemas.

Every component is a frozen dataclass whose fields are its knobs (frozen: once built from its config node it
stays equal to it; what a run derives lives in the run's context and Session). ``@component("peft")`` stores a
schema for it in Hydra's ConfigStore under ``schema/<group>/<ClassName>``; the YAML options in
``conf/<group>/`` pull that schema into their defaults list::

    defaults:
      - /schema/peft/LoRA@_here_
      - _self_

so a misspelt key or a value of the wrong type fails when the config is composed, naming the key.
A knob typed as a dict (e.g. ``data.columns``) is the exception: its keys are the user's, so it is left
open (not struct) and ``data.columns='{messages: conversations}'`` adds keys without Hydra's ``+``.
The schema carries a ``_target_`` field that names the class itself, so ``hydra.utils.instantiate``
on the composed node returns the component. Keys forced in past the schema with ``+group.key=…`` are
refused by ``check_known_keys`` before anything is instantiated.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import declared
from hydratune.components.config.schema import GROUPS

T = TypeVar("T")

#: group -> {class name -> component class}; filled as component modules are imported.
REGISTRY: dict[str, dict[str, type]] = {}
#: group -> {option name -> description} of options stored here rather than in a conf/ YAML
STORED_OPTIONS: dict[str, dict[str, str]] = {}
#: recipe option name -> its class; filled by ``@recipe`` (components/recipe.py) as the modules are imported
RECIPES: dict[str, type] = {}

_OMEGACONF_SCALARS = (int, float, str, bool)


def _schema_type(hint: Any) -> Any:
    """Map a Python type hint to one OmegaConf can validate (it knows scalars, Optional, list, dict)."""
    if hint in _OMEGACONF_SCALARS or dataclasses.is_dataclass(hint):
        return hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            inner = _schema_type(rest[0])
            return typing.Optional[inner] if inner is not Any else Any  # noqa: UP045 - OmegaConf needs Optional
        return Any
    if origin in (list, tuple) and args and args[0] in _OMEGACONF_SCALARS:
        return list[args[0]]
    if origin is dict and len(args) == 2 and args[0] is str and args[1] in _OMEGACONF_SCALARS:
        return dict[str, args[1]]
    return Any


def schema_of(cls: type) -> type:
    """Build the structured-config dataclass for component ``cls``: its fields plus ``_target_``; a numeric
    field keeps the range it declares (``components/config/ranges.py``: ``check_values`` reads it here)."""
    hints = typing.get_type_hints(cls)
    specs: list[tuple[str, Any, Any]] = [
        ("_target_", str, dataclasses.field(default=f"{cls.__module__}.{cls.__qualname__}"))
    ]
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        default: Any
        metadata = declared(cls, f.name)
        if f.default is not dataclasses.MISSING:
            default = dataclasses.field(default=f.default, metadata=metadata)
        elif f.default_factory is not dataclasses.MISSING:
            default = dataclasses.field(default_factory=f.default_factory, metadata=metadata)
        else:
            default = dataclasses.field(default="???", metadata=metadata)
        specs.append((f.name, _schema_type(hints[f.name]), default))
    return dataclasses.make_dataclass(cls.__name__, specs)


def open_dicts(schema: type) -> DictConfig:
    """The schema as a config whose dict-typed knobs accept new keys. Hydra closes the composed config
    (struct mode), so ``key='{a: b}'`` on a closed ``Dict[str, str]`` fails with "Key 'a' is not in
    struct"; a node's own ``struct=False`` flag outlives the composition and wins over the root's."""
    node = OmegaConf.structured(schema)
    for name in node:
        child = node._get_node(name)
        if isinstance(child, DictConfig):
            child._set_flag("struct", False)
    return node


def component(group: str) -> Callable[[type[T]], type[T]]:
    """Class decorator: register a dataclass component as the schema for options of ``group``."""

    def register(cls: type[T]) -> type[T]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"@component needs a dataclass, got {cls!r}")
        if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            # a component is its config: what a run derives lives in its context / Session, never on it
            raise TypeError(f"@component needs a frozen dataclass (@dataclass(frozen=True)), got {cls!r}")
        schema = schema_of(cls)
        cls.__schema__ = schema  # type: ignore[attr-defined]
        ConfigStore.instance().store(group=f"schema/{group}", name=cls.__name__, node=open_dicts(schema))
        REGISTRY.setdefault(group, {})[cls.__name__] = cls
        return cls

    return register


def store_option(group: str, name: str, node: Any, description: str) -> None:
    """Make ``<group>=<name>`` composable without a YAML file (Hydra searches its ConfigStore after
    ``conf/``); ``components/config/options.py`` lists it with the group's YAML options."""
    ConfigStore.instance().store(group=group, name=name, node=node)
    STORED_OPTIONS.setdefault(group, {})[name] = description


def field_names(cls: type) -> list[str]:
    """The config keys a component accepts (for error messages and key checks)."""
    return [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]


def _structured_nodes(cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    """(path, node) of the groups, ``train``, ``estimate``, ``plan`` and each selected tracker."""
    nodes = [(group, cfg[group]) for group in (*GROUPS, "train", "estimate") if group != "tracker"]
    nodes += [("plan", cfg.plan)] if "plan" in cfg else []  # a run dir saved before it had none
    return nodes + [(f"tracker.{name}", node) for name, node in (cfg.tracker or {}).items()]


def known_keys(cfg: DictConfig) -> list[str]:
    """Every key the composed config's schemas know, as a dotted path (``optimizer.lr``)."""
    from hydratune.components.config.schema import Config

    paths = [f.name for f in dataclasses.fields(Config)]
    for path, node in _structured_nodes(cfg):
        schema = OmegaConf.get_type(node)
        if dataclasses.is_dataclass(schema):
            paths += [f"{path}.{f.name}" for f in dataclasses.fields(schema) if f.name != "_target_"]
    return paths


def close_keys(key: str, known: list[str]) -> list[str]:
    """Known keys ``key`` was probably meant as: close as a whole path, or by its last part
    (``lr`` -> ``optimizer.lr``)."""
    import difflib

    leaves: dict[str, list[str]] = {}
    for path in known:
        leaves.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    leaf = key.rsplit(".", 1)[-1]
    found = difflib.get_close_matches(key, known, n=3, cutoff=0.75)
    for name in difflib.get_close_matches(leaf, list(leaves), n=3, cutoff=0.75):
        found += [p for p in leaves[name] if p not in found]
    return found[:5]


def _unknown_key(key: str, where: str, known: list[str], allowed: str) -> ConfigError:
    close = close_keys(key, known)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return ConfigError(f"unknown key '{key}' {where}", key=key, hint=hint + allowed)


def user_groups() -> set[str]:
    """Top-level config groups of this Hydra job's defaults list (``+mygroup=x`` from a user's config dir
    composes a ``mygroup`` node); empty outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    return {str(group).split("/", 1)[0] for group in HydraConfig.get().runtime.choices}


def check_known_keys(cfg: DictConfig, extra_groups: set[str] | None = None) -> None:
    """Keys forced in with ``+key=…`` / ``+group.key=…`` that no schema knows: refused, with the known
    keys closest to it. A top-level key is allowed when it is a config group of the job's defaults list
    (``extra_groups``; default: :func:`user_groups`)."""
    from hydratune.components.config.schema import Config

    known = known_keys(cfg)
    top = {f.name for f in dataclasses.fields(Config)} | (
        user_groups() if extra_groups is None else extra_groups
    )
    for key in cfg:
        if key not in top:
            raise _unknown_key(
                str(key), "at the top level of the config", known, "hydratune --cfg job lists the keys"
            )
    for path, node in _structured_nodes(cfg):
        schema = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(schema):
            continue
        fields = {f.name for f in dataclasses.fields(schema)}
        for key in node:
            if key not in fields:
                allowed = ", ".join(sorted(k for k in fields if k != "_target_"))
                where = f"for {path} option '{schema.__name__}'"
                raise _unknown_key(f"{path}.{key}", where, known, f"known keys: {allowed}")


def recipe_name(saved: str) -> str:
    """A recipe's option name from what a run dir saved: the name itself, a class name (summaries written
    before recipes had names: ``SFT``, ``BestOfN``) or a ``_target_`` path. Unknown: lower-cased as is."""
    short = saved.rsplit(".", 1)[-1]
    for option, cls in RECIPES.items():
        if saved in (option, f"{cls.__module__}.{cls.__qualname__}") or short == cls.__name__:
            return option
    return short.lower()


def recipe_class(saved: str) -> Any:
    """The registered recipe class a saved name, class name or ``_target_`` denotes (None: not registered)."""
    return RECIPES.get(recipe_name(saved))


def check_recipe(component: Any) -> None:
    """The built ``recipe`` node must be a registered recipe (an ``@recipe`` class, which extends
    ``hydratune.components.recipe.Recipe``): the rest of hydratune reads its declarations. A
    ``recipe._target_`` of your own (``trust_targets=true``) registers as its module is imported."""
    if type(component) not in RECIPES.values():
        raise ConfigError(
            f"recipe._target_ builds a {type(component).__name__}, which is not a hydratune recipe",
            key="recipe._target_",
            hint="extend hydratune.components.recipe.Recipe and decorate the class with @recipe "
            "(see ARCHITECTURE.md)",
        )
