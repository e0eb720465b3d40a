"""Files and folders as the hub lays them out: split-named files (a test split is the eval set, never
trained on), shards of any compression, ``.gz`` text files, ``save_to_disk`` folders and ``.arrow`` files,
and every file of a folder that is not read named. ``datasets``' own loaders are the oracle for what a file
or folder holds (``load_dataset``, ``load_from_disk``, ``Dataset.from_file``, ``get_data_patterns``)."""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.chats import ChatDataset

REPO = Path(__file__).resolve().parents[2]


def rows(tag: str, n: int) -> list[dict[str, str]]:
    return [{"prompt": f"{tag} question {i}", "completion": f"{tag} answer {i}"} for i in range(n)]


def jsonl(rows_: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows_).encode()


def put(root: Path, name: str, data: bytes) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def prompts(table: Any) -> list[str]:
    """The first user turn of each row, sorted (the eval split is shuffled)."""
    return sorted(m[0]["content"] for m in table["messages"])


def hf_prompts(table: Any) -> list[str]:
    return sorted(table["prompt"])


def error(fn: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn()
    return info.value


def test_a_hub_layout_folder_trains_on_train_and_evaluates_on_test(tmp_path: Path) -> None:
    import datasets

    put(tmp_path, "data/train.jsonl", jsonl(rows("train", 6)))
    put(tmp_path, "data/test.jsonl", jsonl(rows("test", 2)))
    put(tmp_path, "README.md", b"# my dataset\n")
    data = ChatDataset(path=str(tmp_path)).load()
    hub = datasets.load_dataset(str(tmp_path))  # the oracle: the splits the hub reads from this folder
    assert prompts(data["train"]) == hf_prompts(hub["train"])
    assert prompts(data["eval"]) == hf_prompts(hub["test"])
    assert data.info["eval rows from"] == "the test split of data.path"
    assert data.info["train files"] == "data/train.jsonl (splits from file names)"
    assert data.info["eval files"] == "data/test.jsonl"
    assert data.info["files not read"] == "README.md (not a data file type)"


def test_every_shard_is_read_whatever_its_compression(tmp_path: Path) -> None:
    import datasets

    put(tmp_path, "train-00000-of-00002.jsonl", jsonl(rows("a", 4)))
    put(tmp_path, "train-00001-of-00002.jsonl.gz", gzip.compress(jsonl(rows("b", 4))))
    data = ChatDataset(path=str(tmp_path), eval_fraction=0.0).load()
    hub = datasets.load_dataset(str(tmp_path), split="train")
    assert prompts(data["train"]) == hf_prompts(hub) and len(hub) == 8
    assert "2 files: train-00000-of-00002.jsonl, train-00001-of-00002.jsonl.gz" in data.info["train files"]


@pytest.mark.parametrize("name", ["x.jsonl.gz", "x.json.gz", "x.csv.gz", "x.jsonl.bz2"])
def test_compressed_text_files_read_as_datasets_reads_them(tmp_path: Path, name: str) -> None:
    import datasets

    table = rows("z", 3)
    if ".csv" in name:
        body = ("prompt,completion\n" + "".join(f"{r['prompt']},{r['completion']}\n" for r in table)).encode()
    else:
        body = json.dumps(table).encode() if ".json." in name else jsonl(table)
    put(tmp_path, name, bz2.compress(body) if name.endswith(".bz2") else gzip.compress(body))
    data = ChatDataset(path=str(tmp_path / name), eval_fraction=0.0).load()
    builder = "csv" if ".csv" in name else "json"
    hub = datasets.load_dataset(builder, data_files=[str(tmp_path / name)], split="train")
    assert prompts(data["train"]) == hf_prompts(hub) and len(hub) == 3


def test_save_to_disk_folders_and_arrow_files(tmp_path: Path) -> None:
    import datasets

    train, test = datasets.Dataset.from_list(rows("train", 5)), datasets.Dataset.from_list(rows("test", 2))
    train.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "both"))

    one = ChatDataset(path=str(tmp_path / "one"), eval_fraction=0.0).load()
    assert prompts(one["train"]) == hf_prompts(datasets.load_from_disk(str(tmp_path / "one")))

    both = ChatDataset(path=str(tmp_path / "both")).load()
    oracle = datasets.load_from_disk(str(tmp_path / "both"))
    assert prompts(both["train"]) == hf_prompts(oracle["train"])
    assert prompts(both["eval"]) == hf_prompts(oracle["test"])
    assert both.info["eval files"] == "the 'test' split (save_to_disk)"

    arrow = next((tmp_path / "one").glob("*.arrow"))
    alone = ChatDataset(path=str(arrow), eval_fraction=0.0).load()
    assert prompts(alone["train"]) == hf_prompts(datasets.Dataset.from_file(str(arrow)))

    err = error(ChatDataset(path=str(tmp_path / "both"), split="validation").validate)
    assert err.key == "data.split" and "has no 'validation' split" in str(err) and "train, test" in str(err)


def test_a_latin1_file_is_called_not_utf8(tmp_path: Path) -> None:
    path = put(tmp_path, "latin.jsonl", '{"text": "café"}\n{"text": "naïve"}\n'.encode("latin-1"))
    err = error(ChatDataset(path=str(path)).load)
    assert "latin.jsonl:1: not UTF-8 text" in str(err) and "not JSON lines" not in str(err)
    assert "re-encode the file as UTF-8" in (err.hint or "")


