"""``recipe=eval`` over episodes: every prompt of ``data.path`` run as an episode of GRPO's tool loop and
scored with GRPO's rewards, so a trained agent is measured as it was trained.

With ``recipe.tools`` or ``recipe.environment`` the recipe runs
:class:`~hydratune.components.tool_loop.ToolLoop` (recipe=generate's loop: TRL's parser, token layout) with a
fresh environment per episode (reset with the row's columns, what ``reset`` returns appended to the prompt's
last turn, as TRL does), and scores each episode with ``recipe.reward_funcs`` (called as TRL calls them:
``prompts``, ``completions`` as the episode's messages, ``completion_ids``, the row's columns,
``environments=``) and the environment's ``get_reward()``. The rewards are summed per episode (weight 1
each, as GRPO with ``recipe.reward_weights=null``). The summary reports the mean reward (and each reward's),
tool calls per episode, the episodes cut by ``recipe.max_tool_calls`` or by length, the tool errors by kind;
``episodes.jsonl`` holds every transcript with its rewards. Every check runs before the model loads: the
tools, the environment, the rewards and their columns, the chat template, the prompts with the schemas within
``data.max_prompt_length`` and the model's context.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, NON_NEGATIVE, knob
from hydratune.components.tools import FAULTS, UNKNOWN, ToolUse

OUTPUT = "episodes.jsonl"
#: the keywords TRL passes to a reward function that are not columns (``trainer_state``: no training here)
NOT_COLUMNS = ("prompt", "completion", "completion_ids")


def default_reward_funcs() -> list[Any]:
    return [{"_target_": "hydratune.components.rewards.exact_match", "_partial_": True}]


@dataclass(frozen=True)
class EpisodeScoring(ToolUse):
    """The knobs of ``recipe=eval`` over episodes (``recipe.tools`` / ``recipe.environment`` turn it on)."""

    # a class with reset(**row) and tool methods (dotted path or _target_ node, _partial_: true): a fresh one
    # per episode; its get_reward(), if any, is a reward
    environment: Any = None
    # GRPO's reward functions (dotted paths or _target_ nodes), each episode scored by all, summed
    reward_funcs: list[Any] = field(default_factory=default_reward_funcs)
    max_new_tokens: int = knob(256, AT_LEAST_ONE)  # tokens per turn of an episode
    temperature: float = knob(0.0, NON_NEGATIVE)  # 0 = greedy
    num_return_sequences: int = knob(1, AT_LEAST_ONE)  # episodes per prompt (sampled: temperature > 0)

    @property
    def scores_episodes(self) -> bool:
        return bool(self.tools) or self.environment not in (None, "")

    def changed(self, names: tuple[str, ...]) -> list[str]:
        """Which of the knobs ``names`` differ from their defaults."""
        fields = {f.name: f for f in dataclasses.fields(self)}

        def default(name: str) -> Any:
            f = fields[name]
            return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default

        return [name for name in names if plain(getattr(self, name)) != plain(default(name))]

    def environment_factory(self, *, trusted: bool = True) -> Any:
        """``recipe.environment``'s factory, resolved and checked (components/environment.py), or None."""
        from hydratune.components.environment import resolve_environment

        if self.environment in (None, ""):
            return None
        return resolve_environment(self.environment, trusted=trusted)

    def environment_reward(self, factory: Any) -> bool:
        from hydratune.components.environment import environment_class

        return factory is not None and callable(getattr(environment_class(factory), "get_reward", None))

    def reward_functions(self, *, trusted: bool = True) -> list[tuple[str, Any]]:
        """``(key, function)`` of every reward function, resolved and checked (GRPO's rule)."""
        from hydratune.components.rewards import check_reward

        keyed = [(f"recipe.reward_funcs[{i}]", spec) for i, spec in enumerate(self.reward_funcs or [])]
        functions = [(key, check_reward(spec, key, trusted=trusted)) for key, spec in keyed]
        return [(key, f) for key, f in functions if f is not None]

    def schemas(self) -> list[dict[str, Any]]:
        """The schemas the model is shown: the tools', then the environment's methods'."""
        import functools

        from hydratune.components.environment import environment_class, tool_methods
        from hydratune.components.tools import schema

        factory = self.environment_factory()
        methods = [] if factory is None else tool_methods(environment_class(factory))
        return [
            schema(f) for f in [*self.tool_functions(), *(functools.partial(m, None) for _, m in methods)]
        ]

    def check_episodes(self, cfg: Any, comps: Any) -> None:
        """Before load: the tools, the environment and the rewards resolved and trusted; a reward at all;
        sampling that can give several episodes per prompt; prompt rows."""
        trusted = bool(cfg.get("trust_targets", False))
        self.tool_functions(trusted=trusted)
        factory = self.environment_factory(trusted=trusted)
        for i, spec in enumerate(self.reward_funcs or []):
            if not spec:
                raise ConfigError(
                    f"reward {i} is {spec!r}",
                    key="recipe.reward_funcs",
                    hint="each entry a function: a dotted path or a _target_ node with _partial_: true",
                )
        self.reward_functions(trusted=trusted)
        if not self.reward_funcs and not self.environment_reward(factory):
            raise ConfigError(
                "no reward to score the episodes with",
                key="recipe.reward_funcs",
                hint="recipe.reward_funcs=[hydratune.components.rewards.exact_match], or an environment "
                "with get_reward()",
            )
        if self.temperature == 0 and self.num_return_sequences > 1:
            raise ConfigError(
                "greedy decoding (temperature=0) plays the same episode every time",
                key="recipe.num_return_sequences",
                hint="set recipe.temperature>0 to sample several episodes per prompt",
            )
        if comps.data.kind not in ("chat", "prompts"):
            raise ConfigError(
                "recipe.tools runs episodes from prompts: prompt rows or chat data",
                key="data",
                hint="data=demo_eval, data=demo_agent, or a file of prompts",
            )

    def check_episode_data(self, comps: Any, splits: Any, tokenizer: Any) -> None:
        """With the rows and the tokenizer (before load, in mode=plan too): a chat template that renders tool
        calls and results, chat prompts without images, ``reset`` takes the first row's columns, the first
        prompt with the schemas fits ``data.max_prompt_length`` and the model's context, and the rows hold
        the columns the reward functions read (``answer`` for exact_match)."""
        from hydratune.components.rewards import check_columns
        from hydratune.components.tools import check_prompt_fits, check_template, model_context

        check_template(tokenizer)
        path = str(comps.data.path)
        if getattr(splits, "has_images", False):
            raise ConfigError(
                "recipe.tools runs text conversations; these rows have images",
                key="recipe.tools",
                hint="data.images=false, or drop recipe.tools",
            )
        pairs = comps.data.pairs(splits, "train", 1) or []
        if not pairs:
            raise ConfigError(f"no prompt to run an episode from in {path}", key="data.path")
        prompt = pairs[0][0]
        if isinstance(prompt, str):
            raise ConfigError(
                f"recipe.tools needs chat prompts (a list of messages), and {path}'s are text",
                key="recipe.tools",
                hint='prompts as messages: {"prompt": [{"role": "user", "content": "..."}], ...}',
            )
        factory = self.environment_factory()
        if factory is not None:
            from hydratune.components.environment import check_reset

            check_reset(factory, dict(splits["train"][0]), path)
        check_prompt_fits(comps.data, prompt, tokenizer, self.schemas(), model_context(comps))
        check_columns(self.reward_functions(), splits["train"].column_names, path)

    def episode_plan_lines(self) -> list[str]:
        """``mode=plan``: what runs instead of lm-eval, the rewards, the tools and their schemas."""
        import functools

        from hydratune.components.environment import environment_class, tool_methods
        from hydratune.components.tools import describe, plan_lines

        factory = self.environment_factory()
        names = [reward_name(f) for _, f in self.reward_functions()]
        names += (
            [f"{environment_class(factory).__name__}.get_reward"] if self.environment_reward(factory) else []
        )
        sampling = "greedy" if self.temperature == 0 else f"temperature {self.temperature:g}"
        lines = [
            "# eval: episodes of the tool loop over data.path's prompts "
            f"({self.num_return_sequences} a prompt, {sampling}, {self.max_new_tokens} tokens a turn), "
            f"scored by {' + '.join(names)} (summed); "
            "no lm-eval task runs",
        ]
        methods = [] if factory is None else tool_methods(environment_class(factory))
        count = len(self.tools) + len(methods)
        lines += plan_lines(self.tool_functions(), self.max_tool_calls, self.tool_timeout, count)
        if factory is not None:
            lines += [
                f"# environment {environment_class(factory).__name__} (a fresh one per episode), its methods:"
            ]
            lines += describe([functools.partial(m, None) for _, m in methods])
        return lines

    def score_episodes(self, ctx: Any, session: Any, limit: float | None, batch_size: int) -> dict[str, Any]:
        """The episodes of the first ``limit`` rows (N, or a fraction < 1; None: all), ``batch_size`` a
        generate() call, scored; ``episodes.jsonl``, the summary and the metrics."""
        from hydratune.components.generation.sampling import Sampling, complete
        from hydratune.components.runtime.inference import load_model, write_jsonl
        from hydratune.components.tool_loop import ToolLoop

        c, tokenizer = ctx.components, session.tokenizer
        loaded = c.data.whole().load()  # every row, in file order
        self.check_episode_data(c, loaded, tokenizer)  # as in mode=plan
        agent = ToolLoop(
            tokenizer,
            self.tool_functions(),
            limit=self.max_tool_calls,
            timeout=self.tool_timeout,
            environment=self.environment_factory(),
        )
        starts, dropped, rows = self.starts(c.data, loaded, agent, limit)  # environments reset before load
        session.report["data"] = {
            "path": c.data.path,
            **dict(loaded.info),
            "rows scored (recipe.limit)": rows,
        }
        session.report_chat_template(None)
        model = load_model(c, ctx.device)
        sampling = Sampling(self.max_new_tokens, self.temperature)  # one completion a turn

        def generate(prompts: list[list[int]]) -> list[Any]:
            return [done for [done] in complete(model, tokenizer, prompts, sampling)]

        context = getattr(model.config, "max_position_embeddings", None)
        began, episodes = time.perf_counter(), []
        for b in range(0, len(starts), batch_size):
            ctx.seed_everything()  # a batch draws the same samples whatever ran before it
            batch = starts[b : b + batch_size]
            episodes += agent.run(
                [s.prompt for s in batch],
                [s.ids for s in batch],
                generate,
                context=context,
                environments=[s.environment for s in batch],
            )
        seconds = time.perf_counter() - began
        rewards = self.rewards(starts, episodes, ctx.device)
        totals = [sum(v[i] for v in rewards.values() if v[i] is not None) for i in range(len(episodes))]
        records = [
            record(s, e, {name: values[i] for name, values in rewards.items()}, totals[i])
            for i, (s, e) in enumerate(zip(starts, episodes, strict=True))
        ]
        write_jsonl(ctx.run_dir.path / OUTPUT, records)
        metrics, section = summarize(episodes, rewards, totals, dropped)
        session.report["episodes"] = section
        session.log_metrics({"step": 0, **logged(metrics)})
        session.write_report(metrics, cost={"episode time (s)": round(seconds, 1)})
        return metrics

    def starts(self, data: Any, loaded: Any, agent: Any, limit: float | None) -> tuple[list[Start], int, str]:
        """Each episode's start: its row, a fresh environment reset with the row (what ``reset`` returns
        appended to the prompt's last turn, as TRL does), the prompt rendered whole with the schemas; the
        episodes dropped, and the rows scored of all. A prompt over the limit is dropped
        (``data.on_overlong=drop``, counted) or refused, before load: TRL renders each prompt whole, and so
        does this."""
        table, pairs = loaded["train"], data.pairs(loaded, "train")
        count = (
            len(pairs) if limit is None else int(limit) if limit >= 1 else max(1, round(limit * len(pairs)))
        )
        most, key, policy = data.prompt_limit()
        starts, dropped = [], 0
        for index in range(min(count, len(pairs))):
            row, turns = dict(table[index]), list(pairs[index][0])
            for sample in range(self.num_return_sequences):
                environment, observation = agent.environment_for(row) if agent.environment else (None, None)
                prompt = with_observation(turns, observation)
                ids = agent.prompt_ids(prompt)
                if len(ids) > most and policy == "drop":
                    dropped += 1
                    continue
                if len(ids) > most:
                    raise ConfigError(
                        f"row {index} of {data.path} with the tools' schemas is {len(ids)} tokens, over "
                        f"{key}={most}; an episode's prompt is rendered whole (as GRPO renders it)",
                        key=key,
                        hint=f"{key}={len(ids) + 64}, or data.on_overlong=drop (counted)",
                    )
                starts.append(Start(index, sample, row, prompt, ids, environment))
        return starts, dropped, f"{min(count, len(pairs))} of {len(pairs)}"

    def rewards(self, starts: list[Start], episodes: list[Any], device: str) -> dict[str, list[float | None]]:
        """Each reward's value per episode: every reward function called as TRL's GRPO calls it, then the
        environment's ``get_reward()`` (named after its class, as TRL names it). None: the reward left the
        episode unscored (TRL's NaN)."""
        from hydratune.components.rewards import resolve_reward

        prompts = [s.prompt for s in starts]
        completions = [e.messages[len(s.prompt) :] for s, e in zip(starts, episodes, strict=True)]
        columns = [k for k in (starts[0].row if starts else {}) if k not in NOT_COLUMNS]
        kwargs: dict[str, Any] = {k: [s.row[k] for s in starts] for k in columns}
        kwargs.update(trainer_state=None, log_extra=ignore, log_metric=ignore)
        environments = [s.environment for s in starts]
        if self.environment not in (None, ""):
            kwargs["environments"] = environments
        out: dict[str, list[float | None]] = {}
        for i, spec in enumerate(self.reward_funcs or []):
            function = resolve_reward(spec, device)
            values = list(
                function(
                    prompts=prompts,
                    completions=completions,
                    completion_ids=[e.completion_ids for e in episodes],
                    **kwargs,
                )
            )
            name = reward_name(function)
            if len(values) != len(episodes):
                raise ValueError(f"reward {name} returned {len(values)} rewards for {len(episodes)} episodes")
            out[name if name not in out else f"{name} ({i})"] = [
                None if v is None else float(v) for v in values
            ]
        if starts and self.environment_reward(self.environment_factory()):
            name = type(environments[0]).__name__
            out[name] = [None if (v := e.get_reward()) is None else float(v) for e in environments]
        return out


