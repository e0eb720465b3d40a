"""Image rows before any model loads: ``mode=plan`` (the preparation training runs) exits 2 on each bad
image naming file:line and column, and prints the images' report; the prepared-data cache key changes when
an image file's bytes change though the data file does not (components/data/images.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.fingerprint import changed, fingerprint_node
from hydratune.components.data.prepare import prepare_data
from tests.support.cli import in_process
from tests.support.data import write_jsonl
from tests.unit.test_data_images import BAD, image_pairs, placeholder_row, png


@pytest.fixture
def pictures(tmp_path: Path) -> tuple[Path, Path]:
    return png(tmp_path / "img" / "red.png", (255, 0, 0)), png(tmp_path / "img" / "blue.png", (0, 0, 255))


def plan(tmp_path: Path, capsys: Any, *args: str) -> tuple[int, str, str]:
    """``hydratune mode=plan *args`` in this process: (exit code, stdout, stderr)."""
    code = 0
    try:
        in_process("mode=plan", *args, f"hydra.run.dir={tmp_path / 'plan'}", "train.eval_generations=0")
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("case", BAD)
def test_plan_exits_2_on_a_bad_image_naming_file_line_and_column(
    tmp_path: Path, pictures: Any, capsys: Any, monkeypatch: Any, case: str
) -> None:
    from transformers import AutoModelForCausalLM

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_model)
    images, says = BAD[case]
    rows = [placeholder_row(["img/red.png", "img/blue.png"], k) for k in range(12)]
    rows.insert(2, placeholder_row(images(tmp_path), 9))
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    code, out, err = plan(tmp_path, capsys, f"data.path={path}", "model=tiny_vlm")
    assert code == 2 and "checks passed" not in out, err[-2000:]
    assert f"{path}:3 (row 3)" in err and says.format(tmp=tmp_path) in err, err[-2000:]
    assert "Traceback" not in err


def test_plan_prints_the_images_report(tmp_path: Path, pictures: Any, capsys: Any) -> None:
    path = write_jsonl(tmp_path / "pairs.jsonl", image_pairs(12))
    code, out, err = plan(tmp_path, capsys, "recipe=dpo", f"data.path={path}", "model=tiny_vlm")
    assert code == 0, err[-2000:]
    assert (
        "# data: images (data.path): 12 in 12 of 12 rows (at most 1 per row); pixels per image min 64" in out
    )
    assert "# data: train rows: 11" in out  # the count is of data.path's rows, before the eval split
    # SFT on a VLM hands image rows untokenized to TRL's vision collator (the processor tokenizes them
    # batch by batch); packing them is refused before load, naming the knob
    sft = write_jsonl(
        tmp_path / "sft.jsonl", [placeholder_row(["img/red.png", "img/blue.png"], k) for k in range(12)]
    )
    code, out, err = plan(tmp_path, capsys, f"data.path={sft}", "model=tiny_vlm")
    assert code == 0 and "# data: tokens: image rows, tokenized by the model's processor" in out, err[-2000:]
    code, out, err = plan(tmp_path, capsys, f"data.path={sft}", "model=tiny_vlm", "data.packing=true")
    assert code == 2 and "[data.packing] 12 rows of data.path have images" in err, err[-2000:]


def test_the_cache_key_changes_with_an_image_s_bytes(tmp_path: Path, pictures: Any) -> None:
    red, _ = pictures
    path = write_jsonl(
        tmp_path / "rows.jsonl", [placeholder_row(["img/red.png", "img/blue.png"], k) for k in range(6)]
    )
    data = ChatDataset(path=path, images=True, eval_fraction=0.0, cache_dir=str(tmp_path / "cache"))

    def prepared() -> tuple[str, Any]:
        done = prepare_data(data, None, 0)
        return done.notes["data cache"].split(":")[0], done.splits["train"][0]["images"][0].getpixel((0, 0))

    assert prepared() == ("miss", (255, 0, 0))
    assert prepared() == ("hit", (255, 0, 0))
    before = fingerprint_node({"path": path, "images": True})
    png(red, (0, 255, 0))  # the same name, other bytes: the jsonl is unchanged
    assert prepared() == ("miss", (0, 255, 0))
    assert prepared() == ("hit", (0, 255, 0))
    # a resume compares the same files: the image edited since is named
    assert changed(before, fingerprint_node({"path": path, "images": True})) == [f"{red.resolve()} changed"]
    # a missing image's row skipped (data.on_error=skip): the key changes when the image appears
    write_jsonl(
        Path(path),
        [
            placeholder_row(["img/red.png", "img/late.png"], 0),
            *[placeholder_row(["img/red.png", "img/blue.png"], k) for k in range(5)],
        ],
    )
    data = ChatDataset(
        path=path, images=True, eval_fraction=0.0, cache_dir=str(tmp_path / "cache"), on_error="skip"
    )
    assert [prepare_data(data, None, 0).notes["data cache"][:4] for _ in range(2)] == ["miss", "hit:"]
    png(tmp_path / "img" / "late.png", (0, 0, 0))
    again = prepare_data(data, None, 0)
    assert again.notes["data cache"].startswith("miss") and len(again.splits["train"]) == 6


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_an_image_named_by_path_in_a_table_is_in_the_cache_key(
    tmp_path: Path, pictures: Any, kind: str
) -> None:
    """Issue 49: a csv / parquet row naming its image by path (no bytes): rewriting the image under the same
    name misses the cache (the old pixels never train)."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    from hydratune.components.data.preferences import PreferenceDataset

    red, _ = pictures
    path = tmp_path / f"pairs.{kind}"
    rows = image_pairs(4)
    if kind == "csv":  # the images cell: one path
        with path.open("w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(rows[0]))
            out.writeheader()
            out.writerows({**row, "images": row["images"][0]} for row in rows)
    else:  # a datasets Image struct without bytes
        structs = [{**r, "images": [{"bytes": None, "path": i} for i in r["images"]]} for r in rows]
        pq.write_table(pa.Table.from_pylist(structs), path)
    data = PreferenceDataset(
        path=str(path), images=True, eval_fraction=0.0, cache_dir=str(tmp_path / "cache")
    )

    def prepared() -> tuple[str, Any]:
        done = prepare_data(data, None, 0)
        return done.notes["data cache"].split(":")[0], done.splits["train"][0]["images"][0].getpixel((0, 0))

    assert [prepared(), prepared()] == [("miss", (255, 0, 0)), ("hit", (255, 0, 0))]
    png(red, (0, 255, 0))  # the same name, other bytes: the table is unchanged
    assert prepared() == ("miss", (0, 255, 0))


def test_images_named_in_arrow_and_compressed_csv_files_are_found(tmp_path: Path, pictures: Any) -> None:
    """``referenced_files`` reads every data format the loader reads: an Arrow stream (``datasets``'
    files), a compressed csv whose cell holds a JSON list."""
    import gzip

    import pyarrow as pa

    from hydratune.components.data.images import referenced_files

    red, blue = pictures
    table = pa.Table.from_pylist([{"images": [{"bytes": None, "path": "img/red.png"}], "text": "x"}])
    with pa.OSFile(str(tmp_path / "rows.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    with gzip.open(tmp_path / "rows.csv.gz", "wt") as f:
        f.write('prompt,images\n"<image><image>hi","[""img/red.png"", ""img/blue.png""]"\n')
    found = referenced_files([tmp_path / "rows.arrow", tmp_path / "rows.csv.gz"], [], None, str)
    assert found == [red.resolve(), blue.resolve()]


def test_the_estimate_counts_the_image_tokens_of_the_data(tmp_path: Path, pictures: Any, capsys: Any) -> None:
    """Two 56-pixel images a row are 8 image tokens (one default image: 4): ``hydratune estimate`` and
    ``strategy=auto`` measure them with the processor and count them, the table exactly as with
    ``model.image_tokens_per_row=8`` given; a given value is not measured over."""
    from hydratune.components.commands.estimate_tables import cli

    rows = [placeholder_row(["img/red.png", "img/blue.png"], k) for k in range(12)]
    path = write_jsonl(tmp_path / "two.jsonl", rows)

    def estimate(*args: str) -> str:
        cli(["model=tiny_vlm", f"data.path={path}", "estimate.gpu_memory=8GB", *args])
        return capsys.readouterr().out

    measured, given, other = (
        estimate(),
        estimate("model.image_tokens_per_row=8"),
        estimate("model.image_tokens_per_row=3"),
    )
    said = "image tokens per row: 8 (the most on one of the first 11 train rows with images"
    assert said in measured and "image tokens per row:" not in given, measured
    assert "8 image tokens/row" in measured and "3 image tokens/row" in other
    assert measured[measured.index("mesh:") :] == given[given.index("mesh:") :]
    code, out, err = plan(
        tmp_path, capsys, f"data.path={path}", "model=tiny_vlm", "strategy=auto", "estimate.gpu_memory=80GB"
    )
    assert code == 0 and f"strategy=auto: {said}" in out, err[-2000:]
    assert "the memory estimate counts 8 (model.image_tokens_per_row)" in out
