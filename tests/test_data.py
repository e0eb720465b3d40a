"""Data formats normalise to one shape; bad files fail naming the file, line or column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.data import ChatDataset, PreferenceDataset, PromptDataset
from components.errors import ConfigError

ASSETS = Path(__file__).resolve().parent.parent / "components" / "assets" / "demo"


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("name", ["sft_train.jsonl", "alpaca.jsonl", "prompt_completion.jsonl"])
def test_chat_formats_become_messages(name: str) -> None:
    data = ChatDataset(path=str(ASSETS / name), eval_fraction=0.1, max_samples=40).load()
    row = data["train"][0]
    assert data["train"].column_names == ["messages", "answer"]
    assert row["messages"][0]["role"] == "user" and row["messages"][-1]["role"] == "assistant"
    assert row["answer"] == row["messages"][-1]["content"] and row["answer"].isdigit()
    assert len(data["eval"]) == 4 and len(data["train"]) == 36


def test_text_format_is_language_modelling() -> None:
    data = ChatDataset(path=str(ASSETS / "text.jsonl"), eval_fraction=0.0).load()
    assert data["train"].column_names == ["text"] and len(data["eval"]) == 0
    assert ChatDataset(path=str(ASSETS / "text.jsonl")).prompts("eval") == []


def test_column_mapping_and_system_prompt(tmp_path: Path) -> None:
    path = write(tmp_path / "q.jsonl", [{"question": f"q{i}", "reply": f"a{i}"} for i in range(10)])
    ds = ChatDataset(
        path=path,
        columns={"prompt": "question", "completion": "reply"},
        system_prompt="be brief",
        eval_size=2,
    )
    data = ds.load()
    assert [m["role"] for m in data["train"][0]["messages"]] == ["system", "user", "assistant"]
    prompts = ds.prompts("eval")
    assert len(prompts) == 2 and prompts[0][0][-1]["role"] == "user" and prompts[0][1].startswith("a")


def test_split_is_seeded_and_disjoint() -> None:
    def split(seed: int) -> tuple[list[str], list[str]]:
        data = ChatDataset(path=str(ASSETS / "sft_train.jsonl"), eval_size=50, seed=seed).load()
        return [r["messages"][0]["content"] for r in data["train"]], [
            r["messages"][0]["content"] for r in data["eval"]
        ]

    train, evals = split(1)
    assert split(1) == (train, evals)
    assert split(2)[1] != evals
    assert not set(evals) & set(train) or len(set(evals) & set(train)) < 3  # questions may repeat in wording


def test_missing_file_names_key_and_path() -> None:
    with pytest.raises(ConfigError) as info:
        ChatDataset(path="/nonexistent.jsonl").validate()
    assert info.value.key == "data.path" and "/nonexistent.jsonl" in str(info.value)


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "broken"\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2"):
        ChatDataset(path=str(path)).load()


def test_empty_and_non_utf8_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="no rows"):
        ChatDataset(path=str(empty)).load()
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"text": "café"}\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        ChatDataset(path=str(latin)).load()


def test_unknown_format_lists_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "x.jsonl", [{"foo": 1, "bar": 2}] * 3)
    with pytest.raises(ConfigError, match="foo, bar"):
        ChatDataset(path=path, eval_fraction=0.0).load()


def test_empty_answer_names_the_row(tmp_path: Path) -> None:
    path = write(
        tmp_path / "x.jsonl", [{"prompt": "q", "completion": "a"}, {"prompt": "q", "completion": " "}]
    )
    with pytest.raises(ConfigError, match="row 1"):
        ChatDataset(path=path, eval_fraction=0.0).load()


def test_preference_formats_and_missing_rejected(tmp_path: Path) -> None:
    for name in ("preference_train.jsonl", "preference_messages.jsonl"):
        row = PreferenceDataset(path=str(ASSETS / name), eval_fraction=0.0).load()["train"][0]
        assert row["prompt"][0]["role"] == "user" and row["chosen"][0]["role"] == "assistant"
        assert row["chosen"] != row["rejected"]
    path = write(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "a"}] * 3)
    with pytest.raises(ConfigError) as info:
        PreferenceDataset(path=path, eval_fraction=0.0).load()
    assert "'rejected'" in str(info.value) and "prompt, chosen" in str(info.value)


def test_prompt_dataset_keeps_answers() -> None:
    row = PromptDataset(path=str(ASSETS / "prompts_train.jsonl"), eval_fraction=0.0).load()["train"][0]
    assert row["prompt"][0]["role"] == "user" and row["answer"].isdigit()


def test_on_error_skip_drops_and_counts_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    good = {"prompt": "q", "completion": "a"}
    path.write_bytes(
        b"\n".join(
            [
                json.dumps(good).encode(),
                b'{"prompt": "broken"',
                json.dumps({"prompt": "q"}).encode(),  # no completion
                '{"prompt": "caf\xe9", "completion": "x"}'.encode("latin-1"),
                json.dumps(good).encode(),
            ]
        )
    )
    with pytest.raises(ConfigError, match=r"mixed\.jsonl:2"):
        ChatDataset(path=str(path), eval_fraction=0.0).load()
    ds = ChatDataset(path=str(path), eval_fraction=0.0, on_error="skip")
    data = ds.load()
    assert len(data["train"]) == 2
    assert ds.stats["skipped rows"] == 3


def test_missing_value_names_row_and_column(tmp_path: Path) -> None:
    path = write(
        tmp_path / "x.jsonl", [{"instruction": "i", "output": "o"}, {"instruction": "i", "output": None}]
    )
    with pytest.raises(ConfigError, match=r"row 1 has no value in column 'output'"):
        ChatDataset(path=path, eval_fraction=0.0).load()


@pytest.fixture
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ASSETS.parent / "tiny"))


def test_overlong_policies(tmp_path: Path, tokenizer) -> None:
    rows = [{"prompt": "short", "completion": "a"}, {"prompt": "long " * 80, "completion": "b"}]
    path = write(tmp_path / "x.jsonl", rows)
    keep = ChatDataset(path=path, eval_fraction=0.0, max_length=40)
    assert len(keep.enforce_length(keep.load(), tokenizer)["train"]) == 2  # truncate: the trainer cuts
    drop = ChatDataset(path=path, eval_fraction=0.0, max_length=40, on_overlong="drop")
    assert len(drop.enforce_length(drop.load(), tokenizer)["train"]) == 1
    assert drop.stats["dropped (too long)"] == 1
    strict = ChatDataset(path=path, eval_fraction=0.0, max_length=40, on_overlong="error")
    with pytest.raises(ConfigError, match=r"row 1 has \d+ tokens > data.max_length=40"):
        strict.enforce_length(strict.load(), tokenizer)
    nothing = ChatDataset(path=path, eval_fraction=0.0, max_length=5, on_overlong="drop")
    with pytest.raises(ConfigError, match="no training rows left"):
        nothing.enforce_length(nothing.load(), tokenizer)


def test_empty_data_after_filtering_fails_before_the_model_loads(
    run_recipe, tmp_path: Path, monkeypatch
) -> None:
    from components.model import CausalLM

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(CausalLM, "build", no_load)
    path = write(tmp_path / "x.jsonl", [{"prompt": "long " * 80, "completion": "b"}] * 4)
    with pytest.raises(ConfigError, match="no training rows left"):
        run_recipe(f"data.path={path}", "data.eval_path=null", "data.format=auto", "data.on_overlong=drop")
