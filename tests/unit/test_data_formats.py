"""The data formats users bring: ShareGPT, files with a BOM / CRLF / multi-line csv fields, UltraFeedback and
Anthropic HH preference pairs, ``data.columns='{..}'`` from the command line, errors that name the format
problem instead of offering to skip every row, and the eval split taken from the user's own data.

Every fixture file is written here the way the data ships (LLaMA-Factory's pretty-printed ShareGPT array,
an UltraFeedback-binarized row with its extra columns, HH-RLHF transcripts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.preferences import PreferenceDataset
from hydratune.components.data.prompts import PromptDataset
from tests.support.data import write_jsonl

REPO = Path(__file__).resolve().parents[2]
DEFAULT = "the default: data.eval_fraction sets a share without a cap)"  # the default hold-out's note
TINY = REPO / "components" / "assets" / "tiny"

# LLaMA-Factory's ShareGPT layout (data/glaive_toolcall_en_demo.json): a JSON array, indent 2, a system
# column and a tools column next to the conversation (function_call / observation: a tool call, its result).
SHAREGPT = [
    {
        "conversations": [
            {"from": "human", "value": "What's the weather in Paris?"},
            {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
            {"from": "observation", "value": '{"temperature": 18, "sky": "clear"}'},
            {"from": "gpt", "value": "It is 18 °C and clear in Paris."},
        ],
        "system": "You are a helpful assistant.",
        "tools": '[{"name": "get_weather", "parameters": {"city": {"type": "string"}}}]',
    },
    {
        "conversations": [
            {"from": "system", "value": "Answer briefly."},
            {"from": "human", "value": "What is 2 + 2?"},
            {"from": "gpt", "value": "4"},
            {"from": "human", "value": "And 3 + 3?"},
            {"from": "gpt", "value": "6"},
        ],
        "tools": "",
    },
]
SHAREGPT_MESSAGES = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {  # a function_call turn is the assistant's tool call, in OpenAI's shape
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": '{"temperature": 18, "sky": "clear"}'},
        {"role": "assistant", "content": "It is 18 °C and clear in Paris."},
    ],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"},
        {"role": "assistant", "content": "6"},
    ],
]

QUESTION = "How do I boil an egg?"


def ultrafeedback_row(i: int = 0, question: str = QUESTION) -> dict[str, Any]:
    """One row as HuggingFaceH4/ultrafeedback_binarized ships it (train_prefs split)."""
    user = {"content": f"{question} ({i})", "role": "user"}
    chosen = [user, {"content": f"Simmer it for 9 minutes, then cool it. ({i})", "role": "assistant"}]
    rejected = [user, {"content": f"Eggs cannot be boiled. ({i})", "role": "assistant"}]
    return {
        "prompt": user["content"],
        "prompt_id": f"{i:064x}",
        "chosen": chosen,
        "rejected": rejected,
        "messages": chosen,
        "score_chosen": 8.5,
        "score_rejected": 3.0,
    }


def hh_row(i: int = 0) -> dict[str, str]:
    """One row as Anthropic/hh-rlhf ships it: two whole transcripts that differ in the last reply."""
    shared = f"\n\nHuman: What is {i} + 2?\n\nAssistant: {i + 2}.\n\nHuman: And times 3?\n\nAssistant:"
    return {"chosen": f"{shared} {(i + 2) * 3}.", "rejected": f"{shared} I'd rather not do maths."}


def error(fn: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn()
    return info.value


# ----------------------------------------------------------------------------------------- ShareGPT


@pytest.mark.parametrize("fmt", ["auto", "sharegpt"])
def test_sharegpt_array_file_becomes_chat_messages(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "glaive_toolcall_en_demo.json"
    path.write_text(json.dumps(SHAREGPT, indent=2, ensure_ascii=False), encoding="utf-8")
    ds = ChatDataset(path=str(path), format=fmt, eval_fraction=0.0)
    data = ds.load()
    train = data["train"]
    assert train.column_names == ["messages", "answer", "tools"]  # the tools column reaches the template
    assert train["messages"] == SHAREGPT_MESSAGES
    assert [json.loads(t) if t else t for t in train["tools"]] == [json.loads(SHAREGPT[0]["tools"]), None]
    assert train["answer"] == ["It is 18 °C and clear in Paris.", "6"]
    assert data.info["format"] == ("sharegpt (detected)" if fmt == "auto" else "sharegpt")


def test_either_turn_shape_in_either_column(tmp_path: Path) -> None:
    openai_turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    sharegpt_turns = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    for column, turns in (("conversations", openai_turns), ("messages", sharegpt_turns)):
        path = write_jsonl(tmp_path / f"{column}.jsonl", [{column: turns}] * 3)
        assert ChatDataset(path=path, eval_fraction=0.0).load()["train"][0]["messages"] == openai_turns


def test_other_role_names_need_data_roles_and_the_error_says_so(tmp_path: Path) -> None:
    rows = [
        {"conversations": [{"from": "me", "value": f"q{i}"}, {"from": "bot", "value": f"a{i}"}]}
        for i in range(8)
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    err = error(ChatDataset(path=path).load)
    assert err.key == "data.roles" and "the first 5 rows fail the same way" in str(err)
    assert "role 'me'" in str(err) and "columns: conversations" in str(err)
    assert "data.roles='{me: <user|assistant|system|tool>}'" in (err.hint or "") and "on_error" not in (
        err.hint or ""
    )
    ds = ChatDataset(path=path, roles={"bot": "assistant", "me": "user"}, eval_fraction=0.0)
    assert ds.load()["train"][0]["messages"] == [
        {"role": "user", "content": "q0"},
        {"role": "assistant", "content": "a0"},
    ]
    bad = error(ChatDataset(path=path, roles={"bot": "robot"}).validate)
    assert bad.key == "data.roles" and "'robot'" in str(bad)


def test_roles_and_columns_compose_from_the_command_line_form(compose_cfg, tmp_path: Path) -> None:
    from hydra.utils import instantiate

    rows = [
        {"dialog": [{"from": "me", "value": f"q{i}"}, {"from": "bot", "value": f"a{i}"}]} for i in range(20)
    ]
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    cfg = compose_cfg(
        "data=jsonl_messages",
        f"data.path={path}",
        "data.columns={messages: dialog}",
        "data.roles={bot: assistant, me: user}",
    )
    assert dict(cfg.data.columns) == {"messages": "dialog"} and dict(cfg.data.roles) == {
        "bot": "assistant",
        "me": "user",
    }
    data = instantiate(cfg.data)
    data.validate()
    loaded = data.load()
    assert (len(loaded["train"]), len(loaded["eval"])) == (19, 1)
    assert loaded["train"][0]["messages"][1] == {"role": "assistant", "content": loaded["train"][0]["answer"]}


def test_the_readme_form_of_data_columns_composes_in_every_data_option(compose_cfg) -> None:
    """Hydra closes the composed config (struct), so a new key in a ``Dict`` knob used to need ``+``."""
    for option, column in (("demo_sft", "messages"), ("demo_dpo", "prompt"), ("demo_grpo", "prompt")):
        cfg = compose_cfg(f"data={option}", f"data.columns={{{column}: mine}}")
        assert dict(cfg.data.columns) == {column: "mine"}
    cfg = compose_cfg("data.columns={messages: a}", "data.columns={system: b}")  # a second one adds
    assert dict(cfg.data.columns) == {"messages": "a", "system": "b"}
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_cfg("data.colums={messages: a}")  # a misspelt knob still fails at compose time


def test_column_hints_show_the_one_documented_form(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "q", "reply": "a"}] * 4)
    hints = [
        error(ChatDataset(path=path, columns={"question": "q"}).validate).hint,  # unknown canonical name
        error(ChatDataset(path=path, columns={"prompt": "nope"}).load).hint,  # mapped column missing
        error(ChatDataset(path=path, format="alpaca").load).hint,  # required column missing
        error(ChatDataset(path=path).load).hint,  # matches no format
        error(PreferenceDataset(path=path).load).hint,
    ]
    for hint in hints:
        assert "data.columns='{" in (hint or ""), hint
    assert "data.columns='{prompt: <your column>}'" in (hints[1] or "")
    sources = [*(REPO / "components").glob("*.py"), *(REPO / "recipes").glob("*.py")]
    assert not [p.name for p in sources if "+data.columns" in p.read_text()]


# -------------------------------------------------------------------------------------- file quirks


def test_jsonl_with_a_bom_and_crlf_line_ends(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(4)]
    path = write_jsonl(tmp_path / "windows.jsonl", rows, bom=True, crlf=True)
    data = ChatDataset(path=path, eval_fraction=0.0).load()["train"]
    assert data["answer"] == ["a0", "a1", "a2", "a3"]
    assert data[0]["messages"][0] == {
        "role": "user",
        "content": "q0",
    }  # no BOM left in the first key or value


def test_json_array_with_a_bom_and_crlf(tmp_path: Path) -> None:
    rows = [{"instruction": f"Add {i} and 1.", "output": str(i + 1)} for i in range(3)]
    text = json.dumps(rows, indent=2).replace("\n", "\r\n")
    (tmp_path / "alpaca.json").write_bytes(b"\xef\xbb\xbf" + text.encode())
    data = ChatDataset(path=str(tmp_path / "alpaca.json"), eval_fraction=0.0).load()["train"]
    assert data["answer"] == ["1", "2", "3"]


def test_a_jsonl_file_holding_one_pretty_printed_array(tmp_path: Path) -> None:
    (tmp_path / "export.jsonl").write_text(
        json.dumps(SHAREGPT, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    assert (
        ChatDataset(path=str(tmp_path / "export.jsonl"), eval_fraction=0.0).load()["train"]["messages"]
        == SHAREGPT_MESSAGES
    )
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": }\n')  # JSON lines with a bad line: named
    assert "bad.jsonl:2: malformed JSON" in str(error(ChatDataset(path=str(tmp_path / "bad.jsonl")).load))


def test_csv_with_a_bom_crlf_and_quoted_multiline_fields(tmp_path: Path) -> None:
    csv = (
        "instruction,input,output\r\n"
        '"Write a haiku about rain.",,"Soft rain on the roof,\r\n'
        'the gutter hums its one note,\r\nsleep comes easily."\r\n'
        '"Say ""hi"", politely.",to Ana,"Hello, Ana!"\r\n'
    )
    (tmp_path / "excel.csv").write_bytes(b"\xef\xbb\xbf" + csv.encode())
    data = ChatDataset(path=str(tmp_path / "excel.csv"), eval_fraction=0.0).load()["train"]
    assert data["answer"] == [
        "Soft rain on the roof,\nthe gutter hums its one note,\nsleep comes easily.",
        "Hello, Ana!",
    ]
    assert data[1]["messages"][0]["content"] == 'Say "hi", politely.\n\nto Ana'


def test_utf16_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "notepad.jsonl").write_bytes('{"text": "hi"}\n'.encode("utf-16"))
    err = error(ChatDataset(path=str(tmp_path / "notepad.jsonl")).load)
    assert "is UTF-16 text, not UTF-8" in str(err) and "UTF-8" in (err.hint or "")


# ---------------------------------------------------------------------------------- preference pairs


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY))


def dpo_token_ids(tokenizer: Any, row: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(prompt ids, chosen ids) as TRL's DPOTrainer tokenizes a conversational row: the prompt with the
    generation prompt, prompt + chosen through the chat template, the completion starting where the two
    diverge (``trl.data_utils.common_prefix_length``)."""
    from trl.data_utils import common_prefix_length

    def ids(messages: list[dict[str, str]], **kw: Any) -> list[int]:
        return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)["input_ids"]

    prompt, full = ids(row["prompt"], add_generation_prompt=True), ids(row["prompt"] + row["chosen"])
    n = common_prefix_length(prompt, full)
    return prompt[:n], full[n:]


