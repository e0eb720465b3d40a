"""The prepared-data cache (components/data/prepared_cache.py) and the data path behind it: a key that misses
on any change of the result (a row, the template, the tokenizer, max_length) and hits otherwise; a killed
preparation leaves nothing readable; a damaged entry is never served; rows held memory-mapped, never as
Python lists; worker processes give the same rows, tokens and errors as one process; the progress line;
``hydratune cache ls|clear``; ``mode=plan`` says hit or miss. (Two ranks preparing once is checked
on tests/multiproc/test_cells.py's sft-ddp cell; TRL as the oracle of the tokens in
tests/unit/test_sft_tokens.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data import prepared_cache
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.prepare import prepare_data
from hydratune.components.data.tokens import SFTTokens
from tests.support.data import TINY, multi_turn, write_jsonl


def tokenizer(template: str | None = None) -> Any:
    from transformers import AutoTokenizer

    from hydratune.components.text.chat_template import resolve_chat_template

    tok = AutoTokenizer.from_pretrained(TINY)
    if template:
        tok.chat_template = resolve_chat_template(template)[0]
    return tok


def prepare(path: Path, cache: Path, tok: Any = None, **knobs: Any) -> Any:
    """``prepare_data`` as SFT calls it (rows and tokens), on ``path``, cached in ``cache``."""
    data = ChatDataset(path=str(path), eval_fraction=0.1, cache_dir=str(cache), **knobs)
    tokens = SFTTokens(True, True, data.max_length, False, "bfd")
    return prepare_data(data, tok or tokenizer(), 0, 0, tokens)


def status(prepared: Any) -> str:
    return prepared.notes["data cache"].split(":")[0]


def rows_and_tokens(prepared: Any) -> tuple[list[Any], list[Any]]:
    return prepared.splits["train"][:]["messages"], prepared.tokens["train"][:]["labels"]


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    return Path(write_jsonl(tmp_path / "chats.jsonl", multi_turn(40)))


def test_the_key_misses_on_a_row_the_template_the_tokenizer_and_max_length(
    chats: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = prepare(chats, cache)
    assert status(first) == "miss" and first.tokens is not None
    again = prepare(chats, cache)
    assert status(again) == "hit"
    assert rows_and_tokens(again) == rows_and_tokens(first)  # the same prepared data, memory-mapped

    # one row edited, same size and mtime: the content hash is taken again (its ctime changed)
    text, stat = chats.read_text(), chats.stat()
    edited = text.replace('"content": "one', '"content": "two', 1)
    assert edited != text and len(edited) == len(text)
    chats.write_text(edited)
    os.utime(chats, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = prepare(chats, cache)
    assert status(changed) == "miss" and rows_and_tokens(changed) != rows_and_tokens(first)

    assert status(prepare(chats, cache, tokenizer("chatml"))) == "miss"  # the template
    other = tokenizer()
    other.add_tokens(["<extra>"])  # the tokenizer, same template
    assert status(prepare(chats, cache, other)) == "miss"
    assert status(prepare(chats, cache, max_length=64)) == "miss"
    assert status(prepare(chats, cache, num_proc=2)) == "hit"  # how it is prepared is not what it is
    assert status(prepare(chats, cache, stream_window=7, stream_shuffle=False)) == "hit"  # streams' knobs
    assert len(prepared_cache.entries(cache)) == 5


def test_a_relative_cache_dir_is_the_working_dir_s(
    chats: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 49: ``data.cache_dir=relcache`` crashed every preparation (``relative_to`` of an absolute file
    and a relative staging dir); it is resolved against the working dir, as a user expects."""
    monkeypatch.chdir(tmp_path)
    assert status(prepare(chats, Path("relcache"))) == "miss"
    (entry,) = prepared_cache.entries(tmp_path / "relcache")
    assert entry["path"].parent == tmp_path / "relcache"
    assert status(prepare(chats, Path("relcache"))) == "hit"


