"""``data.mixture``: several sources, each read in its own format (and columns, split, eval rows), sampled by
weight (a fraction of its train rows) or an exact row count with the run's seed, mixed into one train set;
the summary and ``mode=plan`` give the rows taken from each. Bad entries are refused before load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.preferences import PreferenceDataset
from hydratune.components.data.prompts import PromptDataset

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def alpaca(tmp: Path, n: int) -> str:
    return write(tmp / "alpaca.jsonl", [{"instruction": f"alpaca {i}", "output": f"a{i}"} for i in range(n)])


def chats(tmp: Path, n: int, name: str = "chats.jsonl") -> str:
    turns = [
        [{"role": "user", "content": f"chat {i}"}, {"role": "assistant", "content": f"c{i}"}]
        for i in range(n)
    ]
    return write(tmp / name, [{"messages": t} for t in turns])


def origins(table: Any) -> list[str]:
    """Which source each row came from: the first word of its user turn."""
    return [row[0]["content"].split()[0] for row in table["messages"]]


def test_a_weighted_mixture_of_an_alpaca_and_a_messages_file(tmp_path: Path) -> None:
    a, b = alpaca(tmp_path, 20), chats(tmp_path, 40)
    data = ChatDataset(
        path="", eval_fraction=0.0, mixture=[{"path": a, "weight": 0.7}, {"path": b, "rows": 10}], seed=3
    )
    data.validate()
    loaded = data.load()
    train = loaded["train"]
    assert sorted(origins(train)) == ["alpaca"] * 14 + ["chat"] * 10  # 0.7 of 20, and exactly 10
    assert loaded.report.mixture == {"data.mixture[0]": 14, "data.mixture[1]": 10}
    assert origins(train) != sorted(origins(train))  # shuffled together, not one source after the other
    # each source read in its own format: the alpaca rows are user/assistant turns like the chat rows
    row = next(r for r in train if r["messages"][0]["content"].startswith("alpaca"))
    i = row["messages"][0]["content"].split()[1]
    assert row["messages"] == [
        {"role": "user", "content": f"alpaca {i}"},
        {"role": "assistant", "content": f"a{i}"},
    ]
    assert "14 of 20 train rows (weight 0.7)" in loaded.info[f"data.mixture[0] {a}"]
    assert "format: alpaca (detected)" in loaded.info[f"data.mixture[0] {a}"]
    assert "10 of 40 train rows (rows=10)" in loaded.info[f"data.mixture[1] {b}"]
    # seeded: the same seed picks the same rows in the same order, another seed other rows
    again = data.load()["train"]
    assert again["messages"] == train["messages"]
    other = ChatDataset(**{**vars(data), "seed": 4}).load()["train"]
    picked = {m[0]["content"] for m in train["messages"]}
    assert picked != {m[0]["content"] for m in other["messages"]}


def test_each_source_holds_out_its_own_eval_rows(tmp_path: Path) -> None:
    a, b = alpaca(tmp_path, 20), chats(tmp_path, 40)
    evals = chats(tmp_path, 3, "chats_eval.jsonl")
    mixture = [{"path": a, "weight": 1.0, "eval_size": 5}, {"path": b, "rows": 8, "eval_path": evals}]
    loaded = ChatDataset(path="", mixture=mixture).load()
    assert sorted(origins(loaded["eval"])) == ["alpaca"] * 5 + ["chat"] * 3
    assert sorted(origins(loaded["train"])) == ["alpaca"] * 15 + ["chat"] * 8  # weight 1.0: all 15 left
    assert "eval rows from: data.mixture[0].eval_size=5" in loaded.info[f"data.mixture[0] {a}"]
    # the inference recipes read every row: no source holds any out
    whole = ChatDataset(path="", mixture=mixture).whole().load()
    assert len(whole["eval"]) == 0 and len(whole["train"]) == 20 + 8


def test_a_preference_mixture_reads_each_format(tmp_path: Path) -> None:
    explicit = write(
        tmp_path / "pairs.jsonl",
        [{"prompt": f"explicit {i}", "chosen": "yes", "rejected": "no"} for i in range(10)],
    )
    convo = [{"role": "user", "content": "implicit"}]
    implicit = write(
        tmp_path / "ultra.jsonl",
        [
            {
                "chosen": [*convo, {"role": "assistant", "content": f"good {i}"}],
                "rejected": [*convo, {"role": "assistant", "content": f"bad {i}"}],
            }
            for i in range(6)
        ],
    )
    mixture = [{"path": explicit, "rows": 4}, {"path": implicit, "weight": 0.5}]
    loaded = PreferenceDataset(path="", eval_fraction=0.0, mixture=mixture).load()
    prompts = sorted(p[0]["content"].split()[0] for p in loaded["train"]["prompt"])
    assert prompts == ["explicit"] * 4 + ["implicit"] * 3
    assert loaded.report.mixture == {"data.mixture[0]": 4, "data.mixture[1]": 3}
    assert "format: implicit (detected)" in loaded.info[f"data.mixture[1] {implicit}"]


def test_a_prompt_mixture(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", [{"prompt": f"a {i}", "answer": "1"} for i in range(10)])
    b = write(tmp_path / "b.jsonl", [{"question": f"b {i}", "answer": "2"} for i in range(10)])
    mixture = [{"path": a, "rows": 2}, {"path": b, "rows": 5, "columns": {"prompt": "question"}}]
    loaded = PromptDataset(path="", eval_fraction=0.0, mixture=mixture).load()
    assert sorted(p[0]["content"][0] for p in loaded["train"]["prompt"]) == ["a"] * 2 + ["b"] * 5


def error(fn: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn()
    return info.value


@pytest.mark.parametrize(
    ("entry", "key", "words"),
    [
        ({"path": "A", "weight": 0.5, "packing": True}, "data.mixture[1].packing", "unknown key 'packing'"),
        ({"weight": 0.5}, "data.mixture[1].path", "no path"),
        ({"path": "A"}, "data.mixture[1]", "weight"),
        ({"path": "A", "weight": 0.5, "rows": 3}, "data.mixture[1]", "one of the two"),
        ({"path": "A", "weight": 1.5}, "data.mixture[1].weight", "(0, 1]"),
        ({"path": "A", "weight": 0}, "data.mixture[1].weight", "(0, 1]"),
        ({"path": "A", "rows": 0}, "data.mixture[1].rows", ">= 1"),
        ({"path": "missing.jsonl", "weight": 0.5}, "data.mixture[1].path", "not found"),
        ({"path": "A", "weight": 0.5, "format": "csv"}, "data.mixture[1].format", "unknown format"),
        ({"path": "A", "weight": 0.5, "columns": {"nope": "x"}}, "data.mixture[1].columns", "nope"),
    ],
)
def test_a_bad_entry_is_refused_before_load_naming_it(
    tmp_path: Path, entry: dict[str, Any], key: str, words: str
) -> None:
    a = alpaca(tmp_path, 4)
    entry = {k: a if v == "A" else v for k, v in entry.items()}
    err = error(ChatDataset(path="", mixture=[{"path": a, "weight": 1.0}, entry]).validate)
    assert err.key == key and words in str(err), str(err)


def test_data_path_with_a_mixture_is_refused(tmp_path: Path) -> None:
    a = alpaca(tmp_path, 4)
    err = error(ChatDataset(path=a, mixture=[{"path": a, "weight": 1.0}]).validate)
    assert err.key == "data.path" and "data.path=''" in str(err.hint)
    err = error(ChatDataset(path="", eval_path=a, mixture=[{"path": a, "weight": 1.0}]).validate)
    assert err.key == "data.eval_path"


def test_errors_at_load_name_the_entry(tmp_path: Path) -> None:
    a, b = alpaca(tmp_path, 4), chats(tmp_path, 4)
    err = error(ChatDataset(path="", mixture=[{"path": a, "weight": 1.0}, {"path": b, "rows": 9}]).load)
    assert err.key == "data.mixture[1].rows" and "has 3 train rows" in str(err)  # 5% of 4: one held out
    text = write(tmp_path / "text.jsonl", [{"text": "plain"}] * 4)
    err = error(
        ChatDataset(path="", mixture=[{"path": a, "weight": 1.0}, {"path": text, "weight": 1.0}]).load
    )
    assert err.key == "data.mixture[1].format" and "same kind of rows" in str(err)
    err = error(ChatDataset(path="", mixture=[{"path": b, "weight": 1.0, "columns": {"messages": "x"}}]).load)
    assert err.key == "data.mixture[0].columns", str(err)
