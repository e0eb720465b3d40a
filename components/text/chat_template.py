"""Chat templates: named choices, a default for tokenizers without one, and assistant-only loss masks for
ANY prefix-preserving template.

TRL masks assistant tokens through ``{% generation %}`` markers, and patches only the templates it knows
byte for byte. Everything else is masked here, turn by turn: each assistant turn is trained on exactly the
characters it adds to the rendering (its content and end-of-turn token; not its role header, not the
trailing newline, not the next role's header), mapped to tokens with the fast tokenizer's offsets.
``check_template`` runs the same logic on a few conversations without any model.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError

log = logging.getLogger("hydratune")

Messages = list[dict[str, Any]]

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# For base models without special chat tokens: every turn ends with the tokenizer's EOS, so the model learns
# to stop after its answer.
PLAIN = (
    "{% for message in messages %}{{ (message['role'] | capitalize) + ':\\n' + message['content'] + "
    "eos_token + '\\n\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:\\n' }}{% endif %}"
)
BUILTIN = {"chatml": CHATML, "plain": PLAIN}

HYDRATUNE = "hydratune turn-by-turn mask"
TRL_MARKERS = "TRL (template's {% generation %} markers)"
TRL_PATCHED = "TRL (TRL's training template)"
KEY = "model.chat_template"
WAY_OUT = (
    "set model.chat_template to a prefix-preserving template (a name such as chatml, a .jinja path or the "
    "template text), or recipe.assistant_only_loss=false"
)
TOOLS_WAY_OUT = (
    "set model.chat_template to a template that renders tools and tool calls (e.g. qwen2_5, qwen3, "
    "llama3_1), or drop the tool calls and the tools column from the data"
)
# a special-token-like marker at the end of a turn, e.g. <|eot_id|>, <end_of_turn>, </s>
END_MARKER = re.compile(r"(<\|[^|<>\s]{1,40}\|>|</?[A-Za-z_]{1,30}>|<[a-z_]+\|>|<\|[a-z_]+>)\s*$")
CHECK_BATCH = 512  # conversations tokenized per call when every row is checked


def is_conversational(row: dict[str, Any]) -> bool:
    """A row holding a list of chat messages (``messages``, or a conversational ``prompt`` / ``chosen``)."""
    return any(isinstance(v, list) and v and isinstance(v[0], dict) and "role" in v[0] for v in row.values())


def row_tools(value: Any) -> list[dict[str, Any]] | None:
    """A row's ``tools`` cell (JSON text as the data component stores it, or a list) as
    ``apply_chat_template``'s ``tools``; None when blank."""
    if isinstance(value, str):
        return json.loads(value) if value.strip() else None
    return value or None


# ---- named templates -----------------------------------------------------------------------------
def trl_template_dir() -> Path | None:
    """``trl/chat_templates`` of the installed TRL, found without importing TRL."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(spec.submodule_search_locations[0]) / "chat_templates"
    return folder if folder.is_dir() else None


def trl_template_files() -> dict[str, Path]:
    """TRL's original (non-training) templates by file stem, e.g. ``llama3_2``, ``qwen2_5``."""
    folder = trl_template_dir()
    if folder is None:
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.jinja")) if not p.stem.endswith("_training")}


def template_names() -> list[str]:
    """Every name ``model.chat_template`` accepts."""
    return sorted({*BUILTIN, *trl_template_files()})


def is_template_text(value: str) -> bool:
    return "{{" in value or "{%" in value


def resolve_chat_template(value: str) -> tuple[str, str]:
    """``(template text, label)`` for a name, a ``.jinja`` path or template text; ConfigError otherwise."""
    if is_template_text(value):
        return value, "model.chat_template (template text)"
    if value.endswith(".jinja") or "/" in value:
        path = Path(value).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"chat template file not found: {value}", key=KEY, hint="a .jinja file, a name, or the text"
            )
        return path.read_text(encoding="utf-8"), path.name
    if value in BUILTIN:
        return BUILTIN[value], value
    files = trl_template_files()
    if value in files:
        return files[value].read_text(encoding="utf-8"), value
    raise ConfigError(
        f"unknown chat template name '{value}'",
        key=KEY,
        hint=f"one of {', '.join(template_names())}; or a .jinja path, or the template text",
    )


