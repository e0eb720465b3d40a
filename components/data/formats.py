"""Row conversion: one file row in any supported shape (messages, ShareGPT, alpaca, prompt/completion,
preference, HH, tool calls, per-turn training flags, reasoning) to the canonical message lists, each error
naming the row and column."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from hydratune.components.data import images as image_rows
from hydratune.components.data.readers import RowError
from hydratune.components.data.rows import (
    HH_TURN,
    REASONING_KEYS,
    ROLE_ALIASES,
    ROLES,
    TOOL_TURN_KEYS,
    TRAIN_FLAG_KEYS,
    TURN_KEYS,
    Messages,
    Row,
)

if TYPE_CHECKING:
    from hydratune.components.data.images import RowImages


def text_of(row: Row, column: str, *, required: bool = True) -> str:
    """The text in ``column``: numbers become strings; missing or blank is a ``RowError`` if ``required``."""
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):  # csv/parquet blanks are NaN
        value = ""
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise RowError(f"column '{column}' should hold text, got {type(value).__name__}")
    if required and not value.strip():
        raise RowError(f"no value in column '{column}'")
    return value


def alpaca_history(value: Any, column: str = "history") -> Messages:
    """An alpaca row's ``history``: ``[[question, answer], ...]`` (LLaMA-Factory's alpaca shape; JSON text
    in a csv cell too) as user / assistant turns, before the row's own instruction; blank or empty: none.
    Any other shape is a ``RowError`` naming the item."""
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowError(f"column '{column}' holds malformed JSON ({err.msg})") from None
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return []
    if not isinstance(value, list):
        raise RowError(
            f"column '{column}' should be a list of [question, answer] pairs, got {type(value).__name__}"
        )
    turns: Messages = []
    for i, pair in enumerate(value):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise RowError(f"column '{column}' item {i} should be [question, answer] (two texts)")
        turns += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    return turns


def role_names(roles: dict[str, str] | None = None) -> dict[str, str]:
    """Every role name a turn may carry -> the canonical role: ours, ShareGPT's, then ``data.roles``."""
    return {r: r for r in ROLES} | ROLE_ALIASES | dict(roles or {})


def _content_text(value: Any, i: int, column: str) -> str:
    """A turn's content as text: a string (numbers become strings, null ""), or OpenAI content parts
    (``[{"type": "text", "text": ...}, ...]``, plain strings allowed) joined without separator. A non-text
    part (image, audio, file) is a ``RowError``: a text model cannot train on it."""
    if not isinstance(value, list):
        return text_of({"content": value}, "content", required=False)
    texts = []
    for j, part in enumerate(value):
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type", "text") if isinstance(part, dict) else type(part).__name__
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RowError(
                f"message {i} in column '{column}' has a '{kind}' content part (part {j}): only text parts "
                "can be trained",
                key="data.path",
                hint="drop the non-text parts (images, audio, files) from the data, or set "
                "data.on_error=skip to drop such rows and count them",
            )
        texts.append(part["text"])
    return "".join(texts)


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    """One tool call in OpenAI's shape ``{"id"?, "type": "function", "function": {"name", "arguments"}}``,
    from that shape or a bare ``{"name", "arguments"}``; JSON-text arguments become an object (what chat
    templates render with ``tojson``)."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RowError(f"{where} needs a function name ({{'function': {{'name', 'arguments'}}}})")
    arguments = function.get("arguments", function.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise RowError(f"{where}: arguments are not valid JSON ({err.msg})") from None
    out: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if call.get("id") is not None:
        out = {"id": str(call["id"]), **out}
    return out


def parse_tool_calls(value: Any, i: int, column: str) -> list[dict[str, Any]]:
    """A turn's ``tool_calls`` (a list, one call, or a JSON string of either) in OpenAI's shape."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowError(
                f"message {i} in column '{column}': tool calls are not valid JSON ({err.msg})"
            ) from None
    calls = value if isinstance(value, list) else [value]
    return [
        _tool_call(call, f"message {i} in column '{column}', tool call {j}") for j, call in enumerate(calls)
    ]


