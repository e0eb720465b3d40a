"""Data formats normalise to one shape; bad files fail naming the file, line or column.

Every test writes its own small files (``tmp_path``); only the shipped-option test reads the demo assets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.preferences import PreferenceDataset
from hydratune.components.data.prompts import PromptDataset
from hydratune.components.generation.evaluation import eval_prompts
from tests.support.data import chat, write_jsonl

ASSETS = Path(__file__).resolve().parents[2] / "components" / "assets"
CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
]
QA = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]


def write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def numbered(tmp_path: Path, n: int = 20, name: str = "pc.jsonl") -> str:
    """``n`` prompt/completion rows with distinct prompts ``q0``..."""
    return write(tmp_path / name, [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(n)])


def error(fn: Any, *args: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    return info.value


# ------------------------------------------------------------------------------------------ formats


@pytest.mark.parametrize(
    ("row", "fmt", "messages"),
    [
        ({"messages": QA}, "messages", QA),
        ({"messages": CHAT, "extra": 1}, "messages", CHAT),
        ({"instruction": "What is 2 + 2?", "output": "4"}, "alpaca", QA),
        ({"instruction": "What is 2 + 2?", "input": "", "output": "4"}, "alpaca", QA),
        (
            {"instruction": "Add.", "input": "2 and 2", "output": 4},  # numbers become text
            "alpaca",
            [{"role": "user", "content": "Add.\n\n2 and 2"}, {"role": "assistant", "content": "4"}],
        ),
        ({"prompt": "What is 2 + 2?", "completion": "4"}, "prompt_completion", QA),
        ({"prompt": QA[:1], "completion": QA[1:]}, "prompt_completion", QA),
    ],
)
@pytest.mark.parametrize("declared", [False, True])
def test_formats_become_canonical_messages(
    tmp_path: Path, row: dict[str, Any], fmt: str, messages: list[dict[str, str]], declared: bool
) -> None:
    path = write(tmp_path / "d.jsonl", [row] * 3)
    data = ChatDataset(path=path, format=fmt if declared else "auto", eval_fraction=0.0).load()
    # prompt/completion rows also say how many last turns are the completion (completion_only_loss)
    completion = {"completion_turns": 1} if fmt in ("alpaca", "prompt_completion") else {}
    assert data["train"].column_names == ["messages", "answer", *completion]
    assert data["train"][0] == {"messages": messages, "answer": "4", **completion}
    assert len(data["train"]) == 3 and len(data["eval"]) == 0
    assert data["eval"].column_names == data["train"].column_names


def test_text_format_is_language_modelling(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [{"text": f"{i} + 1 = {i + 1}"} for i in range(10)])
    ds = ChatDataset(path=path, eval_size=2)
    data = ds.load()
    assert data["train"].column_names == ["text"] == data["eval"].column_names
    assert (len(data["train"]), len(data["eval"])) == (8, 2)
    assert ds.pairs(data, "eval") is None  # raw text: no prompt to complete


def test_answer_is_last_assistant_turn_and_prompts_cut_before_it(tmp_path: Path) -> None:
    turns = [*QA, {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6"}]
    ds = ChatDataset(path=write(tmp_path / "m.jsonl", [{"messages": turns}] * 2), eval_size=1, dedup="count")
    data = ds.load()
    assert data["eval"][0]["answer"] == "6"
    [(prompt, answer)] = ds.pairs(data, "eval")
    assert prompt == turns[:3] and answer == "6"


@pytest.mark.parametrize(
    ("row", "found"),
    [
        ({"foo": 1, "bar": 2}, "foo, bar"),
        ({"messages": QA, "text": "x"}, "messages, text"),  # ambiguous
        ({"prompt": "q", "completion": "a", "instruction": "i", "output": "o"}, "prompt, completion"),
    ],
)
def test_auto_detect_fails_listing_columns_and_formats(tmp_path: Path, row: dict, found: str) -> None:
    err = error(ChatDataset(path=write(tmp_path / "x.jsonl", [row] * 3), eval_fraction=0.0).load)
    assert err.key == "data.format" and "x.jsonl" in str(err) and found in str(err)
    assert "prompt_completion: prompt + completion" in str(err) and "alpaca: instruction + output" in str(err)


def test_format_is_detected_on_path_and_applied_to_eval_path(tmp_path: Path) -> None:
    train = numbered(tmp_path)
    evals = write(tmp_path / "e.jsonl", [{"messages": QA}])
    err = error(ChatDataset(path=train, eval_path=evals).load)
    assert err.key == "data.columns" and "e.jsonl is missing the column 'prompt'" in str(err)
    assert "columns: messages" in str(err)


# ------------------------------------------------------------------------------------ columns, system


def test_column_mapping_and_system_prompt(tmp_path: Path) -> None:
    path = write(tmp_path / "q.jsonl", [{"question": f"q{i}", "reply": f"a{i}"} for i in range(10)])
    ds = ChatDataset(
        path=path,
        columns={"prompt": "question", "completion": "reply"},
        system_prompt="be brief",
        eval_size=2,
    )
    data = ds.load()
    row = data["train"][0]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert row["messages"][0]["content"] == "be brief" and row["answer"] == row["messages"][2]["content"]
    prompts = ds.pairs(data, "eval")
    assert len(prompts) == 2 and prompts[0][0][-1]["role"] == "user" and prompts[0][1].startswith("a")


def test_mapping_replaces_a_same_named_column_and_system_column_wins(tmp_path: Path) -> None:
    rows = [{"prompt": "ignored", "question": "q", "completion": "a", "persona": "pirate"}]
    ds = ChatDataset(
        path=write(tmp_path / "q.jsonl", rows),
        columns={"prompt": "question", "system": "persona"},
        system_prompt="default",
        eval_fraction=0.0,
    )
    assert ds.load()["train"][0]["messages"] == [
        {"role": "system", "content": "pirate"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]


def test_messages_that_start_with_a_system_turn_keep_it(tmp_path: Path) -> None:
    ds = ChatDataset(path=write(tmp_path / "m.jsonl", [{"messages": CHAT}]), system_prompt="other")
    assert ds.load()["train"][0]["messages"] == CHAT


def test_mapping_to_a_missing_column_lists_the_columns(tmp_path: Path) -> None:
    err = error(ChatDataset(path=numbered(tmp_path), columns={"prompt": "question"}).load)
    assert (
        err.key == "data.columns" and "'question'" in str(err) and "columns: prompt, completion" in str(err)
    )


def test_unknown_canonical_name_in_columns_fails_validate(tmp_path: Path) -> None:
    err = error(ChatDataset(path=numbered(tmp_path), columns={"question": "q"}).validate)
    assert err.key == "data.columns" and "'question'" in str(err) and "instruction" in (err.hint or "")


# ---------------------------------------------------------------------------------------- splitting


def test_split_is_seeded_deterministic_and_disjoint(tmp_path: Path) -> None:
    path = numbered(tmp_path, 50)

    def split(seed: int, **kw: Any) -> tuple[list[str], list[str]]:
        data = ChatDataset(path=path, seed=seed, **kw).load()
        return [r["answer"] for r in data["train"]], [r["answer"] for r in data["eval"]]

    train, evals = split(1, eval_size=10)
    assert split(1, eval_size=10) == (train, evals)
    assert split(2, eval_size=10)[1] != evals
    assert len(evals) == 10 and not set(train) & set(evals)
    assert sorted(train + evals) == sorted(f"a{i}" for i in range(50))
    assert len(split(1, eval_fraction=0.2)[1]) == 10
    assert len(split(1, eval_fraction=0.001)[1]) == 1  # a fraction > 0 holds out at least one row


def test_eval_path_max_samples_and_too_big_eval(tmp_path: Path) -> None:
    data = ChatDataset(
        path=numbered(tmp_path, 30), eval_path=numbered(tmp_path, 4, "e.jsonl"), max_samples=12
    ).load()
    assert (len(data["train"]), len(data["eval"])) == (12, 4)
    assert data["train"][0]["answer"] == "a0"  # max_samples takes the first rows; eval_path is not shuffled
    err = error(ChatDataset(path=numbered(tmp_path, 5), eval_size=5).load)
    assert err.key == "data.eval_size" and "no training rows" in str(err)


# ------------------------------------------------------------------------------------- file formats


def test_json_csv_parquet_and_directories(tmp_path: Path) -> None:
    from datasets import Dataset

    rows = [
        {"instruction": f"i{i}", "input": None if i % 2 else f"x{i}", "output": f"o{i}"} for i in range(6)
    ]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "b.json").write_text(json.dumps({"data": rows}))
    (tmp_path / "c.json").write_text("".join(json.dumps(r) + "\n" for r in rows))  # JSON lines in a .json
    Dataset.from_list(rows).to_csv(str(tmp_path / "d.csv"), index=False)
    Dataset.from_list(rows).to_parquet(str(tmp_path / "e.parquet"))
    for name in ("a.json", "b.json", "c.json", "d.csv", "e.parquet"):
        data = ChatDataset(path=str(tmp_path / name), eval_fraction=0.0).load()
        assert len(data["train"]) == 6, name
        assert data["train"][0]["messages"][0]["content"] == "i0\n\nx0", name
        assert data["train"][1]["messages"][0]["content"] == "i1", name  # blank input: instruction only
    whole = ChatDataset(path=str(tmp_path), eval_fraction=0.0, max_samples=14).load()
    assert len(whole["train"]) == 14


def test_hub_ids_pass_validate_and_fail_offline_clearly(tmp_path: Path, monkeypatch) -> None:
    import datasets

    ChatDataset(path="someorg/some_dataset").validate()  # a hub id, not a missing file
    ChatDataset(path="wikitext").validate()

    def offline(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("Couldn't reach 'someorg/some_dataset' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    err = error(ChatDataset(path="someorg/some_dataset", split="test").load)
    assert err.key == "data.path" and "could not load hub dataset 'someorg/some_dataset'" in str(err)
    assert "split 'test'" in str(err) and "Offline" in str(err) and "local .jsonl" in (err.hint or "")


# ------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "path", ["/nonexistent.jsonl", "./missing.csv", "no_such_dir/train.parquet", "a/b/c"]
)
def test_validate_missing_file_names_key_and_path(path: str) -> None:
    err = error(ChatDataset(path=path).validate)
    assert err.key == "data.path" and path in str(err) and "not found" in str(err)


def test_validate_missing_eval_file_and_bad_suffix(tmp_path: Path) -> None:
    err = error(ChatDataset(path=numbered(tmp_path), eval_path="/nonexistent.jsonl").validate)
    assert err.key == "data.eval_path" and "/nonexistent.jsonl" in str(err)
    (tmp_path / "notes.md").write_text("hello")  # (.txt is read: a corpus, components/data/textcorpus.py)
    err = error(ChatDataset(path=str(tmp_path / "notes.md")).validate)
    assert err.key == "data.path" and "'.md'" in str(err) and ".jsonl" in (err.hint or "")
    (tmp_path / "empty_dir").mkdir()
    assert error(ChatDataset(path=str(tmp_path / "empty_dir")).validate).key == "data.path"


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("format", "yaml"),
        ("packing_strategy", "ffd"),
        ("on_error", "ignore"),
        ("on_overlong", "cut"),
    ],
)
def test_validate_rejects_bad_values(tmp_path: Path, knob: str, value: Any) -> None:
    err = error(ChatDataset(path=numbered(tmp_path), **{knob: value}).validate)
    assert err.key == f"data.{knob}"
    ChatDataset(path=numbered(tmp_path)).validate()  # the defaults are fine


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("eval_fraction", 1.0),
        ("eval_fraction", -0.1),
        ("max_length", 0),
        ("max_length", 15),
        ("eval_size", -1),
        ("max_samples", 0),
    ],
)
def test_out_of_range_values_are_refused(knob: str, value: Any) -> None:
    """Each knob's range is declared on its field, checked before the component is built (check_values)."""
    from hydratune.components.config.ranges import check_knobs

    err = error(lambda: check_knobs(ChatDataset.__schema__, {knob: value}, "data"))  # type: ignore[attr-defined]
    assert err.key == f"data.{knob}" and "must be" in str(err)


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": "broken"\n')
    err = error(ChatDataset(path=str(path)).load)
    assert err.key == "data.path" and "bad.jsonl:3: malformed JSON" in str(err)
    (tmp_path / "bad.json").write_text('[\n  {"text": "ok"},\n  {"text": }\n]')
    assert "bad.json:3: malformed JSON" in str(error(ChatDataset(path=str(tmp_path / "bad.json")).load))
    path.write_text('{"text": "ok"}\n["a list"]\n')
    assert "bad.jsonl:2: expected a JSON object" in str(error(ChatDataset(path=str(path)).load))