def template_label(template: str | dict[str, str] | None, model: str = "") -> str:
    """A name for error messages and the summary: the known name the text matches, else its first line."""
    if isinstance(template, dict):  # named variants: the default one is used
        template = template.get("default")
    if not template:
        return "none"
    for name, text in BUILTIN.items():
        if template == text:
            return name
    for name, path in trl_template_files().items():
        if template == path.read_text(encoding="utf-8"):
            return name
    first = next((line.strip() for line in template.splitlines() if line.strip()), "")
    first = first if len(first) <= 60 else first[:57] + "..."
    return f"{model + ' ' if model else ''}template starting {first!r}"


def default_template(tokenizer: Any) -> tuple[str, str]:
    """For a tokenizer without a chat template: ChatML when its tokens are single tokens of the vocabulary,
    else ``plain`` (turns end with EOS). ConfigError when neither fits."""
    vocab = tokenizer.get_vocab()
    if "<|im_start|>" in vocab and "<|im_end|>" in vocab:
        return CHATML, "chatml"
    if tokenizer.eos_token is None:
        raise ConfigError(
            "the tokenizer has no chat template and no EOS token: no default template can teach the model "
            "to stop",
            key=KEY,
            hint=f"set model.chat_template (one of {', '.join(template_names())}, a .jinja path or text)",
        )
    return PLAIN, "plain"


# ---- turn-by-turn masks --------------------------------------------------------------------------
@dataclass
class Masked:
    """One conversation rendered and masked: the rendering, its assistant character spans, the tokens."""

    text: str
    spans: list[tuple[int, int]]
    input_ids: list[int]
    assistant_masks: list[int]
    aligned: bool  # every span starts and ends on a token boundary


def _render(
    tokenizer: Any, messages: Messages, label: str, generation: bool, tools: Any, template: Any = None
) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation, tools=tools, chat_template=template
        )
    except Exception as err:  # jinja's TemplateError, raise_exception(), TypeError on odd content, ...
        raise ConfigError(
            f"the chat template ({label}) cannot render this conversation: {err}",
            key=KEY,
            hint="fix the data (e.g. roles must alternate, a system turn the template rejects) or " + WAY_OUT,
        ) from None


def _divergence(expected: str, rendered: str) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(expected, rendered, strict=False)) if a != b),
        min(len(expected), len(rendered)),
    )
    return f"at character {at}: expected {expected[at : at + 40]!r}, rendered {rendered[at : at + 40]!r}"


def assistant_spans(
    tokenizer: Any, messages: Messages, *, label: str = "", tools: Any = None, first: int = 0
) -> tuple[str, list[tuple[int, int]]]:
    """The full rendering and, per assistant turn from turn ``first`` on (a completion's), the character
    span it adds (content + end-of-turn, trailing whitespace excluded). ConfigError when a partial rendering
    is not a prefix of the next one."""
    label = label or template_label(tokenizer.chat_template)
    full = _render(tokenizer, messages, label, False, tools)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant" or i < first:
            continue
        header = _render(tokenizer, messages[:i], label, True, tools)
        turn = _render(tokenizer, messages[: i + 1], label, False, tools)
        checks = (
            (
                header,
                turn,
                f"the generation prompt before assistant turn {i} is not a prefix of the "
                "conversation rendered through that turn",
            ),
            (
                turn,
                full,
                f"the conversation rendered through assistant turn {i} is not a prefix of the "
                "whole conversation's rendering",
            ),
        )
        for shorter, longer, what in checks:
            if not longer.startswith(shorter):
                raise ConfigError(
                    f"the chat template ({label}) is not prefix-preserving: {what} "
                    f"({_divergence(shorter, longer)}); it renders turns differently once more follow (e.g. "
                    "drops reasoning or tool calls, or renders the last assistant turn differently), so the "
                    "tokens each assistant turn adds are not defined",
                    key=KEY,
                    hint=WAY_OUT,
                )
        added = turn[len(header) :].rstrip()
        content = message.get("content")
        if isinstance(content, str) and content.strip() not in added:
            raise ConfigError(
                f"the chat template ({label}) does not render assistant turn {i}'s text content (renders "
                f"{added[:60]!r}): it expects other inputs (e.g. a vision template's content blocks)",
                key=KEY,
                hint=WAY_OUT,
            )
        missing = [c["function"]["name"] for c in message.get("tool_calls") or []]
        missing = [name for name in missing if name not in added]
        if missing:
            raise ConfigError(
                f"the chat template ({label}) does not render assistant turn {i}'s tool call "
                f"'{missing[0]}' in that turn (it renders {added[:60]!r})",
                key=KEY,
                hint=TOOLS_WAY_OUT,
            )
        if added:
            spans.append((len(header), len(header) + len(added)))
    return full, spans