def _sharegpt_call(text: str) -> list[dict[str, Any]] | None:
    """A ShareGPT ``function_call`` turn's value as tool calls when it is JSON ``{"name", "arguments"}`` (or
    a list of them); None for other text (kept as the assistant's text)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    calls = value if isinstance(value, list) else [value]
    functions = [c.get("function", c) if isinstance(c, dict) else None for c in calls]
    named = all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in functions)
    return value if calls and named else None


#: what ``parse_turn`` left out of the row being converted (message keys not used, reasoning dropped), one
#: entry per key; ``convert_range`` clears it before each row and counts the rows that name each key
TURN_NOTES: list[str] = []


def _train_flag(message: dict[str, Any], role: str, i: int, column: str) -> bool | None:
    """The turn's training flag (``TRAIN_FLAG_KEYS``): False for a turn not to train, True to train it, None
    without one. A value other than 0/1 (true/false), two flags, or a flag that asks a non-assistant turn to
    be trained is a ``RowError``."""
    found = [k for k in TRAIN_FLAG_KEYS if k in message and message[k] is not None]
    if not found:
        return None
    where = f"message {i} in column '{column}'"
    if len(found) > 1:
        raise RowError(f"{where} has two training flags ({', '.join(found)}): give one")
    key, value = found[0], message[found[0]]
    if value not in (0, 1) or isinstance(value, str):
        allowed = "0 or 1" if key == "weight" else "true or false"
        raise RowError(
            f"{where}: '{key}' should be {allowed} (whether the turn is trained), got {value!r}",
            key="data.path",
            hint=f"write '{key}' as {allowed}, or set data.on_error=skip to drop such rows and count them",
        )
    if value and role != "assistant":
        raise RowError(
            f"{where} is a {role} turn with {key}={value!r}: only assistant turns are trained (the flags say "
            "which assistant turns are not)",
            key="data.path",
            hint=f"drop '{key}' from the {role} turns",
        )
    return bool(value)


def _reasoning(message: dict[str, Any], i: int, column: str) -> tuple[str, str] | None:
    """(the key, the text) of an assistant turn's reasoning (``REASONING_KEYS``), None without one."""
    for key in REASONING_KEYS:
        value = message.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise RowError(
                f"message {i} in column '{column}': '{key}' should be text, got {type(value).__name__}"
            )
        return key, value
    return None


def parse_turn(
    message: Any,
    i: int,
    column: str,
    names: dict[str, str],
    *,
    flags: bool = False,
    reasoning: bool | None = None,
    images: RowImages | None = None,
) -> dict[str, Any]:
    """One ``{"role", "content"}`` or ShareGPT ``{"from", "value"}`` turn as ``{"role", "content"}`` (content
    text), plus what tool calling needs: an assistant turn's ``tool_calls`` (OpenAI's shape; also from a
    legacy ``function_call`` key or a ShareGPT ``function_call`` turn), a tool turn's ``tool_call_id`` and
    ``name``. ``flags``: a per-turn training flag (``TRAIN_FLAG_KEYS``) that turns an assistant turn off
    becomes ``"train": False``. ``reasoning``: an assistant turn's reasoning (``REASONING_KEYS``) is kept as
    ``reasoning_content`` (True) or dropped and counted (False); None: not read. Every other key of the
    message is noted in ``TURN_NOTES`` (the summary counts the rows). ``images`` (data.images: the row's
    ``RowImages``): image parts and ``<image>`` placeholders become ``{"type": "image"}`` parts, the images
    noted in it (``RowImages.content_parts``); None: an image part is a ``RowError`` (a text model)."""
    keys = next(
        (
            k
            for k in TURN_KEYS
            if isinstance(message, dict) and k[0] in message and (k[1] in message or "tool_calls" in message)
        ),
        None,
    )
    if keys is None:
        found = ", ".join(map(str, message)) if isinstance(message, dict) else type(message).__name__
        raise RowError(
            f"message {i} in column '{column}' needs 'role' and 'content' (or ShareGPT's 'from' and "
            f"'value'); found: {found}",
            key="data.format",
        )
    name = message[keys[0]]
    if not isinstance(name, str) or name not in names:
        known = ", ".join(dict.fromkeys([*ROLES, *names]))
        raise RowError(
            f"message {i} in column '{column}' has role '{name}' (known: {known})",
            key="data.roles",
            hint=f"map your role names with data.roles='{{{name}: <user|assistant|system|tool>}}', "
            "e.g. data.roles='{bot: assistant, me: user}'",
        )
    content = message.get(keys[1])
    if images is not None and isinstance(content, (str, list)):
        text: Any = images.content_parts(content, i, column)
    else:
        text = _content_text(content, i, column)
    turn: dict[str, Any] = {"role": names[name], "content": text}
    calls = message.get("tool_calls") or message.get("function_call")
    if name == "function_call" and turn["role"] == "assistant" and not calls and isinstance(text, str):
        calls = _sharegpt_call(turn["content"])
        turn["content"] = "" if calls else turn["content"]
    if calls:
        if turn["role"] != "assistant":
            raise RowError(f"message {i} in column '{column}' is a {turn['role']} turn with tool calls")
        turn["tool_calls"] = parse_tool_calls(calls, i, column)
    used = {*keys, "tool_calls", "function_call"}
    if turn["role"] == "tool":
        turn |= {k: str(message[k]) for k in TOOL_TURN_KEYS if message.get(k) is not None}
        used.update(TOOL_TURN_KEYS)
    if flags:
        used.update(TRAIN_FLAG_KEYS)
        if _train_flag(message, turn["role"], i, column) is False and turn["role"] == "assistant":
            turn["train"] = False
    if reasoning is not None and turn["role"] == "assistant":
        used.update(REASONING_KEYS)
        found = _reasoning(message, i, column)
        if found and reasoning:
            turn["reasoning_content"] = found[1]
        elif found:
            TURN_NOTES.append(f"{found[0]} (data.keep_reasoning=false)")
    TURN_NOTES.extend(str(k) for k in message if k not in used)
    return turn