def test_ultrafeedback_rows_train_the_question_once(tmp_path: Path, tokenizer: Any) -> None:
    path = write_jsonl(tmp_path / "ultrafeedback.jsonl", [ultrafeedback_row(i) for i in range(6)])
    ds = PreferenceDataset(path=path, eval_fraction=0.0)
    data = ds.load()
    row = data["train"][0]
    assert data.info["format"] == "implicit (detected)"
    question = f"{QUESTION} (0)"
    assert row == {
        "prompt": [{"role": "user", "content": question}],
        "chosen": [{"role": "assistant", "content": "Simmer it for 9 minutes, then cool it. (0)"}],
        "rejected": [{"role": "assistant", "content": "Eggs cannot be boiled. (0)"}],
    }
    prompt, chosen = dpo_token_ids(tokenizer, row)
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")  # the whole prompt is the context
    text = tokenizer.decode(prompt + chosen)
    assert text == (
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        "Simmer it for 9 minutes, then cool it. (0)<|im_end|>\n"
    )
    assert text.count(QUESTION) == 1 and QUESTION not in tokenizer.decode(chosen)
    forced = PreferenceDataset(path=path, format="explicit", eval_fraction=0.0).load()["train"][0]
    prompt, chosen = dpo_token_ids(tokenizer, forced)  # the old reading: the question is trained twice
    assert tokenizer.decode(prompt + chosen).count(QUESTION) == 2


