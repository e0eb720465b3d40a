"""Data components: local files or hub datasets, normalised to one canonical shape per recipe family.

- ``ChatDataset`` (SFT): ``messages`` (a list of ``{"role", "content"}`` turns) plus ``answer`` (the content
  of the last assistant turn), or ``text`` alone (language modelling). ShareGPT ``conversations``
  (``{"from", "value"}`` turns), alpaca and prompt/completion rows become the same turns.
- ``PreferenceDataset`` (reward, DPO): ``prompt``/``chosen``/``rejected`` as message lists, from explicit
  pairs, from two conversations that share their leading turns (UltraFeedback) or from Anthropic HH
  transcripts; the shared turns become the prompt, so no token is in both the prompt and a response.
- ``PromptDataset`` (PPO, GRPO): ``prompt`` as a message list, plus ``answer`` when the file has one.

All three share one loader (``read_sources``), one column mapping (``Source.read``) and one seeded
train/eval split (``Source.load_splits``). Rows are converted one by one, so an error names the file, the
line (JSON lines) or row, and the column. ``on_error=skip`` drops bad rows instead and counts them
(``stats``, shown in the run's summary, with ``info``: the format used and where the eval rows came from).
When the first rows all fail the same way, the error says the format or mapping does not fit the file.

A component is its config: ``load()`` returns the splits as :class:`LoadedData`, which carries that load's
report (the counts and how the data was read); nothing is kept on the component.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from components.config.errors import ConfigError
from components.config.registry import component

if TYPE_CHECKING:
    from datasets import Dataset

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
# Suffixes that mark a path as a file (so it must exist) even without ./ or / in front of it.
FILE_SUFFIXES = {
    *BUILDERS,
    *(".txt", ".tsv", ".md", ".yaml", ".yml", ".xml", ".html", ".arrow", ".feather", ".orc", ".avro"),
    *(".xls", ".xlsx", ".pkl", ".pickle", ".npy", ".npz", ".gz", ".bz2", ".xz", ".zst", ".zip", ".tar"),
}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # name or org/name
FORMATS = ("auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text")
SIGNATURES = {  # the columns that identify each format (alpaca's ``input`` and ``system`` are optional)
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}
ROLES = ("system", "user", "assistant", "tool")
# ShareGPT's and LLaMA-Factory's role names (a function call is the assistant's text, its result a tool
# turn); data.roles adds or overrides names
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "observation": "tool", "function_call": "assistant"}
TURN_KEYS = (("role", "content"), ("from", "value"))  # OpenAI-style and ShareGPT-style turns
PREFERENCE_FORMATS = ("auto", "explicit", "implicit", "hh")
PREFERENCE_SIGNATURES = {
    "explicit": "prompt + chosen + rejected (responses: text or assistant messages)",
    "implicit": "chosen + rejected message lists that start with the same turns (the prompt)",
    "hh": "chosen + rejected transcripts as '\\n\\nHuman: ... \\n\\nAssistant: ...' text",
}
HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):[ \t]?")
PROBE_ROWS = 5  # when this many first rows (or all, if fewer) fail alike, the format or mapping is wrong
PACKING_STRATEGIES = ("bfd", "bfd_split", "wrapped")
ON_ERROR = ("raise", "skip")
ON_OVERLONG = ("truncate", "drop", "error")
Messages = list[dict[str, str]]
Row = dict[str, Any]
Pair = tuple[Messages, "str | None"]  # (the prompt turns, the reference answer or None)


@dataclass
class LoadReport:
    """What one load did, for the run's summary: rows dropped by reason (``stats``), how the data was read
    (``info``: the format, where the eval rows came from), and the first skipped row's error."""

    stats: dict[str, int] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    first_skip: str | None = None


class LoadedData(Mapping[str, "Dataset"]):
    """The train/eval splits of one ``load()`` (``data["train"]``, ``data["eval"]``) and its report."""

    def __init__(self, splits: dict[str, Dataset], report: LoadReport) -> None:
        self.splits, self.report = dict(splits), report

    def __getitem__(self, name: str) -> Dataset:
        return self.splits[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.splits)

    def __len__(self) -> int:
        return len(self.splits)

    @property
    def stats(self) -> dict[str, int]:
        """Rows dropped, by reason."""
        return self.report.stats

    @property
    def info(self) -> dict[str, str]:
        """How the data was read: the format used, where the eval rows came from."""
        return self.report.info


class RowError(ValueError):
    """A problem with one row; the loader adds the file and line/row (or skips it with on_error=skip).
    ``key`` and ``hint`` name the knob that fixes it when every row has the problem."""

    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.key, self.hint = key, hint


# ---------------------------------------------------------------------------------------------- paths


def looks_local(path: str) -> bool:
    """A filesystem path rather than a hub dataset id (``name`` or ``org/name``)."""
    return (
        path.startswith(("/", ".", "~"))
        or os.path.exists(os.path.expanduser(path))
        or Path(path).suffix.lower() in FILE_SUFFIXES
        or not HUB_ID.match(path)
    )


def data_files(path: Path) -> list[Path]:
    """The loadable files of a local file or directory (recursively, hidden ones skipped), sorted."""
    if path.is_file():
        return [path]
    files = (f for f in path.rglob("*") if f.is_file() and f.suffix in BUILDERS)
    return sorted(f for f in files if not any(p.startswith(".") for p in f.relative_to(path).parts))


