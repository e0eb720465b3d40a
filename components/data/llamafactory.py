"""LLaMA-Factory dataset dirs read directly: ``data.path=<dir holding dataset_info.json>``.

``dataset_info.json`` names datasets (``"name": {"file_name", "formatting", "ranking", "columns",
"tags"}``, LLaMA-Factory's ``data/README.md``); ``data.subset=<name>`` picks one (needed when it names
several). Its file (or folder of files) is read as any data file is, and each row converted as LLaMA-Factory's
converters convert it (``src/llamafactory/data/converter.py``), into the rows of the run's data option:

- ``formatting: alpaca``: ``history`` pairs, then the user turn ``prompt + "\\n" + query`` (the blank ones
  left out), then the ``response`` (every assistant turn trained, as LLaMA-Factory trains the history's);
  ``system`` and ``tools`` columns. Only a ``prompt`` column mapped (LLaMA-Factory's pre-training entry):
  ``text`` rows.
- ``formatting: sharegpt``: the ``messages`` column's turns, keyed and named by ``tags`` (``role_tag``,
  ``content_tag``, ``user_tag``, ``assistant_tag``, ``observation_tag``: a tool result, ``function_tag``: the
  assistant's tool call, ``system_tag``: a leading system turn, else the ``system`` column); user /
  observation turns at odd places and assistant / function ones at even places, an even count (an odd one
  with ``ranking``), else the row is bad (LLaMA-Factory skips it with a warning; here it is named, or skipped
  and counted with ``data.on_error=skip``).
- ``ranking: true``: ``chosen`` / ``rejected`` (text for alpaca, one turn for sharegpt) after the prompt:
  preference pairs (reward, DPO, ORPO, SimPO, KTO). A ``kto_tag`` column: KTO's unpaired rows (its label).
- Prompt data (PPO, GRPO): the conversation before the last response, and that response as ``answer``.

As LLaMA-Factory does, a ``columns`` (``tags``) object replaces the defaults: a name it leaves out is not
read. Everything else an entry may say is refused before anything loads, naming it: hub / script /
cloud sources, ``subset``, ``folder``, ``num_samples``, media columns (videos, audios; images unless
``data.images``: then read as components/data/images.py reads an ``images`` column), columns or
tags the formatting does not read, and the knobs the entry decides (``data.columns``, ``data.roles``,
``data.format``, ``data.ignore_columns``, ``data.streaming``).
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.readers import RowError, Table, is_blank

INFO = "dataset_info.json"
KEY = "data.path"
FORMATTINGS = ("alpaca", "sharegpt")
#: what an entry may say, and what hydratune does with each key
READ = ("file_name", "formatting", "ranking", "columns", "tags", "split", "file_sha1")
SOURCES = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
UNSUPPORTED = {
    **dict.fromkeys(
        SOURCES, "a dataset fetched from elsewhere: give data.path the hub id or the file itself"
    ),
    "subset": "a hub dataset's subset: data.path=<hub id> data.subset=<subset>",
    "folder": "a hub repository's folder: download it and point data.path at it",
    "revision": "a hub revision: download that revision and point data.path at it",
    "num_samples": "LLaMA-Factory samples rows at random: data.max_samples takes the first N",
}
COLUMNS = {  # ``images``: read with data.images (a vision-language model), refused otherwise (``check``)
    "alpaca": (
        *("prompt", "query", "response", "history", "system", "tools", "chosen", "rejected", "kto_tag"),
        "images",
    ),
    "sharegpt": ("messages", "system", "tools", "chosen", "rejected", "kto_tag", "images"),
}
DEFAULT_COLUMNS = {
    "alpaca": {"prompt": "instruction", "query": "input", "response": "output"},
    "sharegpt": {"messages": "conversations"},
}
MEDIA = ("images", "videos", "audios")
DEFAULT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
#: LLaMA-Factory's roles as hydratune's turn names (``function_call``: the assistant's tool call,
#: ``observation``: a tool result; components/data/rows.py's ROLE_ALIASES)
ROLE_OF = {
    "user_tag": "user",
    "assistant_tag": "assistant",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
#: the knobs an entry decides: refused beside one
DECIDED = {
    "columns": "the entry's 'columns' map them",
    "roles": "the entry's 'tags' name them",
    "ignore_columns": "the entry's 'columns' say what is read (the others are not)",
}


def is_dir(path: Path) -> bool:
    """A folder whose ``dataset_info.json`` is LLaMA-Factory's (entries naming a file or a source), not a
    hub snapshot's or ``save_to_disk``'s metadata."""
    info = path / INFO
    if not path.is_dir() or not info.is_file() or (path / "state.json").is_file():
        return False
    try:
        entries = json.loads(info.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return False
    return (
        isinstance(entries, dict)
        and bool(entries)
        and all(isinstance(e, dict) for e in entries.values())
        and any(("file_name" in e or any(s in e for s in SOURCES)) for e in entries.values())
    )


@dataclass(frozen=True)
class Entry:
    """One dataset of a ``dataset_info.json``, checked: where its rows are and how to read them."""

    root: Path
    name: str
    file: Path
    formatting: str
    ranking: bool
    columns: tuple[tuple[str, str], ...]  # LLaMA-Factory's column name -> the file's
    tags: tuple[tuple[str, str], ...]

    @property
    def column(self) -> dict[str, str]:
        return dict(self.columns)

    @property
    def tag(self) -> dict[str, str]:
        return dict(self.tags)

    @property
    def pretraining(self) -> bool:
        """An alpaca entry mapping ``prompt`` alone (LLaMA-Factory's pre-training shape): text rows."""
        return self.formatting == "alpaca" and set(self.column) == {"prompt"}

    def kind(self) -> str:
        """The data kind its rows are (``Recipe.data_kinds``): preference, unpaired, or chat / prompts."""
        if self.ranking:
            return "preference"
        return "unpaired" if "kto_tag" in self.column else "chat"

    def describe(self) -> str:
        """The summary's line: the entry, its file and how it is read."""
        columns = ", ".join(f"{k}={v}" for k, v in self.columns) or "none"
        out = (
            f"'{self.name}': {self.file.relative_to(self.root)}, formatting {self.formatting}, ranking "
            f"{str(self.ranking).lower()}; columns {columns}"
        )
        if self.formatting == "sharegpt":
            out += "; tags " + (", ".join(f"{k}={v}" for k, v in self.tags) or "none")
        return out


def entries(root: Path) -> dict[str, Any]:
    try:
        found = json.loads((root / INFO).read_text(encoding="utf-8"))
    except ValueError as err:
        raise ConfigError(f"{root / INFO} is not valid JSON ({err})", key=KEY) from None
    return found if isinstance(found, dict) else {}


def entry(root: Path, name: str | None) -> Entry:
    """The entry ``name`` (``data.subset``; the only one when None) of ``root``'s dataset_info.json, every key
    checked (refused naming it when hydratune does not read it)."""
    found = entries(root)
    names = list(found)
    if name is None and len(names) > 1:
        raise ConfigError(
            f"{root / INFO} names {len(names)} datasets ({', '.join(names[:8])}"
            + (", ...)" if len(names) > 8 else ")"),
            key="data.subset",
            hint=f"pick one: data.subset={names[0]}",
        )
    name = names[0] if name is None else name
    if name not in found:
        near = difflib.get_close_matches(name, names, n=3)
        raise ConfigError(
            f"{root / INFO} has no dataset '{name}'" + (f"; did you mean {', '.join(near)}?" if near else ""),
            key="data.subset",
            hint=f"one of: {', '.join(names[:12])}",
        )
    spec = found[name]
    where = f"{INFO} entry '{name}'"
    for key in spec:
        if key in UNSUPPORTED:
            raise ConfigError(
                f"{where} sets '{key}': not supported", key="data.subset", hint=UNSUPPORTED[key]
            )
        if key not in READ:
            raise ConfigError(
                f"{where} has the key '{key}', which LLaMA-Factory's format does not define",
                key="data.subset",
                hint=f"keys read: {', '.join(READ)}; not supported: {', '.join(UNSUPPORTED)}",
            )
    formatting = spec.get("formatting", "alpaca")
    if formatting not in FORMATTINGS:
        raise ConfigError(
            f"{where}: formatting '{formatting}' is not supported",
            key="data.subset",
            hint="formatting alpaca or sharegpt (OpenAI-style messages: sharegpt with role/content tags), or "
            "point data.path at the file itself",
        )
    if spec.get("split", "train") != "train":
        raise ConfigError(
            f"{where}: split '{spec['split']}' (a local file has only 'train')", key="data.subset"
        )
    ranking = spec.get("ranking", False)
    if not isinstance(ranking, bool):
        raise ConfigError(f"{where}: ranking should be true or false, got {ranking!r}", key="data.subset")
    columns = _names(spec, "columns", COLUMNS[formatting], where, formatting)
    columns = DEFAULT_COLUMNS[formatting] if "columns" not in spec else columns
    tags = _names(spec, "tags", tuple(DEFAULT_TAGS), where, formatting)
    if formatting == "sharegpt":
        tags = DEFAULT_TAGS if "tags" not in spec else tags
        for needed in ("role_tag", "content_tag"):
            if not tags.get(needed):
                raise ConfigError(
                    f"{where}: tags has no {needed}", key="data.subset", hint="tags.role_tag: role"
                )
    if ranking and not ("chosen" in columns and "rejected" in columns):
        raise ConfigError(
            f"{where}: ranking is true, but its columns map no chosen / rejected",
            key="data.subset",
            hint='"columns": {..., "chosen": "chosen", "rejected": "rejected"}',
        )
    if ranking and "kto_tag" in columns:
        raise ConfigError(f"{where}: ranking and kto_tag together", key="data.subset")
    file = root / str(spec.get("file_name", ""))  # as data.path gives the dir (relative or not)
    if not spec.get("file_name") or not file.exists():
        raise ConfigError(
            f"{where}: file_name {spec.get('file_name')!r} is not in {root}",
            key="data.subset",
            hint="file_name: the data file (or folder of files) in the dataset_info.json's folder",
        )
    if not file.resolve().is_relative_to(root.resolve()):
        raise ConfigError(f"{where}: file_name {spec['file_name']} is outside {root}", key="data.subset")
    return Entry(root, name, file, formatting, ranking, tuple(columns.items()), tuple(tags.items()))


def _names(spec: dict[str, Any], field: str, known: tuple[str, ...], where: str, fmt: str) -> dict[str, str]:
    """``spec[field]`` (columns or tags) as a mapping, each name checked against ``known``."""
    given = spec.get(field) or {}
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: '{field}' should be an object", key="data.subset")
    if field == "tags" and given and fmt != "sharegpt":
        raise ConfigError(
            f"{where} has tags, which formatting {fmt} does not read (LLaMA-Factory ignores them)",
            key="data.subset",
            hint='drop "tags", or set "formatting": "sharegpt"',
        )
    for name in given:
        if name in MEDIA and not (name == "images" and field == "columns"):
            raise ConfigError(
                f"{where} maps columns.{name}: only text can be trained",
                key="data.subset",
                hint=f"drop {name}",
            )
        if name not in known:
            raise ConfigError(
                f"{where}: {field}.{name} is not read by formatting {fmt}",
                key="data.subset",
                hint=f"{field} of formatting {fmt}: {', '.join(known)}",
            )
    return {k: str(v) for k, v in given.items() if v}


def check(data: Any) -> Entry | None:
    """Before load: the entry data.path (a LLaMA-Factory dir) names, fit for ``data`` (the data option,
    its kind), and no knob the entry decides set beside it. None when data.path is not such a dir."""
    if not data.path or not is_dir(Path(data.path).expanduser()):
        if data.eval_path and is_dir(Path(data.eval_path).expanduser()):
            raise ConfigError(
                f"{data.eval_path} is a LLaMA-Factory dataset dir: read as data.path only",
                key="data.eval_path",
                hint="point data.eval_path at the eval file itself",
            )
        return None
    found = entry(Path(data.path).expanduser(), data.subset)
    if "images" in found.column and not getattr(data, "images", False):  # a text model, as before
        raise ConfigError(
            f"{INFO} entry '{found.name}' maps columns.images: only text can be trained",
            key="data.subset",
            hint="drop images, or train a model that takes images (data.images=true)",
        )
    for knob, why in DECIDED.items():
        if getattr(data, knob, None):
            raise ConfigError(
                f"data.{knob} is set beside a LLaMA-Factory dataset dir: {why}", key=f"data.{knob}"
            )
    if data.split != "train":
        raise ConfigError(f"data.split={data.split}: the {INFO} entry is one split", key="data.split")
    if getattr(data, "streaming", False):
        raise ConfigError(
            "data.streaming reads files as they are; a LLaMA-Factory dataset dir is converted as it loads",
            key="data.streaming",
            hint="data.streaming=false, or point data.path at the file with data.format set",
        )
    wanted = "text" if found.pretraining else "messages"
    fmt = getattr(data, "format", "auto")
    if data.kind == "chat" and fmt not in ("auto", wanted):
        raise ConfigError(
            f"data.format={fmt}: the {INFO} entry '{found.name}' gives {wanted} rows",
            key="data.format",
            hint=f"data.format=auto (or {wanted})",
        )
    if data.kind == "preference" and fmt not in ("auto", "explicit"):
        raise ConfigError(f"data.format={fmt}: the entry gives explicit pairs", key="data.format")
    kind = found.kind()
    fits = {"chat": ("chat", "prompts"), "preference": ("preference",), "unpaired": ("unpaired",)}[kind]
    if data.kind not in fits:
        what = {"preference": "ranking: true (preference pairs)", "unpaired": "a kto_tag column (KTO rows)"}
        raise ConfigError(
            f"the {INFO} entry '{found.name}' holds {what.get(kind, 'SFT rows (ranking: false)')}, and this "
            f"recipe's data is {data.kind} data",
            key="data.subset",
            hint="pick an entry of the recipe's kind, or the recipe for this entry (ranking: recipe=dpo, "
            "reward, orpo or simpo, or recipe=kto data=demo_dpo, which splits pairs; kto_tag: recipe=kto; "
            "else recipe=sft, ppo or grpo)",
        )
    if found.pretraining and data.kind != "chat":
        raise ConfigError(
            f"the {INFO} entry '{found.name}' is pre-training text (prompt only)", key="data.subset"
        )
    return found


# ------------------------------------------------------------------------------------------ rows


def _text(row: dict[str, Any], column: str | None) -> str:
    """The text of ``column`` ("" when unmapped, missing or blank; numbers as text)."""
    value = row.get(column) if column else None
    if is_blank(value):
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise RowError(f"column '{column}' should hold text, got {type(value).__name__}")
    return value


def _alpaca(entry: Entry, row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the prompt turns, the response turns) of an alpaca row, as LLaMA-Factory's AlpacaDatasetConverter."""
    col = entry.column
    prompt: list[dict[str, Any]] = []
    history = row.get(col["history"]) if "history" in col else None
    if isinstance(history, list):
        for i, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise RowError(f"column '{col['history']}' item {i} should be [prompt, response]")
            prompt += [
                {"role": "user", "content": str(pair[0])},
                {"role": "assistant", "content": str(pair[1])},
            ]
    query = [t for t in (_text(row, col.get("prompt")), _text(row, col.get("query"))) if t]
    prompt.append({"role": "user", "content": "\n".join(query)})
    response = (
        [{"role": "assistant", "content": _text(row, col.get("response"))}] if "response" in col else []
    )
    return prompt, response


def _turn(entry: Entry, message: Any, i: int, column: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    """One sharegpt message as a hydratune turn (``{"role", "content"}`` and its other keys), its role tag
    one of ``allowed`` (the tag names)."""
    tags = entry.tag
    if not isinstance(message, dict) or tags["role_tag"] not in message:
        raise RowError(f"message {i} in column '{column}' has no '{tags['role_tag']}' (tags.role_tag)")
    role = message[tags["role_tag"]]
    names = {tags[t]: ROLE_OF[t] for t in allowed if tags.get(t)}
    if role not in names:
        expected = ", ".join(f"'{n}'" for n in names) or "none (the tags name no such role)"
        raise RowError(
            f"message {i} in column '{column}' has role '{role}' where LLaMA-Factory expects {expected} "
            "(user / observation turns at odd places, assistant / function turns at even ones)"
        )
    rest = {k: v for k, v in message.items() if k not in (tags["role_tag"], tags["content_tag"])}
    return {**rest, "role": names[role], "content": message.get(tags["content_tag"])}


ODD = ("user_tag", "observation_tag")
EVEN = ("assistant_tag", "function_tag")


def _sharegpt(entry: Entry, row: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """(the aligned turns, the system prompt) of a sharegpt row, as LLaMA-Factory's
    SharegptDatasetConverter aligns them (a wrong role or count is a ``RowError``)."""
    column, tags = entry.column["messages"], entry.tag
    messages = row.get(column)
    if isinstance(messages, str) and messages.lstrip().startswith("["):  # a csv cell holding JSON
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as err:
            raise RowError(f"column '{column}' holds malformed JSON ({err.msg})") from None
    if not isinstance(messages, list):
        raise RowError(f"column '{column}' should be a list of messages, got {type(messages).__name__}")
    system = _text(row, entry.column.get("system"))
    first = messages[0] if messages else None
    if (
        tags.get("system_tag")
        and isinstance(first, dict)
        and first.get(tags["role_tag"]) == tags["system_tag"]
    ):
        system, messages = str(first.get(tags["content_tag"]) or ""), messages[1:]
    turns = [_turn(entry, m, i, column, (ODD, EVEN)[i % 2]) for i, m in enumerate(messages)]
    if (len(turns) % 2 != 0) != entry.ranking:
        want = "an odd" if entry.ranking else "an even"
        raise RowError(
            f"column '{column}' has {len(turns)} turns after the system one; {want} count is expected"
        )
    return turns, system


def convert(entry: Entry, kind: str, row: dict[str, Any]) -> dict[str, Any]:
    """One row of the entry's file as a row of ``kind`` data in hydratune's canonical shape."""
    col = entry.column
    if entry.pretraining:
        return {"text": _text(row, col["prompt"])}
    if entry.formatting == "alpaca":
        prompt, response = _alpaca(entry, row)
        system = _text(row, col.get("system"))
    else:
        turns, system = _sharegpt(entry, row)
        prompt, response = (turns, []) if entry.ranking else (turns[:-1], turns[-1:])
    lead = [{"role": "system", "content": system}] if system else []
    media = {"images": row.get(col["images"])} if "images" in col else {}  # the data option reads them
    if kind == "preference":
        out = {"prompt": lead + prompt, **media}
        for name in ("chosen", "rejected"):
            value = row.get(col[name])
            if entry.formatting == "sharegpt":
                out[name] = [_turn(entry, value, len(prompt), col[name], EVEN)]
            elif isinstance(value, str) and value.strip():
                out[name] = [{"role": "assistant", "content": value}]
            else:
                raise RowError(f"column '{col[name]}' should hold the {name} response as text")
        return out
    if kind == "unpaired":
        return {"prompt": lead + prompt, "completion": response, "label": row.get(col["kto_tag"])}
    if kind == "prompts":
        out = {"prompt": lead + prompt}
        if response:
            out["answer"] = str(response[0].get("content") or "")
        return out
    out = {"messages": lead + prompt + response, **media}
    if "tools" in col:
        out["tools"] = row.get(col["tools"])
    return out


def columns_of(entry: Entry, kind: str) -> list[str]:
    """The canonical columns :func:`convert` gives rows of ``kind``."""
    if entry.pretraining:
        return ["text"]
    media = ["images"] if "images" in entry.column else []
    return {
        "preference": ["prompt", "chosen", "rejected", *media],
        "unpaired": ["prompt", "completion", "label"],
        "prompts": [
            "prompt",
            *(["answer"] if "response" in entry.column or entry.formatting == "sharegpt" else []),
        ],
    }.get(kind, ["messages", *(["tools"] if "tools" in entry.column else []), *media])


def wrap(entry: Entry, tables: list[Table], kind: str, report: Any) -> list[Table]:
    """``tables`` (the entry's file) read as the entry says: each row converted by :func:`convert` before the
    data option's own conversion (``Table.prepare``), the columns it reads named and the others listed as
    ignored. A column the entry maps and a file lacks is refused naming both."""
    mapped = dict(entry.columns)
    for table in tables:
        present = table.columns
        missing = [f"{ours}={theirs}" for ours, theirs in mapped.items() if theirs not in present]
        needed = [
            m for m in missing if m.split("=")[0] in ("messages", "response", "prompt", "chosen", "rejected")
        ]
        if needed:
            raise ConfigError(
                f"{table.source} has no column '{needed[0].split('=')[1]}' ({INFO} entry '{entry.name}': "
                f"columns.{needed[0]}; columns: {', '.join(present)})",
                key="data.subset",
                hint=f"fix the entry's columns in {entry.root / INFO}",
            )
        report.account(
            [f"{theirs} (LLaMA-Factory {ours})" for ours, theirs in mapped.items() if theirs in present],
            [f"{c} (not in the {INFO} entry)" for c in present if c not in mapped.values()],
        )
        table.prepare = functools.partial(convert, entry, kind)
        table.columns = columns_of(entry, kind)
        table.shape = "explicit" if kind == "preference" else None
        table.image_dir = entry.root  # LLaMA-Factory's media_dir defaults to the dataset dir
    report.info[INFO] = entry.describe()
    return tables