@pytest.mark.parametrize("name", ["empty.jsonl", "blank.jsonl", "empty.json", "empty.csv", "header.csv"])
def test_empty_files_have_no_rows(tmp_path: Path, name: str) -> None:
    content = {"blank.jsonl": "\n  \n", "empty.json": "[]", "header.csv": "prompt,completion\n"}.get(name, "")
    (tmp_path / name).write_text(content)
    err = error(ChatDataset(path=str(tmp_path / name)).load)
    assert err.key == "data.path" and f"{name} holds no rows" in str(err)


@pytest.mark.parametrize("name", ["latin.jsonl", "latin.json", "latin.csv"])
def test_non_utf8_file_is_named(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    body = (
        "prompt,completion\nq,a\ncafé,x\n" if name.endswith(".csv") else '{"text": "ok"}\n{"text": "café"}\n'
    )
    path.write_bytes(body.encode("latin-1"))
    err = error(ChatDataset(path=str(path)).load)
    where = f"{name}:3" if name.endswith(".csv") else f"{name}:2"
    assert err.key == "data.path" and where in str(err) and "not UTF-8" in str(err)


def test_missing_required_column_is_named_with_the_columns_present(tmp_path: Path) -> None:
    path = write(tmp_path / "x.jsonl", [{"instruction": "i", "input": "x"}] * 3)
    err = error(ChatDataset(path=path, format="alpaca").load)
    assert "x.jsonl is missing the column 'output'" in str(err) and "columns: instruction, input" in str(err)
    assert err.key == "data.columns" and "data.columns='{output: <your column>}'" in (err.hint or "")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"prompt": "q", "completion": " "}, "no value in column 'completion'"),
        ({"prompt": "q"}, "no value in column 'completion'"),
        ({"prompt": "q", "completion": ["a"]}, "message 0 in column 'completion' needs 'role' and 'content'"),
        (
            {"prompt": [{"role": "bot", "content": "q"}], "completion": "a"},
            "has role 'bot' (known: system, user, assistant, tool, human, gpt, observation, function_call)",
        ),
        (
            {"prompt": [QA[0]], "completion": [{"role": "user", "content": "a"}]},
            "no assistant turn with content",
        ),
    ],
)
def test_bad_row_names_file_line_row_and_column(tmp_path: Path, bad: dict, message: str) -> None:
    path = write(tmp_path / "x.jsonl", [{"prompt": "q", "completion": "a"}, bad])
    err = error(ChatDataset(path=path, eval_fraction=0.0).load)
    assert "x.jsonl:2 (row 2)" in str(err) and message in str(err)


