"""What a run does with its data before the model loads, shared by the recipes (``Session.load_data``) and
``mode=plan``: read and convert the rows, apply the length policy, tokenize the eval prompts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.generation.evaluation import EvalPrompt, eval_pairs, eval_prompts


@dataclass
class PreparedData:
    """The train/eval splits, the summary's notes on them, and the eval prompts for generation."""

    splits: Any
    notes: dict[str, Any]
    prompts: list[EvalPrompt] = field(default_factory=list)
    default_template: str | None = None  # the name of the template given to a tokenizer that had none


def prepare_data(
    data_component: Any, tokenizer: Any, eval_generations: int, eval_every: int = 0
) -> PreparedData:
    """Load the splits (format, mapping, row errors), apply the component's length policy and tokenize the
    first ``eval_generations`` eval prompts under the same limit. ``tokenizer=None`` (not available offline,
    in ``mode=plan``) checks the rows only. A tokenizer without a chat template gets the documented default
    when the rows are conversations (before anything renders them). ``eval_every`` > 0 (the trainer
    evaluates every so many steps) needs eval rows."""
    from components.text.chat_template import default_template, is_conversational

    stream = None
    if getattr(data_component, "streaming", False):  # train: the stream's first rows, checked as loaded ones
        from components.runtime.streaming import load_stream

        stream, data = load_stream(data_component)
    else:
        data = data_component.load()
    defaulted = None
    if tokenizer is not None and not tokenizer.chat_template and is_conversational(data["train"][0]):
        tokenizer.chat_template, defaulted = default_template(tokenizer)
    if tokenizer is not None and is_conversational(data["train"][0]):
        data = fit_template(data_component, data, tokenizer)
    if tokenizer is not None:
        data = data_component.enforce_length(data, tokenizer)
    check_eval_split(data_component, len(data["eval"]), eval_every)
    notes: dict[str, Any] = {"train rows": len(data["train"]), "eval rows": len(data["eval"])}
    notes.update(data.stats)
    notes.update(data.info)  # the format, where the eval rows came from
    prepared = PreparedData(data, notes, default_template=defaulted)
    pairs = eval_pairs(data_component, data)[:eval_generations] if tokenizer is not None else []
    if pairs:
        limit, key, policy = data_component.prompt_limit()
        prepared.prompts, counts = eval_prompts(
            pairs, tokenizer, max_length=limit, on_overlong=policy, key=key
        )
        notes.update(counts)
    if stream is not None:
        from components.runtime.streaming import as_streamed

        as_streamed(prepared, stream, data_component, tokenizer)
    return prepared


def fit_template(data_component: Any, data: Any, tokenizer: Any) -> Any:
    """The conversations as the chat template can render them, checked on every row before anything renders
    them: a leading system turn folded into the first user turn when the template has no system role
    (``data.fold_system``; false refuses such rows by name), and tool calls or tool schemas the template
    would silently drop refused (a ConfigError naming the template and the first such row)."""
    from components.config.errors import ConfigError
    from components.data import LoadedData
    from components.text.chat_template import (
        check_tools_rendered,
        fold_system,
        is_conversational,
        rejects_system,
        row_tools,
        template_label,
    )

    label = template_label(tokenizer.chat_template)
    splits = dict(data.items())
    if rejects_system(tokenizer):
        folded = 0
        for name, split in splits.items():
            first = split[0] if len(split) else {}
            whole = split[:]  # one read of the whole split
            columns = {c: whole[c] for c in first if is_conversational({c: first[c]})}
            rows = [i for i in range(len(split)) if any(_leading_system(v[i]) for v in columns.values())]
            if rows and not getattr(data_component, "fold_system", True):
                raise ConfigError(
                    f"the chat template ({label}) has no system role, and {len(rows)} {name} rows start "
                    f"with a system turn (the first: {name} row {rows[0]})",
                    key="data.fold_system",
                    hint="data.fold_system=true folds the system prompt into the first user turn; or drop "
                    "the system turns (and data.system_prompt), or set model.chat_template to one with a "
                    "system role",
                )
            if rows:
                folded += len(rows)
                whole |= {c: [fold_system(m) for m in values] for c, values in columns.items()}
                splits[name] = type(split).from_dict(whole, features=split.features)
        if folded:
            data.report.info["system turns"] = (
                f"{folded} folded into the first user turn (the chat template has no system role; "
                "data.fold_system=false refuses them instead)"
            )
    for name, split in splits.items():  # whether the template renders them is the template's property
        if "messages" not in split.column_names:
            continue
        whole = split[:]
        tools = whole.get("tools", [None] * len(split))
        rows = list(zip(whole["messages"], tools, strict=True))
        calls = next(
            ((i, m, t) for i, (m, t) in enumerate(rows) if any(x.get("tool_calls") for x in m)), None
        )
        schemas = next(((i, m, t) for i, (m, t) in enumerate(rows) if t), None)
        for i, messages, row_schemas in {id(x): x for x in (calls, schemas) if x}.values():
            try:
                check_tools_rendered(tokenizer, messages, row_tools(row_schemas), label)
            except ConfigError as err:
                raise ConfigError(f"{name} row {i}: {err.args[0]}", key=err.key, hint=err.hint) from None
    return LoadedData(splits, data.report)


def _leading_system(messages: Any) -> bool:
    return bool(messages) and messages[0].get("role") == "system"


def check_eval_split(data_component: Any, eval_rows: int, eval_every: int) -> None:
    """An empty eval split with periodic evaluation on: the trainer would fail at its first eval step."""
    from components.config.errors import ConfigError

    if eval_rows or eval_every <= 0:
        return
    from components.data import DEFAULT_EVAL_FRACTION

    fraction = getattr(data_component, "eval_fraction", 0)
    fraction = DEFAULT_EVAL_FRACTION if fraction is None else fraction  # unset: the default share
    if fraction:
        raise ConfigError(
            f"the eval split is empty: data.eval_fraction={fraction:g} of {data_component.path} rounds to "
            f"no row, and train.eval_every={eval_every}",
            key="data.eval_fraction",
            hint="data.eval_size=N rows, or data.eval_path=<eval file>, or train.eval_every=0 (no eval)",
        )
    raise ConfigError(
        f"train.eval_every={eval_every} evaluates during training, but there is no eval split "
        "(data.eval_fraction=0 and no data.eval_path)",
        key="train.eval_every",
        hint="train.eval_every=0, or hold out rows: data.eval_fraction=0.05 or data.eval_path=<eval file>",
    )


def eval_every(comps: Any, train: Any) -> int:
    """``train.eval_every`` where the recipe evaluates periodically (its trainer does), else 0."""
    return train.eval_every if comps.recipe.periodic_eval else 0


def plan_data(comps: Any, eval_generations: int, every: int = 0) -> list[str]:
    """``mode=plan``'s data check: what training does before the model loads (rows, format, mapping, length
    policy, eval prompts, the recipe's own data check), as lines to print. Token-level checks need the
    tokenizer: without it (a hub id not cached and not reachable) they are skipped, and the lines say so."""
    from components.config.errors import ConfigError

    try:
        comps.model.check_sources()
    except ConfigError as err:
        tokenizer, skipped = None, f"token lengths not checked: {err.args[0]}"
    else:
        tokenizer, skipped = comps.model.build_tokenizer(convert=False), ""
    prepared = prepare_data(comps.data, tokenizer, eval_generations, every)
    if tokenizer is not None:
        comps.recipe.check_data(comps, prepared.splits, tokenizer)
    lines = [f"# data: {key}: {value}" for key, value in prepared.notes.items()]
    return [*lines, f"# data: {skipped}"] if skipped else lines