def test_hh_transcripts_split_into_prompt_turns_and_final_replies(tmp_path: Path, tokenizer: Any) -> None:
    path = write_jsonl(tmp_path / "hh.jsonl", [hh_row(i) for i in range(5)])
    ds = PreferenceDataset(path=path, eval_fraction=0.0)
    data = ds.load()
    row = data["train"][1]
    assert data.info["format"] == "hh (detected)"
    assert row == {
        "prompt": [
            {"role": "user", "content": "What is 1 + 2?"},
            {"role": "assistant", "content": "3."},
            {"role": "user", "content": "And times 3?"},
        ],
        "chosen": [{"role": "assistant", "content": "9."}],
        "rejected": [{"role": "assistant", "content": "I'd rather not do maths."}],
    }
    prompt, chosen = dpo_token_ids(tokenizer, row)
    assert tokenizer.decode(prompt + chosen).count("And times 3?") == 1
    assert tokenizer.decode(chosen) == "9.<|im_end|>\n"


def test_forced_formats_and_csv_cells_holding_message_lists(tmp_path: Path) -> None:
    from datasets import Dataset

    rows = [ultrafeedback_row(i) for i in range(3)]
    Dataset.from_list([{k: json.dumps(r[k]) for k in ("chosen", "rejected")} for r in rows]).to_csv(
        str(tmp_path / "pairs.csv"), index=False
    )
    row = PreferenceDataset(path=str(tmp_path / "pairs.csv"), eval_fraction=0.0).load()["train"][2]
    assert row["prompt"] == [{"role": "user", "content": f"{QUESTION} (2)"}] and len(row["chosen"]) == 1
    hh = write_jsonl(tmp_path / "hh.jsonl", [hh_row(0)])
    assert (
        PreferenceDataset(path=hh, format="hh", eval_fraction=0.0).load()["train"][0]["chosen"][0]["content"]
        == "6."
    )
    err = error(PreferenceDataset(path=hh, format="implicit", eval_fraction=0.0).load)
    assert "share" in str(err) or "same turns" in str(err)
    assert error(PreferenceDataset(path=hh, format="pairs").validate).key == "data.format"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (  # the replies diverge from the first turn: nothing shared
            {
                "chosen": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}],
                "rejected": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "b"}],
            },
            "do not start with the same turns",
        ),
        (  # the last turn is the user's
            {
                "chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "rejected": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "why?"},
                ],
            },
            "'rejected' turn 2 is a user turn",
        ),
        (  # an empty final reply (HH has these)
            {"chosen": "\n\nHuman: q\n\nAssistant: a", "rejected": "\n\nHuman: q\n\nAssistant:"},
            "the last turn of 'rejected' should be an assistant reply with content; it is an empty assistant",
        ),
        (
            {"chosen": "\n\nHuman: q\n\nAssistant: a", "rejected": "q? a."},
            "column 'rejected' is not a",
        ),
    ],
)
def test_pairs_that_cannot_be_split_name_the_row(tmp_path: Path, bad: dict[str, Any], message: str) -> None:
    good = hh_row(1) if isinstance(bad["chosen"], str) else ultrafeedback_row(1)
    path = write_jsonl(tmp_path / "pairs.jsonl", [good, bad, good])
    err = error(PreferenceDataset(path=path, eval_fraction=0.0).load)
    assert "pairs.jsonl:2 (row 2)" in str(err) and message in str(err)


