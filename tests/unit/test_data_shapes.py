"""More data shapes (issue 34, item 5): identical preference pairs in every format, ``.txt`` corpora,
LLaMA-Factory dataset dirs; each checked on the rows a load gives (what the trainer reads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.config.errors import ConfigError
from components.data import PreferenceDataset
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

    from components.data import ChatDataset, scratch_workers
    from components.runtime.sftdata import SFTTokens
    from tests.support.data import TINY

    (tmp_path / "a").mkdir()
    plain = write_corpus(tmp_path / "a" / "corpus.txt", CORPUS, crlf=True, bom=True)
    packed = tmp_path / "a" / "more.txt.gz"
    packed.write_bytes(gzip.compress("\n\n".join(["Fourth.", "Fifth\ndocument."]).encode()))
    data = ChatDataset(path=plain, eval_fraction=0.0).load()
    assert list(data["train"]["text"]) == CORPUS
    assert data.info["format"] == "text (detected)"
    assert data.info["text documents"] == "3 from corpus.txt (one document per blank-line-separated block)"
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
    from components.data import ChatDataset
    from components.textcorpus import text_rows

    bad = tmp_path / "latin1.txt"
    bad.write_bytes("ok\n\ncaf\xe9\n".encode("latin-1"))
    err = refused(lambda: ChatDataset(path=str(bad), eval_fraction=0.0).load())
    assert "latin1.txt:3: not UTF-8 text (byte 0xe9" in str(err) and err.key == "data.path"
    path = Path(write_corpus(tmp_path / "c.txt", CORPUS))
    assert [(n, r["text"]) for n, r, _ in text_rows(path, 1, "data.path")] == [(2, CORPUS[1]), (3, CORPUS[2])]
