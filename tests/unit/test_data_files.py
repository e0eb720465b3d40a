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


# ------------------------------------------------------------------------------ .txt documents

LINES = "First line.\nSecond line.\n\nThird line, after a blank one.\nFourth.\n\n"
#: data.text_unit -> the documents of LINES
UNITS = {
    "paragraph": ["First line.\nSecond line.", "Third line, after a blank one.\nFourth."],
    "line": ["First line.", "Second line.", "Third line, after a blank one.", "Fourth."],
    "file": ["First line.\nSecond line.\n\nThird line, after a blank one.\nFourth."],
}


@pytest.mark.parametrize("unit", UNITS)
def test_text_unit_cuts_a_txt_file_into_paragraphs_lines_or_one_document(tmp_path: Path, unit: str) -> None:
    """``data.text_unit``: the documents loaded and streamed, counted in the summary with the unit."""
    from hydratune.components.data.textcorpus import TEXT_UNITS, text_rows

    path = tmp_path / "corpus.txt"
    path.write_text(LINES)
    data = ChatDataset(path=str(path), eval_fraction=0.0, text_unit=unit).load(scratch_workers())
    assert list(data["train"]["text"]) == UNITS[unit]
    assert data.info["text documents"].startswith(f"{len(UNITS[unit])} from corpus.txt ({TEXT_UNITS[unit]};")
    assert [r["text"] for _, r, _ in text_rows(path, 0, "data.path", unit)] == UNITS[unit]
    from itertools import islice

    from hydratune.components.data.stream import Position, open_stream

    stream = open_stream(ChatDataset(path=str(path), streaming=True, eval_fraction=0.0, text_unit=unit))[0]
    rows = [row["text"] for row, _ in islice(stream.rows(Position()), len(UNITS[unit]))]
    assert rows == UNITS[unit]  # data.streaming cuts them the same way


def test_a_txt_of_one_line_per_document_is_told_to_set_text_unit_and_then_has_an_eval_split(
    tmp_path: Path,
) -> None:
    """The filer's file: one document per line, no blank line. Read by paragraph it is one document and
    the eval split is empty: the error names data.text_unit=line, and with it the split holds a row."""
    from hydratune.components.data.prepare import check_eval_split

    path = tmp_path / "lines.txt"
    path.write_text("".join(f"sentence {i}\n" for i in range(40)))
    whole = ChatDataset(path=str(path))
    data = whole.load(scratch_workers())
    assert len(data["train"]) == 1 and len(data["eval"]) == 0
    err = refused(lambda: check_eval_split(whole, len(data["eval"]), 200))
    assert "data.text_unit=paragraph" in str(err) and "data.text_unit=line" in (err.hint or "")
    fixed = ChatDataset(path=str(path), text_unit="line")
    fixed.validate()
    split = fixed.load(scratch_workers())
    assert (len(split["train"]), len(split["eval"])) == (38, 2)
    check_eval_split(fixed, len(split["eval"]), 200)  # passes
    bad = refused(lambda: ChatDataset(path=str(path), text_unit="lines").validate())
    assert bad.key == "data.text_unit" and "paragraph, line, file" in (bad.hint or "")


# ------------------------------------------------------------------------------ exact duplicates


def dup_rows() -> list[dict[str, Any]]:
    """40 distinct alpaca rows, then 8 copies: row 1 three times in all, rows 2, 5, 7, 9, 11, 13 twice (an
    ignored column differs: what trains is the same)."""
    rows = [{"instruction": f"q{i}", "output": f"a{i}", "note": "first"} for i in range(40)]
    return rows + [{**rows[i], "note": "copy"} for i in (1, 1, 2, 5, 7, 9, 11, 13)]


COPIES = "8 of 48 rows of data.path are exact copies of another row (7 rows repeated; data.dedup="


def as_keys(table: Any) -> list[str]:
    import json

    return [json.dumps(m, sort_keys=True) for m in table["messages"]]