# ------------------------------------------------------------------------- errors that don't lose data


def test_a_wrong_format_is_named_instead_of_offering_to_skip_every_row(tmp_path: Path) -> None:
    """Every row fails alike: the format or mapping is wrong; skipping would drop all of them."""
    rows = [
        {"messages": [{"speaker": "user", "text": f"q{i}"}, {"speaker": "bot", "text": f"a{i}"}]}
        for i in range(30)
    ]
    err = error(ChatDataset(path=write_jsonl(tmp_path / "chat.jsonl", rows)).load)
    assert "the first 5 rows fail the same way" in str(err) and "found: speaker, text" in str(err)
    assert (
        "columns: messages" in str(err)
        and "on_error" not in (err.hint or "")
        and "sharegpt:" in (err.hint or "")
    )
    pairs = [{"prompt": f"q{i}", "chosen": 1.5, "rejected": 0.5} for i in range(3)]  # scores, not responses
    err = error(PreferenceDataset(path=write_jsonl(tmp_path / "p.jsonl", pairs)).load)
    assert "all 3 rows fail the same way" in str(err) and "columns: prompt, chosen, rejected" in str(err)
    assert "on_error" not in (err.hint or "") and "implicit:" in (err.hint or "")
    one_bad = [
        {"prompt": "q", "completion": "a"},
        {"prompt": "q", "completion": ""},
        {"prompt": "q", "completion": "a"},
    ]
    err = error(ChatDataset(path=write_jsonl(tmp_path / "one.jsonl", one_bad)).load)
    assert "one.jsonl:2 (row 2)" in str(err) and "data.on_error=skip" in (
        err.hint or ""
    )  # one row: skip is fine


