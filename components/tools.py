"""Tools a policy may call while it generates (``recipe.tools`` of GRPO): plain Python functions, resolved and
checked before any model loads, exactly as reward functions are (:mod:`hydratune.components.rewards`).

A tool is named by a dotted path (``my_tools.add``) or a ``_target_`` node with ``_partial_: true`` (its
other keys bound as keywords, hidden from the model). Its module is found where a reward's is (the working
directory, next to the experiment file, beside the command line's ``data.path``); unless
``trust_targets=true`` it must be a plain function of the user's own module (not of an installed package or
the standard library) binding plain data. The model sees the schema transformers builds from its type hints
and docstring (``transformers.utils.get_json_schema``, as TRL renders it); ``mode=plan`` prints it.

At run time each tool is wrapped (:class:`Tool`): a call that raises, returns a non-string, runs past
``recipe.tool_timeout`` seconds or names arguments the tool does not take is answered with an error message
for the model (``error: ...``) and counted (:class:`ToolStats`), never a traceback that stops the run.

At inference (``recipe=generate``, ``hydratune chat --tools``) :class:`ToolLoop` runs the loop TRL's GRPO runs
in training, with the same tools, parser and token layout: generate, parse the tool calls (TRL's
``parse_response``), append the results as ``tool`` messages, generate again, until no call or the limit.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, POSITIVE, knob

KEY = "recipe.tools"
#: the kinds of faults a tool call can have, as counted and logged (``tools/errors_<kind>``)
FAULTS = ("raised", "not_a_string", "timeout", "bad_arguments")
FIX = (
    "a def in your own module (the working directory, beside data.path or the experiment file) with type "
    "hints on every argument and a docstring with an Args: section, e.g. def add(a: int, b: int) -> str"
)
#: chat templates that render tool calls and tool results, are prefix-preserving and that TRL can parse
TOOL_TEMPLATES = ("qwen2_5", "qwen3", "llama3_1")


class ToolStats:
    """Counts of tool calls and of their faults, thread-safe; :meth:`drain` hands out (and resets) the counts
    since the last call, as metrics."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.totals: Counter[str] = Counter()

    def add(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] += 1
            self.totals[kind] += 1

    def drain(self) -> dict[str, float]:
        """``tools/calls`` and ``tools/errors_<kind>`` since the last drain."""
        with self.lock:
            counts, self.counts = self.counts, Counter()
        return {
            f"tools/{'calls' if k == 'calls' else 'errors_' + k}": float(counts[k])
            for k in ("calls", *FAULTS)
        }


class Tool:
    """A checked tool, wrapped so that every fault becomes an error message for the model (and a count)."""

    def __init__(self, function: Callable[..., Any], timeout: float | None, stats: ToolStats) -> None:
        self.function, self.timeout, self.stats = function, timeout, stats
        self.name = tool_name(function)

    def __call__(self, **arguments: Any) -> str:
        self.stats.add("calls")
        try:
            inspect.signature(self.function).bind(**arguments)
        except TypeError as err:
            return self.fault("bad_arguments", f"{self.name} takes {self.parameters()}, not {err}")
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["value"] = self.function(**arguments)
            except BaseException as err:  # any fault of the user's code is the model's to read
                outcome["error"] = err

        worker = threading.Thread(target=call, name=f"tool-{self.name}", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():  # left to finish on its own (a thread cannot be stopped); the episode goes on
            return self.fault("timeout", f"{self.name} took longer than {self.timeout:g} s")
        if "error" in outcome:
            err = outcome["error"]
            return self.fault("raised", f"{self.name} raised {type(err).__name__}: {err}")
        value = outcome.get("value")
        if not isinstance(value, str):
            return self.fault("not_a_string", f"{self.name} returned a {type(value).__name__}, not a string")
        return value

    def fault(self, kind: str, message: str) -> str:
        self.stats.add(kind)
        return f"error: {message}"

    def parameters(self) -> str:
        return "(" + ", ".join(inspect.signature(self.function).parameters) + ")"

    def as_function(self) -> Callable[..., str]:
        """A function TRL and transformers read as the tool: the user's name, docstring and type hints (the
        schema), calling this wrapper."""

        def tool(**arguments: Any) -> str:
            return self(**arguments)

        inner = self.function.func if isinstance(self.function, functools.partial) else self.function
        functools.update_wrapper(tool, inner)
        bound = self.function.keywords if isinstance(self.function, functools.partial) else {}
        tool.__annotations__ = {k: v for k, v in inner.__annotations__.items() if k not in bound}
        signature = inspect.signature(self.function)
        tool.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[p for n, p in signature.parameters.items() if n not in bound]
        )
        return tool