def test_messages_without_an_answer_fail_naming_the_row(tmp_path: Path) -> None:
    rows = [{"messages": QA}, {"messages": QA}, {"messages": [QA[0], {"role": "assistant", "content": ""}]}]
    err = error(ChatDataset(path=write(tmp_path / "m.jsonl", rows), eval_fraction=0.0).load)
    assert "m.jsonl:3 (row 3): no assistant turn with content" in str(err)


def test_csv_rows_are_named_by_row(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("instruction,output\ni,o\ni,\n")
    err = error(ChatDataset(path=str(tmp_path / "x.csv")).load)
    assert "x.csv, row 2: no value in column 'output'" in str(err)


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
    assert data.stats["skipped rows"] == 3
    all_bad = write(tmp_path / "bad.jsonl", [{"prompt": "q", "completion": ""}] * 2)
    err = error(ChatDataset(path=all_bad, on_error="skip").load)
    assert "no training rows left" in str(err)


# --------------------------------------------------------------------------------- preference, prompts


def test_preference_strings_become_messages_and_lists_pass_through(tmp_path: Path) -> None:
    strings = write(
        tmp_path / "s.jsonl", [{"prompt": f"q{i}", "chosen": "good", "rejected": "bad"} for i in range(5)]
    )
    data = PreferenceDataset(path=strings, eval_size=1).load()
    assert data["train"].column_names == ["prompt", "chosen", "rejected"] == data["eval"].column_names
    row = data["train"][0]
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].startswith("q")
    assert row["chosen"] == [{"role": "assistant", "content": "good"}]
    assert row["rejected"] == [{"role": "assistant", "content": "bad"}]
    chat = {"prompt": CHAT[:2], "chosen": [CHAT[2]], "rejected": [{"role": "assistant", "content": "5"}]}
    row = PreferenceDataset(path=write(tmp_path / "m.jsonl", [chat]), eval_fraction=0.0).load()["train"][0]
    assert row == chat


