"""A data file's bytes before any row is read: its type by name (the data suffix and a compression), a
decompressed copy, the UTF-8 byte order mark skipped (UTF-16 refused by name), a byte that is not UTF-8
named with its line."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed.workers import Workers

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
BUILDERS[".txt"] = "text"  # documents: blank-line-separated blocks, or data.text_unit (textcorpus.py)
BUILDERS[".tsv"] = "csv"  # tab-separated values (``csv_delimiter``)
# compressed text files (``x.jsonl.gz``): the suffix -> how to decompress (``zstd`` needs ``zstandard``,
# as it does for ``datasets``)
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma", ".zst": "zstd"}
COMPRESSIBLE = (".jsonl", ".json", ".csv", ".tsv", ".txt")
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
BLOCK = 4 << 20  # bytes read at a time


def file_type(path: Path) -> tuple[str, str | None] | None:
    """(the data suffix, the compression or None) of a file the loader reads, by its name; else None."""
    last = path.suffix.lower()
    if last in COMPRESSIONS:
        inner = Path(path.stem).suffix.lower()
        return (inner, COMPRESSIONS[last]) if inner in COMPRESSIBLE else None
    return (last, None) if last in BUILDERS else None


def data_suffix(path: Path) -> str:
    """``.jsonl`` for ``x.jsonl`` and ``x.jsonl.gz`` alike; a file of no known type: its last suffix."""
    kind = file_type(path)
    return kind[0] if kind else path.suffix.lower()


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def decompressed(path: Path, key: str, workers: Workers) -> Path:
    """``path`` itself, or (``.gz``, ``.bz2``, ``.xz``, ``.zst``) a decompressed copy in ``workers.dir``,
    written a block at a time."""
    kind = file_type(path)
    compression = kind[1] if kind else None
    if compression is None:
        return path
    out = workers.file("decompressed").with_suffix(kind[0] if kind else "")
    try:
        with open_compressed(path, compression) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, BLOCK)
    except Exception as err:  # each library raises its own error for a damaged or mislabelled file
        raise ConfigError(
            f"{path} is not a valid {compression} file ({first_line(err)})",
            key=key,
            hint=f"check the file, or rename it without '{path.suffix}' if it is not compressed",
        ) from None
    return out


def open_compressed(path: Path, compression: str) -> Any:
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return importlib.import_module(compression).open(path, "rb")


def bom_length(path: Path, source: str, key: str) -> int:
    """Bytes of a UTF-8 byte order mark at the start (Windows editors and Excel write one); UTF-16 is
    refused by name (its BOM would otherwise read as a malformed first line)."""
    with open(path, "rb") as f:
        return bom_of(f.read(3), source, key)


def bom_of(head: bytes, source: str, key: str) -> int:
    """:func:`bom_length` of a file whose first bytes are ``head``."""
    if head.startswith(UTF16_BOMS):
        raise ConfigError(
            f"{source} is UTF-16 text, not UTF-8",
            key=key,
            hint="re-encode the file as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8, or 'Save as UTF-8')",
        )
    return len(UTF8_BOM) if head.startswith(UTF8_BOM) else 0


#: the field delimiters a ``.csv`` file is looked at for, and their names (the summary, ``mode=plan``)
CSV_DELIMITERS = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}


def csv_delimiter(head: bytes, suffix: str) -> str:
    """The field delimiter of a csv-like file whose first bytes are ``head``: a tab for ``.tsv``; for
    ``.csv`` the one of ``CSV_DELIMITERS`` that ``csv.Sniffer`` finds in its first complete lines (Excel
    writes ``;`` where the decimal mark is a comma), else a comma."""
    import csv

    if suffix == ".tsv":
        return "\t"
    text = head[len(UTF8_BOM) :] if head.startswith(UTF8_BOM) else head
    sample = text.decode("utf-8", errors="ignore")
    if not sample.endswith("\n") and "\n" in sample:
        sample = sample[: sample.rfind("\n")]  # complete lines only
    try:
        return csv.Sniffer().sniff(sample, delimiters="".join(CSV_DELIMITERS)).delimiter
    except csv.Error:  # no delimiter the lines agree on (one column, say)
        return ","


def not_utf8(source: str, line: int, byte: int, key: str) -> ConfigError:
    return ConfigError(
        f"{source}:{line}: not UTF-8 text (byte 0x{byte:02x}; latin-1 or cp1252 perhaps)",
        key=key,
        hint="re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 in.jsonl > out.jsonl)",
    )
