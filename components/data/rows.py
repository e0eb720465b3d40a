"""The shapes rows take on the data path (messages, rows, the load's report and splits) and the constants
every stage reads: formats and their columns, roles, message keys, task columns, default eval share."""

from __future__ import annotations

import functools
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydratune.components.config.ranges import Range
from hydratune.components.data.file_bytes import BUILDERS, COMPRESSIONS
from hydratune.components.distributed.workers import Workers

if TYPE_CHECKING:
    from datasets import Dataset


# files a hub dataset or a save_to_disk folder carries beside its data (never read as rows)
METADATA_FILES = {"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json", "config.json"}
# Suffixes that mark a path as a file (so it must exist) even without ./ or / in front of it.
FILE_SUFFIXES = {
    *BUILDERS,
    *(".txt", ".tsv", ".md", ".yaml", ".yml", ".xml", ".html", ".feather", ".orc", ".avro"),
    *(".xls", ".xlsx", ".pkl", ".pickle", ".npy", ".npz", *COMPRESSIONS, ".zip", ".tar"),
}
SPLIT_KEYWORDS = {  # the hub's split names in file and folder names (datasets.data_files.SPLIT_KEYWORDS)
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
SEP = "-._ 0-9"  # what may stand beside a split keyword in a name (datasets.data_files.NON_WORDS_CHARS)
SHARDED = re.compile(r"^data/(\w+(?:\.\w+)*)-\d{5}-of-\d{5}[^/]*\.[^/]*$")  # data/<split>-00000-of-00002.*
EVAL_SPLITS = ("validation", "test")  # the eval set of a folder split by name, in order of preference
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # name or org/name
FORMATS = ("auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text")
SIGNATURES = {  # the columns that identify each format (alpaca's ``input``, ``system``, ``history`` optional)
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}
# every column each format reads (``system`` becomes the leading system turn; ``tools`` go with messages)
FORMAT_COLUMNS = {
    "messages": ("messages", "system", "tools"),
    "sharegpt": ("conversations", "system", "tools"),
    "alpaca": ("instruction", "input", "output", "system", "history"),
    "prompt_completion": ("prompt", "completion", "system"),
    "text": ("text",),
}
# the formats whose rows are a prompt and its completion: their rows also carry ``completion_turns`` (how many
# of the last turns are the completion), which recipe.completion_only_loss trains alone
COMPLETION_FORMATS = ("alpaca", "prompt_completion")
ROLES = ("system", "user", "assistant", "tool")
# ShareGPT's and LLaMA-Factory's role names (a function_call turn is the assistant's tool call, its
# observation a tool turn); data.roles adds or overrides names
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "observation": "tool", "function_call": "assistant"}
TURN_KEYS = (("role", "content"), ("from", "value"))  # OpenAI-style and ShareGPT-style turns
TOOL_TURN_KEYS = ("tool_call_id", "name")  # kept on tool turns (which call each result answers)
#: per-turn training flags, in the shapes fine-tuning data carries them: OpenAI's fine-tuning format (and
#: ShareGPT files) ``"weight": 0 | 1``, Axolotl's ``"training"`` (or ``"train"``) ``true | false``. Chat
#: data honours them on assistant turns (a flagged-off turn is kept as context, its tokens untrained: the
#: turn is stored with ``"train": false``); LLaMA-Factory's files carry none
TRAIN_FLAG_KEYS = ("weight", "training", "train")
#: an assistant turn's reasoning (DeepSeek-R1 / Qwen3 ``reasoning_content``; also ``reasoning``,
#: ``thinking``): stored as ``reasoning_content``, the key chat templates render (data.keep_reasoning)
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
PREFERENCE_FORMATS = ("auto", "explicit", "implicit", "hh")
PREFERENCE_SIGNATURES = {
    "explicit": "prompt + chosen + rejected (responses: text or assistant messages)",
    "implicit": "chosen + rejected message lists that start with the same turns (the prompt)",
    "hh": "chosen + rejected transcripts as '\\n\\nHuman: ... \\n\\nAssistant: ...' text",
}
CHAT_TOOLS_COLUMN = "tools"  # chat data: the tool schemas (JSON) rendered with the conversation
HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):[ \t]?")
# Columns that mark rows for another task: (what the rows are, what to do instead). A run whose data option
# does not read one stops before the model loads, unless data.ignore_columns names it (``task_columns``).
TASK_COLUMNS = {
    "label": (
        "unpaired preference feedback (KTO: a completion and whether it is good), which would train every "
        "completion, the label=false ones too",
        "use recipe=kto",
    ),
    "tools": (
        "tool definitions, which only chat messages (a messages or conversations column) take along",
        "put the tools beside a messages column",
    ),
    **dict.fromkeys(
        ("images", "image"),
        (
            "images for a vision-language model, which this run would not see (the text alone trained)",
            "use a model that takes images, or data.images=true",
        ),
    ),
    "chosen": ("preference pairs", "use recipe=dpo or recipe=reward"),
    "rejected": ("preference pairs", "use recipe=dpo or recipe=reward"),
    **dict.fromkeys(
        ("score", "scores", "rating", "ratings"),
        (
            "scored or rated responses (reward / ranking data), whose scores nothing would read",
            "pair the better and worse responses as chosen/rejected for recipe=reward or recipe=dpo",
        ),
    ),
}
#: the eval rows held out of data.path when neither data.eval_path, data.eval_size nor data.eval_fraction is
#: set: this share of the rows, at most DEFAULT_EVAL_ROWS (so that evaluating them cannot dominate a run)
DEFAULT_EVAL_FRACTION = 0.05
DEFAULT_EVAL_ROWS = 1000
PACKING_STRATEGIES = ("bfd", "bfd_split", "wrapped")
ON_ERROR = ("raise", "skip")
ON_OVERLONG = ("truncate", "drop", "error")
Messages = list[dict[str, Any]]
Row = dict[str, Any]
Pair = tuple[Messages, "str | None"]  # (the prompt turns, the reference answer or None)