def test_preference_missing_rejected_names_it(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "a"}] * 3)
    err = error(PreferenceDataset(path=path, eval_fraction=0.0).load)
    assert "'rejected'" in str(err) and "columns: prompt, chosen" in str(err) and "p.jsonl" in str(err)
    mapped = write(tmp_path / "m.jsonl", [{"question": "q", "good": "a", "bad": "b"}])
    ds = PreferenceDataset(path=mapped, columns={"prompt": "question", "chosen": "good", "rejected": "bad"})
    assert ds.load()["train"][0]["rejected"] == [{"role": "assistant", "content": "b"}]


def test_prompt_dataset_keeps_answers(tmp_path: Path) -> None:
    rows = [{"question": f"What is {i} + 1?", "answer": i + 1} for i in range(4)]
    ds = PromptDataset(path=write(tmp_path / "p.jsonl", rows), columns={"prompt": "question"}, eval_size=1)
    data = ds.load()
    row = data["train"][0]
    assert row["prompt"][0]["role"] == "user" and row["answer"].isdigit()
    assert data["eval"].column_names == ["prompt", "answer"]
    assert [answer for _, answer in ds.pairs(data, "eval")] == data["eval"]["answer"]
    bare = PromptDataset(path=write(tmp_path / "b.jsonl", [{"prompt": QA[:1]}] * 2), eval_fraction=0.0)
    loaded = bare.load()
    assert loaded["train"].column_names == ["prompt"]
    assert bare.pairs(loaded, "train") == [(QA[:1], None)] * 2  # no reference answer to score against
    from hydratune.components.config.ranges import check_knobs

    err = error(lambda: check_knobs(PromptDataset.__schema__, {"max_prompt_length": 0}, "data"))  # type: ignore[attr-defined]
    assert err.key == "data.max_prompt_length"