def token_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for tokens inside a span: overlapping it, or (empty offsets) starting in it."""
    mask = []
    for start, end in offsets:
        if end > start:
            hit = any(start < b and end > a for a, b in spans)
        else:
            hit = any(a <= start < b for a, b in spans)
        mask.append(int(hit))
    return mask


def _missing_marker(tokenizer: Any, turn: str, label: str) -> ConfigError | None:
    """A turn ending with a marker such as ``<|eot_id|>`` that the tokenizer splits into pieces: the
    template is another model family's (its special tokens are not this tokenizer's)."""
    found = END_MARKER.search(turn)
    if found is None or found.group(1) in tokenizer.get_vocab():
        return None
    marker = found.group(1)
    pieces = len(tokenizer(marker, add_special_tokens=False)["input_ids"])
    return ConfigError(
        f"the chat template ({label}) ends assistant turns with {marker!r}, which is not a token of this "
        f"tokenizer (it splits into {pieces} pieces): the template is written for another model family's "
        "special tokens, and the model would not learn to stop",
        key=KEY,
        hint="use the model's own template (unset model.chat_template) or one built on its special tokens "
        "(e.g. chatml for <|im_start|>/<|im_end|> models)",
    )


def _check_stops(
    tokenizer: Any,
    ids: list[int],
    offsets: list[tuple[int, int]],
    spans: list[tuple[int, int]],
    label: str,
    text: str = "",
) -> None:
    """Each assistant span must end with a special (end-of-turn) token, or the model never learns to stop."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    for a, b in spans:
        last = [t for t, (s, e) in zip(ids, offsets, strict=True) if s < b and e > a and e <= b + 1]
        if last and last[-1] not in special:
            missing = _missing_marker(tokenizer, text[a:b], label)
            if missing is not None:
                raise missing
            raise ConfigError(
                f"the chat template ({label}) ends an assistant turn with no end-of-turn token (the turn "
                f"ends with {tokenizer.decode(last[-3:])!r}; the next role's header ends it instead): the "
                "model would not learn to stop",
                key=KEY,
                hint=WAY_OUT,
            )


def _row_error(err: ConfigError, row: int, where: str) -> ConfigError:
    return ConfigError(f"{where} row {row}: {err.args[0]}".lstrip(), key=err.key, hint=err.hint)