@dataclass
class LoadReport:
    """What one load did, for the run's summary: rows dropped by reason (``stats``), how the data was read
    (``info``: the format, where the eval rows came from), and the first skipped row's error."""

    stats: dict[str, int] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    first_skip: str | None = None
    used: dict[str, None] = field(default_factory=dict)  # the columns read, as the files name them
    ignored: dict[str, None] = field(default_factory=dict)  # the columns not read, and why
    mixture: dict[str, int] = field(default_factory=dict)  # data.mixture[i] -> the train rows it gave
    # rows the conversion flagged (``CHAT_FLAGS``: a leading system turn, tool calls...), summed over the
    # files: what the later checks look for, so they read the rows only when there is something to find
    flags: dict[str, int] = field(default_factory=dict)
    # message keys not used (``parse_turn``'s ``TURN_NOTES``) -> the rows that have them
    keys: dict[str, int] = field(default_factory=dict)

    def account_keys(self, keys: Mapping[str, int]) -> None:
        """Add the rows naming each message key not used; ``info`` lists them ("none" when none)."""
        for key, n in keys.items():
            self.keys[key] = self.keys.get(key, 0) + n
        shown = ", ".join(f"{k} ({n:,} rows)" for k, n in self.keys.items())
        self.info["message keys ignored"] = shown or "none"

    def account(self, used: list[str], ignored: list[str]) -> None:
        """Add one file's used and ignored columns; ``info`` lists them all (the summary, ``mode=plan``)."""
        self.used.update(dict.fromkeys(used))
        self.ignored.update(dict.fromkeys(ignored))
        self.info["columns used"] = ", ".join(self.used) or "none"
        self.info["columns ignored"] = ", ".join(self.ignored) or "none"


class LoadedData(Mapping[str, "Dataset"]):
    """The train/eval splits of one ``load()`` (``data["train"]``, ``data["eval"]``), its report, and
    whether its rows carry images (``has_images``: what every recipe branches on)."""

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

    @functools.cached_property
    def has_images(self) -> bool:
        """Whether the train rows carry images (an image in any row's ``images`` list, no image decoded),
        read once from the rows themselves: image rows go to a vision-language model's processor batch by
        batch (SFT makes no tokens of them, DPO and GRPO hand the trainer the processor), and a recipe
        that takes none refuses them. The one test of image rows every recipe reads."""
        from hydratune.components.data.images import rows_have_images

        return rows_have_images(self.splits["train"])


_SCRATCH: list[tempfile.TemporaryDirectory[str]] = []


def scratch_workers() -> Workers:
    """Workers for a load outside a run (tests, a notebook): one process, no progress, the Arrow shards in
    a dir of their own under a temporary dir removed when the process exits."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.TemporaryDirectory(prefix="hydratune-data-"))
    return Workers(Path(tempfile.mkdtemp(dir=_SCRATCH[0].name)), num_proc=1, show_progress=False)


# ------------------------------------------------------------------------------------- shared source


#: the shortest data.max_length that holds a chat-formatted prompt and an answer
MIN_MAX_LENGTH = 16
#: data.max_length's range (examples cut to a handful of tokens keep no answer token: nothing would train)
MAX_LENGTH = Range(MIN_MAX_LENGTH)
MAX_LENGTH_HINT = "tokens: room for a prompt and its answer, e.g. 1024 (mode=plan shows the longest)"


def add_count(stats: dict[str, int], key: str, n: int = 1) -> None:
    stats[key] = stats.get(key, 0) + n