def check_path(path: str, key: str) -> None:
    """A local path must exist and be (or hold) files of a supported type; a hub id is left to ``load``."""
    if not path or path == "???":
        raise ConfigError("no dataset given", key=key, hint=f"set {key}=<file, directory or hub dataset>")
    if not looks_local(path):
        return
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(
            f"data file not found: {path}",
            key=key,
            hint="check the path (relative paths are relative to the directory you launch from)",
        )
    if p.is_file() and p.suffix not in BUILDERS:
        raise ConfigError(
            f"unsupported file type '{p.suffix}' for {path}",
            key=key,
            hint=f"use one of {', '.join(BUILDERS)} (or a directory of them, or a hub dataset name)",
        )
    if p.is_dir() and not data_files(p):
        raise ConfigError(f"no {', '.join(BUILDERS)} files in directory {path}", key=key)


# -------------------------------------------------------------------------------------------- reading


@dataclass
class Rows:
    """The rows of one file (or hub split) and where each came from, for error messages."""

    source: str
    rows: list[Row]
    lines: list[int] | None = None  # source line of each row (JSON lines)

    def where(self, i: int) -> str:
        """``file:line (row n)`` for JSON lines, else ``file, row n`` (rows count from 1, header excluded)."""
        if self.lines is not None:
            return f"{self.source}:{self.lines[i]} (row {i + 1})"
        return f"{self.source}, row {i + 1}"

    @property
    def columns(self) -> list[str]:
        """Every column any row has, in first-seen order."""
        seen: dict[str, None] = {}
        for row in self.rows:
            seen.update(dict.fromkeys(row))
        return list(seen)

    def head(self, n: int | None) -> Rows:
        if n is None:
            return self
        return Rows(self.source, self.rows[:n], None if self.lines is None else self.lines[:n])


def _count(stats: dict[str, int], key: str, n: int = 1) -> None:
    stats[key] = stats.get(key, 0) + n


def _bad_line(path: Path, line: int, problem: str, key: str, skip: bool, stats: dict[str, int]) -> None:
    if not skip:
        raise ConfigError(
            f"{path}:{line}: {problem}",
            key=key,
            hint="fix the line, or set data.on_error=skip to drop bad rows and count them",
        )
    _count(stats, "skipped rows")


def _json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _check_first_lines(path: Path, raw: bytes, key: str) -> None:
    """If none of the first ``PROBE_ROWS`` non-blank lines (all, if fewer) is a JSON object, the file is not
    JSON lines at all: say so instead of offering to skip (which would drop every line)."""
    head = [line for line in raw.splitlines() if line.strip()][:PROBE_ROWS]
    if head and not any(_json_object(line) for line in head):
        which = "the only line is" if len(head) == 1 else f"none of the first {len(head)} lines is"
        raise ConfigError(
            f"{path}: {which} a JSON object, so this is not JSON lines (one {{...}} object per line); "
            f"it starts {head[0][:60].decode('utf-8', 'replace')!r}",
            key=key,
            hint="write one JSON object per line (double quotes, not Python's single-quoted dicts), or a "
            ".json file holding one array of objects, or a .csv file with a header row",
        )


UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def without_bom(path: Path, raw: bytes, key: str) -> bytes:
    """The bytes after a UTF-8 byte order mark (Windows editors and Excel write one); UTF-16 is refused
    by name (its BOM would otherwise read as a malformed first line)."""
    if raw.startswith(UTF8_BOM):
        return raw[len(UTF8_BOM) :]
    if raw.startswith(UTF16_BOMS):
        raise ConfigError(
            f"{path} is UTF-16 text, not UTF-8",
            key=key,
            hint="re-encode the file as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8, or 'Save as UTF-8')",
        )
    return raw


def read_json_lines(path: Path, raw: bytes, *, key: str, skip: bool, stats: dict[str, int]) -> Rows:
    """JSON lines, parsed one line at a time so a bad line is reported by number (blank lines ignored;
    CRLF line ends are fine)."""
    if not skip:
        _check_first_lines(path, raw, key)
    rows, lines = [], []
    for number, line_bytes in enumerate(raw.splitlines(), start=1):
        try:
            line = line_bytes.decode("utf-8")
        except UnicodeDecodeError as err:
            _bad_line(path, number, f"not UTF-8 text (byte {err.start} of the line)", key, skip, stats)
            continue
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            _bad_line(path, number, f"malformed JSON ({err.msg}, column {err.colno})", key, skip, stats)
            continue
        if not isinstance(row, dict):
            _bad_line(path, number, f"expected a JSON object, got {type(row).__name__}", key, skip, stats)
            continue
        rows.append(row)
        lines.append(number)
    return Rows(str(path), rows, lines)


def _one_document(raw: bytes) -> bool:
    """Whether a ``.jsonl`` file is really one JSON document: an array, or an object spread over several
    lines (pretty-printed), that parses as a whole."""
    lines = raw.strip().splitlines()
    if not lines or lines[0][:1] not in (b"[", b"{"):
        return False
    if lines[0][:1] == b"{":
        try:
            json.loads(lines[0])
            return False  # a complete object on line 1: JSON lines
        except ValueError:
            pass
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def _not_utf8(path: Path, raw: bytes, err: UnicodeDecodeError, key: str) -> ConfigError:
    line = raw.count(b"\n", 0, err.start) + 1
    return ConfigError(f"{path}:{line}: not UTF-8 text", key=key, hint="re-encode the file as UTF-8")


