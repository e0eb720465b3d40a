"""Prompts for on-policy RL (``PromptDataset``, PPO and GRPO): prompt messages and the reference answer;
with ``data.images`` (a vision-language model) the prompts' images too (components/data/images.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, knob
from hydratune.components.config.registry import component
from hydratune.components.data import images as image_rows
from hydratune.components.data.formats import text_of
from hydratune.components.data.readers import Table
from hydratune.components.data.rows import ON_OVERLONG, LoadedData, LoadReport, Pair, Row, scratch_workers
from hydratune.components.data.source import Source
from hydratune.components.data.tables import first_rows
from hydratune.components.distributed.workers import Workers

if TYPE_CHECKING:
    from datasets import Dataset


@component("data")
@dataclass(frozen=True)
class PromptDataset(Source):
    """Prompts for on-policy RL (PPO, GRPO): ``prompt`` messages and, when given, the reference ``answer``;
    with data.images, the prompt's ``images`` (GRPO on a vision-language model takes them)."""

    CANONICAL: ClassVar[tuple[str, ...]] = ("prompt", "answer")
    kind: ClassVar[str] = "prompts"
    reads_images: ClassVar[bool] = True

    max_prompt_length: int = knob(256, AT_LEAST_ONE)  # tokens, the chat template's generation prompt included
    # prompts longer than max_prompt_length: truncate (generation keeps their end: PPO, generate, best_of_n,
    # eval; GRPO cannot cut a prompt and refuses) | drop (counted) | error (names the first)
    on_overlong: str = "truncate"

    def validate(self) -> None:
        super().validate()
        if self.on_overlong not in ON_OVERLONG:
            raise ConfigError(
                f"unknown '{self.on_overlong}'", key="data.on_overlong", hint=f"one of {ON_OVERLONG}"
            )

    def prompt_limit(self) -> tuple[int, str, str]:
        return self.max_prompt_length, "data.max_prompt_length", self.on_overlong

    def enforce_length(self, data: LoadedData, tokenizer: Any, workers: Workers | None = None) -> LoadedData:
        """Measure every prompt (with the generation prompt) against ``max_prompt_length`` and apply
        ``on_overlong``; the longer ones are counted per split (``prompt_lengths``)."""
        from hydratune.components.data.promptlength import enforce_prompt_length

        return self._finish(enforce_prompt_length(self, data, tokenizer), data.report)

    def pairs(self, data: LoadedData, split: str, limit: int | None = None) -> list[Pair] | None:
        """(the prompt turns, the ``answer`` column's text, or None without that column) per row (of the
        first ``limit``)."""
        table = first_rows(data[split], limit)
        answers = table["answer"] if "answer" in table.column_names else [None] * len(table)
        return list(zip(table["prompt"], answers, strict=True))

    def reads_task_columns(self, columns: list[str]) -> set[str]:
        """The prompt's columns; ``images`` / ``image`` with data.images."""
        return set(self.CANONICAL) | (set(image_rows.IMAGE_COLUMNS) if self.images else set())

    def to_prompt(self, row: Row, answer: bool, images: image_rows.RowImages | None = None) -> Row:
        """One row as ``prompt`` messages, with its reference ``answer`` (text) when the data has them;
        ``images`` (data.images: this row's ``RowImages``): the prompt's image parts and ``<image>``
        placeholders read, and its images (``images``, checked, in placeholder order)."""
        out: Row = {"prompt": self.messages(row.get("prompt"), "user", "prompt", images)}
        if answer:
            out["answer"] = text_of(row, "answer")  # a blank / NaN reference is no reference
        if images is not None:
            out[image_rows.IMAGES_COLUMN] = images.finish(row, {"prompt": out["prompt"]})
        return out

    def load(self, workers: Workers | None = None) -> LoadedData:
        """Train/eval with ``prompt`` (messages) and, if data.path has the column, ``answer`` (text)."""
        workers = workers or scratch_workers()
        has_answer: bool | None = None  # decided on data.path, so both splits have the same columns
        report = LoadReport()

        def build(tables: list[Table], path: str, key: str) -> Dataset:
            nonlocal has_answer
            self.require(tables, ("prompt",), "of a prompt dataset")
            if has_answer is None:
                has_answer = all("answer" in t.columns for t in tables)
            columns = ("prompt", "answer") if has_answer else ("prompt",)
            used = self.CANONICAL
            if self.images:
                columns, used = (*columns, image_rows.IMAGES_COLUMN), (*used, *image_rows.IMAGE_COLUMNS)
            to_prompt = functools.partial(self.to_prompt, answer=has_answer)
            return self.convert(tables, to_prompt, columns, key, report, workers, used)[0]

        return self.load_splits(build, report, workers)