@dataclass
class Start:
    """How an episode starts: its row (index, the sample of it), the row's columns, the prompt (with what
    the environment's ``reset`` returned), its tokens and the episode's environment (None: tools only)."""

    index: int
    sample: int
    row: dict[str, Any]
    prompt: list[dict[str, Any]]
    ids: list[int]
    environment: Any = None


def plain(value: Any) -> Any:
    """A knob's value as its config node: an instantiated partial (a reward's ``_target_``) as the node."""
    import functools

    if isinstance(value, functools.partial):
        target = f"{value.func.__module__}.{value.func.__qualname__}"
        return {"_target_": target, "_partial_": True, **value.keywords}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def with_observation(turns: list[dict[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """The prompt's turns with what ``reset`` returned appended to the last one's text (TRL's rule)."""
    if observation is None or not turns:
        return list(turns)
    last = turns[-1]
    return [*turns[:-1], {**last, "content": f"{last.get('content') or ''}{observation}"}]


def ignore(*args: Any, **kwargs: Any) -> None:
    """``log_extra`` / ``log_metric`` for a reward function: nothing is logged per completion here."""


def reward_name(function: Any) -> str:
    inner = getattr(function, "func", function)
    return str(getattr(inner, "__name__", None) or type(inner).__name__)


def record(start: Start, episode: Any, rewards: dict[str, float | None], total: float) -> dict[str, Any]:
    """One line of ``episodes.jsonl``: the row and sample, the transcript, how it ended, its rewards."""
    out = {
        "index": start.index,
        "sample": start.sample,
        "messages": episode.messages,
        "completion": episode.text,
        "tokens": episode.tokens,
        "finish_reason": episode.finish_reason,
        "tool_calls": episode.calls,
        "tool_errors": dict(episode.errors),
        "rewards": rewards,
        "reward": total,
    }
    if "answer" in start.row:
        out["reference"] = start.row["answer"]
    return out


def summarize(
    episodes: list[Any], rewards: dict[str, list[float | None]], totals: list[float], dropped: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metrics (the mean reward and each reward's, tool calls, cuts, errors) and the summary's
    ``episodes`` section (what the numbers are made of)."""
    errors: Counter[str] = Counter()
    for e in episodes:
        errors.update(e.errors)
    calls = [e.calls for e in episodes]
    n = max(len(episodes), 1)
    metrics: dict[str, Any] = {
        "episodes": len(episodes),
        "mean reward": sum(totals) / n,
        **{f"mean reward {name}": mean(values) for name, values in rewards.items()},
        "tool calls per episode (mean)": sum(calls) / n,
        "tool calls per episode (max)": max(calls, default=0),
        "cut by recipe.max_tool_calls": sum(e.finish_reason == "tool_limit" for e in episodes),
        "cut by length": sum(e.finish_reason == "length" for e in episodes),
        "tool errors": sum(errors.values()),
    }
    unscored = {name: sum(v is None for v in values) for name, values in rewards.items()}
    section = {
        "rewards": f"{', '.join(rewards)}: summed per episode (weight 1 each, as GRPO with "
        "recipe.reward_weights=null)",
        "tool errors": ", ".join(f"{k} {errors[k]}" for k in (*FAULTS, UNKNOWN)),
        "episodes left unscored by a reward (None)": ", ".join(f"{k} {v}" for k, v in unscored.items()),
        "episodes dropped (prompt over the limit, data.on_overlong=drop)": dropped,
        "transcripts": OUTPUT,
    }
    return metrics, section


def mean(values: list[float | None]) -> float:
    """The mean of the values a reward gave (None: unscored, left out, as TRL's nanmean); 0 when none."""
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else 0.0


def logged(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics as tracker names: ``episodes/mean_reward``, ``episodes/tool_calls_per_episode_mean``."""
    out = {}
    for key, value in metrics.items():
        name = "".join(ch if ch.isalnum() else "_" for ch in key.replace("(", "").replace(")", "")).strip("_")
        out[f"episodes/{'_'.join(part for part in name.split('_') if part)}"] = value
    return out