def read_json(path: Path, *, key: str, skip: bool, stats: dict[str, int]) -> Rows:
    """A ``.jsonl`` file, or a ``.json`` file holding a list of objects, a dict of equal-length columns, a
    dict with one list of objects (``{"data": [...]}``) or, despite its name, JSON lines. A UTF-8 BOM is
    skipped; a ``.jsonl`` file that is one JSON document (e.g. a pretty-printed array) is read as one."""
    raw = without_bom(path, path.read_bytes(), key)
    if path.suffix == ".jsonl" and not _one_document(raw):
        return read_json_lines(path, raw, key=key, skip=skip, stats=stats)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _not_utf8(path, raw, err, key) from None
    if not text.strip():
        return Rows(str(path), [])
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # one object per line in a .json file
            return read_json_lines(path, raw, key=key, skip=skip, stats=stats)
        raise ConfigError(
            f"{path}:{err.lineno}: malformed JSON ({err.msg}, column {err.colno})", key=key
        ) from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1 and all(isinstance(r, dict) for r in lists[0]):
            data = lists[0]
        elif data and len(lists) == len(data) and len({len(v) for v in lists}) == 1:
            data = [dict(zip(data, values, strict=True)) for values in zip(*lists, strict=True)]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ConfigError(
            f"{path} is not a list of JSON objects (nor JSON lines)",
            key=key,
            hint='use one object per line, or [{"messages": [...]}, ...]',
        )
    return Rows(str(path), data)


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from, outermost first."""
    chain: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _to_rows(table: Dataset, limit: int | None) -> list[Row]:
    if limit is not None and limit < len(table):
        table = table.select(range(limit))
    return table.to_list()


def read_table(path: Path, *, key: str, limit: int | None = None) -> Rows:
    """A ``.csv`` or ``.parquet`` file through ``datasets.load_dataset`` (a csv's UTF-8 is checked first, so
    a bad byte is reported with its line). Quoted csv fields may span lines; a BOM is skipped, and in a
    file with CRLF line ends the line breaks inside fields become ``\\n`` too."""
    import datasets

    crlf = False
    if path.suffix == ".csv":
        raw = without_bom(path, path.read_bytes(), key)
        crlf = b"\r\n" in raw
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _not_utf8(path, raw, err, key) from None
        if not raw.strip():
            return Rows(str(path), [])
    try:
        table = datasets.load_dataset(BUILDERS[path.suffix], data_files=[str(path)], split="train")
    except Exception as err:
        chain = _chain(err)
        if "corresponds to no data" in str(err) or any(type(e).__name__ == "EmptyDataError" for e in chain):
            return Rows(str(path), [])
        raise ConfigError(
            f"cannot read {path}: {_first_line(chain[-1])}",
            key=key,
            hint=f"check that it is a valid {path.suffix[1:]} file",
        ) from None
    rows = _to_rows(table, limit)
    if crlf:
        rows = [{k: v.replace("\r\n", "\n") if isinstance(v, str) else v for k, v in r.items()} for r in rows]
    return Rows(str(path), rows)


def read_hub(name: str, *, split: str, subset: str | None, key: str, limit: int | None = None) -> Rows:
    """One split of a Hugging Face Hub dataset (or of one already in the local datasets cache)."""
    import datasets

    try:
        table = datasets.load_dataset(name, subset, split=split)
    except Exception as err:
        what = f"'{name}'" + (f" (subset '{subset}')" if subset else "") + f", split '{split}'"
        raise ConfigError(
            f"could not load hub dataset {what}: {_first_line(err)}. Offline (no network, or "
            "HF_HUB_OFFLINE=1) only datasets already in the local cache can be loaded",
            key=key,
            hint="point the path at a local .jsonl/.json/.parquet/.csv file or directory, or run once "
            "with network access to cache the dataset",
        ) from None
    return Rows(f"{name}[{split}]", _to_rows(table, limit))


def read_sources(
    path: str,
    *,
    key: str,
    split: str = "train",
    subset: str | None = None,
    limit: int | None = None,
    skip: bool = False,
    stats: dict[str, int] | None = None,
) -> list[Rows]:
    """The rows of a local file, a directory (one ``Rows`` per file) or a hub dataset; at most ``limit``
    rows in all. No rows at all is an error naming the path."""
    stats = {} if stats is None else stats
    check_path(path, key)
    sources: list[Rows] = []
    if looks_local(path):
        left = limit
        for file in data_files(Path(path).expanduser()):
            if left is not None and left <= 0:
                break
            if BUILDERS[file.suffix] == "json":
                source = read_json(file, key=key, skip=skip, stats=stats).head(left)
            else:
                source = read_table(file, key=key, limit=left)
            sources.append(source)
            left = None if left is None else left - len(source.rows)
    else:
        sources.append(read_hub(path, split=split, subset=subset, key=key, limit=limit))
    if not any(s.rows for s in sources):
        raise ConfigError(
            f"{path} holds no rows" + (" that could be read" if stats.get("skipped rows") else ""),
            key=key,
            hint="check the file (or data.split for a hub dataset)",
        )
    return [s for s in sources if s.rows]


# ------------------------------------------------------------------------------------ row conversion


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


def role_names(roles: dict[str, str] | None = None) -> dict[str, str]:
    """Every role name a turn may carry -> the canonical role: ours, ShareGPT's, then ``data.roles``."""
    return {r: r for r in ROLES} | ROLE_ALIASES | dict(roles or {})