# ------------------------------------------------------------------------------- length, shipped options


@pytest.fixture
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ASSETS / "tiny"))


def test_overlong_policies(tmp_path: Path, tokenizer) -> None:
    rows = [{"prompt": "short", "completion": "a"}, {"prompt": "long " * 80, "completion": "b"}]
    path = write(tmp_path / "x.jsonl", rows)
    keep = ChatDataset(path=path, eval_fraction=0.0, max_length=40)
    assert len(keep.enforce_length(keep.load(), tokenizer)["train"]) == 2  # truncate: the trainer cuts
    drop = ChatDataset(path=path, eval_fraction=0.0, max_length=40, on_overlong="drop")
    dropped = drop.enforce_length(drop.load(), tokenizer)
    assert len(dropped["train"]) == 1
    assert dropped.stats["dropped (too long)"] == 1
    assert [answer for _, answer in drop.pairs(dropped, "train")] == ["a"]  # prompts follow the filtered data
    strict = ChatDataset(path=path, eval_fraction=0.0, max_length=40, on_overlong="error")
    with pytest.raises(ConfigError, match=r"row 1 has \d+ tokens > data.max_length=40"):
        strict.enforce_length(strict.load(), tokenizer)
    nothing = ChatDataset(path=path, eval_fraction=0.0, max_length=5, on_overlong="drop")
    with pytest.raises(ConfigError, match="no training rows left"):
        nothing.enforce_length(nothing.load(), tokenizer)


SHAPES = {
    "ChatDataset": (["messages", "answer"], ["messages", "answer", "completion_turns"], ["text"]),
    "PreferenceDataset": (["prompt", "chosen", "rejected"],),
    "PromptDataset": (["prompt", "answer"], ["prompt"]),
    "UnpairedPreferenceDataset": (["prompt", "completion", "label"],),
}
INFERENCE_ONLY = {"demo_generate", "demo_best_of_n", "demo_eval"}  # every row is generated for / scored
DATA_OPTIONS = sorted(p.stem for p in (ASSETS.parent.parent / "conf" / "data").glob("*.yaml"))


def needs_path(option: str) -> bool:
    text = (ASSETS.parent.parent / "conf" / "data" / f"{option}.yaml").read_text()
    return "\npath: ???" in text


@pytest.mark.parametrize("option", [o for o in DATA_OPTIONS if not needs_path(o)])
def test_shipped_options_load_in_their_canonical_shape(compose_cfg, option: str) -> None:
    from hydra.utils import instantiate

    data = instantiate(compose_cfg(f"data={option}").data)
    data.validate()
    loaded = data.load()
    assert loaded["train"].column_names in SHAPES[type(data).__name__]
    assert loaded["eval"].column_names == loaded["train"].column_names
    assert len(loaded["train"])
    assert len(loaded["eval"]) or option in INFERENCE_ONLY


