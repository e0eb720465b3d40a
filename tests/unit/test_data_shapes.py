"""More data shapes (issue 34, item 5): identical preference pairs in every format, ``.txt`` corpora,
LLaMA-Factory dataset dirs; each checked on the rows a load gives (what the trainer reads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.preferences import PreferenceDataset
from tests.support.data import write_jsonl


def refused(fn: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn()
    return info.value


# ------------------------------------------------------------------------------ identical pairs


def turns(question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def pair_rows(fmt: str, i: int, same: bool) -> dict[str, Any]:
    """Row ``i`` of a preference file in format ``fmt``; ``same``: chosen and rejected identical."""
    good, bad = f"good {i}", f"good {i}" if same else f"bad {i}"
    if fmt == "explicit":
        return {"prompt": f"q{i}", "chosen": good, "rejected": bad}
    if fmt == "implicit":
        return {"chosen": turns(f"q{i}", good), "rejected": turns(f"q{i}", bad)}
    return {
        "chosen": f"\n\nHuman: q{i}\n\nAssistant: {good}",
        "rejected": f"\n\nHuman: q{i}\n\nAssistant: {bad}",
    }


SAME = (3, 7)  # the rows whose chosen and rejected are identical


@pytest.mark.parametrize("fmt", ["explicit", "implicit", "hh"])
def test_identical_pairs_are_refused_or_dropped_and_counted_in_every_format(tmp_path: Path, fmt: str) -> None:
    """A pair with nothing to prefer is refused naming how many and the first (file:line), in every format;
    ``data.on_error=skip`` drops exactly those rows and counts them: no trained pair is identical."""
    path = write_jsonl(tmp_path / f"{fmt}.jsonl", [pair_rows(fmt, i, i in SAME) for i in range(12)])
    err = refused(lambda: PreferenceDataset(path=path, eval_fraction=0.0).load())
    assert err.key == "data.path"
    assert "2 of 12 pairs have the same 'chosen' and 'rejected'" in str(err)
    assert f"{fmt}.jsonl:{SAME[0] + 1} (row {SAME[0] + 1})" in str(err)
    assert "data.on_error=skip" in (err.hint or "")

    data = PreferenceDataset(path=path, eval_fraction=0.0, on_error="skip").load()
    train = data["train"]
    assert len(train) == 12 - len(SAME)
    assert data.stats["dropped (identical chosen/rejected)"] == len(SAME)
    assert all(c != r for c, r in zip(train["chosen"], train["rejected"], strict=True))
    kept = [m[-1]["content"] for m in train["chosen"]]
    assert kept == [f"good {i}" for i in range(12) if i not in SAME]


# ------------------------------------------------------------------------------ .txt corpora

CORPUS = [
    "The first document.\nIts second line, café.",
    "Second document, one line.",
    "Third\ndocument, after two blank lines and one of spaces",
]


def write_corpus(path: Path, docs: list[str], *, crlf: bool = False, bom: bool = False) -> str:
    """``docs`` separated by blank lines (some of them several, or white space only)."""
    gaps = ["\n\n", "\n\n\n   \n"]
    text = "".join(doc + gaps[i % 2] for i, doc in enumerate(docs))
    text = text.replace("\n", "\r\n") if crlf else text
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return str(path)


def test_a_txt_corpus_trains_one_document_per_blank_line_block(tmp_path: Path) -> None:
    """A ``.txt`` file (BOM, CRLF, runs of blank lines), a ``.txt.gz`` and a folder of both: one row per
    document, counted in the summary's info; SFT trains every token of each document and its EOS."""
    import gzip

    from hydratune.components.data.chats import ChatDataset
    from hydratune.components.data.rows import scratch_workers
    from hydratune.components.data.tokens import SFTTokens
    from tests.support.data import TINY

    (tmp_path / "a").mkdir()
    plain = write_corpus(tmp_path / "a" / "corpus.txt", CORPUS, crlf=True, bom=True)
    packed = tmp_path / "a" / "more.txt.gz"
    packed.write_bytes(gzip.compress("\n\n".join(["Fourth.", "Fifth\ndocument."]).encode()))
    data = ChatDataset(path=plain, eval_fraction=0.0).load()
    assert list(data["train"]["text"]) == CORPUS
    assert data.info["format"] == "text (detected)"
    assert data.info["text documents"].startswith(
        "3 from corpus.txt (one document per blank-line-separated block;"
    )
    folder = ChatDataset(path=str(tmp_path / "a"), eval_fraction=0.0).load()
    assert sorted(folder["train"]["text"]) == sorted([*CORPUS, "Fourth.", "Fifth\ndocument."])
    assert folder.info["text documents"].startswith("5 from 2 .txt files")
    assert (
        list(ChatDataset(path=plain, eval_fraction=0.0, max_samples=2).load()["train"]["text"]) == CORPUS[:2]
    )

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY))
    knobs = {"assistant_only": True, "completion_only": True, "max_length": 256, "packing": False}
    tokens, _ = SFTTokens(**knobs, packing_strategy="bfd").prepare(data, tok, scratch_workers())
    for doc, row in zip(CORPUS, tokens["train"], strict=True):
        trained = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
        assert trained == row["input_ids"]  # every token
        assert tok.decode(trained) == doc + tok.eos_token


