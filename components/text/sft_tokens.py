"""SFT rows as the tokens the trainer reads (``input_ids`` + ``labels``), made by hydratune a batch at a
time, exactly as TRL 1.16's ``SFTTrainer._prepare_dataset`` makes them one row at a time (its tokenizing,
its label building from ``assistant_masks`` / ``completion_mask``, its truncation to ``max_length`` and its
dropping of rows left with no trained token; packing is TRL's own ``pack_dataset`` on the result). The
trainer is then handed the tokens with ``skip_prepare_dataset``; ``tests/unit/test_sft_tokens.py`` compares
them row by row with what TRL makes of the same rows.

Which mask (:func:`plan_tokens`): TRL's (the template's ``{% generation %}`` markers, or TRL's patched
training template), hydratune's turn-by-turn mask for any other template, the completion of prompt /
completion rows, or none (every token trained).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.text.chat_template import (
    HYDRATUNE,
    KEY,
    TRL_MARKERS,
    TRL_PATCHED,
    WAY_OUT,
    mask_conversations,
    row_tools,
)

log = logging.getLogger("hydratune")

IGNORE = -100


@dataclass(frozen=True)
class TokenPlan:
    """How SFT rows become tokens, decided before the model loads.

    ``mask``: ``trl`` (TRL's assistant masks: the template's generation markers or ``template``, TRL's
    patched training template), ``hydratune`` (the turn-by-turn mask) or ``none``; ``completion``: only the
    completion of prompt/completion rows is trained (their ``completion_turns`` last turns)."""

    mask: str
    template: str | None
    label: str
    completion: bool
    max_length: int
    packing: bool
    packing_strategy: str

    @property
    def method(self) -> str | None:
        """The summary's name for the assistant mask (None: no assistant mask)."""
        if self.mask == "trl":
            return TRL_PATCHED if self.template else TRL_MARKERS
        return HYDRATUNE if self.mask == "hydratune" else None

    def key(self) -> dict[str, Any]:
        """What the tokens depend on besides the rows and the tokenizer (for the data cache's key)."""
        return {**asdict(self), "version": TOKENS_VERSION}


#: bumped when the tokens made from the same rows would differ (the code's bytes are in the key too)
TOKENS_VERSION = 1


def plan_tokens(
    columns: list[str],
    tokenizer: Any,
    *,
    assistant_only: bool,
    completion_only: bool,
    label: str,
    max_length: int,
    packing: bool = False,
    packing_strategy: str = "bfd",
) -> TokenPlan:
    """The ``TokenPlan`` for rows with ``columns``: the recipe's ``assistant_only_loss`` applies to chat
    ``messages`` (masked by TRL where its template allows, else by hydratune's turn-by-turn mask), and
    ``completion_only_loss`` to prompt/completion rows (``completion_turns``)."""
    from hydratune.components.text.chat_template import choose_method

    assistant = assistant_only and "messages" in columns
    completion = completion_only and "completion_turns" in columns
    mask, template = "none", None
    if assistant:
        method, template = choose_method(tokenizer)
        mask = "hydratune" if method == HYDRATUNE else "trl"
    return TokenPlan(mask, template, label, completion, max_length, packing, packing_strategy)


#: what ``tokenize_batch`` counts per split (``counts``): rows, rows cut at max_length and the tokens cut,
#: rows dropped with nothing to train (none before the cut: ``empty``; all cut off: ``cut_out``), and the
#: tokens to train before the cut and those kept
COUNTS = ("rows", "truncated", "tokens_cut", "empty", "cut_out", "trainable", "trained", "longest")


def tokenize_batch(
    plan: TokenPlan,
    tokenizer: Any,
    rows: dict[str, list[Any]],
    *,
    where: str,
    first: int,
    counts: dict[str, int] | None = None,
) -> dict[str, list[Any]]:
    """``input_ids`` and ``labels`` (-100: not trained) of a batch of rows (columns -> values), truncated to
    ``max_length`` and without the rows left with no trained token, unless packing (which keeps every row
    whole for ``pack_dataset``). Assistant turns flagged not to train (``"train": False``) have their labels
    masked. ``first``: the index of the batch's first row in its split, named with ``where`` (the split) in
    errors. ``counts`` (``COUNTS``) is added to."""
    if "messages" not in rows:
        ids, masks = _text(tokenizer, rows["text"]), None
    elif plan.mask == "hydratune":
        ids, masks = _hydratune(plan, tokenizer, rows, where, first)
    elif plan.completion:
        ids, masks = _prompt_completion(plan, tokenizer, rows, where, first)
    else:
        ids, masks = _conversations(plan, tokenizer, rows, where, first)
    out: dict[str, list[Any]] = {"input_ids": [], "labels": []}
    tally = dict.fromkeys(COUNTS, 0)
    for i, row_ids in enumerate(ids):
        labels = (
            list(row_ids)
            if masks is None
            else [t if m else IGNORE for t, m in zip(row_ids, masks[i], strict=False)]
        )
        if "messages" in rows and any(m.get("train") is False for m in rows["messages"][i]):
            labels = _untrain_turns(plan, tokenizer, rows, i, row_ids, labels, f"{where} row {first + i}")
        trainable = sum(t != IGNORE for t in labels)
        tally["rows"] += 1
        tally["trainable"] += trainable
        tally["longest"] = max(tally["longest"], len(row_ids))
        if not plan.packing:  # TRL truncates after building labels, then drops rows with nothing to train
            if len(row_ids) > plan.max_length:
                tally["truncated"] += 1
                tally["tokens_cut"] += len(row_ids) - plan.max_length
            row_ids, labels = row_ids[: plan.max_length], labels[: plan.max_length]
            if all(t == IGNORE for t in labels):
                tally["empty" if not trainable else "cut_out"] += 1
                continue
        tally["trained"] += sum(t != IGNORE for t in labels)
        out["input_ids"].append(list(row_ids))
        out["labels"].append(labels)
    if counts is not None:
        for name, n in tally.items():
            counts[name] = max(counts.get(name, 0), n) if name == "longest" else counts.get(name, 0) + n
    return out