def parse_messages(value: Any, column: str, roles: dict[str, str] | None = None, **options: Any) -> Messages:
    """A list of ``{"role", "content"}`` (or ShareGPT ``{"from", "value"}``) turns (a JSON string of one is
    parsed), reduced to ``role`` and ``content`` (text) and the tool-calling keys (``parse_turn``, with its
    ``options``: training flags, reasoning), roles mapped to ours (``role_names``)."""
    if isinstance(value, str) and value.lstrip().startswith("["):  # e.g. a csv cell holding JSON
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowError(f"column '{column}' holds malformed JSON ({err.msg})") from None
    if value is None:
        raise RowError(f"no value in column '{column}'")
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else type(value).__name__
        raise RowError(
            f"column '{column}' should be a non-empty list of {{role, content}} messages, got {got}"
        )
    names = role_names(roles)
    return [parse_turn(message, i, column, names, **options) for i, message in enumerate(value)]


def parse_tools(value: Any) -> str | None:
    """A ``tools`` cell (a list of JSON schemas, one schema, or a JSON string of either) as JSON text of a
    list (what TRL and ``apply_chat_template(tools=...)`` read); None when blank."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value in ("", []):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowError(f"column 'tools' holds malformed JSON ({err.msg})") from None
    tools = [value] if isinstance(value, dict) else value
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RowError(f"column 'tools' should be a list of JSON schemas, got {type(value).__name__}")
    return json.dumps(tools, ensure_ascii=False) if tools else None


def turn_text(message: dict[str, Any]) -> str:
    """What an assistant turn says: its content (parts: their text), else its tool calls as JSON."""
    content = image_rows.text_of_content(message["content"])
    if content.strip() or not message.get("tool_calls"):
        return content
    return json.dumps([c["function"] for c in message["tool_calls"]], ensure_ascii=False)


def json_turns(value: Any) -> list[Any] | None:
    """``value`` as a list of turns if it is one, or a string holding one as JSON (a csv cell); else None."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, list) and value and all(isinstance(m, dict) for m in value) else None


def as_messages(
    value: Any, role: str, column: str, roles: dict[str, str] | None = None, **options: Any
) -> Messages:
    """Text becomes one message of ``role`` (it must not be blank); a message list (or a JSON string of one)
    is checked (``parse_turn``'s ``options``; ``images``, the row's ``RowImages``, reads text's ``<image>``
    placeholders too)."""
    if isinstance(value, str) and json_turns(value) is None:
        text: Any = text_of({column: value}, column)
        images = options.get("images")
        if images is not None:
            text = images.content_parts(text, 0, column)
        return [{"role": role, "content": text}]
    return parse_messages(value, column, roles, **options)


def hh_messages(value: Any, column: str) -> Messages:
    """An Anthropic HH transcript (``"\\n\\nHuman: ... \\n\\nAssistant: ..."``) as user/assistant turns."""
    parts = HH_TURN.split(text_of({column: value}, column).strip())
    if len(parts) < 3 or parts[0].strip():
        raise RowError(
            f"column '{column}' is not a '\\n\\nHuman: ... \\n\\nAssistant: ...' transcript "
            f"(it starts {parts[0][:40]!r})",
            key="data.format",
        )
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return [
        {"role": "user" if who == "Human" else "assistant", "content": text.strip()} for who, text in pairs
    ]


def split_shared(chosen: Messages, rejected: Messages) -> Row:
    """Two conversations that start with the same turns as ``prompt`` (those turns, up to the last one
    before the replies) and the two replies, each ending with an assistant turn."""
    k = 0
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1
    while k and chosen[k - 1]["role"] == "assistant":  # the prompt ends where a reply starts
        k -= 1
    if k == 0:
        raise RowError(
            "'chosen' and 'rejected' do not start with the same turns, so there is no prompt to split off "
            f"(their first turns: {chosen[0]['role']} / {rejected[0]['role']})",
            key="data.format",
        )
    out: Row = {"prompt": chosen[:k]}  # identical conversations: counted by the load (``identical_pair``)
    for name, reply in (("chosen", chosen[k:]), ("rejected", rejected[k:])):
        user = next((j for j, m in enumerate(reply) if m["role"] == "user"), None)
        if user is not None:
            raise RowError(
                f"'chosen' and 'rejected' differ before their last user turn ('{name}' turn {k + user} is a "
                "user turn after the shared prompt)"
            )
        if (
            not reply
            or reply[-1]["role"] != "assistant"
            or not image_rows.text_of_content(reply[-1]["content"]).strip()
        ):
            last = "missing" if not reply else f"a '{reply[-1]['role']}' turn"
            last = "an empty assistant turn" if reply and reply[-1]["role"] == "assistant" else last
            raise RowError(
                f"the last turn of '{name}' should be an assistant reply with content; it is {last}"
            )
        out[name] = reply
    return out


def last_answer(messages: Messages) -> int:
    """Index of the last assistant turn with content (or tool calls); a ``RowError`` if there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant" and turn_text(messages[i]).strip():
            return i
    raise RowError("no assistant turn with content (nothing to train on)")