@pytest.mark.parametrize("option", ["alpaca_file", "jsonl_messages"])
def test_template_options_need_a_path(compose_cfg, tmp_path: Path, option: str) -> None:
    from hydra.utils import instantiate
    from omegaconf.errors import MissingMandatoryValue

    if option not in DATA_OPTIONS:
        pytest.skip(f"no conf/data/{option}.yaml")
    with pytest.raises(MissingMandatoryValue):
        instantiate(compose_cfg(f"data={option}").data)
    rows = (  # distinct rows: copies of one row cannot be held out (data.dedup)
        [{"instruction": f"i{n}", "input": "x", "output": "o"} for n in range(4)]
        if option == "alpaca_file"
        else [{"messages": [{**QA[0], "content": f"q{n}"}, *QA[1:]]} for n in range(4)]
    )
    path = write(tmp_path / "mine.jsonl", rows)
    data = instantiate(compose_cfg(f"data={option}", f"data.path={path}").data)
    data.validate()
    assert len(data.load()["eval"]) == 1  # eval_fraction 0.05 holds out at least one row


def test_empty_data_after_filtering_fails_before_the_model_loads(
    run_recipe, tmp_path: Path, monkeypatch
) -> None:
    from hydratune.components.model import CausalLM

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(CausalLM, "build", no_load)
    path = write(tmp_path / "x.jsonl", [{"prompt": "long " * 80, "completion": "b"}] * 4)
    with pytest.raises(ConfigError, match="no training rows left"):
        run_recipe(
            f"data.path={path}",
            "data.eval_path=null",
            "data.format=auto",
            "data.on_overlong=drop",
            "data.max_length=128",
        )


def test_overlong_eval_prompts_are_truncated_to_their_end_dropped_or_named(tokenizer: Any) -> None:
    short = ([{"role": "user", "content": "2+2?"}], "4")
    long = ([{"role": "user", "content": "tell me " * 400 + "2+3?"}], "5")
    full = tokenizer.apply_chat_template(long[0], tokenize=False, add_generation_prompt=True)
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    assert len(full_ids) > 200

    kept, counts = eval_prompts([short, long], tokenizer, max_length=64, on_overlong="truncate")
    assert [len(p.ids) <= 64 for p in kept] == [True, True]
    assert kept[1].ids == full_ids[-64:]  # the end survives: the question and the generation prompt
    assert (kept[0].truncated, kept[1].truncated) == (False, True)
    assert counts == {"eval prompts truncated": 1}

    kept, counts = eval_prompts([short, long], tokenizer, max_length=64, on_overlong="drop")
    assert [p.answer for p in kept] == ["4"]
    assert counts == {"eval prompts dropped (too long)": 1}

    with pytest.raises(ConfigError, match=r"eval prompt 1 has \d+ tokens > data.max_length=64") as err:
        eval_prompts([short, long], tokenizer, max_length=64, on_overlong="error")
    assert err.value.key == "data.max_length"


def test_session_tokenizes_eval_prompts_within_max_length_before_any_model(
    compose_cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3,000-token eval row with data.max_length=96 (truncate): the prompt the model will see is cut
    while the data loads, and no model has been built at that point."""
    from hydratune.components.model import CausalLM
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components, RunContext
    from hydratune.components.runtime.rundir import RunDir
    from hydratune.components.runtime.session import Session

    train = write_jsonl(tmp_path / "train.jsonl", [chat(f"{i}+1?", str(i + 1)) for i in range(8)])
    evals = write_jsonl(tmp_path / "eval.jsonl", [chat("1+1?", "2"), chat("x " * 3000 + "1+2?", "3")])
    cfg = compose_cfg(
        "data=jsonl_messages", f"data.path={train}", f"data.eval_path={evals}", "data.max_length=96"
    )
    comps = Components.from_config(cfg)
    device = check_before_load(cfg, comps)
    monkeypatch.setattr(CausalLM, "build", lambda *a, **k: pytest.fail("a model was built"))
    session = Session.start(RunContext(cfg, comps, RunDir(tmp_path / "run"), device))
    session.load_data()
    assert [len(p.ids) <= 96 for p in session.eval_prompts] == [True, True]
    assert [p.truncated for p in session.eval_prompts] == [False, True]
    assert session.report["data"]["eval prompts truncated"] == 1


def test_a_cached_hub_id_passes_without_the_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydratune.components.modeling import hub

    monkeypatch.setattr(hub, "is_cached", lambda name, filename, revision=None: True)
    monkeypatch.setattr(hub, "probe", lambda *a: pytest.fail("probed the hub for a cached id"))
    hub.check_available("Qwen/Qwen2.5-0.5B", key="model.name_or_path", filename="config.json")