def _untrain_turns(
    plan: TokenPlan,
    tokenizer: Any,
    rows: dict[str, list[Any]],
    i: int,
    row_ids: list[int],
    labels: list[int],
    where: str,
) -> list[int]:
    """``labels`` with the tokens of row ``i``'s assistant turns flagged ``"train": False`` masked: each
    turn's characters are what its rendering adds after the generation prompt (the template must render
    the turns before it unchanged), mapped to tokens by the fast tokenizer's offsets."""
    from hydratune.components.text.chat_template import token_mask

    messages = rows["messages"][i]
    tools = (rows.get("tools") or [None] * len(rows["messages"]))[i]

    def render(turns: list[Any], generation: bool) -> str:
        return tokenizer.apply_chat_template(
            turns,
            tools=json.loads(tools) if tools else None,
            chat_template=plan.template,
            tokenize=False,
            add_generation_prompt=generation,
        )

    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"{where}: assistant turns flagged not to train are located with a fast tokenizer's offsets; "
            f"{type(tokenizer).__name__} is not one",
            key="model.tokenizer",
            hint="use a fast tokenizer (tokenizer.json), or drop the per-turn training flags (weight / "
            "training)",
        )
    full = render(messages, False)
    spans = []
    for k, message in enumerate(messages):
        if message.get("role") != "assistant" or message.get("train") is not False:
            continue
        head, through = render(messages[:k], True), render(messages[: k + 1], False)
        if not (through.startswith(head) and full.startswith(through)):
            raise ConfigError(
                f"{where}: assistant turn {k} is flagged not to train, but the chat template ({plan.label}) "
                "renders the turns before it differently once more follow, so its tokens cannot be found",
                key=KEY,
                hint=f"{WAY_OUT}; or drop the per-turn training flags (weight / training) from the data",
            )
        spans.append((len(head), len(through)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != list(row_ids):
        raise ConfigError(
            f"{where}: the tokens of the rendered conversation differ from the trained ones, so the turns "
            "flagged not to train cannot be located",
            key=KEY,
            hint=f"{WAY_OUT}; or drop the per-turn training flags (weight / training) from the data",
        )
    mask = token_mask([tuple(o) for o in enc["offset_mapping"]], spans)
    return [IGNORE if hit else label for label, hit in zip(labels, mask, strict=True)]


def _text(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Language modelling: the text with the EOS appended where it does not end with it, tokenized as TRL
    does (the tokenizer's special tokens added)."""
    eos = tokenizer.eos_token
    texts = [t if t.endswith(eos) else t + eos for t in texts]
    return tokenizer(texts)["input_ids"]


def _groups(rows: dict[str, list[Any]]) -> dict[str, list[int]]:
    """Row indices by their tools (rows with the same tools are rendered in one call)."""
    tools = rows.get("tools") or [None] * len(rows["messages"])
    groups: dict[str, list[int]] = {}
    for i, value in enumerate(tools):
        groups.setdefault(value or "", []).append(i)
    return groups


def _encode(
    plan: TokenPlan,
    tokenizer: Any,
    conversations: list[Any],
    members: list[int],
    tools: str,
    where: str,
    first: int,
    **kwargs: Any,
) -> Any:
    """``apply_chat_template`` (tokenized) of the ``members`` rows of ``conversations``, in one call; when
    the template fails on the batch, each row alone names the one it cannot render."""

    def encode(rows: list[int]) -> Any:
        return tokenizer.apply_chat_template(
            [conversations[i] for i in rows],
            tools=json.loads(tools) if tools else None,
            chat_template=plan.template,
            tokenize=True,
            return_dict=True,
            **kwargs,
        )

    try:
        return encode(members)
    except Exception:  # jinja's TemplateError, raise_exception(), TypeError on odd content, ...
        for i in members:
            try:
                encode([i])
            except Exception as err:
                raise ConfigError(
                    f"{where} row {first + i}: the chat template ({plan.label}) cannot render this "
                    f"conversation: {err}",
                    key=KEY,
                    hint="fix the data (e.g. roles must alternate, a system turn the template rejects) or "
                    + WAY_OUT,
                ) from None
        raise


def _conversations(
    plan: TokenPlan, tokenizer: Any, rows: dict[str, list[Any]], where: str, first: int
) -> tuple[list[list[int]], list[list[int]] | None]:
    """Whole conversations, tokenized as ``apply_chat_template`` does (TRL's assistant masks with
    ``mask=trl``)."""
    n, trl = len(rows["messages"]), plan.mask == "trl"
    ids: list[Any] = [None] * n
    masks: list[Any] | None = [None] * n if trl else None
    for tools, members in _groups(rows).items():
        enc = _encode(
            plan, tokenizer, rows["messages"], members, tools, where, first, return_assistant_tokens_mask=trl
        )
        for k, i in enumerate(members):
            ids[i] = enc["input_ids"][k]
            if masks is not None:
                masks[i] = enc["assistant_masks"][k]
                _check_trained(masks[i], plan, where, first + i)
    return ids, masks


def _prompt_completion(
    plan: TokenPlan, tokenizer: Any, rows: dict[str, list[Any]], where: str, first: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Prompt / completion rows as TRL tokenizes them: the prompt with the generation prompt, the whole
    conversation (with TRL's assistant masks under ``mask=trl``), the completion starting where the two
    token lists diverge."""
    from trl.data_utils import common_prefix_length

    n, trl = len(rows["messages"]), plan.mask == "trl"
    prompts = [m[: len(m) - c] for m, c in zip(rows["messages"], rows["completion_turns"], strict=True)]
    ids: list[Any] = [None] * n
    masks: list[Any] = [None] * n
    for tools, members in _groups(rows).items():
        head = _encode(plan, tokenizer, prompts, members, tools, where, first, add_generation_prompt=True)
        whole = _encode(
            plan, tokenizer, rows["messages"], members, tools, where, first, return_assistant_tokens_mask=trl
        )
        for k, i in enumerate(members):
            prompt_ids, row_ids = head["input_ids"][k], whole["input_ids"][k]
            cut = common_prefix_length(prompt_ids, row_ids)
            if cut < len(prompt_ids):
                _warn_prompt_not_prefix(tokenizer, prompt_ids[cut:])
            mask = [0] * cut + [1] * (len(row_ids) - cut)
            if trl:
                assistant = whole["assistant_masks"][k]
                _check_trained(assistant, plan, where, first + i)
                mask = [a and b for a, b in zip(mask, assistant, strict=False)]
            ids[i], masks[i] = row_ids, mask
    return ids, masks


_WARNED: list[bool] = []


def _warn_prompt_not_prefix(tokenizer: Any, tail: list[int]) -> None:
    if not _WARNED:
        _WARNED.append(True)
        log.warning(
            "the tokenized prompt is not a prefix of the tokenized prompt+completion (the chat template "
            "renders the prompt alone differently, or tokens merge across the boundary); the completion "
            "starts where they diverge, and this end of the prompt is not in the training sequence: %r",
            tokenizer.decode(tail),
        )


def _hydratune(
    plan: TokenPlan, tokenizer: Any, rows: dict[str, list[Any]], where: str, first: int
) -> tuple[list[list[int]], list[list[int]]]:
    """hydratune's turn-by-turn mask (``completion``: only the assistant turns among the last
    ``completion_turns``)."""
    conversations = rows["messages"]
    tools = [row_tools(t) for t in rows.get("tools") or [None] * len(conversations)]
    firsts = None
    if plan.completion:
        firsts = [len(c) - n for c, n in zip(conversations, rows["completion_turns"], strict=True)]
    masked = mask_conversations(
        tokenizer, conversations, label=plan.label, tools=tools, firsts=firsts, where=where, first=first
    )
    unaligned = sum(not m.aligned for m in masked)
    if unaligned:
        log.warning(
            "%d of %d conversations have an assistant turn whose first or last token also holds template "
            "text (a token spans the boundary); that token is trained",
            unaligned,
            len(masked),
        )
    return [m.input_ids for m in masked], [m.assistant_masks for m in masked]


def _check_trained(mask: list[int], plan: TokenPlan, where: str, row: int) -> None:
    """A row whose assistant mask is empty would train nothing (TRL raises on it, after the model loaded)."""
    if 1 not in mask:
        raise ConfigError(
            f"{where} row {row}: the chat template ({plan.label}) marks no assistant text in this "
            "conversation (its {% generation %} blocks hold nothing), so it would train nothing",
            key=KEY,
            hint=WAY_OUT,
        )


def pack(dataset: Any, plan: TokenPlan, num_proc: int | None = None) -> Any:
    """TRL's own packing of tokenized rows (``trl.data_utils.pack_dataset``), as SFTTrainer packs them."""
    from trl.data_utils import pack_dataset

    rows = dataset.select_columns(["input_ids", "labels"])
    if len(rows) == 0:  # pack_dataset fails on an empty split (no eval rows: data.eval_fraction=0)
        return rows.add_column("seq_lengths", [])
    return pack_dataset(
        rows,
        plan.max_length,
        plan.packing_strategy,
        {"num_proc": num_proc},
    )
