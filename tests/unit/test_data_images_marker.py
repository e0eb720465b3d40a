"""Image rows as data (issue 45, item 5): ``LoadedData.has_images`` is the one marker of image rows, and the
recipes branch on it (not on the summary's words); a row's images are collected in its own ``RowImages``,
never in module state, so two tables prepared in one process keep their own images."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hydratune.components.data import images as image_rows
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.prepare import IMAGE_TOKENS_NOTE, prepare_data
from hydratune.components.data.rows import LoadedData, LoadReport, scratch_workers
from hydratune.components.data.tables import convert_range
from hydratune.components.data.tokens import SFTTokens
from hydratune.components.distributed.workers import open_shards
from tests.support.data import TINY, chat, write_jsonl
from tests.unit.test_data_images import BLUE, RED, placeholder_row, png

#: a vision-language model component as SFTTokens reads it (image rows are left to its processor)
VISION = SimpleNamespace(is_vision=True, chat_template=None, name_or_path="tiny")


class Reached(Exception):
    """Raised where a recipe's text path starts (the fake session's token facts or model)."""


def sft_tokens() -> SFTTokens:
    return SFTTokens(True, True, 64, False, "bfd", model=VISION)


def files(tmp_path: Path) -> dict[str, str]:
    """An image chat file, and a text one (its rows have an images column, all empty: no image)."""
    png(tmp_path / "img" / "red.png", RED)
    images = [placeholder_row(["img/red.png"] * 2, k) for k in range(4)]
    text = [chat(f"{k} + 1?", str(k + 1)) for k in range(4)]
    return {
        "images": write_jsonl(tmp_path / "images.jsonl", images),
        "text": write_jsonl(tmp_path / "text.jsonl", text),
    }


def prepared(path: str) -> Any:
    from transformers import AutoTokenizer

    data = ChatDataset(path=path, images=True, eval_fraction=0.0, cache=False)
    return prepare_data(data, AutoTokenizer.from_pretrained(str(TINY)), 0, tokens=sft_tokens())


def test_the_marker_is_true_exactly_for_image_rows_and_sft_then_makes_no_tokens(tmp_path: Path) -> None:
    paths = files(tmp_path)
    with_images, text = prepared(paths["images"]), prepared(paths["text"])
    assert with_images.splits.has_images is True and text.splits.has_images is False
    assert "images" in text.splits["train"].column_names  # a column of empty lists is no image row
    assert with_images.tokens is None and with_images.notes["tokens"] == IMAGE_TOKENS_NOTE  # words only
    assert text.tokens is not None and len(text.tokens["train"]) == 4 and "tokens" not in text.notes


def test_token_preparation_follows_the_marker_not_the_rows(tmp_path: Path, monkeypatch: Any) -> None:
    """The marker, read once from the rows, is what decides: forced True on text rows, no tokens."""
    monkeypatch.setattr(LoadedData, "has_images", property(lambda self: True))
    assert prepared(files(tmp_path)["text"]).tokens is None


@pytest.mark.parametrize("marked", [True, False])
def test_sft_and_dpo_branch_on_the_marker(marked: bool, monkeypatch: Any) -> None:
    """SFT takes its image path and DPO checks image pairs exactly when ``has_images`` says so, whatever
    the summary's words (here: the image line on text rows, none on image rows)."""
    from hydratune.components.runtime.session import Session
    from hydratune.recipes.dpo import DPO
    from hydratune.recipes.sft import SFT

    rows = LoadedData({"train": [], "eval": []}, LoadReport())
    rows.__dict__["has_images"] = marked  # the marker as the data read it

    class FakeSession:
        report: dict[str, Any] = {"data": {} if marked else {"tokens": IMAGE_TOKENS_NOTE}}

        def load_data(self) -> LoadedData:
            return rows

        @property
        def token_facts(self) -> Any:  # SFT's text path reads its tokens' plan first
            raise Reached

        def build_model(self) -> Any:
            raise Reached

    monkeypatch.setattr(Session, "start", staticmethod(lambda ctx: FakeSession()))
    monkeypatch.setattr(SFT, "run_image_rows", lambda self, session, data: {"path": "image rows"})
    checked: list[bool] = []
    monkeypatch.setattr(DPO, "check_image_pairs", lambda self, session: checked.append(True))
    ctx = SimpleNamespace(components=None)
    if marked:
        assert SFT().run(ctx) == {"path": "image rows"}
    else:
        with pytest.raises(Reached):
            SFT().run(ctx)
    with pytest.raises(Reached):
        DPO().run(ctx)
    assert checked == ([True] if marked else [])


