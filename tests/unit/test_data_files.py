"""Data files as users have them (issue 49): csv delimiters other than a comma and ``.tsv``, ``.txt``
documents one per line, exact duplicate rows and the train/eval split, alpaca's ``history`` in a plain
file. Each is checked on the rows a load gives, against another reader (pandas) or the other path
(a LLaMA-Factory dir) where one exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.rows import scratch_workers


def refused(fn: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn()
    return info.value


# ------------------------------------------------------------------------------ csv delimiters

#: (file name, delimiter, what the summary calls it): each file's rows are ROWS
DELIMITED = [("semicolon.csv", ";", "semicolon"), ("tabs.csv", "\t", "tab"), ("pipe.csv", "|", "pipe")]
DELIMITED += [("values.tsv", "\t", "tab"), ("plain.csv", ",", None)]
ROWS = [
    {"instruction": "Add 2, then 3; say it", "output": "5"},
    {"instruction": 'He said "hi"\nthen left', "output": "ok, fine"},
    {"instruction": "x | y", "output": "1;2"},
]


def write_delimited(path: Path, delimiter: str) -> str:
    """ROWS as a csv with ``delimiter`` (quoted where a field needs it, as Excel writes them)."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.DictWriter(f, ["instruction", "output"], delimiter=delimiter)
        out.writeheader()
        out.writerows(ROWS)
    return str(path)


@pytest.mark.parametrize(("name", "delimiter", "called"), DELIMITED)
def test_csv_delimiters_are_found_and_tsv_is_read_as_pandas_reads_them(
    tmp_path: Path, name: str, delimiter: str, called: str | None
) -> None:
    """A ``.csv`` separated by ``;``, a tab or ``|`` (quoted fields holding the others), and a ``.tsv``:
    the rows are pandas' with that separator (loaded and streamed), and the summary names the delimiter
    when it is not a comma."""
    import pandas

    path = write_delimited(tmp_path / name, delimiter)
    expected = pandas.read_csv(path, sep=delimiter, dtype=str, keep_default_na=False).to_dict("records")
    assert expected == ROWS  # the oracle reads the file as written
    data = ChatDataset(path=path, eval_fraction=0.0).load(scratch_workers())
    got = [{"instruction": m[0]["content"], "output": m[1]["content"]} for m in data["train"]["messages"]]
    assert got == expected
    assert data.info["format"] == "alpaca (detected)"
    from hydratune.components.data.stream import Position, table_rows

    assert [row for _, row, _ in table_rows(Path(path), Position())] == expected  # data.streaming's reader
    note = data.info.get("csv delimiter", "")
    assert (f"{name} ({called}): not a comma" in note) if called else not note


def test_a_one_column_csv_stays_one_column(tmp_path: Path) -> None:
    """A ``text`` csv whose documents hold semicolons is not cut at them."""
    path = tmp_path / "docs.csv"
    path.write_text("text\na; b; c\nd; e; f\n")
    data = ChatDataset(path=str(path), eval_fraction=0.0).load(scratch_workers())
    assert list(data["train"]["text"]) == ["a; b; c", "d; e; f"]
