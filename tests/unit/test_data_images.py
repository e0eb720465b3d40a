"""Image rows (components/data/images.py; issue 36's data side): the shapes users have (OpenAI-style content
parts with a path, a file:// or a data: URL; an images column with <image> placeholders, also through a
LLaMA-Factory dir; datasets Image features in parquet and save_to_disk) give the same canonical rows and
the same image bytes; each bad image is a row error naming file:line and column (data.on_error=skip drops
and counts it); data.image_max_pixels downsizes and counts; text models refuse image rows as before."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data import images as image_rows
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.preferences import PreferenceDataset
from tests.support.data import write_jsonl

RED, BLUE = (255, 0, 0), (0, 0, 255)


def png(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (8, 8)) -> Path:
    from PIL import Image, PngImagePlugin

    path.parent.mkdir(parents=True, exist_ok=True)
    note = PngImagePlugin.PngInfo()
    note.add_text("Comment", "kept: the bytes as given, never decoded and encoded again")
    Image.new("RGB", size, color).save(path, format="PNG", pnginfo=note)
    return path


def data_url(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


QUESTION, ANSWER = "What colours? ", "red, then blue"


def parts_row(first: str, second: str, k: int) -> dict[str, Any]:
    """Shape (a): OpenAI content parts carrying their images."""
    user = [
        {"type": "image_url", "image_url": {"url": first}},
        {"type": "text", "text": f"{QUESTION}{k}"},
        {"type": "image_url", "image_url": {"url": second}},
    ]
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": ANSWER}]}


def placeholder_row(images: list[Any], k: int, *, key: str = "messages") -> dict[str, Any]:
    """Shape (b): <image> placeholders in the text and an images column (LLaVA, LLaMA-Factory)."""
    turns = [
        {"role": "user", "content": f"<image>{QUESTION}{k}<image>"},
        {"role": "assistant", "content": ANSWER},
    ]
    return {key: turns, "images": images}


RED_PNG = "img/red.png"


def image_pairs(n: int) -> list[dict[str, Any]]:
    """``n`` explicit preference pairs, each prompt holding img/red.png by an <image> placeholder."""
    return [
        {"prompt": f"<image>Which colour? {k}", "chosen": "red", "rejected": "blue", "images": [RED_PNG]}
        for k in range(n)
    ]


@pytest.fixture
def pictures(tmp_path: Path) -> tuple[Path, Path]:
    return png(tmp_path / "img" / "red.png", RED), png(tmp_path / "img" / "blue.png", BLUE, (16, 8))


def load(path: Path | str, **knobs: Any) -> Any:
    knobs = {"images": True, "eval_fraction": 0.0, "cache": False, **knobs}
    return ChatDataset(path=str(path), **knobs).load()


def canonical(loaded: Any) -> list[tuple[Any, list[bytes]]]:
    """(the messages, the images' bytes) of every train row, as stored (bytes, not decoded)."""
    from datasets import Image, List

    table = loaded["train"].cast_column("images", List(Image(decode=False)))
    return [(row["messages"], [i["bytes"] for i in row["images"]]) for row in table]


def test_the_shapes_give_the_same_rows_and_bytes(tmp_path: Path, pictures: tuple[Path, Path]) -> None:
    from datasets import Dataset, Features, Image, List, Value

    red, blue = pictures
    n = 3
    parts = tmp_path / "parts.jsonl"  # a relative path, a file:// URL, a data: URL
    write_jsonl(
        parts, [parts_row("img/red.png", [f"file://{blue}", data_url(blue)][k % 2], k) for k in range(n)]
    )
    llava = tmp_path / "llava.jsonl"
    write_jsonl(llava, [placeholder_row(["img/red.png", str(blue)], k) for k in range(n)])
    sharegpt = tmp_path / "sharegpt.jsonl"  # ShareGPT-4V: conversations with from / value
    rows = []
    for k in range(n):
        turns = [{"from": "human", "value": f"<image>{QUESTION}{k}<image>"}, {"from": "gpt", "value": ANSWER}]
        rows.append({"conversations": turns, "images": ["img/red.png", "img/blue.png"]})
    write_jsonl(sharegpt, rows)
    factory = tmp_path / "lf"  # a LLaMA-Factory dir: its images column, paths from the dataset dir
    png(factory / "pics" / "red.png", RED), png(factory / "pics" / "blue.png", BLUE, (16, 8))
    rows = [
        {
            "conversations": [
                {"from": "human", "value": f"<image>{QUESTION}{k}<image>"},
                {"from": "gpt", "value": ANSWER},
            ],
            "images": ["pics/red.png", "pics/blue.png"],
        }
        for k in range(n)
    ]
    (factory / "data").mkdir()
    (factory / "data" / "vqa.json").write_text(json.dumps(rows))
    info = {
        "vqa": {
            "file_name": "data/vqa.json",
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "images": "images"},
        }
    }
    (factory / "dataset_info.json").write_text(json.dumps(info))
    # datasets Image features: bytes inside a parquet file and a save_to_disk folder
    features = Features(
        {"messages": List({"role": Value("string"), "content": Value("string")}), "images": List(Image())}
    )
    hf = Dataset.from_dict(
        {
            "messages": [placeholder_row([], k)["messages"] for k in range(n)],
            "images": [
                [{"bytes": red.read_bytes(), "path": None}, {"bytes": blue.read_bytes(), "path": None}]
            ]
            * n,
        },
        features=features,
    )
    hf.to_parquet(tmp_path / "hf.parquet")
    hf.save_to_disk(tmp_path / "hf_disk")
    saved = sorted((tmp_path / "hf_disk").iterdir())

    # the hub's vision datasets (trl-lib/llava-instruct-mix...): content parts as Arrow structs (every part
    # every key, None where absent) with bare image parts
    def struct_parts(k: int) -> list[dict[str, Any]]:
        user = [{"type": "image", "text": None}, {"type": "text", "text": f"{QUESTION}{k}"}]
        user.append({"type": "image", "text": None})
        return [
            {"role": "user", "content": user},
            {"role": "assistant", "content": [{"type": "text", "text": ANSWER}]},
        ]

    Dataset.from_dict(
        {
            "messages": [struct_parts(k) for k in range(n)],
            "images": [
                [{"bytes": red.read_bytes(), "path": None}, {"bytes": blue.read_bytes(), "path": None}]
            ]
            * n,
        },
        features=None,
    ).cast_column("images", List(Image())).to_parquet(tmp_path / "structs.parquet")

    expected = None
    shapes = (parts, llava, sharegpt, factory, tmp_path / "hf.parquet", tmp_path / "hf_disk")
    for path in (*shapes, tmp_path / "structs.parquet"):
        got = canonical(load(path))
        expected = expected or got
        assert got == expected, path
    assert sorted((tmp_path / "hf_disk").iterdir()) == saved  # nothing written beside the user's files
    messages, images = expected[0]
    assert images == [red.read_bytes(), blue.read_bytes()]  # the bytes as given, in placeholder order
    assert messages == [  # TRL's vision shape: every turn a list of parts
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": f"{QUESTION}0"}, {"type": "image"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": ANSWER}]},
    ]
    from trl.data_utils import prepare_multimodal_messages  # TRL fills exactly these placeholders

    filled = prepare_multimodal_messages(messages, images=["R", "B"])
    assert [p.get("image") for p in filled[0]["content"]] == ["R", None, "B"]
    row = load(llava)["train"][0]  # read back as TRL reads it: PIL images
    assert [im.size for im in row["images"]] == [(8, 8), (16, 8)] and row["answer"] == ANSWER