def test_skipping_every_row_says_why(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i}", "completion": [{"role": "bot", "content": "a"}]} for i in range(3)]
    err = error(ChatDataset(path=write_jsonl(tmp_path / "x.jsonl", rows), on_error="skip").load)
    assert "every row was skipped; the first: " in str(err) and "x.jsonl:1 (row 1)" in str(err)
    assert "role 'bot'" in str(err)


# ---------------------------------------------------------------------------------------- eval split


@pytest.mark.parametrize(
    ("knobs", "n_eval", "eval_from"),
    [
        ({}, 1000, f"5% of data.path, at most 1,000 rows (seed 42; {DEFAULT}"),  # not 1,250: the cap
        ({"eval_fraction": 0.05}, 1250, "5% of data.path (seed 42)"),  # said explicitly: all of it
        ({"eval_size": 1500}, 1500, "data.eval_size=1500 of data.path (seed 42)"),
    ],
)
def test_the_default_eval_hold_out_is_capped_and_explicit_ones_are_not(
    tmp_path: Path, knobs: dict[str, Any], n_eval: int, eval_from: str
) -> None:
    """25,000 rows: the default holds out 5% but at most 1,000 rows (evaluating them at the end of a short
    run would dominate it); an explicit share or count means what it says."""
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(25_000)))
    loaded = ChatDataset(path=str(path), **knobs).load()
    assert len(loaded["eval"]) == n_eval and len(loaded["train"]) == 25_000 - n_eval
    assert loaded.info["eval rows from"] == eval_from


