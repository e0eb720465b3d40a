"""Plain ``.txt`` corpora for continued pre-training: one document per blank-line-separated block, per line
or per file (``data.text_unit``).

A ``.txt`` file (also ``.txt.gz``/``.bz2``/``.xz``/``.zst``) is read as rows ``{"text": <document>}``, the
SFT ``text`` format (language modelling: every token trained, EOS appended as TRL does). By default
(``paragraph``) a document is a run of non-blank lines; one or more blank lines (white space only) end it,
so a file of one document (no blank line) is one row, and a dump of articles or paragraphs separated by
blank lines is one row each. ``line``: every non-blank line is a document (a file of one sentence, one
record per line); ``file``: the whole file is one (its blank lines kept inside, none at either end).
Line breaks inside a document are kept (``\\r\\n`` becomes ``\\n``); a UTF-8 BOM is skipped; a file that is
not UTF-8 is refused naming its line. The file is scanned once for where each document starts (8 bytes a
document), then read range by range like JSON lines: nothing holds the whole file. A ``.txt`` file a
LLaMA-Factory entry names is read as LLaMA-Factory reads it: one document per non-blank line (``line``).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hydratune.components.data.file_bytes import bom_of, decompressed, not_utf8, open_compressed
from hydratune.components.data.readers import Table
from hydratune.components.distributed.workers import Workers

TEXT_SUFFIX = ".txt"
#: data.text_unit's values -> what the summary says about how a ``.txt`` file became rows
TEXT_UNITS = {
    "paragraph": "one document per blank-line-separated block",
    "line": "one document per non-blank line",
    "file": "one document per file",
}


def documents(
    f: IO[bytes],
    source: str,
    key: str,
    *,
    first_line: int = 1,
    at_start: bool = True,
    unit: str = "paragraph",
) -> Iterator[tuple[int, int, str]]:
    """``(byte offset, first line number, text)`` of each document of a binary file (``at_start``: read
    from its start, a BOM skipped; else positioned at a document's start, line ``first_line``). The
    offsets count from where reading began. ``unit`` (``TEXT_UNITS``): ``paragraph``, documents end at blank
    lines; ``line``, every non-blank line is a document (also how LLaMA-Factory reads a ``.txt`` file its
    dataset_info.json names: ``datasets``' text builder); ``file``, the whole file is one."""
    head = f.read(3) if at_start else b""
    offset = bom_of(head, source, key) if at_start else 0
    lines: list[str] = []
    start, first = offset, first_line
    for number, raw in enumerate(_lines(head[offset:], f), start=first_line):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as err:
            raise not_utf8(source, number, raw[err.start], key) from None
        blank = not line.strip()
        if not blank and not lines:
            start, first = offset, number
        if not blank or (unit == "file" and lines):
            lines.append(line)
        if lines and (unit == "line" or (unit == "paragraph" and blank)):
            yield start, first, "\n".join(lines)
            lines = []
        offset += len(raw)
    while lines and not lines[-1].strip():  # a file's trailing blank lines
        lines.pop()
    if lines:
        yield start, first, "\n".join(lines)


def _lines(head: bytes, f: IO[bytes]) -> Iterator[bytes]:
    """The lines of ``head`` + the rest of ``f`` (bytes already read, then the file): no seeking back, so a
    compressed stream reads too."""
    pieces = head.splitlines(keepends=True)
    if pieces and not pieces[-1].endswith(b"\n"):
        pieces[-1] += f.readline()
    yield from pieces
    yield from f


@dataclass
class TextTable(Table):
    """A ``.txt`` file's documents as ``{"text"}`` rows (``starts``: each document's byte offset and first
    line, from the scan)."""

    path: Path = Path()
    starts: array[int] = field(default_factory=lambda: array("q"))
    lines: array[int] = field(default_factory=lambda: array("q"))
    unit: str = "paragraph"
    lf: bool = False  # a LLaMA-Factory entry's file (read by line, as LLaMA-Factory reads it)

    def _raw(self, start: int, stop: int) -> Iterator[tuple[int, int | None, dict[str, Any]]]:
        if start >= stop:
            return
        with open(self.path, "rb") as f:
            f.seek(self.starts[start])
            index = start
            for _, _, text in documents(
                f,
                self.source,
                "data.path",
                first_line=self.lines[start],
                at_start=False,
                unit=self.unit,
            ):
                if index >= stop:
                    return
                yield index, self.lines[index], {"text": text}
                index += 1


def read_text(
    path: Path,
    *,
    key: str,
    workers: Workers,
    limit: int | None = None,
    unit: str = "paragraph",
    lf: bool = False,
) -> TextTable:
    """A ``.txt`` file (decompressed first when compressed) as a table of its documents (cut by ``unit``,
    ``TEXT_UNITS``; ``lf``: a LLaMA-Factory entry's file, by line), at most ``limit``."""
    unit = "line" if lf else unit
    plain = decompressed(path, key, workers)
    starts, lines = array("q"), array("q")
    with open(plain, "rb") as f:
        for offset, first, _ in documents(f, str(path), key, unit=unit):
            if limit is not None and len(starts) >= limit:
                break
            starts.append(offset)
            lines.append(first)
    return TextTable(
        str(path), ["text"], len(starts), path=plain, starts=starts, lines=lines, unit=unit, lf=lf
    )


def text_rows(
    path: Path, skip: int, key: str, unit: str = "paragraph"
) -> Iterator[tuple[int, dict[str, Any], None]]:
    """A stream's rows of a ``.txt`` file: ``(document number, row, None)`` after its first ``skip``
    documents (read again and passed over, as a compressed file's lines are; cut by ``unit``)."""
    from hydratune.components.data.file_bytes import file_type

    compression = (file_type(path) or (TEXT_SUFFIX, None))[1]
    with open_compressed(path, compression) if compression else open(path, "rb") as f:
        for number, (_, _, text) in enumerate(documents(f, str(path), key, unit=unit), start=1):
            if number > skip:
                yield number, {"text": text}, None


def documents_note(tables: list[Table]) -> dict[str, str]:
    """The summary's line for the ``.txt`` files among ``tables``: how many documents, and how they were
    cut."""
    texts = [t for t in tables if isinstance(t, TextTable)]
    if not texts:
        return {}
    files = f"{len(texts)} .txt files" if len(texts) > 1 else Path(texts[0].source).name
    unit = TEXT_UNITS[texts[0].unit]
    if texts[0].lf:
        unit = "one per non-blank line, as LLaMA-Factory reads it"
    else:
        others = " or ".join(f"data.text_unit={u}" for u in TEXT_UNITS if u != texts[0].unit)
        unit += f"; {others} cuts them otherwise"
    return {"text documents": f"{sum(t.rows for t in texts):,} from {files} ({unit})"}