def tool_name(function: Any) -> str:
    inner = function.func if isinstance(function, functools.partial) else function
    return str(getattr(inner, "__name__", inner))


def resolve_tool(spec: Any, key: str, *, trusted: bool) -> Callable[..., Any]:
    """The function ``spec`` names (a dotted path, a ``_target_`` node, an instantiated partial), imported
    from the user's module dirs, checked for trust (unless ``trusted``) and for a schema (before load)."""
    function = named(spec, key, inspect.isfunction, f"a dotted path: {FIX}", "a function")
    if not trusted:
        check_trusted_tool(function, key)
    schema(function, key)
    return function


def named(spec: Any, key: str, accepts: Callable[[Any], bool], fix: str, noun: str) -> Any:
    """What a config value names, for a tool or an environment: a dotted path imported, a ``_target_`` node
    as a partial of its target (its other keys bound), an instantiated partial or ``accepts``-ed object as
    is; anything else a ConfigError."""
    if isinstance(spec, dict) and spec.get("_target_"):
        kwargs = {k: v for k, v in spec.items() if not k.startswith("_")}
        return functools.partial(imported(str(spec["_target_"]), f"{key}._target_"), **kwargs)
    if isinstance(spec, str) and spec:
        return imported(spec, key)
    if isinstance(spec, functools.partial) or accepts(spec):
        return spec
    raise ConfigError(f"{key} is {spec!r}, not {noun}", key=key, hint=fix)


def imported(dotted: str, key: str) -> Callable[..., Any]:
    """``import_reward``'s resolution (module dirs, close matches of a misspelt module or function), with a
    tool's fix in the hint."""
    from hydratune.components.rewards import import_reward

    try:
        return import_reward(dotted, key)
    except ConfigError as err:
        message = str(err).split("\n")[0].split("] ", 1)[-1]
        near = message.partition("; did you mean ")[2].rstrip("?").split(", ")[0]
        module = dotted.rpartition(".")[0]
        fix = f"{key}={module}.{near}" if near and "has no function" in message else FIX
        raise ConfigError(message, key=key, hint=fix) from None


def check_trusted_tool(function: Any, key: str) -> None:
    """Without ``trust_targets=true``: a plain function of the user's own module (or hydratune's), binding
    plain data only (a shared config cannot turn ``os.system`` into a tool): the rewards' rule."""
    from hydratune.components.rewards import check_trusted

    hint = "a plain def in your own module; if you trust the config: trust_targets=true"
    check_trusted(function, key, what="tool", hint=hint)


def schema(function: Any, key: str = KEY) -> dict[str, Any]:
    """The JSON schema the model is shown (``get_json_schema`` of the wrapped tool); a function it cannot
    describe (no docstring, an argument without a type hint or a description) is a ConfigError."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(Tool(function, None, ToolStats()).as_function())
    except Exception as err:  # DocstringParsingException, TypeHintParsingException: the user's def
        raise ConfigError(
            f"cannot describe tool {tool_name(function)} to the model: {err}", key=key, hint=FIX
        ) from None


def resolve_tools(specs: Sequence[Any], *, trusted: bool, key: str = KEY) -> list[Callable[..., Any]]:
    """Every ``recipe.tools[i]`` (``key[i]``), resolved and checked; two tools of one name are refused (the
    model calls them by name)."""
    functions = [resolve_tool(spec, f"{key}[{i}]", trusted=trusted) for i, spec in enumerate(specs)]
    names = [tool_name(f) for f in functions]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(
                f"two tools are named {name} ({key}[{names.index(name)}] and [{i}]): the model calls them "
                "by name",
                key=f"{key}[{i}]",
                hint="rename one of the functions",
            )
    return functions


def wrap(functions: Sequence[Callable[..., Any]], timeout: float | None, stats: ToolStats) -> list[Any]:
    """The functions TRL's GRPOTrainer takes as ``tools=``: each one wrapped (:class:`Tool`)."""
    return [Tool(f, timeout, stats).as_function() for f in functions]