def test_duplicates_are_named_in_plan_and_never_on_both_sides_of_the_split(tmp_path: Path) -> None:
    """The default (``data.dedup=split``): the 8 copies are named in what mode=plan prints (the notes of
    ``prepare_data``, which plan runs), kept in train, and no eval row equals a train row, for every seed
    tried (``count`` lets them cross, and says how many)."""
    from hydratune.components.data.prepare import prepare_data
    from tests.support.data import write_jsonl

    path = write_jsonl(tmp_path / "dups.jsonl", dup_rows())
    notes = prepare_data(ChatDataset(path=path, eval_fraction=0.5, cache=False), None, 0).notes
    assert notes["duplicate rows"].startswith(f"{COPIES}split: kept in train")
    crossed = 0
    for seed in range(6):
        data = ChatDataset(path=path, eval_fraction=0.5, seed=seed, ignore_columns=["note"]).load(
            scratch_workers()
        )
        assert len(data["train"]) + len(data["eval"]) == 48 and len(data["eval"]) == 24
        assert not set(as_keys(data["eval"])) & set(as_keys(data["train"]))
        counted = ChatDataset(path=path, eval_fraction=0.5, seed=seed, dedup="count", ignore_columns=["note"])
        loaded = counted.load(scratch_workers())
        shared = [k for k in as_keys(loaded["eval"]) if k in set(as_keys(loaded["train"]))]
        note = loaded.info.get("eval rows that copy a train row", "")
        assert note.startswith(f"{len(shared)} of 24") if shared else not note
        crossed += len(shared)
    assert crossed  # without the rule, the seeds do put copies on both sides


def test_dedup_drop_and_an_eval_file_of_train_copies(tmp_path: Path) -> None:
    """``drop`` keeps the first of each row and counts the others; an eval file's copies of train rows are
    named (the user's file, ``split``) or dropped from eval and counted (``drop``); a file of one row
    repeated holds out nothing, says why, and periodic eval is then refused naming data.dedup; where no
    row's copies fit the eval rows asked for, one row is held out with all of its copies."""
    from hydratune.components.data.prepare import check_eval_split
    from tests.support.data import write_jsonl

    path = write_jsonl(tmp_path / "dups.jsonl", dup_rows())
    dropped = ChatDataset(path=path, eval_fraction=0.0, dedup="drop", ignore_columns=["note"]).load(
        scratch_workers()
    )
    assert as_keys(dropped["train"]) == list(dict.fromkeys(as_keys(dropped["train"])))
    assert [m[0]["content"] for m in dropped["train"]["messages"]] == [f"q{i}" for i in range(40)]
    assert dropped.stats["dropped (exact duplicates)"] == 8
    assert dropped.info["duplicate rows"].startswith(COPIES + "drop")
    evals = write_jsonl(
        tmp_path / "eval.jsonl", [{"instruction": f"q{i}", "output": f"a{i}"} for i in (3, 50)]
    )
    train = write_jsonl(
        tmp_path / "train.jsonl", [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(9)]
    )
    kept = ChatDataset(path=train, eval_path=evals).load(scratch_workers())  # the user's eval file: named
    assert len(kept["eval"]) == 2 and kept.info["eval rows that copy a train row"].startswith("1 of 2")
    held = ChatDataset(path=train, eval_path=evals, dedup="drop").load(scratch_workers())
    assert [m[0]["content"] for m in held["eval"]["messages"]] == ["q50"]
    assert held.stats["dropped from eval (copies of train rows)"] == 1
    same = write_jsonl(tmp_path / "same.jsonl", [{"instruction": "q", "output": "a"}] * 6)
    alone = ChatDataset(path=same, eval_size=1)
    none = alone.load(scratch_workers())
    assert (len(none["train"]), len(none["eval"])) == (6, 0)
    assert none.info["eval rows held out"].startswith(
        "none: every one of the 6 rows of data.path is the same"
    )
    err = refused(lambda: check_eval_split(alone, 0, 200, none.info["eval rows held out"]))
    assert err.key == "data.dedup" and "data.dedup=count" in (err.hint or "")
    assert len(ChatDataset(path=same, eval_size=1, dedup="count").load(scratch_workers())["eval"]) == 1
    rows = [{"instruction": f"q{i % 2}", "output": "a"} for i in range(6)]
    few = ChatDataset(path=write_jsonl(tmp_path / "two.jsonl", rows), eval_size=1).load(scratch_workers())
    assert (len(few["train"]), len(few["eval"])) == (3, 3)  # no row fits: one held out with its copies
    assert not set(as_keys(few["eval"])) & set(as_keys(few["train"]))
    bad = refused(lambda: ChatDataset(path=train, dedup="true").validate())
    assert bad.key == "data.dedup" and "split, drop, count" in (bad.hint or "")


