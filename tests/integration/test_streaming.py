"""``data.streaming=true`` (components/data/stream.py, components/data/stream_prepare.py): rows read lazily in
every format ``load()`` reads and converted exactly as loaded rows are; ranks read disjoint rows; a bad row
still names its file and line (or is counted); the feed resumes at the exact example; a run stopped by a
real SIGTERM and resumed trains on the same rows and ends with the same weights as one that never stopped;
what a stream cannot do is refused before anything loads. One 2-process run is shared by the rank checks."""

from __future__ import annotations

import gzip
import json
import os
import signal
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from hydratune.components.config.errors import EXIT_INTERRUPTED, ConfigError
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.feed import Place, Windows
from hydratune.components.data.stream import PROBE, STREAM, Position, open_stream
from hydratune.components.data.stream_prepare import POSITION_FILE, check_positions
from tests.conftest import REPO
from tests.support.cli import in_process

QUICK = ["train.eval_generations=0", "train.write_plots=false", "train.log_every=1"]
#: a streaming run small enough to stop, resume and repeat: 40 rows, windows of 24 (they straddle the end
#: of a pass), 8 steps of 2 x 4 rows (64 rows: a pass and a half), a checkpoint every 3 steps
RUN = [
    *QUICK,
    "data.streaming=true",
    "data.stream_window=24",
    "train.micro_batch_size=4",
    "train.gradient_accumulation_steps=2",
    "train.max_steps=8",
    "train.save_every=3",
    "train.eval_every=0",
]


def chat(i: int) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": f"Compute {i} + 7."},
            {"role": "assistant", "content": str(i + 7)},
        ]
    }


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def streamed(
    data: ChatDataset, n: int, *, rank: int = 0, world: int = 1, start: Position | None = None
) -> list:
    stream = open_stream(data, rank=rank, world=world)[0]
    return list(islice(stream.rows(start or Position()), n))


# ---- reading ----------------------------------------------------------------------------------------
def formats(root: Path) -> dict[str, Path]:
    """The same 57 conversations in every layout ``load()`` reads."""
    import datasets

    rows = [chat(i) for i in range(57)]
    flat = [{"prompt": f"q{i}", "completion": f"a{i}\r\nmore"} for i in range(57)]
    out = {"jsonl": write_jsonl(root / "a.jsonl", rows)}
    with gzip.open(root / "b.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    out["jsonl.gz"] = root / "b.jsonl.gz"
    (root / "c.json").write_text(json.dumps(rows))
    out["json"] = root / "c.json"
    (root / "d.jsonl").write_text(json.dumps(rows, indent=2))  # one pretty-printed document
    out["pretty jsonl"] = root / "d.jsonl"
    datasets.Dataset.from_list(flat).to_csv(root / "e.csv")
    out["csv"] = root / "e.csv"
    datasets.Dataset.from_list(flat).to_parquet(root / "f.parquet")
    out["parquet"] = root / "f.parquet"
    datasets.Dataset.from_list(flat).save_to_disk(root / "g")
    out["save_to_disk"] = root / "g"
    out["arrow"] = next((root / "g").glob("*.arrow"))
    split = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(flat), "test": datasets.Dataset.from_list(flat[:3])}
    )
    split.save_to_disk(root / "h")
    out["DatasetDict"] = root / "h"
    shards = root / "shards" / "data"
    shards.mkdir(parents=True)
    for k in range(3):
        write_jsonl(shards / f"train-{k:05d}-of-00003.jsonl", rows[k * 19 : (k + 1) * 19])
    out["hub shards"] = shards.parent
    return out