def parse_turn(message: Any, i: int, column: str, names: dict[str, str]) -> dict[str, str]:
    """One ``{"role", "content"}`` or ShareGPT ``{"from", "value"}`` turn as ``{"role", "content"}``."""
    keys = next(
        (k for k in TURN_KEYS if isinstance(message, dict) and k[0] in message and k[1] in message), None
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
    return {"role": names[name], "content": text_of(message, keys[1], required=False)}


def parse_messages(value: Any, column: str, roles: dict[str, str] | None = None) -> Messages:
    """A list of ``{"role", "content"}`` (or ShareGPT ``{"from", "value"}``) turns (a JSON string of one is
    parsed), reduced to ``role`` and ``content``, roles mapped to ours (``role_names``), content text."""
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
    return [parse_turn(message, i, column, names) for i, message in enumerate(value)]


def json_turns(value: Any) -> list[Any] | None:
    """``value`` as a list of turns if it is one, or a string holding one as JSON (a csv cell); else None."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, list) and value and all(isinstance(m, dict) for m in value) else None


def as_messages(value: Any, role: str, column: str, roles: dict[str, str] | None = None) -> Messages:
    """Text becomes one message of ``role`` (it must not be blank); a message list (or a JSON string of one)
    is checked."""
    if isinstance(value, str) and json_turns(value) is None:
        return [{"role": role, "content": text_of({column: value}, column)}]
    return parse_messages(value, column, roles)


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
    if chosen == rejected:
        raise RowError("'chosen' and 'rejected' are the same conversation")
    out: Row = {"prompt": chosen[:k]}
    for name, reply in (("chosen", chosen[k:]), ("rejected", rejected[k:])):
        user = next((j for j, m in enumerate(reply) if m["role"] == "user"), None)
        if user is not None:
            raise RowError(
                f"'chosen' and 'rejected' differ before their last user turn ('{name}' turn {k + user} is a "
                "user turn after the shared prompt)"
            )
        if not reply or reply[-1]["role"] != "assistant" or not reply[-1]["content"].strip():
            last = "missing" if not reply else f"a '{reply[-1]['role']}' turn"
            last = "an empty assistant turn" if reply and reply[-1]["role"] == "assistant" else last
            raise RowError(
                f"the last turn of '{name}' should be an assistant reply with content; it is {last}"
            )
        out[name] = reply
    return out


def last_answer(messages: Messages) -> int:
    """Index of the last assistant turn with content; a ``RowError`` if there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant" and messages[i]["content"].strip():
            return i
    raise RowError("no assistant turn with content (nothing to train on)")


# ------------------------------------------------------------------------------------- shared source


#: the shortest data.max_length that holds a chat-formatted prompt and an answer
MIN_MAX_LENGTH = 16


def check_max_length(max_length: int) -> None:
    """Examples cut to a handful of tokens keep no answer token: nothing would be trained."""
    if max_length < MIN_MAX_LENGTH:
        raise ConfigError(
            f"must be >= {MIN_MAX_LENGTH} tokens (room for a prompt and its answer), got {max_length}",
            key="data.max_length",
            hint="data.max_length=1024 (the longest examples' token count; see mode=plan)",
        )


@dataclass(frozen=True)
class Source:
    """Where rows come from, how bad rows are handled and how train/eval are split (every data option)."""

    #: the canonical column names ``columns`` may map (each component sets its own)
    CANONICAL: ClassVar[tuple[str, ...]] = ()
    #: what the rows hold (a recipe declares the kinds it reads: ``Recipe.data_kinds``)
    kind: ClassVar[str] = ""

    path: str = "???"  # local jsonl/json/parquet/csv file, a directory of them, or a hub dataset name
    eval_path: str | None = None  # a separate eval set; else eval_size / eval_fraction rows are held out
    split: str = "train"  # hub datasets: the split to load
    subset: str | None = None  # hub datasets: the config (subset) name
    columns: dict[str, str] = field(default_factory=dict)  # canonical name -> the file's column name
    eval_fraction: float = 0.05
    eval_size: int = 0  # rows held out for eval; 0 = use eval_fraction
    max_samples: int | None = None  # use only the first N rows of data.path (before the eval split)
    seed: int = 42
    on_error: str = "raise"  # raise | skip: drop malformed / incomplete rows and count them
    # your turns' role names -> system | user | assistant | tool, e.g. '{bot: assistant, me: user}'
    # (ShareGPT's human, gpt, observation and function_call are known already)
    roles: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        """Cheap checks (no ``datasets`` import): paths, ranges, enums, column-mapping keys."""
        check_path(self.path, "data.path")
        if self.eval_path:
            check_path(self.eval_path, "data.eval_path")
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"must be in [0, 1), got {self.eval_fraction}", key="data.eval_fraction")
        if self.eval_size is not None and self.eval_size < 0:
            raise ConfigError(f"must be >= 0, got {self.eval_size}", key="data.eval_size")
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"must be >= 1 or null, got {self.max_samples}", key="data.max_samples")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"unknown '{self.on_error}'", key="data.on_error", hint=f"one of {ON_ERROR}")
        unknown = [c for c in self.columns if c not in self.CANONICAL]
        if unknown:
            raise ConfigError(
                f"unknown column name '{unknown[0]}' for {type(self).__name__}",
                key="data.columns",
                hint=f"map from the canonical names ({', '.join(self.CANONICAL)}) to your file's columns, "
                f"e.g. data.columns='{{{self.CANONICAL[0]}: my_column}}'",
            )
        bad = next(((k, v) for k, v in self.roles.items() if v not in ROLES), None)
        if bad:
            raise ConfigError(
                f"role '{bad[0]}' is mapped to '{bad[1]}'",
                key="data.roles",
                hint=f"map each of your role names to one of {', '.join(ROLES)}, "
                "e.g. data.roles='{bot: assistant, me: user}'",
            )

    def whole(self) -> Source:
        """This option reading every row of data.path in file order (no eval split held out): what the
        inference recipes generate from."""
        return dataclasses.replace(self, eval_fraction=0.0, eval_size=0, eval_path=None)

    def pairs(self, data: LoadedData, split: str) -> list[Pair] | None:
        """(the prompt turns, the reference answer or None) per row of ``split``, for generation; None
        when the rows hold no prompt to complete (raw text, preference pairs)."""
        return None

    def prompt_limit(self) -> tuple[int, str, str]:
        """(the longest prompt in tokens, the key that sets it, what happens to longer ones) for the
        prompts generated from."""
        raise NotImplementedError

    def enforce_length(self, data: LoadedData, tokenizer: Any) -> LoadedData:
        """The length policy on loaded rows (here: none; the trainer truncates)."""
        return data

    def messages(self, value: Any, role: str, column: str) -> Messages:
        """``as_messages`` with this option's ``roles``."""
        return as_messages(value, role, column, self.roles)

    def formats_hint(self) -> str:
        """What this data option accepts (each component says), for errors about a whole file."""
        return (
            f"map your columns to {', '.join(self.CANONICAL)}, e.g. data.columns='{{{self.CANONICAL[0]}: q}}'"
        )

    def read(self, path: str, key: str, report: LoadReport, limit: int | None = None) -> list[Rows]:
        """The rows of ``path`` (at most ``limit``) with ``columns`` applied: each mapped column renamed to
        its canonical name. A mapped column the file lacks is an error listing the columns it has."""
        sources = read_sources(
            path,
            key=key,
            split=self.split,
            subset=self.subset,
            limit=limit,
            skip=self.on_error == "skip",
            stats=report.stats,
        )
        mapping = {theirs: ours for ours, theirs in self.columns.items() if theirs != ours}
        targets = set(mapping.values())
        for source in sources if mapping else []:
            present = source.columns
            missing = [theirs for theirs in mapping if theirs not in present]
            if missing:
                ours = mapping[missing[0]]
                raise ConfigError(
                    f"{source.source} has no column '{missing[0]}' (columns: {', '.join(present)})",
                    key="data.columns",
                    hint=f"map {ours} to one of those: data.columns='{{{ours}: <your column>}}'",
                )
            source.rows = [
                {k: v for k, v in row.items() if k not in targets and k not in mapping}
                | {ours: row[theirs] for theirs, ours in mapping.items() if theirs in row}
                for row in source.rows
            ]
        return sources

    def require(self, sources: list[Rows], needed: tuple[str, ...], why: str) -> None:
        """Every file must have the ``needed`` columns (a row may still lack a value: that is a row error)."""
        for source in sources:
            present = source.columns
            missing = [c for c in needed if c not in present]
            if missing:
                raise ConfigError(
                    f"{source.source} is missing the column '{missing[0]}' {why} "
                    f"(columns: {', '.join(present)})",
                    key="data.columns",
                    hint=f"map yours with data.columns='{{{missing[0]}: <your column>}}'",
                )

    def convert(
        self,
        sources: list[Rows],
        fn: Callable[[Row], Row],
        columns: tuple[str, ...],
        key: str,
        report: LoadReport,
    ) -> Dataset:
        """Map every row with ``fn`` into a table of exactly ``columns``. A ``RowError`` names the file and
        line/row, or (``on_error=skip``) drops the row and counts it; when the first rows all fail alike,
        the error says the format or mapping does not fit (skipping would drop every row)."""
        from datasets import Dataset

        if self.on_error == "raise":
            self.check_first_rows(sources[0], fn)
        out = []
        for source in sources:
            for i, row in enumerate(source.rows):
                try:
                    out.append(fn(row))
                except RowError as err:
                    if self.on_error == "skip":
                        _count(report.stats, "skipped rows")
                        report.first_skip = report.first_skip or f"{source.where(i)}: {err}"
                        continue
                    raise ConfigError(
                        f"{source.where(i)}: {err}",
                        key=key,
                        hint=(f"{err.hint}; or " if err.hint else "")
                        + "fix the row, or set data.on_error=skip to drop bad rows and count them",
                    ) from None
        return Dataset.from_list(out) if out else Dataset.from_dict({c: [] for c in columns})

    def check_first_rows(self, source: Rows, fn: Callable[[Row], Row]) -> None:
        """If the first ``PROBE_ROWS`` rows (all, if fewer) fail with the same error, the file does not fit
        the format or mapping: say so with the columns found, not "fix the row"."""
        errors: list[RowError] = []
        for row in source.rows[:PROBE_ROWS]:
            try:
                fn(row)
                return
            except RowError as err:
                errors.append(err)
        if len({str(e) for e in errors}) != 1:
            return
        first, n = errors[0], len(errors)
        which = "the only row fails" if len(source.rows) == 1 else f"the first {n} rows fail"
        which = f"all {n} rows fail" if 1 < n == len(source.rows) else which
        raise ConfigError(
            f"{source.source}: {which} the same way, so the data format or the column mapping does not "
            f"fit this file: {first} (columns: {', '.join(source.columns)})",
            key=first.key or "data.columns",
            hint=first.hint or self.formats_hint(),
        )

    def load_splits(self, build: Callable[[list[Rows], str, str], Dataset], report: LoadReport) -> LoadedData:
        """Train and eval tables; ``build(rows, path, key)`` normalises each file's rows. Without
        ``eval_path``, ``eval_size`` (or ``eval_fraction``) rows of data.path are held out, seeded.
        ``info["eval rows from"]`` says which."""
        from components.config.resolvers import is_demo_asset

        train = build(self.read(self.path, "data.path", report, self.max_samples), self.path, "data.path")
        if self.eval_path:
            evals = build(
                self.read(self.eval_path, "data.eval_path", report), self.eval_path, "data.eval_path"
            )
            demo = is_demo_asset(self.eval_path)
            report.info["eval rows from"] = (
                "the demo eval file" if demo else f"data.eval_path={self.eval_path}"
            )
        else:
            if self.eval_size:
                n = self.eval_size
                if n >= len(train):
                    raise ConfigError(
                        f"holding out {n} eval rows leaves no training rows ({self.path} has {len(train)})",
                        key="data.eval_size",
                        hint="hold out fewer rows, or give a separate data.eval_path",
                    )
            else:  # a fraction > 0 holds out at least one row, and never the last one
                n = (
                    min(max(1, round(len(train) * self.eval_fraction)), len(train) - 1)
                    if self.eval_fraction
                    else 0
                )
            if n:
                parts = train.train_test_split(test_size=n, seed=self.seed, shuffle=True)
                train, evals = parts["train"], parts["test"]
            else:
                evals = train.select([])
            share = f"data.eval_size={n}" if self.eval_size else f"{self.eval_fraction * 100:g}%"
            report.info["eval rows from"] = (
                f"{share} of data.path (seed {self.seed})" if n else "none (data.eval_fraction=0)"
            )
        return self._finish({"train": train, "eval": evals}, report)

    def _finish(self, splits: dict[str, Dataset], report: LoadReport) -> LoadedData:
        if len(splits["train"]) == 0:
            first = report.first_skip
            raise ConfigError(
                f"no training rows left in {self.path} after filtering"
                + (f" (every row was skipped; the first: {first})" if first else ""),
                key="data.path",
                hint="see the skipped / dropped counts; fix the data or relax data.on_overlong",
            )
        return LoadedData(splits, report)


