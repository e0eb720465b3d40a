"""GRPO's ``recipe.environment``: a stateful environment the policy acts in (TRL's ``environment_factory``).

An environment is a class of the user's own module with ``reset(**row)`` (it receives the row's columns and
may return text appended to the prompt) and public methods, the tools of that episode (type hints and a
docstring each, as every tool: components/tools.py); ``get_reward()``, if it has one, is a reward. It is
named as a tool is (a dotted path or a ``_target_`` node with ``_partial_: true``, other keys passed to the
constructor) and checked before load under the same trust rules.

TRL pools instances and resets them between episodes; hydratune hands it :func:`fresh_factory`'s proxy,
whose ``reset`` builds a new instance, so no state leaks from one rollout into the next, and whose tool
methods answer every fault with an error message for the model (counted), as tools do.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.tools import Tool, ToolStats, named, schema

KEY = "recipe.environment"
NOT_TOOLS = ("reset", "get_reward")
FIX = (
    "a class in your own module with reset(self, **row) and public methods with type hints and a docstring "
    "(the tools), e.g. def add(self, a: int) -> str"
)


def tool_methods(cls: type) -> list[tuple[str, Callable[..., Any]]]:
    """The class's public functions but ``reset`` and ``get_reward``: the tools TRL exposes."""
    return [
        (name, f)
        for name, f in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in NOT_TOOLS and not name.startswith("_")
    ]


def resolve_environment(spec: Any, *, trusted: bool) -> Callable[[], Any]:
    """The factory (the class, its constructor's keywords bound) ``spec`` names, checked before load."""
    factory = named(spec, KEY, inspect.isclass, FIX, "a class")
    cls = environment_class(factory)
    if not inspect.isclass(cls):
        raise ConfigError(f"{KEY} names {cls!r}, not a class", key=KEY, hint=FIX)
    if not trusted:
        from hydratune.components.rewards import check_trusted

        hint = "a class in your own module; if you trust the config: trust_targets=true"
        check_trusted(factory, KEY, what="environment", hint=hint, accepts=inspect.isclass, plain="a class")
    if not callable(getattr(cls, "reset", None)):
        raise ConfigError(f"environment {cls.__name__} has no reset(**row)", key=KEY, hint=FIX)
    methods = tool_methods(cls)
    if not methods:
        raise ConfigError(
            f"environment {cls.__name__} has no public method for the model to call", key=KEY, hint=FIX
        )
    for _, method in methods:
        schema(functools.partial(method, None), KEY)  # the schema of the bound method, as TRL renders it
    return factory


def environment_class(factory: Any) -> Any:
    return factory.func if isinstance(factory, functools.partial) else factory


def check_reset(factory: Callable[..., Any], row: dict[str, Any], path: str) -> None:
    """Before load: ``reset`` takes the columns of a row of the data (TRL passes it ``**row``)."""
    cls = environment_class(factory)
    try:
        inspect.signature(cls.reset).bind(None, **row)
    except TypeError as err:
        raise ConfigError(
            f"{cls.__name__}.reset cannot take the columns of {path}'s rows ({', '.join(row)}): {err}",
            key=KEY,
            hint="def reset(self, **row) takes every column",
        ) from None


def fresh_factory(factory: Callable[[], Any], timeout: float | None, stats: ToolStats) -> Callable[[], Any]:
    """A factory of proxies TRL may pool: each ``reset`` builds a fresh environment; each tool method runs
    as a :class:`~hydratune.components.tools.Tool` (faults answered and counted); ``get_reward`` and every
    other attribute read through to the current environment (reward functions receive the proxies)."""
    cls = environment_class(factory)

    def reset(self: Any, **row: Any) -> Any:
        self.__dict__["inner"] = factory()
        return self.inner.reset(**row)

    def __getattr__(self: Any, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    namespace: dict[str, Any] = {"reset": reset, "__getattr__": __getattr__, "__doc__": cls.__doc__}
    for name, method in tool_methods(cls):
        namespace[name] = proxied(name, method, timeout, stats)
    if callable(getattr(cls, "get_reward", None)):
        namespace["get_reward"] = lambda self: self.inner.get_reward()
    return type(cls.__name__, (), namespace)


def proxied(
    name: str, method: Callable[..., Any], timeout: float | None, stats: ToolStats
) -> Callable[..., Any]:
    """A method calling the current environment's ``name`` as a Tool; it reads (schema) as ``method``."""

    def call(self: Any, **arguments: Any) -> str:
        return Tool(getattr(self.inner, name), timeout, stats)(**arguments)

    functools.update_wrapper(call, method)
    return call