@pytest.mark.parametrize(
    ("recipe_data", "extra", "eval_from", "n_eval"),
    [
        ("recipe=dpo", [], "the demo eval file", 64),
        ("recipe=dpo", ["data.path=MINE"], f"5% of data.path, at most 1,000 rows (seed 42; {DEFAULT}", 2),
        ("recipe=dpo", ["data.path=MINE", "data.eval_path=EVAL"], "data.eval_path=EVAL", 3),
        (
            "recipe=dpo",
            ["data.path=MINE", "data.eval_fraction=0.1", "train.seed=7"],
            "10% of data.path (seed 7)",
            4,
        ),
        ("recipe=dpo", ["data.path=MINE", "data.eval_size=5"], "data.eval_size=5 of data.path (seed 42)", 5),
        ("recipe=dpo", ["data.path=MINE", "data.eval_fraction=0"], "none (data.eval_fraction=0)", 0),
        ("data=demo_sft", ["data.path=MINE"], f"5% of data.path, at most 1,000 rows (seed 42; {DEFAULT}", 2),
        ("data=demo_grpo", ["data.path=MINE"], f"5% of data.path, at most 1,000 rows (seed 42; {DEFAULT}", 2),
    ],
)
def test_eval_rows_come_from_the_users_data(
    compose_cfg, tmp_path: Path, recipe_data: str, extra: list[str], eval_from: str, n_eval: int
) -> None:
    from hydra.utils import instantiate

    pairs = [{"prompt": f"What is {i} + 1?", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(40)]
    if "sft" in recipe_data:
        pairs = [{"prompt": p["prompt"], "completion": p["chosen"]} for p in pairs]
    elif "grpo" in recipe_data:
        pairs = [{"prompt": p["prompt"], "answer": p["chosen"]} for p in pairs]
    mine = write_jsonl(tmp_path / "mine.jsonl", pairs)
    evals = write_jsonl(tmp_path / "mine_eval.jsonl", pairs[:3])
    overrides = [o.replace("MINE", mine).replace("EVAL", evals) for o in extra]
    data = instantiate(compose_cfg(recipe_data, *overrides).data)
    data.validate()
    loaded = data.load()
    assert loaded.info["eval rows from"] == eval_from.replace("EVAL", evals)
    assert len(loaded["eval"]) == n_eval
    if "data.path=MINE" in extra and "data.eval_path=EVAL" not in extra:  # held out from mine: disjoint
        assert len(loaded["train"]) + n_eval == 40
        assert not {str(r) for r in loaded["eval"]} & {str(r) for r in loaded["train"]}


# --------------------------------------------------------------------------- TRL takes the converted rows


def test_prompt_dataset_reads_sharegpt_style_prompts(tmp_path: Path) -> None:
    rows = [
        {"prompt": [{"from": "human", "value": f"What is {i} + 1?"}], "answer": str(i + 1)} for i in range(3)
    ]
    row = PromptDataset(path=write_jsonl(tmp_path / "p.jsonl", rows), eval_fraction=0.0).load()["train"][0]
    assert row == {"prompt": [{"role": "user", "content": "What is 0 + 1?"}], "answer": "1"}


def test_a_shared_assistant_turn_stays_in_the_replies(tmp_path: Path) -> None:
    """The prompt ends before the replies start: a turn the two replies share (here the same tool call)
    stays in both, so the prompt never ends with an assistant turn (DPO adds a generation prompt to it)."""
    call = {"role": "assistant", "content": '{"name": "search", "arguments": {"q": "eggs"}}'}
    user = {"role": "user", "content": QUESTION}
    row = {
        "chosen": [user, call, {"role": "assistant", "content": "Simmer it for 9 minutes."}],
        "rejected": [user, call, {"role": "assistant", "content": "No results."}],
    }
    pair = PreferenceDataset(path=write_jsonl(tmp_path / "p.jsonl", [row]), eval_fraction=0.0).load()[
        "train"
    ][0]
    assert pair["prompt"] == [user]
    assert pair["chosen"] == row["chosen"][1:] and pair["rejected"] == row["rejected"][1:]


def test_a_file_that_is_not_json_lines_is_named_as_such(tmp_path: Path) -> None:
    """Python dict reprs (single quotes) on every line: no line is JSON, so skipping is not offered."""
    (tmp_path / "repr.jsonl").write_text(
        "".join(repr({"prompt": f"q{i}", "completion": "a"}) + "\n" for i in range(9))
    )
    err = error(ChatDataset(path=str(tmp_path / "repr.jsonl")).load)
    assert "none of the first 5 lines is a JSON object, so this is not JSON lines" in str(err)
    assert (
        "{'prompt': 'q0'" in str(err)
        and "on_error" not in (err.hint or "")
        and "single-quoted" in (err.hint or "")
    )