# ------------------------------------------------------------------------------------------- SFT data


@component("data")
@dataclass(frozen=True)
class ChatDataset(Source):
    """SFT data: chat ``messages``, ShareGPT ``conversations``, alpaca, prompt/completion or raw ``text``,
    loaded as ``messages`` + ``answer`` (conversational) or ``text`` (language modelling)."""

    CANONICAL: ClassVar[tuple[str, ...]] = (
        *("messages", "conversations", "instruction", "input", "output", "prompt", "completion", "text"),
        "system",
    )
    kind: ClassVar[str] = "chat"

    format: str = "auto"  # auto | messages | sharegpt | alpaca | prompt_completion | text
    system_prompt: str | None = None  # prepended as a system turn to rows that have none
    max_length: int = 1024  # tokens per example (the trainer truncates; see on_overlong)
    on_overlong: str = "truncate"  # truncate | drop | error: rows longer than max_length tokens
    packing: bool = False
    packing_strategy: str = "bfd"  # bfd (best-fit, boundary-safe) | bfd_split | wrapped
    # each micro-batch flattened into one row (position_ids restart per example): no pad tokens, same
    # examples per step; ignored with packing (bfd packing is padding-free already)
    padding_free: bool = True

    def validate(self) -> None:
        super().validate()
        if self.format not in FORMATS:
            raise ConfigError(f"unknown format '{self.format}'", key="data.format", hint=f"one of {FORMATS}")
        if self.packing_strategy not in PACKING_STRATEGIES:
            raise ConfigError(
                f"unknown '{self.packing_strategy}'",
                key="data.packing_strategy",
                hint=f"one of {PACKING_STRATEGIES}",
            )
        check_max_length(self.max_length)
        if self.on_overlong not in ON_OVERLONG:
            raise ConfigError(
                f"unknown '{self.on_overlong}'", key="data.on_overlong", hint=f"one of {ON_OVERLONG}"
            )

    def formats_hint(self) -> str:
        accepted = "; ".join(f"{name}: {' + '.join(cols)}" for name, cols in SIGNATURES.items())
        return (
            f"formats accepted: {accepted}. Set data.format, or map your columns, e.g. "
            "data.columns='{messages: conversations}' or data.columns='{prompt: question, completion: reply}'"
        )

    def detect(self, columns: list[str], path: str, report: LoadReport) -> str:
        """``format``, or (``auto``) the one format whose columns the file has."""
        if self.format != "auto":
            report.info["format"] = self.format
            return self.format
        found = [name for name, needed in SIGNATURES.items() if all(c in columns for c in needed)]
        if len(found) == 1:
            report.info["format"] = f"{found[0]} (detected)"
            return found[0]
        accepted = "; ".join(f"{name}: {' + '.join(cols)}" for name, cols in SIGNATURES.items())
        problem = f"is ambiguous: it fits formats {', '.join(found)}" if found else "matches no format"
        raise ConfigError(
            f"{path} {problem} (columns: {', '.join(columns)}; formats accepted: {accepted})",
            key="data.format",
            hint="set data.format, or map your columns, e.g. data.columns='{messages: conversations}' "
            "or data.columns='{prompt: question, completion: reply}'",
        )

    def load(self) -> LoadedData:
        """Train/eval in the canonical shape: ``messages`` + ``answer``, or ``text``. The format is detected
        on data.path and applied to data.eval_path too."""
        fmt: str | None = None
        report = LoadReport()

        def build(sources: list[Rows], path: str, key: str) -> Dataset:
            nonlocal fmt
            kind = fmt = fmt or self.detect(sources[0].columns, path, report)
            self.require(sources, SIGNATURES[kind], f"needed by format={kind}")
            if kind == "text":
                return self.convert(
                    sources, lambda row: {"text": text_of(row, "text")}, ("text",), key, report
                )
            columns = ("messages", "answer")
            return self.convert(sources, lambda row: self.to_chat(row, kind), columns, key, report)

        return self.load_splits(build, report)

    def to_chat(self, row: Row, fmt: str) -> Row:
        """One row of format ``fmt`` as ``{"messages": [...], "answer": str}``. A ``system`` column, else
        ``system_prompt``, becomes a leading system turn unless the messages already start with one."""
        if fmt in ("messages", "sharegpt"):
            column = SIGNATURES[fmt][0]
            messages = parse_messages(row.get(column), column, self.roles)
        elif fmt == "alpaca":
            user = text_of(row, "instruction")
            extra = text_of(row, "input", required=False)
            messages = [
                {"role": "user", "content": f"{user}\n\n{extra}" if extra.strip() else user},
                {"role": "assistant", "content": text_of(row, "output")},
            ]
        else:
            messages = self.messages(row.get("prompt"), "user", "prompt")
            messages += self.messages(row.get("completion"), "assistant", "completion")
        system = text_of(row, "system", required=False) or self.system_prompt
        if system and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": system}, *messages]
        return {"messages": messages, "answer": messages[last_answer(messages)]["content"]}

    def enforce_length(self, data: LoadedData, tokenizer: Any) -> LoadedData:
        """Apply ``on_overlong`` to rows longer than ``max_length`` tokens (``truncate`` leaves them to the
        trainer, which cuts them; ``drop`` removes and counts them; ``error`` names the first)."""
        if self.on_overlong == "truncate":
            return data

        def length(row: Row) -> int:
            if "messages" in row:
                ids = tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True)
                return len(ids["input_ids"])
            return len(tokenizer(row["text"])["input_ids"])

        out = {}
        for name, table in data.items():
            lengths = [length(row) for row in table]
            long = {i for i, n in enumerate(lengths) if n > self.max_length}
            if long and self.on_overlong == "error":
                first = min(long)
                raise ConfigError(
                    f"{self.path} ({name}): row {first} has {lengths[first]} tokens > data.max_length="
                    f"{self.max_length} ({len(long)} such rows)",
                    key="data.max_length",
                    hint="raise data.max_length, or set data.on_overlong=truncate or drop",
                )
            if long:
                _count(data.stats, "dropped (too long)", len(long))
            out[name] = table.select([i for i in range(len(table)) if i not in long]) if long else table
        return self._finish(out, data.report)

    def prompt_limit(self) -> tuple[int, str, str]:
        return self.max_length, "data.max_length", self.on_overlong

    def pairs(self, data: LoadedData, split: str) -> list[Pair] | None:
        """(the conversation before the last assistant turn with content, that turn's content) per row of
        ``split``; None for raw-text data."""
        if "messages" not in data[split].column_names:
            return None
        out: list[Pair] = []
        for row in data[split]:
            messages = row["messages"]
            last = last_answer(messages)
            out.append((messages[:last], messages[last]["content"]))
        return out


