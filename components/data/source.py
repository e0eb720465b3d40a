"""The shared source of every data option (``Source``): local files or hub datasets, normalised to one
canonical shape per recipe family.

- ``ChatDataset`` (SFT, chats.py): ``messages`` (a list of ``{"role", "content"}`` turns) plus ``answer``, or
  ``text`` alone (language modelling); ShareGPT, alpaca and prompt/completion rows become the same turns.
- ``PreferenceDataset`` (reward, DPO, preferences.py): ``prompt``/``chosen``/``rejected`` message lists from
  explicit pairs, two conversations sharing their leading turns (UltraFeedback) or Anthropic HH transcripts.
- ``UnpairedPreferenceDataset`` (KTO): ``prompt``/``completion`` message lists and a boolean ``label``.
- ``PromptDataset`` (PPO, GRPO, prompts.py): ``prompt`` messages, plus ``answer`` when the file has one.

All of them share one loader (``layout.read_sources``), one column mapping (``Source.read``) and one seeded
train/eval split (``Source.load_splits``). Rows are converted one by one, so an error names the file, the
line (JSON lines) or row, and the column. ``on_error=skip`` drops bad rows instead and counts them. Every
column and message key is accounted for: the report lists the columns read and those ignored, and a column
that marks another task (``TASK_COLUMNS``) stops the load unless the option reads it or ``ignore_columns``
names it. A component is its config: ``load()`` returns the splits as ``LoadedData`` with that load's report.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, SEED, knob
from hydratune.components.data import duplicates
from hydratune.components.data.duplicates import DEDUP
from hydratune.components.data.formats import as_messages
from hydratune.components.data.images import IMAGE_COLUMNS, RowImages, TableImages, check_combination
from hydratune.components.data.layout import (
    Layout,
    Part,
    check_path,
    entry_layout,
    local_layout,
    looks_local,
    read_sources,
)
from hydratune.components.data.mixture import EVAL_KNOBS, load_mixture, mixture_entries
from hydratune.components.data.readers import PROBE_ROWS, RowError, Table
from hydratune.components.data.rows import (
    DEFAULT_EVAL_FRACTION,
    DEFAULT_EVAL_ROWS,
    ON_ERROR,
    ROLES,
    TASK_COLUMNS,
    LoadedData,
    LoadReport,
    Messages,
    Pair,
    Row,
    add_count,
)
from hydratune.components.data.tables import (
    MESSAGE_COLUMNS,
    Converted,
    convert_one,
    convert_range,
    empty_rows,
    pick,
    prepared,
    stores_json_turns,
    with_json_turns,
)
from hydratune.components.distributed.workers import Workers, open_shards

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from datasets import Dataset


@dataclass(frozen=True)
class Source:
    """Where rows come from, how bad rows are handled and how train/eval are split (every data option)."""

    #: the canonical column names ``columns`` may map (each component sets its own)
    CANONICAL: ClassVar[tuple[str, ...]] = ()
    #: what the rows hold (a recipe declares the kinds it reads: ``Recipe.data_kinds``)
    kind: ClassVar[str] = ""
    #: whether this option reads image rows (``data.images``; components/data/images.py)
    reads_images: ClassVar[bool] = False

    path: str = "???"  # local jsonl/json/parquet/csv file, a directory of them, or a hub dataset name
    eval_path: str | None = None  # a separate eval set; else eval_size / eval_fraction rows are held out
    # the split to read: a hub dataset's, a save_to_disk DatasetDict's or a folder's split-named files
    split: str = "train"
    subset: str | None = None  # hub datasets: the config (subset) name; a LLaMA-Factory dir: the entry
    columns: dict[str, str] = field(default_factory=dict)  # canonical name -> the file's column name
    # the share of data.path's rows held out for eval; null (the default): 5%, at most 1,000 rows
    eval_fraction: float | None = knob(None, FRACTION)
    eval_size: int = knob(0, NON_NEGATIVE)  # rows held out for eval; 0 = use eval_fraction
    # use only the first N rows of data.path (before the eval split)
    max_samples: int | None = knob(None, AT_LEAST_ONE)
    seed: int = knob(42, SEED)
    on_error: str = "raise"  # raise | skip: drop malformed / incomplete rows and count them
    # your turns' role names -> system | user | assistant | tool, e.g. '{bot: assistant, me: user}'
    # (ShareGPT's human, gpt, observation and function_call are known already)
    roles: dict[str, str] = field(default_factory=dict)
    # your columns this run does not read, on purpose: a column that marks another task (label beside
    # prompt/completion, tools without messages, score/rating, chosen/rejected) stops the run otherwise
    ignore_columns: list[str] = field(default_factory=list)
    # several sources in one train set, each {path, weight (a fraction of its rows) or rows (a count), and
    # any of PER_SOURCE}, e.g. [{path: a.jsonl, weight: 0.7}, {path: b.json, rows: 500, format: alpaca}]
    mixture: list[dict[str, Any]] = field(default_factory=list)
    # the prepared data (rows, tokens) written once under cache_dir and memory-mapped by later runs, ranks
    # and sweep points (components/runtime/datacache.py); false: prepared again by every run and rank
    cache: bool = True
    # null: $HYDRATUNE_DATA_CACHE, else $HYDRATUNE_CACHE/data (~/.cache/hydratune/data); a relative dir is
    # the working dir's
    cache_dir: str | None = None
    # processes preparing the data (reading, masking, tokenizing); null: the cores this process may use
    num_proc: int | None = knob(None, AT_LEAST_ONE)
    # read data.path lazily, row by row while training (corpora larger than memory or disk): SFT only,
    # with train.max_steps; eval rows: data.eval_path, or the stream's own first rows; never cached
    # (data.cache has no effect). docs/data.md, "Streaming"
    streaming: bool = False
    # image rows (content parts, an images column, <image> placeholders; docs/data.md, "Images"): null
    # follows the model (a model component that declares accepts_images), false refuses image parts as a
    # text model must, true reads them
    images: bool | None = None
    # images with more pixels than this are downsized (aspect kept) while the rows are prepared; null: kept
    image_max_pixels: int | None = knob(None, AT_LEAST_ONE)
    # exact duplicate rows (components/data/duplicates.py), always counted: split (a row and its copies on
    # one side of the held-out train/eval split; an eval file's copies of train rows named) | drop (every
    # copy after the first dropped, and an eval file's copies of train rows, counted) | count (named only)
    dedup: str = "split"

    def validate(self) -> None:
        """Cheap checks (no ``datasets`` import): paths, enums, column-mapping keys (the knobs' ranges:
        ``check_values``; a mixture entry's: here)."""
        from hydratune.components.data import llamafactory

        if self.mixture:
            mixture_entries(self)  # each entry's path and knobs, checked as data.mixture[i].<knob>
        elif not llamafactory.check(self):  # a LLaMA-Factory dataset dir: its dataset_info.json entry
            check_path(self.path, "data.path", self.split, separate_eval=bool(self.eval_path))
        if self.eval_path:
            check_path(self.eval_path, "data.eval_path", None)
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"unknown '{self.on_error}'", key="data.on_error", hint=f"one of {ON_ERROR}")
        if self.dedup not in DEDUP:
            raise ConfigError(f"unknown '{self.dedup}'", key="data.dedup", hint=f"one of {', '.join(DEDUP)}")
        known = (*self.CANONICAL, *(IMAGE_COLUMNS if self.reads_images else ()))
        unknown = [c for c in self.columns if c not in known]
        if unknown:
            raise ConfigError(
                f"unknown column name '{unknown[0]}' for {type(self).__name__}",
                key="data.columns",
                hint=f"map from the canonical names ({', '.join(self.CANONICAL)}) to your file's columns, "
                f"e.g. data.columns='{{{self.CANONICAL[0]}: my_column}}'",
            )
        mapped = next((c for c in self.ignore_columns if c in self.columns.values()), None)
        if mapped:
            raise ConfigError(
                f"'{mapped}' is both mapped (data.columns) and ignored",
                key="data.ignore_columns",
                hint=f"drop '{mapped}' from data.ignore_columns, or its mapping from data.columns",
            )
        if self.images and not self.reads_images:
            raise ConfigError(
                f"{type(self).__name__} ({self.kind} data) does not read images",
                key="data.images",
                hint="data.images=false (or null); image rows are read by SFT (ChatDataset) and preference "
                "pairs (PreferenceDataset)",
            )
        check_combination(self)
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
        mixture = [{k: v for k, v in e.items() if k not in EVAL_KNOBS} for e in self.mixture]
        return dataclasses.replace(self, eval_fraction=0.0, eval_size=0, eval_path=None, mixture=mixture)

    def pairs(self, data: LoadedData, split: str, limit: int | None = None) -> list[Pair] | None:
        """(the prompt turns, the reference answer or None) per row of ``split`` (its first ``limit``),
        for generation; None when the rows hold no prompt to complete (raw text, preference pairs)."""
        return None

    def prompt_limit(self) -> tuple[int, str, str]:
        """(the longest prompt in tokens, the key that sets it, what happens to longer ones) for the
        prompts generated from."""
        raise NotImplementedError

    def enforce_length(self, data: LoadedData, tokenizer: Any, workers: Workers | None = None) -> LoadedData:
        """The length policy on loaded rows (here: none; the trainer truncates)."""
        return data

    def messages(self, value: Any, role: str, column: str, images: RowImages | None = None) -> Messages:
        """``as_messages`` with this option's ``roles`` and ``turn_options``; ``images``: the row's
        ``RowImages`` (data.images), None for text."""
        return as_messages(value, role, column, self.roles, images=images, **self.turn_options())

    def turn_options(self) -> dict[str, Any]:
        """What ``parse_turn`` reads besides roles, content, tool calls and images (here: nothing more;
        chat data reads training flags and reasoning)."""
        return {}

    def formats_hint(self) -> str:
        """What this data option accepts (each component says), for errors about a whole file."""
        return (
            f"map your columns to {', '.join(self.CANONICAL)}, e.g. data.columns='{{{self.CANONICAL[0]}: q}}'"
        )

    def read(
        self,
        path: str,
        key: str,
        report: LoadReport,
        workers: Workers,
        limit: int | None = None,
        parts: list[Part] | None = None,
    ) -> list[Table]:
        """The rows of ``path`` (at most ``limit``; of ``parts`` when given: a local layout's), shaped
        (:meth:`shape`)."""
        tables = read_sources(
            path,
            key=key,
            workers=workers,
            split=self.split,
            subset=self.subset,
            limit=limit,
            skip=self.on_error == "skip",
            stats=report.stats,
            parts=parts,
            text_unit=getattr(self, "text_unit", "paragraph"),  # SFT's text rows (ChatDataset)
        )
        from hydratune.components.data.readers import delimiter_note
        from hydratune.components.data.textcorpus import documents_note

        report.info.update(documents_note(tables) | delimiter_note(tables))
        entry = next((p.reader for p in parts or [] if p.reader is not None), None)
        if entry is not None:  # a LLaMA-Factory dataset dir's entry
            from hydratune.components.data.llamafactory import wrap

            tables = wrap(entry, tables, self.kind, report)
        return self.shape(tables, key, report)

    def shape(self, tables: list[Table], key: str, report: LoadReport) -> list[Table]:
        """``tables`` with ``ignore_columns`` dropped and ``columns`` applied (each mapped column renamed to
        its canonical name; a mapped column a file lacks is an error listing the columns it has), checked
        for columns of another task."""
        self.drop_ignored(tables, key, report)
        mapping = self.mapping()
        targets = set(mapping.values())
        for table in tables if mapping else []:
            present = table.columns
            missing = [theirs for theirs in mapping if theirs not in present]
            if missing:
                ours = mapping[missing[0]]
                raise ConfigError(
                    f"{table.source} has no column '{missing[0]}' (columns: {', '.join(present)})",
                    key="data.columns",
                    hint=f"map {ours} to one of those: data.columns='{{{ours}: <your column>}}'",
                )
            replaced = [c for c in present if c in targets]
            report.account([], [f"{c} (replaced by data.columns)" for c in replaced])
            table.apply_mapping(set(), mapping)
        for table in tables:
            self.task_columns(table)
        return tables

    def mapping(self) -> dict[str, str]:
        """``columns`` as the rows read need it: the file's column -> the canonical name."""
        return {theirs: ours for ours, theirs in self.columns.items() if theirs != ours}

    def drop_ignored(self, tables: list[Table], key: str, report: LoadReport) -> None:
        """Remove ``ignore_columns`` from every row (before the mapping and format detection). A name that
        no file of data.path has is an error (a typo would leave the column it meant in use)."""
        if not self.ignore_columns:
            return
        present = {c for table in tables for c in table.columns}
        missing = [c for c in self.ignore_columns if c not in present]
        if missing and key == "data.path":
            raise ConfigError(
                f"data.ignore_columns names '{missing[0]}', which {self.path} does not have "
                f"(columns: {', '.join(dict.fromkeys(c for t in tables for c in t.columns))})",
                key="data.ignore_columns",
                hint="name columns of the file, e.g. data.ignore_columns=[label]",
            )
        for table in tables:
            table.apply_mapping(set(self.ignore_columns), {})
        report.account([], [f"{c} (data.ignore_columns)" for c in self.ignore_columns if c in present])

    def reads_task_columns(self, columns: list[str]) -> set[str]:
        """The ``TASK_COLUMNS`` this option reads from a file with ``columns`` (here: its canonical ones)."""
        return set(self.CANONICAL)

    def task_columns(self, source: Table) -> None:
        """Stop on a column that marks the rows for another task and that this option would not read
        (``TASK_COLUMNS``; ``label`` only beside a ``completion``): the run would train as if it were not
        there. ``data.ignore_columns`` (dropped before this) says it is meant."""
        present = source.columns
        read = self.reads_task_columns(present)
        found = [
            c
            for c in present
            if c in TASK_COLUMNS and c not in read and (c != "label" or "completion" in present)
        ]
        if not found:
            return
        what, instead = TASK_COLUMNS[found[0]]
        names = [c for c in found if TASK_COLUMNS[c] == TASK_COLUMNS[found[0]]]
        quoted = ", ".join(f"'{c}'" for c in names)
        raise ConfigError(
            f"{source.source} has the column{'s' if len(names) > 1 else ''} {quoted}: {what}; "
            f"{type(self).__name__} ({self.kind} data) does not read {'them' if len(names) > 1 else 'it'} "
            f"(columns: {', '.join(present)})",
            key="data.ignore_columns",
            hint=f"{instead}, or data.ignore_columns=[{', '.join(names)}] to run without "
            + ("them" if len(names) > 1 else "it"),
        )

    def require(self, sources: list[Table], needed: tuple[str, ...], why: str) -> None:
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
        tables: list[Table],
        fn: Callable[..., Row],
        columns: tuple[str, ...],
        key: str,
        report: LoadReport,
        workers: Workers,
        used: tuple[str, ...] | None = None,
        flags: Mapping[str, Callable[[Row], bool]] | None = None,
    ) -> tuple[Dataset, Converted]:
        """Map every row with ``fn`` into a memory-mapped table of exactly ``columns``, written as Arrow
        shards by ``workers`` (in row order). A ``RowError`` names the file and line/row, or
        (``on_error=skip``) drops the row and counts it; when the first rows all fail alike, the error
        says the format or mapping does not fit (skipping would drop every row). ``used``: the canonical
        columns ``fn`` reads (default: ``CANONICAL``), for the report's used / ignored lists. ``flags``:
        tests on the converted rows, counted (returned, and summed in ``report.flags``). With data.images,
        ``fn`` takes ``images=``, each row's ``RowImages`` (``tables.convert_one``)."""
        from datasets import concatenate_datasets

        for table in tables:
            if table.prepare is None:  # else the reader accounted for the file's columns
                self.account(table, used or self.CANONICAL, report)
        pixels = self.image_max_pixels

        def images_of(table: Table) -> TableImages | None:  # relative image paths: from the table's folder
            return TableImages.of(table, pixels) if self.images else None

        if self.on_error == "raise":
            self.check_first_rows(tables[0], prepared(tables[0], fn), images_of(tables[0]))
        skip = self.on_error == "skip"
        tasks = [
            functools.partial(
                convert_range, table, span, prepared(table, fn), columns, workers.file("rows"), key, skip,
                flags or {}, images=images_of(table),
            )
            for table in tables
            for span in table.ranges(4 * workers.num_proc)
        ]  # fmt: skip
        more = f" (+{len(tables) - 1} files)" if len(tables) > 1 else ""
        label = f"converting {Path(tables[0].source).name}{more}"
        results = workers.run(tasks, label, sum(t.rows for t in tables))
        done = Converted()
        for result in results:
            done.merge(result)
        if done.skipped:
            add_count(report.stats, "skipped rows", done.skipped)
        report.first_skip = report.first_skip or done.first_skip
        for name, n in done.flags.items():
            add_count(report.flags, name, n)
        if any(c in MESSAGE_COLUMNS for c in columns):  # every message key is used or named
            report.account_keys(done.keys)
        if self.images:
            report.info[f"images ({key})"] = done.images.note(done.rows, pixels)
        if not done.paths:
            return empty_rows(columns), done
        shards = [open_shards([path]) for path in done.paths]
        if len({stores_json_turns(t) for t in shards}) == 1:
            return open_shards(done.paths), done
        return concatenate_datasets(with_json_turns(shards)), done

    def account(self, source: Table, used: tuple[str, ...], report: LoadReport) -> None:
        """Report which of ``source``'s columns are read (named as the file names them) and which not."""
        theirs = {ours: f"{mine} (as {ours})" for ours, mine in self.columns.items() if mine != ours}
        present = source.columns
        report.account(
            [theirs.get(c, c) for c in present if c in used], [c for c in present if c not in used]
        )

    def check_first_rows(
        self, source: Table, fn: Callable[..., Row], images: TableImages | None = None
    ) -> None:
        """If the first ``PROBE_ROWS`` rows (all, if fewer) fail with the same error, the file does not fit
        the format or mapping: say so with the columns found, not "fix the row". ``images``: the table's,
        for image rows."""
        errors: list[RowError] = []
        for row in source.head(PROBE_ROWS):
            try:
                convert_one(fn, row, images)
                return
            except RowError as err:
                errors.append(err)
        if len({str(e) for e in errors}) != 1:
            return
        first, n = errors[0], len(errors)
        which = "the only row fails" if source.rows == 1 else f"the first {n} rows fail"
        which = f"all {n} rows fail" if 1 < n == source.rows else which
        raise ConfigError(
            f"{source.source}: {which} the same way, so the data format or the column mapping does not "
            f"fit this file: {first} (columns: {', '.join(source.columns)})",
            key=first.key or "data.columns",
            hint=first.hint or self.formats_hint(),
        )

    def load_splits(
        self, build: Callable[[list[Table], str, str], Dataset], report: LoadReport, workers: Workers
    ) -> LoadedData:
        """Train and eval tables; ``build(tables, path, key)`` normalises each file's rows. Without
        ``eval_path``, ``eval_size`` (or ``eval_fraction``) rows of data.path are held out, seeded.
        ``info["eval rows from"]`` says which. With ``mixture``: each source loaded so, then mixed."""
        from hydratune.components.config.resolvers import is_demo_asset

        if self.mixture:
            return load_mixture(self, workers)
        layout = self.layout(self.path, self.split)
        parts = layout.train if layout else None
        train = build(
            self.read(self.path, "data.path", report, workers, self.max_samples, parts),
            self.path,
            "data.path",
        )
        train, keys = duplicates.dedup_train(train, self.dedup, report)
        if self.eval_path:
            apart = self.layout(self.eval_path, None)
            evals = build(
                self.read(
                    self.eval_path, "data.eval_path", report, workers, parts=apart.train if apart else None
                ),
                self.eval_path,
                "data.eval_path",
            )
            demo = is_demo_asset(self.eval_path)
            report.info["eval rows from"] = (
                "the demo eval file" if demo else f"data.eval_path={self.eval_path}"
            )
            report.info.update(apart.info("eval") if apart else {})
            evals = duplicates.separate_eval(keys, evals, self.dedup, report)
        elif layout and layout.eval:
            evals = build(
                self.read(self.path, "data.path", report, workers, parts=layout.eval), self.path, "data.path"
            )
            report.info["eval rows from"] = f"the {layout.eval_split} split of data.path"
            evals = duplicates.separate_eval(keys, evals, self.dedup, report)
        else:
            if self.eval_size:
                n = self.eval_size
                if n >= len(train):
                    raise ConfigError(
                        f"holding out {n} eval rows leaves no training rows ({self.path} has {len(train)})",
                        key="data.eval_size",
                        hint="hold out fewer rows, or give a separate data.eval_path",
                    )
            else:
                n = self.held_out(len(train))
            if n:  # as datasets' train_test_split(seed=, shuffle=True) picks them, as index mappings
                import numpy as np

                order = np.random.default_rng(self.seed).permutation(len(train))
                kept, held = duplicates.held_out(keys, order.tolist(), n, self.dedup)
                if not held:
                    report.info[duplicates.NO_EVAL] = duplicates.no_eval(len(keys), self.dedup)
                copies = duplicates.split_note([keys[i] for i in kept], [keys[i] for i in held])
                if copies:  # data.dedup=count
                    report.info["eval rows that copy a train row"] = (
                        f"{copies:,} of {len(held):,} (data.dedup=count: kept; eval measures memorisation "
                        "there)"
                    )
                train, evals = pick(train, kept), pick(train, held)
            else:
                evals = pick(train, [])
            report.info["eval rows from"] = self.eval_share() if n else "none (data.eval_fraction=0)"
        report.info.update(layout.info() if layout else {})
        if layout and layout.ignored:
            log.warning("data: files not read in %s: %s", self.path, report.info["files not read"])
        return self._finish({"train": train, "eval": evals}, report)

    def held_out(self, rows: int) -> int:
        """How many of ``rows`` the eval split holds out (no eval_size, no eval file): ``eval_fraction`` of
        them, at least one and never the last one; unset, the default share capped at DEFAULT_EVAL_ROWS."""
        fraction = DEFAULT_EVAL_FRACTION if self.eval_fraction is None else self.eval_fraction
        if not fraction:
            return 0
        n = min(max(1, round(rows * fraction)), rows - 1)
        return min(n, DEFAULT_EVAL_ROWS) if self.eval_fraction is None else n

    def eval_share(self) -> str:
        """Where the held-out eval rows of data.path come from, for the summary."""
        if self.eval_size:
            return f"data.eval_size={self.eval_size} of data.path (seed {self.seed})"
        if self.eval_fraction is not None:
            return f"{self.eval_fraction * 100:g}% of data.path (seed {self.seed})"
        return (
            f"{DEFAULT_EVAL_FRACTION * 100:g}% of data.path, at most {DEFAULT_EVAL_ROWS:,} rows (seed "
            f"{self.seed}; the default: data.eval_fraction sets a share without a cap)"
        )

    def layout(self, path: str, split: str | None) -> Layout | None:
        """How local ``path`` is read (``local_layout``; ``split=None``: as data.eval_path); None for a hub
        dataset."""
        if not looks_local(path):
            return None
        key = "data.path" if split is not None else "data.eval_path"
        from hydratune.components.data import llamafactory

        root = Path(path).expanduser()
        if split is not None and llamafactory.is_dir(root):  # a LLaMA-Factory dataset dir: its entry's file
            return entry_layout(root, llamafactory.entry(root, self.subset))
        return local_layout(root, split, key, separate_eval=bool(self.eval_path))

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