def test_a_txt_file_that_is_not_utf8_is_refused_naming_its_line_and_streams_resume(tmp_path: Path) -> None:
    from hydratune.components.data.chats import ChatDataset
    from hydratune.components.data.textcorpus import text_rows

    bad = tmp_path / "latin1.txt"
    bad.write_bytes("ok\n\ncaf\xe9\n".encode("latin-1"))
    err = refused(lambda: ChatDataset(path=str(bad), eval_fraction=0.0).load())
    assert "latin1.txt:3: not UTF-8 text (byte 0xe9" in str(err) and err.key == "data.path"
    path = Path(write_corpus(tmp_path / "c.txt", CORPUS))
    assert [(n, r["text"]) for n, r, _ in text_rows(path, 1, "data.path")] == [(2, CORPUS[1]), (3, CORPUS[2])]


# ------------------------------------------------------------------------------ LLaMA-Factory dirs
# The shapes of LLaMA-Factory's data/README.md (its dataset_info.json entries and the rows they describe); the
# expected rows are what its converters (src/llamafactory/data/converter.py) make of them.

ALPACA = [
    {
        "instruction": "Add 2 and 3.",
        "input": "Answer with a number.",
        "output": "5",
        "system": "You add.",
        "history": [["What is 1+1?", "2"]],
    },
    {"instruction": "Add 4 and 4.", "input": "", "output": "8", "system": "", "history": []},
]
TOOLS = json.dumps([{"name": "weather", "description": "the weather", "parameters": {"type": "object"}}])
SHAREGPT = [
    {
        "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "function_call", "value": '{"name": "weather", "arguments": {"city": "Paris"}}'},
            {"from": "observation", "value": "sunny"},
            {"from": "gpt", "value": "It is sunny."},
        ],
        "system": "Use tools.",
        "tools": TOOLS,
    }
]
OPENAI = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello", "weight": 1},
        ]
    }
]
SPEAKERS = [{"dialog": [{"speaker": "me", "text": "Ping"}, {"speaker": "bot", "text": "Pong"}]}]
PAIRS_SHAREGPT = [
    {
        "conversations": [{"from": "human", "value": "Pick one"}],
        "chosen": {"from": "gpt", "value": "good"},
        "rejected": {"from": "gpt", "value": "bad"},
    }
]
PAIRS_ALPACA = [{"instruction": "Pick", "input": "one", "chosen": "good", "rejected": "bad"}]
KTO = [{"instruction": "Say hi", "input": "", "output": "hi", "kto_tag": True}]
TEXT = [{"text": "A document."}, {"text": "Another one."}]
INFO = {
    "alpaca_sft": {
        "file_name": "alpaca.json",
        "columns": {
            "prompt": "instruction",
            "query": "input",
            "response": "output",
            "system": "system",
            "history": "history",
        },
    },
    "alpaca_no_query": {
        "file_name": "alpaca.json",
        "columns": {"prompt": "instruction", "response": "output"},
    },
    "pretrain": {"file_name": "text.json", "columns": {"prompt": "text"}},
    "wiki": {"file_name": "wiki.txt", "columns": {"prompt": "text"}},
    "sharegpt_tools": {
        "file_name": "sharegpt.json",
        "formatting": "sharegpt",
        "columns": {"messages": "conversations", "system": "system", "tools": "tools"},
    },
    "openai": {
        "file_name": "openai.jsonl",
        "formatting": "sharegpt",
        "columns": {"messages": "messages"},
        "tags": {
            "role_tag": "role",
            "content_tag": "content",
            "user_tag": "user",
            "assistant_tag": "assistant",
            "system_tag": "system",
        },
    },
    "speakers": {
        "file_name": "speakers.jsonl",
        "formatting": "sharegpt",
        "columns": {"messages": "dialog"},
        "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "me", "assistant_tag": "bot"},
    },
    "dpo_sharegpt": {
        "file_name": "pairs_sharegpt.json",
        "formatting": "sharegpt",
        "ranking": True,
        "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"},
    },
    "dpo_alpaca": {
        "file_name": "pairs_alpaca.json",
        "ranking": True,
        "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"},
    },
    "kto": {
        "file_name": "kto.json",
        "columns": {"prompt": "instruction", "query": "input", "response": "output", "kto_tag": "kto_tag"},
    },
}


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LLaMA-Factory data dir: dataset_info.json and the files its entries name."""
    root = tmp_path_factory.mktemp("llamafactory")
    for name, rows in [
        ("alpaca.json", ALPACA),
        ("text.json", TEXT),
        ("sharegpt.json", SHAREGPT),
        ("pairs_sharegpt.json", PAIRS_SHAREGPT),
        ("pairs_alpaca.json", PAIRS_ALPACA),
        ("kto.json", KTO),
    ]:
        (root / name).write_text(json.dumps(rows))
    write_jsonl(root / "openai.jsonl", OPENAI)
    write_jsonl(root / "speakers.jsonl", SPEAKERS)
    (root / "wiki.txt").write_text("First article.\nSecond article.\n\nThird article.\n")
    (root / "dataset_info.json").write_text(json.dumps(INFO))
    return root


def lf(cls: Any, root: Path, name: str, **knobs: Any) -> Any:
    """``cls`` reading entry ``name`` of ``root``, validated and loaded (every row trains)."""
    data = cls(path=str(root), subset=name, eval_fraction=0.0, **knobs)
    data.validate()
    return data.load()


def test_llamafactory_alpaca_rows_train_the_history_and_the_response(factory: Path) -> None:
    """The README's alpaca entry: system, history pairs, then ``instruction\\ninput`` (input left out when
    blank) and the output; decoded, exactly the history's response and the output are trained."""
    from hydratune.components.data.chats import ChatDataset
    from hydratune.components.data.rows import scratch_workers
    from hydratune.components.data.tokens import SFTTokens
    from tests.support.data import TINY

    data = lf(ChatDataset, factory, "alpaca_sft")
    assert data["train"][0]["messages"] == [
        {"role": "system", "content": "You add."},
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "Add 2 and 3.\nAnswer with a number."},
        {"role": "assistant", "content": "5"},
    ]
    assert data["train"][1]["messages"] == [
        {"role": "user", "content": "Add 4 and 4."},
        {"role": "assistant", "content": "8"},
    ]
    assert data.info["dataset_info.json"].startswith("'alpaca_sft': alpaca.json, formatting alpaca")
    assert "instruction (LLaMA-Factory prompt)" in data.info["columns used"]
    assert (
        data.info["files not read"]
        == "8 other data files (not the file of the dataset_info.json entry 'alpaca_sft')"
    )

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY))
    knobs = {"assistant_only": True, "completion_only": True, "max_length": 512, "packing": False}
    tokens, _ = SFTTokens(**knobs, packing_strategy="bfd").prepare(data, tok, scratch_workers())
    row = tokens["train"][0]
    trained = [t if label != -100 else None for t, label in zip(row["input_ids"], row["labels"], strict=True)]
    spans, current = [], []
    for t in [*trained, None]:
        if t is None and current:
            spans.append(tok.decode(current))
            current = []
        elif t is not None:
            current.append(t)
    assert spans == ["2<|im_end|>", "5<|im_end|>"]

    narrow = lf(ChatDataset, factory, "alpaca_no_query")  # a columns object replaces the defaults
    assert narrow["train"][0]["messages"][-2] == {"role": "user", "content": "Add 2 and 3."}
    assert "input (not in the dataset_info.json entry)" in narrow.info["columns ignored"]
    assert list(lf(ChatDataset, factory, "pretrain")["train"]["text"]) == ["A document.", "Another one."]
    wiki = lf(ChatDataset, factory, "wiki")  # a .txt entry: one row per line, as LLaMA-Factory reads it
    assert list(wiki["train"]["text"]) == ["First article.", "Second article.", "Third article."]
    assert "(one per non-blank line, as LLaMA-Factory reads it)" in wiki.info["text documents"]