# ------------------------------------------------------------------------------------ reward / DPO data


@component("data")
@dataclass(frozen=True)
class PreferenceDataset(Source):
    """Preference pairs for reward modelling and DPO, loaded as ``prompt``, ``chosen``, ``rejected`` message
    lists. ``explicit``: a prompt column and the two responses (text becomes one user / assistant message).
    ``implicit`` (UltraFeedback): ``chosen`` and ``rejected`` are whole conversations that start with the
    same turns; those turns are the prompt and the rest the responses, so no token is in both (a ``prompt``
    column is then not used). ``hh`` (Anthropic HH-RLHF): the same, from ``"\\n\\nHuman: ...
    \\n\\nAssistant: ..."`` transcripts."""

    CANONICAL: ClassVar[tuple[str, ...]] = ("prompt", "chosen", "rejected")
    kind: ClassVar[str] = "preference"

    format: str = "auto"  # auto | explicit | implicit (shared leading turns) | hh (Human:/Assistant: text)
    max_length: int = 1024  # tokens of prompt + response

    def prompt_limit(self) -> tuple[int, str, str]:
        return self.max_length, "data.max_length", "truncate"

    def validate(self) -> None:
        super().validate()
        if self.format not in PREFERENCE_FORMATS:
            raise ConfigError(
                f"unknown format '{self.format}'", key="data.format", hint=f"one of {PREFERENCE_FORMATS}"
            )
        check_max_length(self.max_length)

    def formats_hint(self) -> str:
        accepted = "; ".join(f"{name}: {what}" for name, what in PREFERENCE_SIGNATURES.items())
        return (
            f"formats accepted: {accepted}. Set data.format, or map your columns, e.g. "
            "data.columns='{prompt: question, chosen: good, rejected: bad}'"
        )

    def detect(self, row: Row, report: LoadReport) -> str:
        """``format``, or (``auto``) what the first row of data.path holds: HH transcripts, conversations
        that start with a non-assistant turn (implicit), else responses to a prompt column (explicit)."""
        if self.format != "auto":
            report.info["format"] = self.format
            return self.format
        chosen, fmt = row.get("chosen"), "explicit"
        if isinstance(chosen, str) and re.match(r"\s*Human:", chosen) and "\n\nAssistant:" in chosen:
            fmt = "hh"
        elif (turns := json_turns(chosen)) is not None:
            try:
                first = parse_messages(turns, "chosen", self.roles)[0]["role"]
            except RowError:
                first = "assistant"  # explicit's conversion names the problem
            fmt = "explicit" if first == "assistant" else "implicit"
        report.info["format"] = f"{fmt} (detected)"
        return fmt

    def to_pair(self, row: Row, fmt: str) -> Row:
        """One row of format ``fmt`` as ``prompt``/``chosen``/``rejected`` message lists."""
        if fmt == "explicit":
            return {
                "prompt": self.messages(row.get("prompt"), "user", "prompt"),
                "chosen": self.messages(row.get("chosen"), "assistant", "chosen"),
                "rejected": self.messages(row.get("rejected"), "assistant", "rejected"),
            }
        if fmt == "hh":
            return split_shared(
                hh_messages(row.get("chosen"), "chosen"), hh_messages(row.get("rejected"), "rejected")
            )
        return split_shared(
            self.messages(row.get("chosen"), "assistant", "chosen"),
            self.messages(row.get("rejected"), "assistant", "rejected"),
        )

    def load(self) -> LoadedData:
        """Train/eval with ``prompt``, ``chosen`` and ``rejected``, each a list of messages. The format is
        detected on data.path and applied to data.eval_path too."""
        fmt: str | None = None
        report = LoadReport()

        def build(sources: list[Rows], path: str, key: str) -> Dataset:
            nonlocal fmt
            kind = fmt = fmt or self.detect(sources[0].rows[0], report)
            needed = self.CANONICAL if kind == "explicit" else self.CANONICAL[1:]
            self.require(sources, needed, f"of a preference pair (format={kind})")
            return self.convert(sources, lambda row: self.to_pair(row, kind), self.CANONICAL, key, report)

        return self.load_splits(build, report)