def test_the_report_counts_images_rows_and_pixels(tmp_path: Path, pictures: tuple[Path, Path]) -> None:
    rows = [placeholder_row(["img/red.png", "img/blue.png"], 0), placeholder_row(["img/blue.png"], 1)]
    rows[1]["messages"][0]["content"] = "<image>one"
    rows.append(
        {"messages": [{"role": "user", "content": "text only"}, {"role": "assistant", "content": "ok"}]}
    )
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    loaded = load(path)
    assert loaded.info["images (data.path)"] == (
        "3 in 2 of 3 rows (at most 2 per row); pixels per image min 64, median 128, max 128"
    )
    assert loaded["train"][2]["images"] == [] and loaded["train"][2]["messages"][0]["content"] == "text only"
    assert "images" in loaded.info["columns used"]


def test_image_max_pixels_downsizes_keeping_the_aspect(tmp_path: Path) -> None:
    png(tmp_path / "big.png", RED, (40, 20)), png(tmp_path / "small.png", BLUE, (4, 4))
    rows = [placeholder_row(["big.png", "small.png"], k) for k in range(2)]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    loaded = load(path, image_max_pixels=200)
    assert [im.size for im in loaded["train"][0]["images"]] == [(20, 10), (4, 4)]  # 800 px -> 200, 2:1 kept
    assert loaded.info["images (data.path)"].endswith("2 downsized to data.image_max_pixels=200")
    assert "min 16, median 108, max 200" in loaded.info["images (data.path)"]