def test_a_damaged_entry_is_never_served(chats: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = prepare(chats, cache)
    (entry,) = prepared_cache.entries(cache)
    shard = next(entry["path"].rglob("*.arrow"))
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated behind the cache's back
    again = prepare(chats, cache)
    assert status(again) == "miss"  # prepared again, not read
    assert rows_and_tokens(again) == rows_and_tokens(first)
    (entry["path"] / prepared_cache.META).unlink()
    assert status(prepare(chats, cache)) == "miss"  # no meta.json: not whole


def test_rows_stay_memory_mapped(chats: Path, tmp_path: Path) -> None:
    """The loaded rows and the tokens are Arrow files mapped from disk, not tables built in memory."""
    from datasets.table import ConcatenationTable, MemoryMappedTable

    def mapped(dataset: Any) -> bool:
        table = dataset.data
        blocks = table.blocks if isinstance(table, ConcatenationTable) else [[table]]
        return all(isinstance(b, MemoryMappedTable) for row in blocks for b in row)

    for cache in (tmp_path / "a", tmp_path / "a"):  # prepared, then reused
        prepared = prepare(chats, cache)
        assert all(mapped(split) for split in [*prepared.splits.values(), *prepared.tokens.values()])
    loaded = ChatDataset(path=str(chats), eval_fraction=0.1).load()  # outside a run too
    assert mapped(loaded["train"]) and mapped(loaded["eval"])


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte ranges of 1 KB, row ranges of 8 rows: many tasks on a small file, run by worker processes."""
    from hydratune.components.data import json_files, preferences, readers
    from hydratune.components.distributed import workers

    monkeypatch.setattr(json_files, "MIN_RANGE", 1024)
    for module in (workers, readers, preferences):
        monkeypatch.setattr(module, "SHARD_ROWS", 8)
    monkeypatch.setattr(workers, "PARALLEL_FROM", {"rows": 0, "bytes": 0})  # worker processes however small


def test_worker_processes_give_the_rows_tokens_and_errors_of_one(tmp_path: Path, small_ranges: None) -> None:
    lines = [json.dumps(r) for r in multi_turn(300, seed=2)]
    lines[150] = '{"messages": [oops'  # line 151
    lines[230] = "[1, 2]"  # line 231
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    results = {}
    for n in (1, 2):
        with pytest.raises(ConfigError, match=rf"{path}:151: malformed JSON") as err:
            prepare(path, tmp_path / f"raise{n}", num_proc=n)
        assert err.value.key == "data.path"
        skipped = prepare(path, tmp_path / f"skip{n}", num_proc=n, on_error="skip")
        assert skipped.notes["skipped rows"] == 2
        results[n] = rows_and_tokens(skipped)
    assert results[1] == results[2]
    expected = [json.loads(line)["messages"] for i, line in enumerate(lines) if i not in (150, 230)]
    train = prepare(path, tmp_path / "skip1", num_proc=1, on_error="skip").splits
    assert sorted(map(json.dumps, [*train["train"]["messages"], *train["eval"]["messages"]])) == sorted(
        json.dumps([{"role": m["role"], "content": m["content"]} for m in rows]) for rows in expected
    )


def test_a_bad_row_is_named_by_file_and_line_from_any_worker(tmp_path: Path, small_ranges: None) -> None:
    rows = multi_turn(200, seed=3)
    rows[170] = {"messages": [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "x"}]}
    path = Path(write_jsonl(tmp_path / "roles.jsonl", rows))
    with pytest.raises(
        ConfigError, match=rf"{path}:171 \(row 171\): message 0 in column 'messages' has role"
    ):
        prepare(path, tmp_path / "cache", num_proc=2)


def test_progress_lines_say_rows_rate_and_eta(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from hydratune.components.distributed import workers

    now = [100.0]
    monkeypatch.setattr(workers.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(workers.sys.stdout, "isatty", lambda: False)
    progress = workers.Progress("tokenizing train rows", 10_000)
    for done, at in ((1000, 101.0), (4000, 104.0), (6000, 106.0), (9000, 111.0)):
        now[0] = at
        progress.update(done)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [  # nothing in the first 2 s, then a line every 5 s
        "data: tokenizing train rows  6,000/10,000 rows  1,000 rows/s  eta 0:00:04",
        "data: tokenizing train rows  9,000/10,000 rows  818 rows/s  eta 0:00:01",
    ]


def test_cache_ls_and_clear(chats: Path, tmp_path: Path, capsys: Any) -> None:
    from hydratune.components.commands.cache import cli

    cache = tmp_path / "cache"
    prepare(chats, cache)
    prepare(chats, cache, max_length=64)
    assert cli(["ls", "--dir", str(cache)]) == 0
    listing = capsys.readouterr().out
    assert (
        "2 entries" in listing
        and "36/4" in listing
        and str(chats) in listing
        and "ChatDataset, tokens" in listing
    )
    key = prepared_cache.entries(cache)[0]["key"]
    assert cli(["clear", key[:8], "--dir", str(cache)]) == 0
    assert [e["key"] for e in prepared_cache.entries(cache)] != [key] and len(
        prepared_cache.entries(cache)
    ) == 1
    with pytest.raises(ConfigError, match="no entry"):
        cli(["clear", "zzzz", "--dir", str(cache)])
    assert cli(["clear", "--dir", str(cache)]) == 0
    assert prepared_cache.entries(cache) == [] and not (cache / "hashes").exists()


def test_plan_says_whether_it_prepared_or_reused(compose_cfg: Any, tmp_path: Path) -> None:
    from hydratune.components.data.prepare import plan_data
    from hydratune.components.runtime.run import Components

    def plan() -> list[str]:
        comps = Components.from_config(compose_cfg("mode=plan", f"data.cache_dir={tmp_path / 'cache'}"))
        return plan_data(comps, 0)

    first = [line for line in plan() if line.startswith("# data: data cache: ")]
    second = [line for line in plan() if line.startswith("# data: data cache: ")]
    assert len(first) == 1 and first[0].startswith("# data: data cache: miss: prepared ")
    assert len(second) == 1 and second[0].startswith("# data: data cache: hit: reused ")
    key = first[0].split("prepared ")[1].split()[0]
    assert key in second[0]


def test_a_cache_dir_that_cannot_be_written_is_named(chats: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write the data cache") as err:
        prepare(chats, blocker / "cache")
    assert err.value.key == "data.cache_dir"


def test_a_planted_or_edited_entry_is_never_served(chats: Path, tmp_path: Path) -> None:
    """Every file of an entry is checked by sha256, inside its own dir: tokens edited at the same size, two
    entries' files swapped, a file replaced by a link to one outside the cache, a meta.json that points
    outside or cannot be parsed — each is prepared again, and nothing outside the cache is read or removed."""
    cache = tmp_path / "cache"
    first = prepare(chats, cache)
    other = prepare(chats, cache, max_length=64)
    expected = rows_and_tokens(first)  # read now: the planting below edits the files it maps
    entry, other_entry = (Path(p.notes["data cache"].split(" into ")[1]) for p in (first, other))
    meta = json.loads((entry / prepared_cache.META).read_text())
    shard = entry / meta["splits"]["tokens/train"]["files"][0]
    outside = tmp_path / "outside.arrow"

    def edit_in_place() -> None:  # one token changed, same size
        data = bytearray(shard.read_bytes())
        data[-200] ^= 1
        shard.write_bytes(bytes(data))

    def swap() -> None:
        theirs = (
            other_entry
            / json.loads((other_entry / prepared_cache.META).read_text())["splits"]["tokens/train"]["files"][
                0
            ]
        )
        mine = shard.read_bytes()
        shard.write_bytes(theirs.read_bytes())
        theirs.write_bytes(mine)

    def link_outside() -> None:
        outside.write_bytes(shard.read_bytes())
        shard.unlink()
        shard.symlink_to(outside)

    def meta_points_outside() -> None:
        outside.write_bytes(shard.read_bytes())
        planted = json.loads((entry / prepared_cache.META).read_text())
        spec = planted["splits"]["tokens/train"]
        digest = spec["sha256"].pop(spec["files"][0])
        spec["files"][0] = str(outside)
        spec["sha256"][str(outside)] = digest
        (entry / prepared_cache.META).write_text(json.dumps(planted))

    def unparsable() -> None:
        (entry / prepared_cache.META).write_text('{"format": 2, "key": ')

    for plant in (edit_in_place, swap, link_outside, meta_points_outside, unparsable):
        plant()
        again = prepare(chats, cache)
        assert status(again) == "miss", plant.__name__
        assert rows_and_tokens(again) == expected, plant.__name__
        if outside.exists():  # read by nobody, removed by nobody
            assert outside.is_file() and not outside.is_symlink(), plant.__name__
            outside.unlink()
    assert status(prepare(chats, cache, max_length=64)) == "miss"  # the swap damaged the other entry too


def test_a_damaged_entry_in_a_cache_that_cannot_be_written_is_refused(
    chats: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither served nor prepared again: refused, naming the damage (a read-only cache refuses removing the
    entry; simulated, since this suite may run as root, which writes anywhere)."""
    import errno

    cache = tmp_path / "cache"
    prepare(chats, cache)
    (entry,) = prepared_cache.entries(cache)
    shard = next(entry["path"].rglob("*.arrow"))
    data = bytearray(shard.read_bytes())
    data[-200] ^= 1
    shard.write_bytes(bytes(data))

    def read_only(path: Path) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(prepared_cache, "_remove", read_only)
    with pytest.raises(ConfigError, match=r"is damaged .*does not match the sha256") as err:
        prepare(chats, cache)
    assert err.value.key == "data.cache_dir" and "cannot write the data cache" in str(err.value)


def test_a_full_disk_in_a_worker_is_named_not_a_traceback(tmp_path: Path) -> None:
    """A worker's ENOSPC (pyarrow writing a shard) reaches the cache as the OSError it is: the named exit."""
    import errno

    def full(tick: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.arrow"))

    def build(workers: Any) -> Any:
        workers.run([full], "rows", 1)

    data = ChatDataset(path="unused.jsonl", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"the disk of the data cache .* is full") as err:
        prepared_cache.prepare(data, {"any": "parts"}, build, 1)
    assert err.value.key == "data.cache_dir"
    assert not list((tmp_path / "cache" / prepared_cache.STAGING).iterdir())  # nothing half-written is left