def test_no_reader_of_image_rows_outside_the_marker() -> None:
    """Recipes and the runtime ask ``has_images``; nothing outside the data wing tests the rows itself or
    compares the summary's words."""
    repo = Path(__file__).resolve().parents[2]
    sources = [*(repo / "recipes").glob("*.py"), *(repo / "components" / "runtime").glob("*.py")]
    for path in sources:
        text = path.read_text()
        assert "rows_have_images" not in text, path
        assert "IMAGE_TOKENS_NOTE" not in text, path
    for name in ("sft", "dpo", "grpo"):
        assert "has_images" in (repo / "recipes" / f"{name}.py").read_text(), name


def test_two_tables_prepared_together_keep_their_own_images(tmp_path: Path) -> None:
    """Table B converted in full in the middle of each row of table A (one process): A's rows keep A's
    folder, A's data.image_max_pixels and A's counts; B's keep B's. Module-level row or table state (the
    folder relative paths are read from, the row's images) would hand A's rows B's images."""
    png(tmp_path / "a" / "img" / "x.png", RED)  # the same relative name in both folders
    png(tmp_path / "b" / "img" / "x.png", BLUE, (16, 8))
    path_a = write_jsonl(
        tmp_path / "a" / "rows.jsonl", [placeholder_row(["img/x.png"] * 2, k) for k in range(3)]
    )
    path_b = write_jsonl(
        tmp_path / "b" / "rows.jsonl", [placeholder_row(["img/x.png"] * 2, k) for k in range(2)]
    )
    option = ChatDataset(path=path_a, images=True, cache=False)
    workers = scratch_workers()
    (table_a,) = option.read(path_a, "data.path", LoadReport(), workers)
    (table_b,) = option.read(path_b, "data.path", LoadReport(), workers)
    fn, columns, _ = option.converter([table_a], "messages", False)

    def convert(table: Any, row_fn: Any, name: str, max_pixels: int | None) -> Any:
        images = image_rows.TableImages.of(table, max_pixels)
        span = (0, table.rows)
        return convert_range(
            table, span, row_fn, columns, workers.file(name), "data.path", False, {}, ignore, images=images
        )

    inner: list[Any] = []

    def a_row_with_b_inside(row: dict[str, Any], **images: Any) -> dict[str, Any]:
        inner.append(convert(table_b, fn, "b", 64))  # B downsizes its 16x8 images to 64 pixels at most
        return fn(row, **images)

    done_a = convert(table_a, a_row_with_b_inside, "a", None)
    red = (tmp_path / "a" / "img" / "x.png").read_bytes()
    assert [[image["bytes"] for image in row] for row in read_images(done_a.paths)] == [[red, red]] * 3
    assert (done_a.images.rows, done_a.images.pixels, done_a.images.resized) == (3, [64] * 6, 0)
    for done_b in inner:
        assert (done_b.images.rows, done_b.images.resized, len(done_b.images.pixels)) == (2, 4, 4)
        assert max(done_b.images.pixels) <= 64
        for row in read_images(done_b.paths):
            assert all(size(image["bytes"]) != (8, 8) for image in row)
    state = (dict, list, set, image_rows.RowImages, image_rows.TableImages)
    found = [k for k, v in vars(image_rows).items() if not k.startswith("__") and isinstance(v, state)]
    assert not found, found  # no module-level row or table state


def ignore(rows: int) -> None:
    """A conversion's progress tick, not shown."""


def read_images(paths: list[Path]) -> list[list[dict[str, Any]]]:
    from datasets import Image, List

    table = open_shards(paths).cast_column("images", List(Image(decode=False)))
    return list(table["images"])


def size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.size