def mask_conversations(
    tokenizer: Any,
    conversations: list[Messages],
    *,
    label: str = "",
    tools: list[Any] | None = None,
    firsts: list[int] | None = None,
    where: str = "",
    first: int = 0,
) -> list[Masked]:
    """``input_ids`` (tokenized as ``apply_chat_template`` does: no added special tokens) and
    ``assistant_masks`` of every conversation (``tools[i]``: row i's tool schemas; only the assistant turns
    from turn ``firsts[i]`` on are trained). Rendered one by one, tokenized in batches; an error names the
    row (``where``: e.g. the split; ``first``: the number of the first conversation in it)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"assistant-only loss with this chat template needs a fast tokenizer (offsets); "
            f"{type(tokenizer).__name__} is not",
            key="recipe.assistant_only_loss",
            hint="use a fast tokenizer, or " + WAY_OUT,
        )
    label = label or template_label(tokenizer.chat_template)
    tools = tools or [None] * len(conversations)
    firsts = firsts or [0] * len(conversations)
    out: list[Masked] = []
    for start in range(0, len(conversations), CHECK_BATCH):
        rendered = []
        for row in range(start, min(start + CHECK_BATCH, len(conversations))):
            try:
                rendered.append(
                    assistant_spans(
                        tokenizer, conversations[row], label=label, tools=tools[row], first=firsts[row]
                    )
                )
            except ConfigError as err:
                raise _row_error(err, first + row, where) from None
        enc = tokenizer([t for t, _ in rendered], add_special_tokens=False, return_offsets_mapping=True)
        for i, ((text, spans), ids, offsets) in enumerate(
            zip(rendered, enc["input_ids"], enc["offset_mapping"], strict=True)
        ):
            offsets = [tuple(o) for o in offsets]
            starts = {s for s, _ in offsets} | {0}
            ends = {e for _, e in offsets}
            try:
                _check_stops(tokenizer, ids, offsets, spans, label, text)
            except ConfigError as err:
                raise _row_error(err, first + start + i, where) from None
            aligned = all(a in starts and b in ends for a, b in spans)
            out.append(Masked(text, spans, list(ids), token_mask(offsets, spans), aligned))
    return out


def mask_conversation(
    tokenizer: Any, messages: Messages, *, label: str = "", tools: Any = None, first: int = 0
) -> Masked:
    """One conversation's ``mask_conversations``."""
    try:
        return mask_conversations(tokenizer, [messages], label=label, tools=[tools], firsts=[first])[0]
    except ConfigError as err:
        raise ConfigError(err.args[0].removeprefix("row 0: "), key=err.key, hint=err.hint) from None


def check_tools_rendered(
    tokenizer: Any, messages: Messages, tools: Any, label: str, template: Any = None
) -> None:
    """A conversation with tool calls (or a ``tools`` column) must render differently without them: a
    template that ignores them trains a tool-calling turn as an empty reply. ConfigError naming the
    template otherwise."""
    calls = any(m.get("tool_calls") for m in messages)
    if not calls and not tools:
        return

    def render(turns: Messages, schemas: Any) -> str:
        return _render(tokenizer, turns, label, False, schemas, template)

    full = render(messages, tools)
    what = None
    if calls and render([{k: v for k, v in m.items() if k != "tool_calls"} for m in messages], tools) == full:
        what = "the assistant turns' tool_calls (a tool-calling turn would be trained as an empty reply)"
    elif tools and render(messages, None) == full:
        what = "the tools column's schemas (the model would call tools it was never shown)"
    if what:
        raise ConfigError(f"the chat template ({label}) does not render {what}", key=KEY, hint=TOOLS_WAY_OUT)


def check_template(
    tokenizer: Any,
    conversations: list[Messages],
    *,
    label: str = "",
    tools: list[Any] | None = None,
    where: str = "",
) -> dict[str, Any]:
    """Mask ``conversations`` with the tokenizer's template, no model needed (``mode=plan`` can call this).

    Raises ConfigError (naming the row) for a template that is not prefix-preserving or fails to render;
    returns counts and the trained text of the first conversation."""
    label = label or template_label(tokenizer.chat_template)
    masked = mask_conversations(tokenizer, conversations, label=label, tools=tools, where=where)
    first = masked[0] if masked else None
    return {
        "template": label,
        "conversations": len(masked),
        "assistant turns": sum(len(m.spans) for m in masked),
        "unaligned spans": sum(not m.aligned for m in masked),
        "first trained text": ("".join(first.text[a:b] for a, b in first.spans) if first is not None else ""),
    }