def test_every_format_streams_the_rows_load_gives_and_resumes_anywhere(tmp_path: Path) -> None:
    """The oracle is ``load()``: the stream's first pass is its rows, converted alike; from the position
    after any row it continues with the next one (JSON lines by byte offset, the others by row)."""
    for name, path in formats(tmp_path).items():
        loaded = ChatDataset(path=str(path), eval_fraction=0.0).load()["train"].to_list()
        data = ChatDataset(path=str(path), eval_fraction=0.0, streaming=True)
        first = streamed(data, len(loaded) + 3)
        assert [row for row, _ in first[: len(loaded)]] == loaded, name
        assert [row for row, _ in first[len(loaded) :]] == loaded[:3], name  # the next pass
        for k in (1, len(loaded) // 2, len(loaded)):
            again = streamed(data, 3, start=first[k - 1][1])
            assert [row for row, _ in again] == [row for row, _ in first[k : k + 3]], (name, k)


@pytest.mark.parametrize("files", [1, 4])
def test_ranks_read_disjoint_rows_that_cover_the_data(tmp_path: Path, files: int) -> None:
    """Two ranks: every row is read by exactly one (one file: rows dealt in turn; four files: two whole
    files each), and a JSON line of rank 1's is never parsed by rank 0: its malformed line stops rank 1
    only, naming file and line."""
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [chat(i) for i in range(40)]
    for k in range(files):
        write_jsonl(folder / f"part{k}.jsonl", rows[k * 40 // files : (k + 1) * 40 // files])
    data = ChatDataset(path=str(folder), eval_fraction=0.0, streaming=True)
    seen = []
    for rank in (0, 1):
        stream = open_stream(data, rank=rank, world=2)[0]
        seen.append([json.dumps(row) for row, _ in stream.one_pass(Position())])
    assert len(seen[0]) == len(seen[1]) == 20
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(
        json.dumps(ChatDataset.to_chat(data, r, "messages")) for r in rows
    )

    last = folder / f"part{files - 1}.jsonl"
    lines = last.read_text().splitlines()
    lines[-1] = "{not json"  # the data's last row, rank 1's in both layouts, broken after the streams opened
    ranks = [open_stream(data, rank=rank, world=2)[0] for rank in (0, 1)]
    last.write_text("\n".join(lines) + "\n")
    assert len(list(ranks[0].one_pass(Position()))) == 20
    with pytest.raises(ConfigError, match=rf"{last}:{len(lines)}: malformed JSON"):
        list(ranks[1].one_pass(Position()))


def test_a_hub_dataset_streams_through_datasets_streaming_mode(tmp_path: Path, monkeypatch) -> None:
    """A hub id is read by ``datasets.load_dataset(..., streaming=True)`` (here answered from a local file:
    offline, the hub is refused before load, see the plan test): its first rows held out for eval, the
    rest split between ranks by ``split_dataset_by_node``, a position resumed by skipping."""
    import datasets

    rows = [chat(i) for i in range(30)]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    real = datasets.load_dataset

    def load_dataset(name: str, *args: Any, **kwargs: Any) -> Any:
        if name != "someone/chats":
            return real(name, *args, **kwargs)
        assert kwargs["streaming"] is True and kwargs["split"] == "train"
        return real("json", data_files=[str(path)], split="train", streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    data = ChatDataset(path="someone/chats", streaming=True, eval_size=4)
    stream, _, evals = open_stream(data)
    as_rows = [ChatDataset.to_chat(data, r, "messages") for r in rows]
    assert evals.to_list() == as_rows[:4]
    first = list(islice(stream.rows(Position()), 30))
    assert [row for row, _ in first[:26]] == as_rows[4:] and [row for row, _ in first[26:]] == as_rows[4:8]
    assert [row for row, _ in islice(stream.rows(first[9][1]), 3)] == as_rows[14:17]
    seen = [
        json.dumps(row)
        for rank in (0, 1)
        for row, _ in open_stream(data, rank=rank, world=2)[0].one_pass(Position())
    ]
    assert sorted(seen) == sorted(map(json.dumps, as_rows[4:]))


def test_a_bad_row_past_the_checked_ones_names_its_file_and_line_or_is_counted(tmp_path: Path) -> None:
    rows: list[Any] = [chat(i) for i in range(PROBE + 50)]
    rows[PROBE + 9] = {"messages": [{"role": "user", "content": "no answer"}]}  # line PROBE + 10
    path = write_jsonl(tmp_path / "big.jsonl", rows)
    raising = ChatDataset(path=str(path), eval_fraction=0.0, streaming=True)
    stream = open_stream(raising)[0]  # the first PROBE rows are fine: checked before any model loads
    with pytest.raises(
        ConfigError, match=rf"{path}:{PROBE + 10} \(row {PROBE + 10}\): no assistant turn"
    ) as err:
        list(islice(stream.rows(Position()), PROBE + 20))
    assert err.value.key == "data.path" and "data.on_error=skip" in err.value.hint

    skipping = ChatDataset(path=str(path), eval_fraction=0.0, streaming=True, on_error="skip")
    *_, (_, after) = streamed(skipping, PROBE + 49)
    assert after.counts() == {"read": PROBE + 50, "skipped": 1, "dropped": 0, "keys": {}}

    rows[3] = {"messages": "not a list"}  # among the first rows: refused before load, as load() refuses it
    write_jsonl(path, rows)
    with pytest.raises(ConfigError, match=rf"{path}:4 \(row 4\)"):
        open_stream(raising)


def test_message_keys_a_stream_does_not_use_are_counted_past_the_checked_rows(tmp_path: Path) -> None:
    """A key no template renders (``meta``), on rows read after the checked first ones, is counted per row
    (the summary's ``streamed message keys ignored``), and the count survives a position's JSON."""
    rows = [chat(i) for i in range(PROBE + 30)]
    for i in range(PROBE + 5, PROBE + 12):
        rows[i]["messages"][0]["meta"] = {"source": "forum", "i": i}
    path = write_jsonl(tmp_path / "keys.jsonl", rows)
    stream = open_stream(ChatDataset(path=str(path), eval_fraction=0.0, streaming=True))[0]
    *_, (_, at) = list(islice(stream.rows(Position()), PROBE + 30))
    assert at.counts()["keys"] == {"meta": 7}
    assert Position.of(json.loads(json.dumps(at.as_dict()))).keys == {"meta": 7}


def test_the_length_policy_applies_to_every_streamed_row(tmp_path: Path) -> None:
    """data.on_overlong on a row read after the checked ones: dropped and counted, or named."""
    from hydratune.components.data.prepare import prepare_data
    from hydratune.components.text.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(str(REPO / "components" / "assets" / "tiny"))
    rows = [chat(i) for i in range(PROBE + 20)]
    rows[PROBE + 5]["messages"][0]["content"] = "many words " * 200  # line PROBE + 6
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    knobs = {"path": str(path), "eval_fraction": 0.0, "streaming": True, "max_length": 64}
    stream = prepare_data(ChatDataset(**knobs, on_overlong="drop"), tokenizer, 0).splits["train"]
    *_, (_, after) = islice(stream.rows(Position()), PROBE + 19)
    assert after.counts() == {"read": PROBE + 20, "skipped": 0, "dropped": 1, "keys": {}}
    stream = prepare_data(ChatDataset(**knobs, on_overlong="error"), tokenizer, 0).splits["train"]
    with pytest.raises(
        ConfigError, match=rf"{path}:{PROBE + 6} \(row {PROBE + 6}\): \d+ tokens > data.max_length=64"
    ):
        list(islice(stream.rows(Position()), PROBE + 19))


@pytest.mark.parametrize("template", [None, "chatml"])  # TRL's markers (the tiny template), hydratune's mask
def test_a_streamed_row_has_the_tokens_of_the_loaded_row(tmp_path: Path, template: str | None) -> None:
    """The trainer's tokens of a stream, each row tokenized as it is read, are those the loaded (cached)
    path makes of the same rows: the same ids, labels and mask, cut at max_length, rows with nothing left
    to train dropped."""
    from hydratune.components.data.prepare import prepare_data
    from hydratune.components.data.tokens import SFTTokens
    from hydratune.components.text.chat_template import resolve_chat_template
    from hydratune.components.text.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(str(REPO / "components" / "assets" / "tiny"))
    if template:
        tokenizer.chat_template = resolve_chat_template(template)[0]
    rows = [chat(i) for i in range(40)]
    rows[3]["messages"][0]["content"] = "many words " * 40  # cut at max_length: no answer token left
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    tokens = SFTTokens(True, True, 48, False, "bfd")
    knobs = {"path": str(path), "eval_fraction": 0.0, "max_length": 48}
    loaded = prepare_data(ChatDataset(**knobs, cache=False), tokenizer, 0, tokens=tokens).tokens
    streamed = prepare_data(ChatDataset(**knobs, streaming=True), tokenizer, 0, tokens=tokens).tokens
    assert loaded is not None and streamed is not None
    expected = loaded["train"].to_list()
    assert len(expected) == 39  # row 3 dropped
    got = [row for row, _ in islice(streamed["train"].rows(Position()), 39)]
    assert got == expected


def test_the_feed_resumes_at_the_exact_example_shuffled_and_packed(tmp_path: Path) -> None:
    """The feed's windows (shuffled, packed with TRL's pack_dataset) started from the place after any
    example give exactly the examples that followed it (the stream restarted at its window)."""
    path = write_jsonl(tmp_path / "rows.jsonl", [{"text": "x " * (i % 13 + 1)} for i in range(30)])
    data = ChatDataset(
        path=str(path), eval_fraction=0.0, streaming=True, packing=True, max_length=24, stream_window=7
    )
    stream = open_stream(data)[0]

    def tokenized(row: dict[str, Any]) -> dict[str, Any]:  # a stand-in for TRL's lazy tokenization
        ids = [len(w) for w in row["text"].split()] + [0]
        return {"input_ids": ids, "labels": ids}

    prepared = stream.dataset().map(tokenized)

    def fed(start: Place, n: int) -> list[dict[str, Any]]:
        return list(islice(Windows(prepared, stream, data, start), n))

    straight = fed(Place(), 60)
    assert len({json.dumps(ex["_feed"]["window"]) for ex in straight}) > 4  # several windows, passes
    assert any(len(ex["seq_lengths"]) > 1 for ex in straight)  # really packed
    for k in range(0, len(straight) - 5, 3):
        place = straight[k]["_feed"]
        again = fed(Place(place["window"], place["next"], place["counts"]), 5)
        assert [ex["input_ids"] for ex in again] == [ex["input_ids"] for ex in straight[k + 1 : k + 6]], k


@pytest.mark.parametrize(
    ("knobs", "held"),
    [({}, 5), ({"eval_size": 7}, 7), ({"eval_fraction": 0.0}, 0), ({"eval_size": 7, "max_samples": 50}, 7)],
)
def test_a_stream_holds_out_its_first_rows_for_eval_and_never_trains_on_them(tmp_path, knobs, held) -> None:
    """Unset, the eval rows are the share load() holds out of a file as long (5% of 100 rows); eval_size:
    that many; 0: none. They are the stream's first rows: no rank reads them in any pass."""
    rows = [chat(i) for i in range(100)]
    folder = tmp_path / "data"
    folder.mkdir()
    for k in range(4):  # 4 files: 2 ranks take whole files, the first file partly held out
        write_jsonl(folder / f"part{k}.jsonl", rows[k * 25 : (k + 1) * 25])
    data = ChatDataset(path=str(folder), streaming=True, **knobs)
    stream, report, evals = open_stream(data)
    assert (evals.to_list() if evals else []) == [
        ChatDataset.to_chat(data, r, "messages") for r in rows[:held]
    ]
    if held:
        assert report.info["eval rows from"].startswith(f"the first {held} rows of data.path")
    used = rows[held : data.max_samples or 100]
    for world in (1, 2):
        seen = []
        for rank in range(world):
            stream = open_stream(data, rank=rank, world=world)[0]
            one = [row for row, _ in stream.one_pass(Position())]
            assert [row for row, _ in islice(stream.rows(Position()), 2 * len(one))] == one * 2  # every pass
            seen += one
        expected = [ChatDataset.to_chat(data, r, "messages") for r in used]
        assert sorted(map(json.dumps, seen)) == sorted(map(json.dumps, expected)), world


# ---- before the load --------------------------------------------------------------------------------
REFUSED = [
    (["recipe=dpo", "data=demo_dpo"], "data.streaming", "only recipe=sft"),
    (["recipe=generate", "data=demo_generate"], "data.streaming", "only recipe=sft"),
    (["train.max_steps=-1"], "train.max_steps", "no length to count epochs in"),
    (["data.eval_path=null", "data.eval_fraction=0.05"], "data.eval_fraction", "length is not known"),
    (["train.num_workers=2"], "train.num_workers", "position"),
    (["data=jsonl_messages", "data.mixture=[{path: DEMO, weight: 1.0}]"], "data.mixture", "one source"),
]


def test_what_a_stream_cannot_do_is_refused_before_load(compose_cfg) -> None:
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    def check(*more: str) -> None:
        cfg = compose_cfg(*QUICK, "data.streaming=true", "train.max_steps=4", *more)
        check_before_load(cfg, Components.from_config(cfg))

    check()  # the demo SFT streams as it is (its eval rows: the demo eval file)
    demo = str(REPO / "components" / "assets" / "demo" / "sft_train.jsonl")
    for overrides, key, says in REFUSED:
        with pytest.raises(ConfigError, match=says) as err:
            check(*(o.replace("DEMO", demo) for o in overrides))
        assert err.value.key == key and err.value.hint, overrides


def test_resuming_with_another_number_of_processes_is_refused(tmp_path: Path) -> None:
    for rank in (0, 1):
        (tmp_path / POSITION_FILE.format(rank=rank)).write_text(json.dumps({"world": 2, "rank": rank}))
    check_positions(tmp_path, 2)
    with pytest.raises(ConfigError, match="written by 2 streaming processes") as err:
        check_positions(tmp_path, 1)
    assert err.value.key == "launcher.nproc_per_node"
    with pytest.raises(ConfigError, match="no stream position for rank 0") as err:  # not a streaming run's
        check_positions(tmp_path / "elsewhere", 1)
    assert err.value.key == "resume"


def test_plan_checks_only_the_first_rows_and_says_so(tmp_path: Path, capsys, monkeypatch) -> None:
    from hydratune.components.model import CausalLM

    monkeypatch.setattr(CausalLM, "build", lambda *a, **k: pytest.fail("a model was loaded"))
    path = write_jsonl(tmp_path / "big.jsonl", [chat(i) for i in range(PROBE + 5)])
    in_process(
        "mode=plan",
        "data.streaming=true",
        "train.max_steps=4",
        f"data.path={path}",
        f"hydra.run.dir={tmp_path / 'p'}",
    )
    out = capsys.readouterr().out
    assert f"only its first {PROBE} rows were read and checked before training" in out
    assert "eval rows from: the first 50 rows of data.path" in out  # 5% of them, by default
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 (no DNS retries)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit) as code:  # a hub dataset, streamed: offline, refused before load, named
        in_process(
            "mode=plan",
            "data.streaming=true",
            "train.max_steps=4",
            "data.path=someone/not-cached",
            f"hydra.run.dir={tmp_path / 'q'}",
        )
    err = capsys.readouterr().err
    assert (
        code.value.code == 2
        and "[data.path]" in err
        and "could not load hub dataset 'someone/not-cached'" in err
    )
    assert "Traceback" not in err


# ---- training -----------------------------------------------------------------------------------------


def same_weights(a: Path, b: Path) -> None:
    first, second = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key


def test_a_packed_stream_resumes_to_the_same_weights(tmp_path, monkeypatch) -> None:
    """The same with data.packing (bfd, padding-free batches), stopped by a SIGTERM to this process."""
    from hydratune.components.data import feed

    path = write_jsonl(tmp_path / "rows.jsonl", [chat(i * 37) for i in range(40)])
    common = [*RUN, "data.packing=true", "data.max_length=48", f"data.path={path}", f"data.eval_path={path}"]
    real = feed.Feed.collate

    def collate(self: Any, collator: Any) -> Any:
        inner, calls = real(self, collator), []

        def hooked(examples: list[Any]) -> Any:
            calls.append(1)
            if len(calls) == 5:
                os.kill(os.getpid(), signal.SIGTERM)
            return inner(examples)

        return hooked

    monkeypatch.setattr(feed.Feed, "collate", collate)
    with pytest.raises(SystemExit) as code:
        in_process(*common, f"hydra.run.dir={tmp_path / 'stopped'}")
    assert code.value.code == EXIT_INTERRUPTED
    monkeypatch.setattr(feed.Feed, "collate", real)
    in_process(f"resume={tmp_path / 'stopped'}", f"hydra.run.dir={tmp_path / 'resumed'}")
    in_process(*common, f"hydra.run.dir={tmp_path / 'straight'}")
    same_weights(tmp_path / "straight", tmp_path / "resumed")
    assert "packed rows trained" in (tmp_path / "resumed" / "summary.md").read_text()


def test_a_row_position_is_json(tmp_path: Path) -> None:
    """What a checkpoint stores and each streamed row carries (``_stream``) round-trips through JSON."""
    path = write_jsonl(tmp_path / "rows.jsonl", [chat(i) for i in range(3)])
    stream = open_stream(ChatDataset(path=str(path), eval_fraction=0.0, streaming=True))[0]
    row = next(iter(stream.dataset()))
    assert Position.of(json.loads(json.dumps(row[STREAM]))) == next(stream.rows(Position()))[1]
