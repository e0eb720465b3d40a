"""What a run does with its data before the model loads, shared by the recipes (``Session.load_data``) and
``mode=plan``: read and convert the rows, apply the length policy, tokenize the eval prompts."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydratune.components.data.duplicates import NO_EVAL
from hydratune.components.data.textcorpus import TEXT_SUFFIX, TEXT_UNITS
from hydratune.components.generation.evaluation import EvalPrompt, eval_pairs, eval_prompts
from hydratune.components.text.chat_template import fold_system

#: the summary's words on image rows handed to the trainer as rows (``check_image_tokens``); what the
#: recipes branch on is ``LoadedData.has_images``, never this line
IMAGE_TOKENS_NOTE = (
    "image rows, tokenized by the model's processor batch by batch (TRL's vision collator): each image "
    "expanded to its image tokens, the loss on the assistant's answer only (the chat template's generation "
    "markers; image tokens never trained); data.max_length does not cut them (an image's tokens or the "
    "answer would be cut) and no padding-free batches (TRL refuses them for images)"
)
#: the summary's data cache line for data.streaming
STREAM_NOT_CACHED = "not used (data.streaming: the rows are read as training goes; data.cache has no effect)"


@dataclass
class PreparedData:
    """The train/eval splits, the summary's notes on them, and the eval prompts for generation; with a
    recipe that has its tokens prepared (SFT), those tokens by split and the facts about them."""

    splits: Any
    notes: dict[str, Any]
    prompts: list[EvalPrompt] = field(default_factory=list)
    default_template: str | None = None  # the name of the template given to a tokenizer that had none
    tokens: dict[str, Any] | None = None
    token_facts: dict[str, Any] = field(default_factory=dict)


def prepare_data(
    data_component: Any,
    tokenizer: Any,
    eval_generations: int,
    eval_every: int = 0,
    tokens: Any = None,
) -> PreparedData:
    """Load the splits (format, mapping, row errors), fit the chat template, apply the component's length
    policy and, for a recipe that has them made here (``tokens``: SFT), tokenize every row; all of it
    through the prepared-data cache (components/runtime/prepared_cache.py: made once, memory-mapped after).
    Then tokenize the first ``eval_generations`` eval prompts under the same limit. ``tokenizer=None`` (not
    available offline, in ``mode=plan``) checks the rows only. A tokenizer without a chat template gets the
    documented default when the rows are conversations (before anything renders them). ``eval_every`` > 0
    (the trainer evaluates every so many steps) needs eval rows. A stream (``data.streaming``) is not
    cached: its first rows and its eval rows go through all of this, the others as training reads them
    (``components/data/stream_prepare.py``)."""
    from dataclasses import asdict

    from hydratune.components.data import prepared_cache
    from hydratune.components.data.pair_lengths import check_pairs, pair_notes
    from hydratune.components.data.rows import LoadedData, LoadReport
    from hydratune.components.distributed.workers import data_processes
    from hydratune.components.text.chat_template import default_template

    tokens = tokens if tokenizer is not None else None
    streaming = getattr(data_component, "streaming", False)
    parts = None
    if getattr(data_component, "cache", True) and not streaming:  # a stream is read as it trains: not cached
        parts = prepared_cache.key_parts(
            data_component, tokenizer, tokens.key() if tokens is not None else None
        )
    stream = None

    def load(workers: Any) -> Any:
        nonlocal stream
        if not streaming:
            return data_component.load(workers)
        from hydratune.components.data.stream_prepare import load_stream

        stream, loaded = load_stream(data_component, workers)  # train: its first rows, checked as loaded ones
        return loaded

    def build(workers: Any) -> prepared_cache.Prepared:
        data, defaulted = _load(data_component, load, tokenizer, workers, tokens)
        made = {"rows/train": data["train"], "rows/eval": data["eval"]}
        facts: dict[str, Any] = {"report": asdict(data.report), "default template": defaulted}
        # image rows: no tokens here, the processor tokenizes them batch by batch (TRL's vision collator;
        # a token maker that takes no images was refused by _load)
        if tokens is not None and not data.has_images:
            # a stream: its first rows and eval rows as unpacked tokens (the feed packs the stream)
            token_maker = tokens.unpacked() if streaming else tokens
            token_splits, facts["tokens"] = token_maker.prepare(data, tokenizer, workers)
            made |= {f"tokens/{name}": split for name, split in token_splits.items()}
        return prepared_cache.Prepared(made, facts)

    outcome = prepared_cache.prepare(data_component, parts, build, data_processes(data_component.num_proc))
    made, facts = outcome.prepared.datasets, outcome.prepared.facts
    data = LoadedData({"train": made["rows/train"], "eval": made["rows/eval"]}, LoadReport(**facts["report"]))
    defaulted = facts.get("default template")
    if defaulted and tokenizer is not None and not tokenizer.chat_template:  # reused: set it as preparing did
        tokenizer.chat_template = default_template(tokenizer)[0]
    check_eval_split(data_component, len(data["eval"]), eval_every, data.info.get(NO_EVAL))
    notes: dict[str, Any] = {"train rows": len(data["train"]), "eval rows": len(data["eval"])}
    notes.update(data.stats)
    notes.update(data.info)  # the format, where the eval rows came from
    token_facts = facts.get("tokens") or {}
    split_tokens = {name[len("tokens/") :]: d for name, d in made.items() if name.startswith("tokens/")}
    if "pairs" in token_facts:  # preference rows: the trainer tokenizes; the limit's effect counted
        notes.update(pair_notes(token_facts))
        check_pairs(token_facts, {name: len(rows) for name, rows in data.items()})
    elif token_facts:
        notes.update(length_notes(data_component, token_facts, getattr(tokenizer, "model_max_length", None)))
        check_tokens(data_component, token_facts, {name: len(rows) for name, rows in data.items()})
        check_trained_tokens(split_tokens["train"], tokenizer, token_facts)
    notes["data cache"] = STREAM_NOT_CACHED if streaming else outcome.note()
    prepared = PreparedData(data, notes, [], defaulted, split_tokens or None, token_facts)
    pairs = eval_pairs(data_component, data, eval_generations) if tokenizer is not None else []
    if pairs:
        limit, key, policy = data_component.prompt_limit()
        prepared.prompts, counts = eval_prompts(
            pairs, tokenizer, max_length=limit, on_overlong=policy, key=key, images=eval_images(data, pairs)
        )
        notes.update(counts)
    if stream is not None:
        from hydratune.components.data.stream_prepare import as_streamed

        as_streamed(prepared, stream, data_component, tokenizer, tokens)
    return prepared


def eval_images(data: Any, pairs: list[Any], split: str = "eval") -> list[list[Any]] | None:
    """The images of the ``split`` rows the ``pairs`` were made of (the first rows, in order; PIL images),
    or None when those rows have none."""
    from hydratune.components.data.images import IMAGES_COLUMN, rows_have_images

    if not pairs or not rows_have_images(data[split]):
        return None
    return list(data[split].select(range(len(pairs)))[IMAGES_COLUMN])


def plan_image_tokens(model: Any, tokenizer: Any, splits: Any, limit: int = 64) -> dict[str, str]:
    """``mode=plan``'s line on a vision-language model's image rows: the image tokens the processor makes
    of the first ``limit`` train rows with images, beside what the memory estimate counts (a processor that
    cannot load offline: the line says so)."""
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.data.images import measured_image_tokens

    if not getattr(model, "is_vision", False) or not splits.has_images:
        return {}
    key = "image tokens per row (measured)"
    try:
        processor = model.build_processor(tokenizer)
    except ConfigError as err:
        return {key: f"not measured: {err.args[0]}"}
    counts = measured_image_tokens(processor, splits["train"], limit)
    if not counts:
        return {}
    line = f"max {max(counts):,}, mean {sum(counts) / len(counts):,.1f} on the first {len(counts)} train rows"
    assumed = model.estimated_image_tokens()
    if assumed is not None:
        line += f" with images; the memory estimate counts {assumed:,} (model.image_tokens_per_row)"
        if max(counts) > assumed:
            line += f": more than it counts, set model.image_tokens_per_row={max(counts)}"
    return {key: line}


def check_image_recipe(recipe: Any, splits: Any) -> None:
    """Rows with images for a recipe whose trainer takes none (``Recipe.image_rows``: SFT, DPO and GRPO
    do),
    refused once the rows are read (``splits.has_images``), before the model loads, naming the recipe."""
    from hydratune.components.config.errors import ConfigError

    if getattr(recipe, "image_rows", False) or not splits.has_images:
        return
    raise ConfigError(
        f"recipe={recipe.name} does not train on image rows (its trainer is not given the model's "
        "processor); SFT, DPO and GRPO do (and recipe=generate answers them)",
        key="recipe",
        hint="recipe=sft, recipe=dpo or recipe=grpo, or data.images=false for text-only rows",
    )


def check_image_tokens(data: Any, tokens: Any) -> bool:
    """Whether the rows reach the trainer untokenized: image rows for a token maker that declares
    ``accepts_images`` (SFT on a vision-language model: TRL's vision collator runs the model's processor
    batch by batch, so nothing is tokenized here). Image rows for a token maker without it (a text model)
    are refused, before load, and so is packing them (TRL 1.16 packs no image rows: the processor makes
    each row's tokens at batch time, so there are no lengths to pack by). Text rows: False (tokenized
    here, on a vision-language model too)."""
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.data.images import CAPABILITY

    if not data.has_images:
        return False  # text rows, for a vision-language model too: tokenized as text
    if not getattr(tokens, CAPABILITY, False):
        raise ConfigError(
            "the rows have images, and this recipe tokenizes its rows before training (text only): image "
            "rows are tokenized by the model's processor as batches are made",
            key="data.images",
            hint="train a vision-language model (its recipe path hands image rows to TRL's vision "
            "collator), or data.images=false for text-only rows",
        )
    if getattr(tokens, "packing", False):
        raise ConfigError(
            "data.packing does not pack image rows: the model's processor tokenizes them batch by batch "
            "(each image expanded to its image tokens), so their lengths are not known before training, and "
            "TRL 1.16's SFTTrainer refuses packing for vision datasets",
            key="data.packing",
            hint="data.packing=false (image rows are padded per batch)",
        )
    return True


def length_notes(
    data_component: Any, token_facts: dict[str, Any], context: int | None = None
) -> dict[str, str]:
    """One line per split of what the length policy did to the tokens (``SFTTokens.prepare``'s counts):
    rows cut at data.max_length and the tokens cut, rows dropped with nothing left to train, the share of
    the tokens to train that is kept; and a longest row past the model's context (``context``: the
    tokenizer's ``model_max_length``)."""
    from hydratune.components.text.sft_tokens import COUNTS

    plan = token_facts["plan"]
    notes = {}
    for name, found in (token_facts.get("counts") or {}).items():
        c = dict.fromkeys(COUNTS, 0) | found
        where = f"length ({name}, data.max_length={plan['max_length']})"
        rows = f"{c['rows']:,} row{'' if c['rows'] == 1 else 's'}, the longest {c['longest']:,} tokens"
        if context and min(plan["max_length"], c["longest"]) > context:  # rows kept past the context
            rows += f" (past the tokenizer's model_max_length={context:,}, the model's context)"
        if plan["packing"]:
            notes[where] = f"{rows} (packed: no row is cut here)"
            continue
        kept = c["trained"] / c["trainable"] if c["trainable"] else 0.0
        dropped = c["cut_out"] + c["empty"]
        notes[where] = (
            f"{rows}; {c['truncated']:,} truncated ({c['tokens_cut']:,} tokens cut); {dropped:,} dropped "
            f"with nothing left to train ({c['cut_out']:,} cut off, {c['empty']:,} with no turn to train); "
            f"{kept:.0%} of the tokens to train kept"
        )
    return notes


def _suggested_length(longest: int) -> int:
    """A data.max_length that holds a row of ``longest`` tokens (rounded up to a multiple of 256)."""
    return -(-longest // 256) * 256


def check_tokens(data_component: Any, token_facts: dict[str, Any], rows: dict[str, int]) -> None:
    """Before the model loads (``mode=plan`` too): a split that had rows and kept none after the length
    policy (TRL would stop on an empty dataset after the load), or a train split keeping less than
    data.min_trained_fraction of its tokens to train, is refused naming the fix."""
    from hydratune.components.config.errors import ConfigError

    plan = token_facts["plan"]
    limit = plan["max_length"]
    floor = getattr(data_component, "min_trained_fraction", 0.0)
    for name, c in (token_facts.get("counts") or {}).items():
        if not rows.get(name) or not c or plan["packing"]:
            continue
        left = c["rows"] - c["cut_out"] - c["empty"]
        if left == 0 and c["cut_out"]:
            raise ConfigError(
                f"no {name} row is left to train within data.max_length={limit}: {c['cut_out']} of "
                f"{c['rows']} rows lose every token to train to the cut, {c['empty']} have none (the longest "
                f"row has {c['longest']:,} tokens; a system prompt or tool schemas alone past the limit "
                "leave "
                "nothing)",
                key="data.max_length",
                hint=f"raise data.max_length (e.g. data.max_length={_suggested_length(c['longest'])}), or "
                "shorten the rows",
            )
        if left == 0:
            raise ConfigError(
                f"no {name} row has a token to train: every assistant turn of its {c['rows']} rows is "
                "flagged "
                "not to train (weight 0 / training false) or empty",
                key="data.path",
                hint="flag the turns to train with weight 1 (training true), or drop the flags",
            )
        kept = c["trained"] / c["trainable"] if c["trainable"] else 1.0
        if name == "train" and kept < floor:
            raise ConfigError(
                f"only {kept:.0%} of the {name} tokens to train are kept within data.max_length={limit} "
                f"({c['truncated']:,} of {c['rows']:,} rows truncated, {c['tokens_cut']:,} tokens cut; "
                f"the longest row has {c['longest']:,} tokens), below data.min_trained_fraction={floor:g}",
                key="data.max_length",
                hint=f"raise data.max_length (e.g. data.max_length={_suggested_length(c['longest'])}), or "
                "data.min_trained_fraction=0 to train on what is left",
            )


def check_trained_tokens(tokens: Any, tokenizer: Any, token_facts: dict[str, Any]) -> None:
    """The loss-mask checks (``check_label_mask``: nothing, everything or never the stop token trained) on
    the prepared train tokens, before the model loads, as training repeats them on its trainer's data."""
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.text.masking import check_label_mask, label_mask_stats, stop_token_ids

    plan = token_facts["plan"]
    stats = label_mask_stats(tokens, stop_token_ids(tokenizer))
    try:
        check_label_mask(stats, masked=plan["mask"] != "none" or plan["completion"])
    except ConfigError as err:
        cut = (token_facts.get("counts") or {}).get("train", {})
        if err.key != "model.chat_template" or not cut.get("truncated"):
            raise
        raise ConfigError(  # the stop token is past the cut: the length, not the template, is the cause
            f"only {stats['rows_with_eos_trained']:.0%} of train rows train the end-of-sequence token: "
            f"{cut['truncated']:,} of {cut['rows']:,} rows are cut at data.max_length={plan['max_length']} "
            f"before their end (the longest has {cut['longest']:,} tokens), so the model would not learn to "
            "stop",
            key="data.max_length",
            hint=f"raise data.max_length (e.g. data.max_length={_suggested_length(cut['longest'])}), or "
            "data.on_overlong=drop to leave the long rows out (counted)",
        ) from None


def _load(
    data_component: Any, load: Any, tokenizer: Any, workers: Any, tokens: Any = None
) -> tuple[Any, str | None]:
    """The rows as training reads them: loaded (``load(workers)``), the chat template given (the default
    for a tokenizer without one) and fitted, the length policy applied. Returns them and the default
    template's name. Image rows for a recipe that tokenizes here (``tokens``) are refused first
    (``check_image_tokens``), or left untokenized and uncut (SFT on a vision-language model)."""
    from hydratune.components.text.chat_template import default_template, is_conversational

    data = load(workers)
    untokenized = tokens is not None and check_image_tokens(data, tokens)
    if untokenized:
        data.report.info["tokens"] = IMAGE_TOKENS_NOTE  # the summary's words only
    defaulted = None
    conversational = is_conversational(data["train"][0])
    if tokenizer is not None and not tokenizer.chat_template and conversational:
        tokenizer.chat_template, defaulted = default_template(tokenizer)
    if tokenizer is not None and conversational:
        data = fit_template(data_component, data, tokenizer, workers)
    if tokenizer is not None and not untokenized:
        data = data_component.enforce_length(data, tokenizer, workers)
    return data, defaulted


def fit_template(data_component: Any, data: Any, tokenizer: Any, workers: Any) -> Any:
    """The conversations as the chat template can render them, checked on every row before anything renders
    them: a leading system turn folded into the first user turn when the template has no system role
    (``data.fold_system``; false refuses such rows by name), and tool calls or tool schemas the template
    would silently drop refused (a ConfigError naming the template and the first such row). The rows are
    read only when the conversion counted such rows (``LoadReport.flags``)."""
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.data.rows import LoadedData
    from hydratune.components.data.tables import MESSAGE_COLUMNS
    from hydratune.components.text.chat_template import (
        check_tools_rendered,
        rejects_system,
        row_tools,
        template_label,
    )

    label = template_label(tokenizer.chat_template)
    splits = dict(data.items())
    flags = data.report.flags
    if flags.get("system") and rejects_system(tokenizer):
        folded = 0
        for name, split in splits.items():
            columns = [c for c in split.column_names if c in MESSAGE_COLUMNS]
            rows = rows_where(split, columns, functools.partial(_any_leading_system, columns=columns))
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
                fold = functools.partial(_fold, columns)
                splits[name] = workers.map_rows(
                    split, fold, split.features, f"folding system turns of {name} rows", f"folded-{name}"
                )
        if folded:
            data.report.info["system turns"] = (
                f"{folded} folded into the first user turn (the chat template has no system role; "
                "data.fold_system=false refuses them instead)"
            )
    if flags.get("reasoning"):
        check_reasoning_rendered(splits, tokenizer, label, flags["reasoning"])
    for name, split in splits.items():  # whether the template renders them is the template's property
        if "messages" not in split.column_names or not (flags.get("tool_calls") or flags.get("tools")):
            continue
        columns = ["messages", *(["tools"] if "tools" in split.column_names else [])]
        calls = rows_where(split, columns, lambda row: any(m.get("tool_calls") for m in row["messages"]), 1)
        schemas = rows_where(split, columns, lambda row: bool(row.get("tools")), 1)
        for i in dict.fromkeys([*calls, *schemas]):
            row = split[i]
            try:
                check_tools_rendered(tokenizer, row["messages"], row_tools(row.get("tools")), label)
            except ConfigError as err:
                raise ConfigError(f"{name} row {i}: {err.args[0]}", key=err.key, hint=err.hint) from None
    return LoadedData(splits, data.report)


def check_reasoning_rendered(splits: dict[str, Any], tokenizer: Any, label: str, count: int) -> None:
    """Rows whose assistant turns carry reasoning (``reasoning_content``): the chat template must render it
    (the first such row, rendered with and without it, must differ), or the model would be trained on the
    answers without their reasoning. ConfigError naming the template and the fix otherwise."""
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.text.chat_template import choose_method, row_tools

    template = choose_method(tokenizer)[1]  # TRL's training template where it patches this one (e.g. qwen3)
    for name, split in splits.items():
        columns = ["messages", *(["tools"] if "tools" in split.column_names else [])]
        found = rows_where(
            split, columns, lambda row: any(m.get("reasoning_content") for m in row["messages"]), 1
        )
        if not found:
            continue
        row = split[found[0]]
        tools = row_tools(row.get("tools"))
        bare = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in row["messages"]]
        rendered = tokenizer.apply_chat_template(
            row["messages"], tools=tools, tokenize=False, chat_template=template
        )
        if rendered == tokenizer.apply_chat_template(
            bare, tools=tools, tokenize=False, chat_template=template
        ):
            raise ConfigError(
                f"{name} row {found[0]}: the chat template ({label}) does not render the assistant turns' "
                f"reasoning (reasoning_content; {count:,} rows have it): the model would be trained on the "
                "answers without it",
                key="model.chat_template",
                hint="set model.chat_template to a template that renders reasoning_content (e.g. qwen3), or "
                "data.keep_reasoning=false to train without the reasoning (the rows are counted)",
            )
        return


def rows_where(split: Any, columns: list[str], test: Any, limit: int | None = None) -> list[int]:
    """The indices of ``split``'s rows that pass ``test`` (reading ``columns`` a batch at a time; at most
    ``limit``)."""
    from hydratune.components.distributed.workers import SHARD_ROWS

    found: list[int] = []
    part = split.select_columns(columns)
    for a in range(0, len(part), SHARD_ROWS):
        batch = part[a : a + SHARD_ROWS]
        for i, values in enumerate(zip(*(batch[c] for c in columns), strict=True)):
            if test(dict(zip(columns, values, strict=True))):
                found.append(a + i)
                if limit is not None and len(found) >= limit:
                    return found
    return found


def _leading_system(messages: Any) -> bool:
    return bool(messages) and messages[0].get("role") == "system"


def _fold(columns: list[str], batch: dict[str, list[Any]], first: int) -> dict[str, list[Any]]:
    """A batch with the leading system turn of each message list folded (``fold_system``)."""
    return batch | {c: [fold_system(m) for m in batch[c]] for c in columns}


def _any_leading_system(row: dict[str, Any], columns: list[str]) -> bool:
    return any(_leading_system(row[c]) for c in columns)


def _names_text(path: str) -> bool:
    """Whether ``path`` is a ``.txt`` file or a folder of them (``.txt.gz``... too)."""
    from hydratune.components.data.file_bytes import data_suffix

    p = Path(path).expanduser()
    files = [p] if not p.is_dir() else [f for f in p.rglob("*") if f.is_file()]
    return any(data_suffix(f) == TEXT_SUFFIX for f in files)


def check_eval_split(
    data_component: Any, eval_rows: int, eval_every: int, duplicates: str | None = None
) -> None:
    """An empty eval split with periodic evaluation on: the trainer would fail at its first eval step.
    ``duplicates``: why data.dedup held out nothing (components/data/duplicates.py), when it did not."""
    from hydratune.components.config.errors import ConfigError

    if eval_rows or eval_every <= 0:
        return
    if duplicates:
        raise ConfigError(
            f"the eval split is empty, and train.eval_every={eval_every}: eval rows held out: {duplicates}",
            key="data.dedup",
            hint="data.dedup=count, or data.eval_path=<eval file>, or train.eval_every=0 (no eval)",
        )
    from hydratune.components.data.rows import DEFAULT_EVAL_FRACTION

    fraction = getattr(data_component, "eval_fraction", 0)
    fraction = DEFAULT_EVAL_FRACTION if fraction is None else fraction  # unset: the default share
    if fraction:
        unit = getattr(data_component, "text_unit", None)
        text = unit and unit != "line" and _names_text(str(data_component.path))
        raise ConfigError(
            f"the eval split is empty: data.eval_fraction={fraction:g} of {data_component.path} rounds to "
            f"no row, and train.eval_every={eval_every}"
            + (f" (data.text_unit={unit}: {TEXT_UNITS[unit]})" if text else ""),
            key="data.eval_fraction",
            hint=("data.text_unit=line for a .txt of one document per line, or " if text else "")
            + "data.eval_size=N rows, or data.eval_path=<eval file>, or train.eval_every=0 (no eval)",
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
    from hydratune.components.config.errors import ConfigError

    try:
        comps.model.check_sources()
    except ConfigError as err:
        tokenizer, skipped = None, f"token lengths not checked: {err.args[0]}"
    else:
        tokenizer, skipped = comps.model.build_tokenizer(convert=False), ""
    prepared = prepare_data(comps.data, tokenizer, eval_generations, every, comps.recipe.tokens(comps))
    check_image_recipe(comps.recipe, prepared.splits)
    if tokenizer is not None:
        prepared.notes.update(plan_image_tokens(comps.model, tokenizer, prepared.splits))
    if tokenizer is not None:
        comps.recipe.check_data(comps, prepared.splits, tokenizer)
    lines = [f"# data: {key}: {value}" for key, value in prepared.notes.items()]
    return [*lines, f"# data: {skipped}"] if skipped else lines
