"""``data.max_prompt_length`` on prompt data (PPO, GRPO, generate, best_of_n, eval), before any model loads.

Every prompt is measured as generation sees it: the chat template with its generation prompt. The prompts
over the limit are counted per split (the summary and ``mode=plan``: ``prompts over data.max_prompt_length``,
with the longest), then ``data.on_overlong`` applies: ``truncate`` leaves them to generation, which keeps
their last tokens (PPO's rollouts, generate; GRPO cannot cut a prompt, TRL renders it whole, and refuses
them: ``OVERLONG``), ``drop`` removes and counts them, ``error`` names the first.
"""

from __future__ import annotations

from typing import Any

from hydratune.components.config.errors import ConfigError

#: the info line that counts the prompts over the limit (a recipe that cannot cut them reads it)
OVERLONG = "prompts over data.max_prompt_length"
BATCH = 256


def prompt_lengths(prompts: list[Any], tokenizer: Any) -> list[int]:
    """Tokens of each prompt (messages: chat-templated with the generation prompt; text: as is)."""
    out = []
    for start in range(0, len(prompts), BATCH):
        batch = prompts[start : start + BATCH]
        texts = [
            p
            if isinstance(p, str)
            else tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
            for p in batch
        ]
        out += [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return out


def enforce_prompt_length(data: Any, loaded: Any, tokenizer: Any) -> dict[str, Any]:
    """The splits of ``loaded`` with ``data.on_overlong`` applied to prompts over ``data.max_prompt_length``;
    the counts in ``loaded.report`` (info: how many and the longest; stats: the rows dropped)."""
    limit, out, counts = data.max_prompt_length, {}, []
    for name, table in loaded.items():
        lengths = prompt_lengths(list(table["prompt"]), tokenizer) if len(table) else []
        long = [i for i, n in enumerate(lengths) if n > limit]
        if long and data.on_overlong == "error":
            raise ConfigError(
                f"{data.path} ({name}): row {long[0]}'s prompt has {lengths[long[0]]} tokens > "
                f"data.max_prompt_length={limit} ({len(long)} such rows)",
                key="data.max_prompt_length",
                hint="raise data.max_prompt_length, or set data.on_overlong=drop (or truncate: PPO and "
                "generation keep a prompt's end)",
            )
        if long:
            counts.append(f"{len(long)} of {len(table)} {name} (longest {max(lengths)} tokens)")
        if long and data.on_overlong == "drop":
            stats = loaded.report.stats
            stats["dropped (prompt over data.max_prompt_length)"] = stats.get(
                "dropped (prompt over data.max_prompt_length)", 0
            ) + len(long)
            keep = sorted(set(range(len(table))) - set(long))
            if name == "train" and not keep:
                raise ConfigError(
                    f"every train prompt of {data.path} is over data.max_prompt_length={limit} tokens (the "
                    f"longest: {max(lengths)}), and data.on_overlong=drop would drop them all",
                    key="data.max_prompt_length",
                    hint=f"raise it, e.g. data.max_prompt_length={1 << max(lengths).bit_length()}",
                )
            table = table.select(keep, keep_in_memory=True)
        out[name] = table
    if counts:
        what = {"drop": "dropped", "truncate": f"cut to their last {limit} tokens when generated"}
        loaded.report.info[OVERLONG] = f"{'; '.join(counts)}: {what.get(data.on_overlong, '')}"
    return out