def choose_method(tokenizer: Any) -> tuple[str, str | None]:
    """How assistant-only loss is computed: ``(method, TRL's training template or None)``.

    TRL's own path when the template has ``{% generation %}`` markers or TRL knows how to patch it; otherwise
    hydratune's turn-by-turn mask."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if isinstance(template, str) and has_generation_markers(template):
        return TRL_MARKERS, None
    try:
        patched = get_training_chat_template(tokenizer)
    except Exception:  # ValueError: not patchable; templates failing TRL's probe renders likewise
        return HYDRATUNE, None
    return (TRL_PATCHED, patched) if patched else (TRL_MARKERS, None)


# ---- a template without a system role --------------------------------------------------------------
def rejects_system(tokenizer: Any) -> bool:
    """Whether the chat template refuses a system turn (Gemma's raises) that it renders without."""
    user = {"role": "user", "content": "hi"}
    try:
        tokenizer.apply_chat_template([user], tokenize=False)
    except Exception:  # a template that fails anyway is named by the later checks
        return False
    try:
        tokenizer.apply_chat_template([{"role": "system", "content": "be brief"}, user], tokenize=False)
    except Exception:  # jinja's TemplateError from raise_exception()
        return True
    return False


def fold_system(messages: Messages) -> Messages:
    """A leading system turn folded into the first user turn (``system + "\n\n" + user``; content parts,
    an image row's: the system's parts, a ``"\n\n"`` text part, the user's); unchanged without one, or
    without a user turn after it."""
    if not messages or messages[0].get("role") != "system":
        return messages
    user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if user is None:
        return messages
    system, first = messages[0]["content"], messages[user]["content"]
    if isinstance(system, list) or isinstance(first, list):
        content: Any = [*_parts(system), {"type": "text", "text": "\n\n"}, *_parts(first)]
    else:
        content = f"{system}\n\n{first}"
    folded = dict(messages[user], content=content)
    return [*messages[1:user], folded, *messages[user + 1 :]]


def _parts(content: Any) -> list[dict[str, Any]]:
    """A turn's content as content parts (text: one text part)."""
    return content if isinstance(content, list) else [{"type": "text", "text": str(content)}]


def label_for(model: Any, tokenizer: Any) -> str:
    """The template as the user named it (``model.chat_template``), else by its known name or first line."""
    if model.chat_template:
        return resolve_chat_template(model.chat_template)[1]
    return template_label(tokenizer.chat_template, model.name_or_path)


# ---- the summary's view of one example -----------------------------------------------------------
def generation_header(tokenizer: Any) -> list[int]:
    """The tokens the chat template puts before an assistant turn (its generation prompt, e.g.
    ``<|im_start|>assistant\n``); [] when the template does not tell."""
    turn = [{"role": "user", "content": "x"}]
    try:
        bare = tokenizer.apply_chat_template(turn, tokenize=False)
        prompted = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that cannot render this probe: no split
        return []
    if not prompted.startswith(bare) or len(prompted) == len(bare):
        return []
    return list(tokenizer(prompted[len(bare) :], add_special_tokens=False)["input_ids"])


def _split_after_header(tokens: list[int], header: list[int]) -> list[list[int]]:
    """An untrained run cut after each generation prompt inside it (not at its end): an assistant turn that
    is not trained (a per-turn flag, a prompt's turn) starts a row of its own."""
    pieces, start, n = [], 0, len(header)
    for i in range(len(tokens) - n):
        if n and tokens[i : i + n] == header and i + n > start:
            pieces.append(tokens[start : i + n])
            start = i + n
    return [*pieces, tokens[start:]]


def mask_segments(
    tokenizer: Any,
    input_ids: list[int],
    labels: list[int],
    *,
    max_segments: int = 24,
    max_chars: int = 100,
    header: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Consecutive runs of trained / untrained tokens, decoded, newlines escaped, long runs shortened; an
    untrained run is also cut after each ``header`` (``generation_header``) inside it, so an assistant turn
    left untrained shows in a row of its own."""
    runs: list[tuple[bool, list[int]]] = []
    for token, label in zip(input_ids, labels, strict=True):
        trained = label != -100
        if runs and runs[-1][0] == trained:
            runs[-1][1].append(token)
        else:
            runs.append((trained, [token]))
    if header:
        runs = [
            (t, piece) for t, run in runs for piece in (_split_after_header(run, header) if not t else [run])
        ]
    rows = []
    for i, (trained, tokens) in enumerate(runs[:max_segments]):
        text = tokenizer.decode(tokens, skip_special_tokens=False)
        text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
        if len(text) > max_chars:
            half = (max_chars - 5) // 2
            text = f"{text[:half]} ... {text[-half:]}"
        text = f"`` {text} ``" if "`" in text else f"`{text}`"  # as code: markers such as <s> stay visible
        rows.append({"#": i + 1, "trained": "yes" if trained else "no", "tokens": len(tokens), "text": text})
    if len(runs) > max_segments:
        rest = runs[max_segments:]
        rows.append(
            {"#": "...", "trained": "", "tokens": sum(len(t) for _, t in rest), "text": f"{len(rest)} more"}
        )
    return rows