# -------------------------------------------------------------------------------------- PPO/GRPO data


@component("data")
@dataclass(frozen=True)
class PromptDataset(Source):
    """Prompts for on-policy RL (PPO, GRPO): ``prompt`` messages and, when given, the reference ``answer``."""

    CANONICAL: ClassVar[tuple[str, ...]] = ("prompt", "answer")
    kind: ClassVar[str] = "prompts"

    max_prompt_length: int = 256  # tokens

    def validate(self) -> None:
        super().validate()
        if self.max_prompt_length < 1:
            raise ConfigError(f"must be >= 1, got {self.max_prompt_length}", key="data.max_prompt_length")

    def prompt_limit(self) -> tuple[int, str, str]:
        return self.max_prompt_length, "data.max_prompt_length", "truncate"

    def pairs(self, data: LoadedData, split: str) -> list[Pair] | None:
        """(the prompt turns, the ``answer`` column's text, or None without that column) per row."""
        table = data[split]
        answers = table["answer"] if "answer" in table.column_names else [None] * len(table)
        return list(zip(table["prompt"], answers, strict=True))

    def load(self) -> LoadedData:
        """Train/eval with ``prompt`` (messages) and, if data.path has the column, ``answer`` (text)."""
        has_answer: bool | None = None  # decided on data.path, so both splits have the same columns
        report = LoadReport()

        def to_prompt(row: Row) -> Row:
            out: Row = {"prompt": self.messages(row.get("prompt"), "user", "prompt")}
            if has_answer:
                out["answer"] = text_of(row, "answer")  # a blank / NaN reference is no reference
            return out

        def build(sources: list[Rows], path: str, key: str) -> Dataset:
            nonlocal has_answer
            self.require(sources, ("prompt",), "of a prompt dataset")
            if has_answer is None:
                has_answer = all("answer" in s.columns for s in sources)
            columns = ("prompt", "answer") if has_answer else ("prompt",)
            return self.convert(sources, to_prompt, columns, key, report)

        return self.load_splits(build, report)