def describe(functions: Sequence[Callable[..., Any]]) -> list[str]:
    """``mode=plan``'s lines: each tool's name, parameters and description, as its schema shows them."""
    import json

    lines = []
    for function in functions:
        spec = schema(function)["function"]
        lines.append(f"#   {spec['name']}: {json.dumps(spec.get('parameters', {}), sort_keys=True)}")
        lines.append(f"#     {spec.get('description', '')}")
    return lines


def check_template(tokenizer: Any) -> None:
    """Before load: the chat template renders a tool call and a tool result (TRL's
    ``supports_tool_calling``), TRL can parse the model's tool calls (a known template or the tokenizer's own
    response template), and it is prefix-preserving or TRL has a training template for it."""
    from trl.chat_template_utils import (
        add_response_schema,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    from hydratune.components.text.chat_template import template_label

    label = template_label(getattr(tokenizer, "chat_template", None))
    others = ", ".join(TOOL_TEMPLATES[1:])
    hint = f"model.chat_template={TOOL_TEMPLATES[0]} (or {others}): they render tool calls and results"
    if not supports_tool_calling(tokenizer):
        why = "does not render a tool call and a tool result (user -> assistant with tool_calls -> tool)"
        raise ConfigError(f"the chat template ({label}) {why}", key="model.chat_template", hint=hint)
    if (
        getattr(tokenizer, "response_template", None) is None
        and getattr(tokenizer, "response_schema", None) is None
    ):
        import copy

        try:
            add_response_schema(copy.copy(tokenizer))
        except ValueError:
            raise ConfigError(
                f"TRL cannot parse tool calls out of the chat template's ({label}) output: it knows no "
                "response template for it",
                key="model.chat_template",
                hint=hint,
            ) from None
    if not is_chat_template_prefix_preserving(tokenizer):
        from trl.chat_template_utils import get_training_chat_template

        try:
            get_training_chat_template(tokenizer)
        except ValueError:
            raise ConfigError(
                f"the chat template ({label}) is not prefix-preserving (a turn renders differently once "
                "another follows), which TRL's tool loop needs",
                key="model.chat_template",
                hint=hint,
            ) from None


def marked_episode(tokenizer: Any, ids: Sequence[int], trained: Sequence[int]) -> str:
    """An episode's completion decoded, the spans that carry no loss (tool results, the template's turn
    headers between them) in ``[[...]]``: what is trained is what is outside the brackets."""
    text, run, state = [], [], None
    for token, mask in zip(ids, trained, strict=True):
        if bool(mask) != state and run:
            piece = tokenizer.decode(run)
            text.append(piece if state else f"[[{piece}]]")
            run = []
        state = bool(mask)
        run.append(int(token))
    if run:
        piece = tokenizer.decode(run)
        text.append(piece if state else f"[[{piece}]]")
    return "".join(text)


class Episodes:
    """The summary's ``tools`` section, kept up to date as TRL's tool loop returns (:meth:`observe`):
    episodes, tool calls per episode (mean, max), episodes cut by ``recipe.max_tool_calls`` or by length (a
    call left unanswered), the tool faults, and the first episode that called a tool, decoded with its
    untrained spans in ``[[...]]``. ``gather`` (several ranks: every rank calls :meth:`observe` at once)
    collects every rank's list, so the counts are of the whole run, not of the rank that writes them."""

    def __init__(
        self,
        tokenizer: Any,
        limit: int | None,
        stats: ToolStats,
        gather: Callable[[list[Any]], list[Any]] | None = None,
    ) -> None:
        self.tokenizer, self.limit, self.stats = tokenizer, limit, stats
        self.gather = gather or (lambda items: items)
        self.calls: list[int] = []
        self.section: dict[str, Any] = {}
        self.cut = Counter[str]()

    def observe(self, tool_mask: Sequence[Sequence[int]], completions: Any, completion_ids: Any) -> None:
        """One generation batch: ``_tool_call_loop``'s tool mask, messages and token ids per episode."""
        local: list[tuple[int, str]] = []
        for i, messages in enumerate(completions):
            assistant = [m for m in messages if m.get("role") == "assistant"]
            calls = sum(len(m.get("tool_calls") or []) for m in assistant)
            answered = sum(1 for m in messages if m.get("role") == "tool")
            cut = ""
            if assistant and assistant[-1].get("tool_calls"):  # the last call got no answer
                rounds = sum(1 for m in assistant if m.get("tool_calls")) - 1
                cut = "limit" if self.limit is not None and rounds >= self.limit else "length"
            local.append((calls, cut))
            if answered and "sample episode (untrained in [[...]])" not in self.section:
                sample = marked_episode(self.tokenizer, list(completion_ids[i]), list(tool_mask[i]))
                self.section["sample episode (untrained in [[...]])"] = sample.replace(
                    "\n", "\\n"
                )  # a table cell
        for calls, cut in self.gather(local):
            self.calls.append(calls)
            self.cut.update([cut] if cut else [])
        totals: Counter[str] = Counter()
        for counts in self.gather([dict(self.stats.totals)]):
            totals.update(counts)
        calls = self.calls
        self.section.update(
            {
                "episodes": len(self.calls),
                "tool calls per episode (mean, max)": f"{sum(calls) / len(calls):.2f}, {max(calls)}",
                "cut by recipe.max_tool_calls": self.cut["limit"],
                "cut by length (a call left unanswered)": self.cut["length"],
                "tool errors": ", ".join(f"{k} {totals[k]}" for k in FAULTS),
            }
        )


def check_prompt_fits(
    data: Any, prompt: Any, tokenizer: Any, schemas: Sequence[Any], context: int | None = None
) -> None:
    """The template renders the tools' schemas into every prompt, which the data's prompt lengths do not
    count: ``prompt`` (the first row's) with them must fit ``data.max_prompt_length`` and leave room for a
    reply in the model's ``context`` (``max_position_embeddings``: TRL's loop and recipe=generate's end an
    episode there), before load."""
    ids = tokenizer.apply_chat_template(
        prompt, tools=list(schemas), add_generation_prompt=True, tokenize=True
    )
    length = len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    limit, key, _ = data.prompt_limit()
    first = (
        f"the first prompt of {data.path} with the tools' schemas the chat template adds is {length} tokens"
    )
    if length > limit:
        raise ConfigError(
            f"{first}, over {key}={limit}",
            key=key,
            hint=f"{key}={length + 64} or more (the schemas are in every prompt), or fewer tools",
        )
    if context is not None and length >= context:
        raise ConfigError(
            f"{first}, and the model's context (max_position_embeddings) is {context}: no room for a reply",
            key=KEY,
            hint="fewer tools or shorter docstrings, a model with a longer context (a random-init model: "
            f"+model.architecture.max_position_embeddings={1 << (2 * length - 1).bit_length()})",
        )


def model_context(comps: Any) -> int | None:
    """The model's context in tokens (its config's ``max_position_embeddings``, read before load), or None
    where the config does not say."""
    config = comps.model.load_config()
    config = getattr(config, "text_config", None) or config  # a vision-language model: its language model
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None


def plan_lines(
    functions: Sequence[Callable[..., Any]], limit: int | None, timeout: float, count: int
) -> list[str]:
    """``mode=plan``'s tools section: the head (count, rounds, timeout) and each tool's schema."""
    rounds = "no limit" if limit is None else limit
    return [f"# tools ({count}; rounds per episode: {rounds}; timeout {timeout:g} s):", *describe(functions)]


@dataclass(frozen=True)
class ToolUse:
    """The tool knobs of a recipe whose model may call tools (``recipe=generate``; GRPO has its own, with
    environments): ``recipe.tools``, ``recipe.max_tool_calls``, ``recipe.tool_timeout``."""

    # functions the model may call while it generates (dotted paths or _target_ nodes, _partial_: true)
    tools: list[Any] = field(default_factory=list)
    max_tool_calls: int | None = knob(None, AT_LEAST_ONE)  # tool-calling rounds per episode; null: no limit
    tool_timeout: float = knob(10.0, POSITIVE)  # seconds a tool call may take before the model reads an error

    def tool_functions(self, *, trusted: bool = True) -> list[Any]:
        """Every ``recipe.tools[i]``, resolved and checked (before load)."""
        return resolve_tools(self.tools or [], trusted=trusted)


#: a call TRL's own loop answers (a tool that does not exist, arguments that are not an object): counted
UNKNOWN = "unknown"