def corrupt(tmp_path: Path) -> str:
    (tmp_path / "img" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not an image")
    return "img/bad.png"


#: each bad image: (the row's images, what the error says)
BAD = {
    "missing file": (
        lambda tmp: ["img/red.png", "img/gone.png"],
        "the image file {tmp}/img/gone.png does not exist",
    ),
    "corrupt bytes": (lambda tmp: ["img/red.png", corrupt(tmp)], "is not a readable image"),
    "http url": (
        lambda tmp: ["img/red.png", "https://example.com/x.png"],
        "is a https URL; nothing is downloaded",
    ),
    "count mismatch": (lambda tmp: ["img/red.png"], "the row has 2 image placeholders (<image> or"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_image_names_file_line_and_column(tmp_path: Path, pictures: Any, case: str) -> None:
    images, says = BAD[case]
    rows = [placeholder_row(["img/red.png", "img/blue.png"], k) for k in range(3)]
    rows.insert(2, placeholder_row(images(tmp_path), 9))
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(ConfigError) as info:
        load(path)
    column = "" if case == "count mismatch" else "column 'images' item 1: "
    assert f"{path}:3 (row 3): {column}" in str(info.value), info.value
    assert says.format(tmp=tmp_path) in str(info.value), info.value
    skipped = load(path, on_error="skip")  # dropped and counted
    assert len(skipped["train"]) == 3 and skipped.stats["skipped rows"] == 1


def test_an_image_that_is_a_fifo_is_refused_not_read(tmp_path: Path, pictures: Any) -> None:
    """Issue 49: a FIFO named as an image hung the preparation silently (a read that never returns)."""
    import os

    os.mkfifo(tmp_path / "img" / "pipe.png")
    rows = [placeholder_row(["img/red.png", "img/blue.png"], k) for k in range(3)]
    rows.insert(1, placeholder_row(["img/red.png", "img/pipe.png"], 9))
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert f"{path}:2 (row 2): column 'images' item 1: the image {tmp_path}/img/pipe.png" in str(info.value)
    assert "is not a regular file (a FIFO)" in str(info.value)
    assert len(load(path, on_error="skip")["train"]) == 3


def test_content_part_errors_name_the_message_and_part(tmp_path: Path, pictures: Any) -> None:
    rows = [parts_row("img/red.png", "img/blue.png", k) for k in range(2)]
    rows.append(parts_row("img/red.png", "http://example.com/b.png", 2))
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(
        ConfigError, match=r"rows.jsonl:3 \(row 3\): message 0 in column 'messages', part 2: the image"
    ):
        load(path)
    both = [parts_row("img/red.png", "img/blue.png", 0) | {"images": ["img/red.png"]}] * 2
    with pytest.raises(ConfigError, match="both inside its content parts"):
        load(write_jsonl(tmp_path / "both.jsonl", both))


def test_text_models_refuse_image_rows_as_before(tmp_path: Path, pictures: Any) -> None:
    rows = [parts_row("img/red.png", "img/blue.png", k) for k in range(3)]
    path = write_jsonl(tmp_path / "parts.jsonl", rows)
    with pytest.raises(
        ConfigError, match="has a 'image_url' content part \\(part 0\\): only text parts can be trained"
    ):
        load(path, images=False)
    with pytest.raises(ConfigError, match="has a 'image_url' content part"):
        load(path, images=None)  # null, no model to follow: a text model
    columns = write_jsonl(tmp_path / "llava.jsonl", [placeholder_row(["img/red.png", "img/blue.png"], 0)] * 3)
    with pytest.raises(ConfigError) as info:  # the images column is not trained past silently
        load(columns, images=False)
    assert info.value.key == "data.ignore_columns" and "images for a vision-language model" in str(info.value)


def test_the_images_knob_follows_the_model_component() -> None:
    class Text:
        pass

    class Vision:
        accepts_images = True

    class Declared:
        accepts_images = False

    data = ChatDataset(path="x.jsonl")
    assert image_rows.with_images(data, Text()).images is False  # today's CausalLM declares nothing
    assert image_rows.with_images(data, Vision()).images is True

    class Method:
        def accepts_images(self) -> bool:
            return False

    assert image_rows.with_images(data, Method()).images is False  # a method is asked, not taken as truthy
    assert image_rows.with_images(ChatDataset(path="x.jsonl", images=False), Vision()).images is False
    with pytest.raises(ConfigError, match="does not take images"):
        image_rows.with_images(ChatDataset(path="x.jsonl", images=True), Declared())


def test_streaming_and_packing_are_refused_on_image_rows(tmp_path: Path, pictures: Any) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", [placeholder_row(["img/red.png", "img/blue.png"], 0)] * 3)
    with pytest.raises(ConfigError) as info:
        ChatDataset(path=path, images=True, streaming=True).validate()
    assert info.value.key == "data.streaming"
    with pytest.raises(ConfigError) as info:
        load(path, packing=True)
    assert info.value.key == "data.packing" and info.value.hint == "data.packing=false"


def test_preference_pairs_with_images_in_the_prompt(tmp_path: Path, pictures: Any) -> None:
    rows = image_pairs(3)
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    loaded = PreferenceDataset(path=path, images=True, eval_fraction=0.0, cache=False).load()
    row = loaded["train"][0]
    assert row["prompt"] == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour? 0"}]}
    ]
    assert row["chosen"] == [{"role": "assistant", "content": "red"}] and [i.size for i in row["images"]] == [
        (8, 8)
    ]
    assert loaded.info["images (data.path)"].startswith("3 in 3 of 3 rows")
    rows[1]["images"] = ["img/missing.png"]
    with pytest.raises(ConfigError, match=r"pairs.jsonl:2 \(row 2\): column 'images' item 0"):
        PreferenceDataset(path=write_jsonl(tmp_path / "pairs.jsonl", rows), images=True, cache=False).load()


def test_grpo_prompts_with_images_in_two_shapes_give_the_same_rows(tmp_path: Path, pictures: Any) -> None:
    """GRPO's prompt rows (``PromptDataset``): an ``images`` column with ``<image>`` placeholders and image
    parts carrying data URLs give the same prompt turns and image bytes; a missing image names its row."""
    from datasets import Image, List

    from hydratune.components.data.prompts import PromptDataset

    red, blue = pictures
    placeholders = [{**placeholder_row([RED_PNG, "img/blue.png"], k), "answer": "red"} for k in range(3)]
    parts = [{**parts_row(data_url(red), data_url(blue), k), "answer": "red"} for k in range(3)]
    for rows in (placeholders, parts):
        for row in rows:
            row["prompt"] = row.pop("messages")[:1]

    def prompts(rows: list[dict[str, Any]], name: str) -> list[Any]:
        path = write_jsonl(tmp_path / name, rows)
        loaded = PromptDataset(path=path, images=True, eval_fraction=0.0, cache=False).load()
        table = loaded["train"].cast_column("images", List(Image(decode=False)))
        return [(r["prompt"], r["answer"], [i["bytes"] for i in r["images"]]) for r in table]

    got = prompts(placeholders, "placeholders.jsonl")
    assert got == prompts(parts, "parts.jsonl")
    assert got[0][0][0]["content"] == [
        {"type": "image"}, {"type": "text", "text": f"{QUESTION}0"}, {"type": "image"}
    ]  # fmt: skip
    assert got[0][2] == [red.read_bytes(), blue.read_bytes()]
    placeholders[1]["images"] = ["img/missing.png", RED_PNG]
    with pytest.raises(ConfigError, match=r"placeholders.jsonl:2 \(row 2\): column 'images' item 0"):
        prompts(placeholders, "placeholders.jsonl")


def test_a_data_url_must_be_base64_and_decodable(tmp_path: Path) -> None:
    row = image_rows.TableImages(tmp_path, None).row()
    with pytest.raises(image_rows.RowError, match="should be base64"):
        row.load_image("data:image/png,abc", "here")
    with pytest.raises(image_rows.RowError, match="not valid base64"):
        row.load_image("data:image/png;base64,***", "here")
    buffer = io.BytesIO()
    from PIL import Image

    Image.new("L", (3, 5)).save(buffer, format="PNG")
    assert row.load_image({"bytes": buffer.getvalue(), "path": None}, "here")["bytes"] == buffer.getvalue()


def test_one_image_column_and_an_eval_file_of_its_own_folder(tmp_path: Path, pictures: Any) -> None:
    from datasets import Dataset, Features, Image, Value

    red, _ = pictures
    turns = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    turns.append({"role": "assistant", "content": "red"})
    features = Features(  # an image column of one image (datasets' Image), bare placeholders
        {
            "messages": [
                {"role": Value("string"), "content": [{"type": Value("string"), "text": Value("string")}]}
            ]
        }
        | {"image": Image()}
    )
    turns[1]["content"] = [{"type": "text", "text": "red"}]
    rows = {"messages": [turns] * 3, "image": [{"bytes": red.read_bytes(), "path": None}] * 3}
    Dataset.from_dict(rows, features=features).to_parquet(tmp_path / "one.parquet")
    png(tmp_path / "eval" / "img" / "red.png", RED)  # the eval file's own img/ folder
    evals = write_jsonl(tmp_path / "eval" / "rows.jsonl", [placeholder_row(["img/red.png"] * 2, 0)])
    loaded = load(tmp_path / "one.parquet", eval_path=evals)
    train = canonical(loaded)
    assert train[0][1] == [red.read_bytes()] and train[0][0][0]["content"][0] == {"type": "image"}
    assert len(loaded["eval"]) == 1 and loaded.info["images (data.eval_path)"].startswith("2 in 1 of 1 rows")


def test_an_images_column_of_another_name_is_mapped(tmp_path: Path, pictures: Any) -> None:
    rows = [placeholder_row(["img/red.png", "img/blue.png"], k) for k in range(2)]
    rows = [{"messages": r["messages"], "pictures": r["images"]} for r in rows]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    ChatDataset(path=path, images=True, columns={"images": "pictures"}).validate()  # what compose checks
    loaded = load(path, columns={"images": "pictures"})
    assert [im.size for im in loaded["train"][0]["images"]] == [(8, 8), (16, 8)]
    assert "pictures (as images)" in loaded.info["columns used"]


def test_options_that_read_no_images_refuse_the_knob(tmp_path: Path) -> None:
    from hydratune.components.data.preferences import UnpairedPreferenceDataset

    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "hi", "completion": "yo", "label": True}])
    for option in (UnpairedPreferenceDataset,):  # KTO's rows (PromptDataset reads GRPO's image prompts)
        with pytest.raises(ConfigError) as info:
            option(path=path, images=True).validate()
        assert info.value.key == "data.images" and "does not read images" in str(info.value)
        assert (
            image_rows.with_images(option(path=path), type("Vision", (), {"accepts_images": True})()).images
            is None
        )