# ------------------------------------------------------------------------------ alpaca history

HISTORY_ROWS = [
    {
        "instruction": "Add 2 and 3.",
        "input": "Answer with a number.",
        "output": "5",
        "system": "You add.",
        "history": [["What is 1+1?", "2"], ["And 2+2?", "4"]],
    },
    {"instruction": "Add 4 and 4.", "input": "", "output": "8", "system": "", "history": []},
    {"instruction": "Add 1 and 6.", "input": "", "output": "7", "history": [["Ready?", "Yes."]]},
]


def trained_ids(data: Any) -> list[list[int]]:
    """Each train row's tokens that carry loss, as SFT makes them (assistant-only and completion-only loss,
    the sft recipe's defaults), with the tiny tokenizer."""
    from transformers import AutoTokenizer

    from hydratune.components.data.tokens import SFTTokens
    from tests.support.data import TINY

    tok = AutoTokenizer.from_pretrained(str(TINY))
    knobs = {"assistant_only": True, "completion_only": True, "max_length": 512, "packing": False}
    tokens, _ = SFTTokens(**knobs, packing_strategy="bfd").prepare(data, tok, scratch_workers())
    return [
        [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
        for row in tokens["train"]
    ]


def test_a_plain_alpaca_file_with_history_trains_as_the_llamafactory_dir_does(tmp_path: Path) -> None:
    """The same rows as a plain .jsonl and as a LLaMA-Factory dir's alpaca entry: the same turns (the user
    turn's instruction and input joined by each path's own separator) and, token for token, the same
    tokens carrying loss: every answer of the history and the output."""
    import json

    from tests.support.data import write_jsonl

    plain = write_jsonl(tmp_path / "alpaca.jsonl", HISTORY_ROWS)
    root = tmp_path / "lf"
    root.mkdir()
    write_jsonl(root / "alpaca.jsonl", HISTORY_ROWS)
    columns = {"prompt": "instruction", "query": "input", "response": "output", "system": "system"}
    entry = {"file_name": "alpaca.jsonl", "columns": {**columns, "history": "history"}}
    (root / "dataset_info.json").write_text(json.dumps({"alpaca": entry}))
    ours = ChatDataset(path=plain, eval_fraction=0.0).load(scratch_workers())
    theirs = ChatDataset(path=str(root), subset="alpaca", eval_fraction=0.0).load(scratch_workers())

    def joined(rows: Any) -> list[Any]:
        return [[{**t, "content": t["content"].replace("\n\n", "\n")} for t in m] for m in rows["messages"]]

    assert joined(ours["train"]) == joined(theirs["train"])
    assert ours["train"][0]["messages"][1:5] == [
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "And 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert "history" in ours.info["columns used"] and "history" not in ours.info["columns ignored"]
    import pandas

    cells = [{**r, "history": json.dumps(r["history"])} for r in HISTORY_ROWS]  # a csv cell holds JSON text
    pandas.DataFrame(cells).to_csv(tmp_path / "alpaca.csv", index=False)
    from_csv = ChatDataset(path=str(tmp_path / "alpaca.csv"), eval_fraction=0.0).load(scratch_workers())
    assert list(from_csv["train"]["messages"]) == list(ours["train"]["messages"])
    mine, lf = trained_ids(ours), trained_ids(theirs)
    assert mine == lf
    from transformers import AutoTokenizer

    from tests.support.data import TINY

    tok = AutoTokenizer.from_pretrained(str(TINY))
    assert [tok.decode(ids) for ids in mine] == [
        "2<|im_end|>4<|im_end|>5<|im_end|>",
        "8<|im_end|>",
        "Yes.<|im_end|>7<|im_end|>",
    ]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{**HISTORY_ROWS[1], "history": [["only a question"]]}] * 2)
    err = refused(lambda: ChatDataset(path=bad, eval_fraction=0.0).load(scratch_workers()))
    assert "column 'history' item 0 should be [question, answer]" in str(err)
