"""The allowed values of every numeric knob, declared once on its field, checked before anything is built.

OmegaConf checks a knob's type (``int``, ``float``) when the config is composed, not its value: ``nan``,
``inf`` and ``-1`` are floats and ints like any other. So every numeric field of the structured configs (the
shared ``train:`` / ``estimate:`` nodes, every component, every recipe) declares its range where it is
declared, with :func:`knob`::

    lr: float = knob(1e-4, POSITIVE)
    betas: list[float] = knob([0.9, 0.95], FRACTION)  # a list: each element
    max_steps: int = knob(-1, Range(1, also=(-1,)), hint="-1 trains for train.epochs")  # -1: a sentinel

The range is the field's metadata. A subclass that redeclares a field only for another default
(``lr: float = 1e-3``) keeps its base's range (:func:`range_of` reads the class's bases); one that declares
``knob`` again has its own. The schema Hydra composes with (``registry.schema_of``) carries it, and
:func:`check_values` walks the composed config and refuses, naming the key and the range, any value outside
it and any non-finite float. ``tests/unit/test_value_probes.py`` fails when a numeric field declares no
range, and when a component's own checks refuse a value its declared range allows.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf

from hydratune.components.config.errors import ConfigError

T = TypeVar("T")

SEED_MAX = 2**32 - 1  # numpy's and torch's seeds
RANGE, HINT = "hydratune.range", "hydratune.range_hint"  # the field metadata knob() writes


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (``<`` where open), a finite number; ``also``: sentinels outside it;
    ``only``: the values allowed (:func:`one_of`), ``low``/``high`` their bounds."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    also: tuple[float, ...] = ()
    only: tuple[float, ...] = ()

    def allows(self, value: float) -> bool:
        if value in self.also:
            return True
        if not math.isfinite(value):
            return False
        if self.only:
            return value in self.only
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.only:
            return " or ".join(f"{v:g}" for v in self.only)
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        text = " and ".join(parts) or "any"
        text = f"a finite number {text}" if parts else "any finite number"
        return text + "".join(f", or {v:g}" for v in self.also)


def one_of(*values: float) -> Range:
    """Exactly one of ``values`` (``optimizer.bits``: 8 or 32)."""
    return Range(min(values), max(values), only=values)


FINITE = Range()
POSITIVE = Range(0, low_open=True)  # > 0
NON_NEGATIVE = Range(0)  # >= 0
AT_LEAST_ONE = Range(1)
FRACTION = Range(0, 1, high_open=True)  # [0, 1)
UNIT = Range(0, 1)  # [0, 1]
SEED = Range(0, SEED_MAX)
PORT = Range(1, 65535)


def knob(default: T, allowed: Range, *, hint: str | None = None) -> T:
    """A numeric field's default and its range (``hint``: what the refusal adds, e.g. the paper's values).
    A list default is copied for each instance (a ``default_factory``); its range is each element's."""
    metadata = {RANGE: allowed, **({HINT: hint} if hint else {})}
    if isinstance(default, list):
        items = list(default)
        return typing.cast(T, dataclasses.field(default_factory=lambda: list(items), metadata=metadata))
    return typing.cast(T, dataclasses.field(default=default, metadata=metadata))


def declared(cls: type, name: str) -> Mapping[str, Any]:
    """The range metadata of field ``name`` of dataclass ``cls``: its own declaration's, else (a
    redeclaration for another default) the nearest base's that declares one; empty when none does."""
    for klass in getattr(cls, "__mro__", (cls,)):
        f = getattr(klass, "__dataclass_fields__", {}).get(name)
        if f is not None and RANGE in f.metadata:
            return {k: v for k, v in f.metadata.items() if k in (RANGE, HINT)}
    return {}


def range_of(cls: type, name: str) -> Range | None:
    """The declared range of knob ``name`` of ``cls`` (a component, a recipe or their schema; None: not
    declared)."""
    return declared(cls, name).get(RANGE)


def is_numeric(hint: Any) -> bool:
    """An ``int`` / ``float`` knob, optional or not, or a list of them (``bool`` is not a number here)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (list, tuple):
        return bool(args) and all(is_numeric(a) for a in args)
    if args:
        return all(is_numeric(a) for a in args)
    return hint in (int, float)


def numeric_fields(schema: type) -> Iterator[tuple[str, Any]]:
    """The numeric knobs of a structured-config dataclass: (name, type hint)."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.init and not f.name.startswith("_") and is_numeric(hints[f.name]):
            yield f.name, hints[f.name]


def check_value(key: str, value: Any, allowed: Range | None, hint: str | None = None) -> None:
    """Refuse ``value`` for knob ``key`` unless it is in ``allowed`` (None: any finite number); None (unset)
    is allowed, a list is checked element by element."""
    if value is None:
        return
    if isinstance(value, (list, tuple, ListConfig)):
        for item in value:
            check_value(key, item, allowed, hint)
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return  # an interpolation or a type OmegaConf let through: not a number to judge here
    allowed = allowed or FINITE
    if not allowed.allows(value):
        raise ConfigError(
            f"must be {allowed}, got {value}",
            key=key,
            hint=f"pass {key}=<{allowed}>" + (f" ({hint})" if hint else ""),
        )


def check_knobs(schema: type, values: Mapping[str, Any], prefix: str) -> None:
    """The numeric knobs of ``schema`` that ``values`` sets (a config node, a data.mixture entry), each
    within the range its field declares; named ``<prefix>.<knob>``."""
    for name, _ in numeric_fields(schema):
        if name in values:
            meta = declared(schema, name)
            check_value(f"{prefix}.{name}", values[name], meta.get(RANGE), meta.get(HINT))


def structured_nodes(node: DictConfig, path: str = "") -> Iterator[tuple[str, DictConfig, type]]:
    """(path, node, schema) of every node of a composed config typed by a dataclass: the shared ``train`` /
    ``estimate`` first (the groups' knobs interpolate ``${train.seed}``), then the groups, each selected
    tracker (``tracker.<name>``)."""
    schema = OmegaConf.get_type(node)
    if path and dataclasses.is_dataclass(schema):
        yield path, node, schema
    keys = [str(k) for k in node]
    if not path:
        keys.sort(key=lambda k: k not in ("train", "estimate"))
    for key in keys:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            yield from structured_nodes(child, f"{path}.{key}" if path else key)


def check_values(cfg: DictConfig) -> None:
    """Every numeric knob of the composed config finite and within the range its field declares."""
    for path, node, schema in structured_nodes(cfg):
        check_knobs(schema, node, path)
