"""The tool loop at inference (``recipe=generate``, ``recipe=eval`` over episodes, ``hydratune chat``): the
loop TRL's GRPO runs in training, over the tools of components/tools.py and the environments of
components/environment.py."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydratune.components.environment import environment_class, fresh_factory, tool_methods
from hydratune.components.tools import FAULTS, UNKNOWN, Tool, ToolStats, check_template, schema, tool_name


@dataclass
class Episode:
    """One conversation of the tool loop at inference: the messages (the prompt's, then the model's turns,
    tool calls included, and the tools' results as ``tool`` messages), the tokens the model generated, the
    tool calls made and their faults by kind, and why it ended: ``stop`` (an answer without a call),
    ``length`` (a turn cut at the token limit, or the context full), ``tool_limit`` (a call left
    unanswered at ``max_tool_calls`` rounds)."""

    messages: list[dict[str, Any]]
    tokens: int = 0
    calls: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    finish_reason: str = ""
    #: the tokens after the prompt: the model's turns and the tool results between them (TRL's completion ids)
    completion_ids: list[int] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The model's last turn's text (its answer)."""
        return str(self.messages[-1].get("content") or "") if self.messages else ""


class ToolLoop:
    """The tool loop at inference, as TRL's GRPO tool loop runs it in training (``_tool_call_loop``): the
    prompt rendered with the tools' schemas (and TRL's training template where the chat template is not
    prefix-preserving); each turn parsed by TRL's ``parse_response``; the calls run as :class:`Tool` s
    (faults answered with ``error: ...`` and counted); the results appended as ``tool`` messages, their
    tokens made by TRL's own ``_get_tool_suffix_ids`` and concatenated to the context (no re-rendering: the
    model sees what it saw in training); then the next turn, until no call, ``limit`` rounds, the token
    limit or the context. ``environment`` (``recipe.environment``'s factory): each episode gets a fresh one
    (:meth:`environment_for`), whose public methods are that episode's tools beside ``functions``."""

    def __init__(
        self,
        tokenizer: Any,
        functions: Sequence[Callable[..., Any]],
        *,
        limit: int | None,
        timeout: float,
        environment: Callable[[], Any] | None = None,
    ) -> None:
        import copy

        from trl.chat_template_utils import (
            add_response_schema,
            get_training_chat_template,
            is_chat_template_prefix_preserving,
        )

        check_template(tokenizer)
        self.stats = ToolStats()
        self.tools = {tool_name(f): Tool(f, timeout, self.stats) for f in functions}
        methods = [] if environment is None else tool_methods(environment_class(environment))
        self.methods = {name for name, _ in methods}
        self.environment = None if environment is None else fresh_factory(environment, timeout, self.stats)
        bound = [functools.partial(m, None) for _, m in methods]  # the schemas TRL renders for them
        self.schemas = [schema(f) for f in [*functions, *bound]]
        self.limit = limit
        if (
            getattr(tokenizer, "response_template", None) is None
            and getattr(tokenizer, "response_schema", None) is None
        ):
            tokenizer = add_response_schema(copy.copy(tokenizer))
        self.tokenizer = tokenizer
        prefix_preserving = is_chat_template_prefix_preserving(tokenizer)
        self.chat_template = None if prefix_preserving else get_training_chat_template(tokenizer)

    @property
    def template(self) -> dict[str, Any]:
        """``apply_chat_template``'s keywords for a prompt: the tools' schemas, TRL's template if any."""
        return {"tools": self.schemas or None, "chat_template": self.chat_template}

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, **self.template
        )
        return list(ids["input_ids"])

    def environment_for(self, row: dict[str, Any]) -> tuple[Any, Any]:
        """A fresh environment for one episode, reset with the row's columns (as TRL resets it), and what
        ``reset`` returned (text TRL appends to the prompt's last turn, or None)."""
        if self.environment is None:
            raise ValueError("this tool loop has no environment")
        environment = self.environment()
        return environment, environment.reset(**row)

    def call(
        self, tool_call: dict[str, Any], errors: Counter[str], environment: Any = None
    ) -> dict[str, Any]:
        """A ``tool`` message answering one parsed call (a tool's, or a method of the episode's
        ``environment``); what TRL's loop answers itself (no such tool, arguments that are not an object) is
        answered as TRL does, counted ``unknown``."""
        before = Counter({k: self.stats.totals[k] for k in FAULTS})
        name = (tool_call.get("function") or {}).get("name") or tool_call.get("name", "unknown")
        try:
            if tool_call.get("type") != "function":
                raise ValueError(f"Unsupported tool call type: {tool_call.get('type')}")
            if name in self.tools:
                tool: Callable[..., Any] = self.tools[name]
            elif environment is not None and name in self.methods:
                tool = getattr(environment, name)  # a Tool around the episode's own instance (fresh_factory)
            else:
                raise ValueError(f"Tool {name} not found.")
            result: Any = tool(**tool_call["function"]["arguments"])
        except Exception as err:  # TRL's answer: {'error': ...}
            self.stats.add(UNKNOWN)
            errors[UNKNOWN] += 1
            result = {"error": str(err)}
        errors.update(
            {k: self.stats.totals[k] - before[k] for k in FAULTS if self.stats.totals[k] > before[k]}
        )
        return {"role": "tool", "name": name, "content": str(result)}

    def suffix_ids(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """The tokens between the model's turn and its next one (the tool results and the turn headers),
        by TRL's own ``GRPOTrainer._get_tool_suffix_ids`` (it reads only these attributes)."""
        from types import SimpleNamespace

        from trl import GRPOTrainer

        trainer = SimpleNamespace(
            processing_class=self.tokenizer,
            _tokenizer=self.tokenizer,
            chat_template=self.chat_template,
            chat_template_kwargs={},
            _is_vlm=False,
        )
        return list(GRPOTrainer._get_tool_suffix_ids(trainer, tool_messages))

    def run(
        self,
        conversations: Sequence[list[dict[str, Any]]],
        prompt_ids: Sequence[list[int]],
        generate: Callable[[list[list[int]]], list[Any]],
        *,
        context: int | None = None,
        on_message: Callable[[dict[str, Any]], None] | None = None,
        environments: Sequence[Any] | None = None,
    ) -> list[Episode]:
        """The episodes of a batch of prompts (``conversations`` rendered as ``prompt_ids``): ``generate``
        completes a list of token lists (one completion each, with its ``ids``, ``tokens`` and
        ``finish_reason``); only the episodes that called a tool go on to the next turn. ``context``: the
        model's length (an episode ends when its tokens reach it); ``on_message`` sees each new message;
        ``environments``: each episode's own (:meth:`environment_for`), whose methods it may call."""
        from trl.chat_template_utils import parse_response

        own = list(environments) if environments is not None else [None] * len(conversations)
        episodes = [Episode([dict(m) for m in c]) for c in conversations]
        ids = [list(p) for p in prompt_ids]
        rounds = [0] * len(ids)
        active = list(range(len(ids)))
        while active:
            done = generate([ids[i] for i in active])
            going = []
            for i, completion in zip(active, done, strict=True):
                episode, new = episodes[i], list(completion.ids)
                message = parse_response(self.tokenizer, new, prefix=ids[i], tools=self.schemas)
                episode.messages.append(message)
                episode.tokens += completion.tokens
                episode.completion_ids += new
                ids[i] += new
                if on_message:
                    on_message(message)
                calls = message.get("tool_calls")
                if completion.finish_reason == "length" or not calls:
                    episode.finish_reason = completion.finish_reason
                    continue
                if self.limit is not None and rounds[i] >= self.limit:
                    episode.finish_reason = "tool_limit"
                    continue
                results = [self.call(call, episode.errors, own[i]) for call in calls]
                rounds[i] += 1
                episode.calls += len(calls)
                episode.messages += results
                for result in results:
                    if on_message:
                        on_message(result)
                suffix = self.suffix_ids(results)
                episode.completion_ids += suffix
                ids[i] += suffix
                if context is not None and len(ids[i]) >= context:
                    episode.finish_reason = "length"
                    continue
                going.append(i)
            active = going
        return episodes