def test_data_split_and_eval_path_choose_the_folders_files(tmp_path: Path) -> None:
    put(tmp_path, "data/train-00000-of-00001.jsonl", jsonl(rows("train", 4)))
    put(tmp_path, "data/validation-00000-of-00001.jsonl", jsonl(rows("val", 2)))
    put(tmp_path, "data/test-00000-of-00001.jsonl", jsonl(rows("test", 3)))
    put(tmp_path, "extra.jsonl", jsonl(rows("extra", 1)))
    other = put(tmp_path.parent / "elsewhere", "eval.jsonl", jsonl(rows("own", 2)))

    data = ChatDataset(path=str(tmp_path)).load()  # validation before test
    assert prompts(data["eval"]) == sorted(r["prompt"] for r in rows("val", 2))
    assert data.info["files not read"] == (
        "data/test-00000-of-00001.jsonl (the test split: eval reads the validation split); "
        "extra.jsonl (not a data/<split>-NNNNN-of-NNNNN shard like the other files)"
    )
    on_test = ChatDataset(path=str(tmp_path), split="test").load()
    assert prompts(on_test["train"]) == sorted(r["prompt"] for r in rows("test", 3))
    assert "data/train-00000-of-00001.jsonl (the train split" in on_test.info["files not read"]

    given = ChatDataset(path=str(tmp_path), eval_path=str(other)).load()
    assert prompts(given["eval"]) == sorted(r["prompt"] for r in rows("own", 2))
    assert "(the validation split: data.eval_path is the eval set)" in given.info["files not read"]
    assert len(given["train"]) == 4

    held_out = tmp_path.parent / "held_out"
    put(held_out, "test.jsonl", jsonl(rows("held", 3)))
    put(held_out, "train.jsonl", jsonl(rows("not me", 3)))
    folder = ChatDataset(path=str(tmp_path), eval_path=str(held_out)).load()  # its test split
    assert prompts(folder["eval"]) == sorted(r["prompt"] for r in rows("held", 3))
    assert (
        folder.info["files not read (eval)"]
        == "train.jsonl (the train split: data.eval_path reads its test split)"
    )
    (held_out / "test.jsonl").unlink()
    err = error(ChatDataset(path=str(tmp_path), eval_path=str(held_out)).validate)
    assert err.key == "data.eval_path" and "has no validation or test split" in str(err)

    err = error(ChatDataset(path=str(tmp_path), split="dev").validate)
    assert err.key == "data.split" and "train, validation, test" in str(err)


def test_a_file_that_cannot_be_read_is_named_or_refused(tmp_path: Path) -> None:
    put(tmp_path, "a.jsonl", jsonl(rows("a", 4)))
    put(tmp_path, "notes.txt", b"to do\n")
    put(tmp_path, "dataset_info.json", b'{"description": ""}')
    data = ChatDataset(path=str(tmp_path), eval_fraction=0.0).load()
    assert len(data["train"]) == 4
    assert data.info["files not read"] == (
        "dataset_info.json (metadata, not rows); notes.txt (plain text beside other data files (a corpus "
        "folder is all .txt))"
    )


@pytest.mark.skipif(importlib.util.find_spec("zstandard") is not None, reason="zstandard reads .zst here")
def test_a_zstd_shard_without_zstandard_refuses_the_run(tmp_path: Path) -> None:
    put(tmp_path, "train-00000-of-00002.jsonl", jsonl(rows("a", 4)))
    put(tmp_path, "train-00001-of-00002.jsonl.zst", b"(zstd bytes)")
    err = error(ChatDataset(path=str(tmp_path)).validate)
    assert "train-00001-of-00002.jsonl.zst is zstd-compressed" in str(err) and "pip install zstandard" in (
        err.hint or ""
    )


@pytest.mark.parametrize(
    "files",
    [
        ["data/train.jsonl", "data/test.jsonl"],
        ["train-00000-of-00002.jsonl", "train-00001-of-00002.jsonl.gz"],
        [
            "data/train-00000-of-00002.parquet",
            "data/train-00001-of-00002.parquet",
            "data/test-00000-of-00001.csv",
        ],
        ["train/a.jsonl", "train/b.jsonl", "validation/c.jsonl", "notes.jsonl"],
        ["my_train.csv", "my-dev.csv", "eval.csv", "latest.csv"],
        ["training.jsonl", "a.jsonl"],
        ["a.jsonl", "sub/b.json"],
    ],
)
def test_files_are_split_as_the_hub_splits_them(tmp_path: Path, files: list[str]) -> None:
    from datasets.data_files import DataFilesDict, get_data_patterns

    from hydratune.components.data.layout import split_files

    for name in files:
        put(tmp_path, name, b"")
    hub = DataFilesDict.from_patterns(get_data_patterns(str(tmp_path)), base_path=str(tmp_path))
    expected = {s: sorted(Path(f).relative_to(tmp_path).as_posix() for f in fs) for s, fs in hub.items()}
    splits, unsplit, _ = split_files(sorted(files))
    assert splits == expected
    assert sorted(unsplit) == sorted(set(files) - {f for fs in expected.values() for f in fs})