def test_llamafactory_sharegpt_rows_keep_tools_system_and_custom_tags(factory: Path) -> None:
    """sharegpt with the default tags (function_call: the assistant's tool call, observation: its result,
    the system and tools columns), OpenAI-shaped messages (role/content tags, a leading system turn) and
    tag names data.roles cannot express (speaker/text, me/bot)."""
    from hydratune.components.data.chats import ChatDataset

    tools = lf(ChatDataset, factory, "sharegpt_tools")["train"][0]
    assert [m["role"] for m in tools["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert tools["messages"][0]["content"] == "Use tools."
    call = tools["messages"][2]["tool_calls"][0]["function"]
    assert call == {"name": "weather", "arguments": {"city": "Paris"}}
    assert json.loads(tools["tools"])[0]["name"] == "weather"
    openai = lf(ChatDataset, factory, "openai")["train"][0]["messages"]
    assert [(m["role"], m["content"]) for m in openai] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello"),
    ]
    speakers = lf(ChatDataset, factory, "speakers")["train"][0]["messages"]
    assert speakers == [{"role": "user", "content": "Ping"}, {"role": "assistant", "content": "Pong"}]


def test_llamafactory_ranking_kto_and_prompt_entries(factory: Path) -> None:
    from hydratune.components.data.preferences import PreferenceDataset, UnpairedPreferenceDataset
    from hydratune.components.data.prompts import PromptDataset

    for name, prompt in [("dpo_sharegpt", "Pick one"), ("dpo_alpaca", "Pick\none")]:
        pair = lf(PreferenceDataset, factory, name)
        assert pair["train"][0] == {
            "prompt": [{"role": "user", "content": prompt}],
            "chosen": [{"role": "assistant", "content": "good"}],
            "rejected": [{"role": "assistant", "content": "bad"}],
        }
        assert pair.info["format"] == "explicit (dataset_info.json)"
    kto = lf(UnpairedPreferenceDataset, factory, "kto")["train"][0]
    assert kto == {
        "prompt": [{"role": "user", "content": "Say hi"}],
        "completion": [{"role": "assistant", "content": "hi"}],
        "label": True,
    }
    prompts = lf(PromptDataset, factory, "alpaca_sft")["train"]
    assert prompts[1] == {"prompt": [{"role": "user", "content": "Add 4 and 4."}], "answer": "8"}


def test_a_broken_llamafactory_row_is_named_or_skipped(tmp_path: Path) -> None:
    """A sharegpt row whose roles are out of LLaMA-Factory's order (it skips it with a warning) is named
    with its line, or skipped and counted with data.on_error=skip."""
    from hydratune.components.data.chats import ChatDataset

    good = {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}
    bad = {"conversations": [{"from": "gpt", "value": "b"}, {"from": "human", "value": "a"}]}
    write_jsonl(tmp_path / "chats.jsonl", [good, good, good, bad, good, good])
    info = {"chats": {"file_name": "chats.jsonl", "formatting": "sharegpt"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    err = refused(lambda: lf(ChatDataset, tmp_path, "chats"))
    assert "chats.jsonl:4 (row 4): message 0 in column 'conversations' has role 'gpt'" in str(err)
    skipped = lf(ChatDataset, tmp_path, None, on_error="skip")
    assert len(skipped["train"]) == 5 and skipped.stats["skipped rows"] == 1


@pytest.mark.parametrize(
    ("entry", "knobs", "key", "named"),
    [
        ({"hf_hub_url": "org/x"}, {}, "data.subset", "sets 'hf_hub_url': not supported"),
        ({"num_samples": 10}, {}, "data.subset", "sets 'num_samples'"),
        ({"columns": {"prompt": "a", "images": "i"}}, {}, "data.subset", "columns.images: only text"),
        ({"tags": {"role_tag": "r"}}, {}, "data.subset", "has tags, which formatting alpaca does not read"),
        ({"formatting": "openai"}, {}, "data.subset", "formatting 'openai' is not supported"),
        (
            {"columns": {"messages": "m"}},
            {},
            "data.subset",
            "columns.messages is not read by formatting alpaca",
        ),
        ({"ranking": True}, {}, "data.subset", "ranking is true, but its columns map no chosen"),
        ({"shuffle": True}, {}, "data.subset", "'shuffle', which LLaMA-Factory's format does not define"),
        ({"file_name": "missing.json"}, {}, "data.subset", "file_name 'missing.json' is not in"),
        ({}, {"columns": {"prompt": "q"}}, "data.columns", "beside a LLaMA-Factory dataset dir"),
        ({}, {"roles": {"bot": "assistant"}}, "data.roles", "beside a LLaMA-Factory dataset dir"),
        ({}, {"format": "sharegpt"}, "data.format", "gives messages rows"),
        ({}, {"streaming": True}, "data.streaming", "converted as it loads"),
        ({}, {"subset": "nope"}, "data.subset", "has no dataset 'nope'"),
    ],
)
def test_llamafactory_entries_hydratune_does_not_read_are_refused_before_load(
    tmp_path: Path, entry: dict[str, Any], knobs: dict[str, Any], key: str, named: str
) -> None:
    from hydratune.components.data.chats import ChatDataset

    (tmp_path / "a.json").write_text(json.dumps(ALPACA))
    spec = {"file_name": "a.json", **entry}
    (tmp_path / "dataset_info.json").write_text(json.dumps({"a": spec}))
    knobs = {"subset": "a", **knobs}
    err = refused(ChatDataset(path=str(tmp_path), eval_fraction=0.0, **knobs).validate)
    assert err.key == key and named in str(err), str(err)


def test_llamafactory_entry_choice_and_kind_are_checked_before_load(factory: Path) -> None:
    from hydratune.components.data.chats import ChatDataset
    from hydratune.components.data.preferences import PreferenceDataset

    err = refused(ChatDataset(path=str(factory)).validate)
    assert (
        err.key == "data.subset"
        and "names 10 datasets" in str(err)
        and "data.subset=alpaca_sft" in (err.hint or "")
    )
    err = refused(ChatDataset(path=str(factory), subset="dpo_sharegpt").validate)
    assert "holds ranking: true (preference pairs)" in str(err) and "recipe=dpo" in (err.hint or "")
    err = refused(PreferenceDataset(path=str(factory), subset="alpaca_sft").validate)
    assert "holds SFT rows (ranking: false)" in str(err)
    near = refused(ChatDataset(path=str(factory), subset="alpaca_stf").validate)
    assert "did you mean alpaca_sft" in str(near)