def test_trl_s_vision_collators_take_the_rows(tmp_path: Path) -> None:
    """TRL as the oracle of the shape: its SFT and DPO vision collators (what its trainers batch image rows
    with) take the loaded rows as they are, with a processor assembled offline (the tiny tokenizer, an
    <image> token, CLIP's image processor)."""
    from transformers import AutoTokenizer, CLIPImageProcessor, LlavaProcessor
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from tests.support.data import TINY

    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['content'] is string %}{{ m['content'] }}"
        "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}"
        "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = AutoTokenizer.from_pretrained(TINY)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}),
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=template,
        image_token="<image>",
    )
    png(tmp_path / "img" / "red.png", RED, (28, 28)), png(tmp_path / "img" / "blue.png", BLUE, (56, 28))
    rows = [placeholder_row(["img/red.png", "img/blue.png"], k) for k in range(3)]
    rows.append(
        {"messages": [{"role": "user", "content": "text only"}, {"role": "assistant", "content": "ok"}]}
    )
    chats = load(write_jsonl(tmp_path / "rows.jsonl", rows))["train"]
    batch = DataCollatorForVisionLanguageModeling(processor)([dict(row) for row in chats])
    assert batch["pixel_values"].shape[0] == 6 and batch["input_ids"].shape[0] == 4  # 3 rows x 2 images
    assert int((batch["input_ids"] == tok.convert_tokens_to_ids("<image>")).sum()) > 0
    pair = {"chosen": "red", "rejected": "blue", "images": ["img/red.png"]}
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": f"<image>Which? {k}", **pair} for k in range(3)])
    prefs = PreferenceDataset(path=path, images=True, eval_fraction=0.0, cache=False).load()["train"]
    batch = DataCollatorForVisionPreference(processor)([dict(row) for row in prefs])
    assert batch["pixel_values"].shape[0] == 6 and batch["input_ids"].shape[0] == 6  # chosen and rejected


def test_what_reads_image_rows_with_a_text_tokenizer_is_refused_or_kept_exact(
    tmp_path: Path, pictures: Any
) -> None:
    from hydratune.components.text.chat_template import fold_system

    path = write_jsonl(tmp_path / "rows.jsonl", [placeholder_row(["img/red.png", "img/blue.png"], 0)] * 2)
    data = ChatDataset(path=path, images=True, eval_fraction=0.0, cache=False, on_overlong="drop")
    with pytest.raises(ConfigError) as info:  # lengths without the image tokens would be wrong
        data.enforce_length(data.load(), tokenizer=None)
    assert info.value.key == "data.on_overlong"
    image = [{"type": "image"}, {"type": "text", "text": "what?"}]
    folded = fold_system(
        [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": image},
        ]
    )
    assert folded == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "\n\n"}, *image],
        }
    ]
    assert (
        fold_system([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])[0]["content"]
        == "S\n\nU"
    )
