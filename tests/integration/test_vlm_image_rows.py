"""Image rows trained by SFT on the tiny VLM (docs/vlm.md, "Training on image rows"): the batch the
trainer's collator makes (TRL's ``DataCollatorForVisionLanguageModeling`` + hydratune's
``NoImageTokenLoss``) decoded: its trained labels are the assistant's answer and never an image token;
the same rows in three shapes give the same tokens and pixels; the loss-mask guard refuses a collator that
trains image tokens; packing image rows is refused before load."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hydra.utils import instantiate

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.chats import ChatDataset
from tests.support.data import write_jsonl
from tests.unit.test_data_images import BLUE, RED, png

IMAGE_TOKEN = 603  # <image> in the bundled tokenizer
QUESTION, ANSWER = "Which colours?", "red, then blue"


@pytest.fixture
def processor(compose_cfg) -> Any:
    """model=tiny_vlm's processor with the run's tokenizer."""
    model = instantiate(compose_cfg("model=tiny_vlm").model, _convert_="all")
    return model.build_processor(model.build_tokenizer())


def collator(processor: Any, *, assistant_only: bool = True, guarded: bool = True) -> Any:
    """The collator SFT's image path trains with: TRL's, as its SFTTrainer builds it for a template with
    generation markers, inside ``NoImageTokenLoss``."""
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from hydratune.components.text.batching import NoImageTokenLoss, image_token_ids

    inner = DataCollatorForVisionLanguageModeling(processor, assistant_only_loss=assistant_only)
    wrapped = NoImageTokenLoss(inner, image_token_ids(processor))
    wrapped.enabled = guarded
    return wrapped


def shapes(tmp_path: Path) -> list[Path]:
    """The same two rows as OpenAI image_url parts, an images column with <image> placeholders, and a
    parquet file with datasets Image features."""
    from datasets import Dataset, Features, Image, List, Value

    red, blue = png(tmp_path / "img" / "red.png", RED), png(tmp_path / "img" / "blue.png", BLUE, (16, 8))
    parts = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "img/red.png"}},
                        {"type": "text", "text": f"{QUESTION} {k}"},
                        {"type": "image_url", "image_url": {"url": "img/blue.png"}},
                    ],
                },
                {"role": "assistant", "content": ANSWER},
            ]
        }
        for k in range(2)
    ]
    placeholders = [
        {
            "messages": [
                {"role": "user", "content": f"<image>{QUESTION} {k}<image>"},
                {"role": "assistant", "content": ANSWER},
            ],
            "images": ["img/red.png", "img/blue.png"],
        }
        for k in range(2)
    ]
    features = Features(
        {"messages": List({"role": Value("string"), "content": Value("string")}), "images": List(Image())}
    )
    both = [{"bytes": red.read_bytes(), "path": None}, {"bytes": blue.read_bytes(), "path": None}]
    table = Dataset.from_dict(
        {"messages": [r["messages"] for r in placeholders], "images": [both, both]}, features=features
    )
    table.to_parquet(tmp_path / "rows.parquet")
    return [
        Path(write_jsonl(tmp_path / "parts.jsonl", parts)),
        Path(write_jsonl(tmp_path / "placeholders.jsonl", placeholders)),
        tmp_path / "rows.parquet",
    ]


def rows(path: Path) -> list[dict[str, Any]]:
    """The train rows as hydratune's data component hands them to the trainer (canonical shape)."""
    loaded = ChatDataset(path=str(path), images=True, eval_fraction=0.0, cache=False).load()
    return [loaded["train"][i] for i in range(len(loaded["train"]))]


def test_three_shapes_give_the_same_tokens_and_pixels(processor: Any, tmp_path: Path) -> None:
    batches = [collator(processor)(rows(path)) for path in shapes(tmp_path)]
    first = batches[0]
    assert (first["input_ids"] == IMAGE_TOKEN).sum().item() == 2 * 2 * 4  # 2 rows, 2 images, 4 tokens each
    for other in batches[1:]:
        assert set(other) == set(first)
        for key, value in first.items():
            assert torch.equal(other[key], value), key


def test_a_collated_batch_trains_the_answer_and_no_image_token(processor: Any, tmp_path: Path) -> None:
    """Decoded: the labels that train are the answer and its end-of-turn token, in every row; the image
    tokens are in the input and none is trained. Without the answer-only mask (assistant_only_loss
    false) the guard still keeps every image token out of the loss."""
    batch = collator(processor)(rows(shapes(tmp_path)[1]))
    tok = processor.tokenizer
    for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True):
        trained = labels[labels != -100]
        assert tok.decode(trained) == f"{ANSWER}<|im_end|>"
        assert (ids == IMAGE_TOKEN).sum().item() == 8 and IMAGE_TOKEN not in trained.tolist()
        assert "<image>" in tok.decode(ids)
    whole = collator(processor, assistant_only=False)(rows(shapes(tmp_path)[1]))
    trained = whole["labels"][whole["labels"] != -100].tolist()
    assert IMAGE_TOKEN not in trained and "<fake_token_around_image>" not in tok.decode(trained)
    assert QUESTION in tok.decode(trained)  # the rest of the conversation trains


def test_the_guard_refuses_a_collator_that_trains_image_tokens(processor: Any, tmp_path: Path) -> None:
    """The break-check the recipe runs on its first batch (``Session.check_image_loss_mask``): a collator
    whose labels hold image tokens (no answer-only mask, no ``NoImageTokenLoss``) is refused by name; the
    recipe's collator passes and its first example is reported."""
    from hydratune.components.runtime.session import Session

    train = rows(shapes(tmp_path)[1])
    measured: list[list[int]] = []
    session = SimpleNamespace(
        processor=processor, tokenizer=processor.tokenizer, report={}, note_image_tokens=measured.extend
    )
    broken = SimpleNamespace(
        train_dataset=train, data_collator=collator(processor, assistant_only=False, guarded=False)
    )
    with pytest.raises(ConfigError, match="image tokens are in the loss") as err:
        Session.check_image_loss_mask(session, broken, masked=False)  # type: ignore[arg-type]
    assert err.value.key == "model.chat_template"
    good = SimpleNamespace(train_dataset=train, data_collator=collator(processor))
    Session.check_image_loss_mask(session, good, masked=True)  # type: ignore[arg-type]
    assert session.report["loss mask"]["image tokens trained"] == 0
    assert session.report["loss mask"]["rows_with_eos_trained"] == 1
    assert [sum(t == IMAGE_TOKEN for t in ids) for ids in measured] == [8, 8]  # the rows' input ids


def pair_rows(tmp_path: Path, n: int = 16) -> Path:
    """Explicit image pairs: a prompt with an <image> placeholder, text chosen / rejected."""
    red, blue = png(tmp_path / "img" / "red.png", RED, (56, 56)), png(tmp_path / "img" / "blue.png", BLUE)
    rows = [
        {
            "prompt": "<image>What colour is this image?",
            "chosen": ["red", "blue"][k % 2],
            "rejected": ["blue", "red"][k % 2],
            "images": [[str(red), str(blue)][k % 2]],
        }
        for k in range(n)
    ]
    return Path(write_jsonl(tmp_path / "pairs.jsonl", rows))


def test_image_pairs_train_the_completions_only(processor: Any, tmp_path: Path) -> None:
    """TRL's vision preference collator on hydratune's image pairs, decoded: the completion mask covers
    the chosen / rejected answers (and their end-of-turn token), never an image token."""
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hydratune.components.data.preferences import PreferenceDataset

    loaded = PreferenceDataset(path=str(pair_rows(tmp_path, 2)), images=True, eval_fraction=0.0, cache=False)
    train = loaded.load()["train"]
    batch = DataCollatorForVisionPreference(processor)([train[0], train[1]])
    tok = processor.tokenizer
    columns = (batch["input_ids"], batch["completion_mask"])
    answers = [tok.decode(ids[mask.bool()]) for ids, mask in zip(*columns, strict=True)]
    assert answers == ["red<|im_end|>\n", "blue<|im_end|>\n", "blue<|im_end|>\n", "red<|im_end|>\n"], answers
    for ids, mask in zip(batch["input_ids"], batch["completion_mask"], strict=True):
        assert (ids == IMAGE_TOKEN).sum().item() == 4 and IMAGE_TOKEN not in ids[mask.bool()].tolist()


def test_dpo_on_image_pairs_moves_the_reward_margin(tmp_path: Path) -> None:
    """``hydratune recipe=dpo model=tiny_vlm data.path=<image pairs>``: the processor goes to TRL's
    DPOTrainer (its vision collator), and the margin on the training pairs moves from 0."""
    import json

    from tests.support.cli import in_process

    run = tmp_path / "run"
    path = pair_rows(tmp_path)
    in_process(
        "recipe=dpo",
        "model=tiny_vlm",
        f"data.path={path}",
        f"data.eval_path={path}",
        "train.max_steps=10",
        "train.micro_batch_size=8",
        "train.eval_every=0",
        "train.save_every=1000",
        "train.write_plots=false",
        f"hydra.run.dir={run}",
    )
    result = json.loads((run / "result.json").read_text())
    before, after = result["training pairs (before)"], result["training pairs (after)"]
    assert before["eval_rewards/margins"] == 0.0 and after["eval_rewards/margins"] > 0.2, after
    assert after["eval_rewards/accuracies"] == 1.0
    assert result["data"]["tokens"].startswith("image pairs, tokenized by the model's processor")
    with pytest.raises(SystemExit) as exit_:
        in_process(
            "recipe=dpo",
            "model=tiny_vlm",
            f"data.path={path}",
            "recipe.precompute_ref_log_probs=true",
            f"hydra.run.dir={tmp_path / 'refused'}",
        )
    assert exit_.value.code == 2


def test_a_recipe_without_image_rows_is_refused_before_load(tmp_path: Path, capsys: Any) -> None:
    """ORPO's trainer is not given the processor: image pairs are refused once read (mode=plan too)."""
    from tests.integration.test_image_rows_plan import plan

    code, _, err = plan(tmp_path, capsys, "recipe=orpo", "model=tiny_vlm", f"data.path={pair_rows(tmp_path)}")
    assert code == 2 and "[recipe] recipe=orpo does not train on image rows" in err, err[-2000:]


def test_a_batch_of_text_and_image_rows_collates(processor: Any, tmp_path: Path) -> None:
    """A batch whose first row has no image and a later one has (data mixing text and image rows): TRL's
    collator alone fails on it in transformers 5.23 (Idefics3's processor, ``text_replacement_offsets``);
    ``NoImageTokenLoss`` puts the image rows first, and every row still trains its answer only."""
    png(tmp_path / "img" / "red.png", RED), png(tmp_path / "img" / "blue.png", BLUE)
    text = [{"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]}]
    pictured = {
        "messages": [
            {"role": "user", "content": f"<image>{QUESTION}<image>"},
            {"role": "assistant", "content": ANSWER},
        ],
        "images": ["img/red.png", "img/blue.png"],
    }
    path = Path(write_jsonl(tmp_path / "mixed.jsonl", [*text, pictured]))
    batch = rows(path)
    assert [len(r["images"]) for r in batch] == [0, 2]
    with pytest.raises(ValueError, match="text_replacement_offsets"):
        collator(processor).inner([dict(r) for r in batch])
    out = collator(processor)([dict(r) for r in batch])
    tok = processor.tokenizer
    trained = [tok.decode(labels[labels != -100]) for labels in out["labels"]]
    assert trained == [f"{ANSWER}<|im_end|>", "hi<|im_end|>"]  # the image row first
    assert out["pixel_values"].shape[:2] == (2, 2)


def test_chat_image_is_checked_before_the_model_loads(tmp_path: Path, monkeypatch: Any) -> None:
    """``hydratune chat <dir> --image <file>``: a file that is not an image, or a text model (no processor
    saved), is refused by name before anything loads."""
    from hydratune.components.commands import chat

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(chat, "load", no_model)
    text_model = tmp_path / "text"
    text_model.mkdir()
    (text_model / "config.json").write_text("{}")
    (tmp_path / "notes.png").write_text("not an image")
    red = png(tmp_path / "red.png", RED)
    os.mkfifo(tmp_path / "pipe.png")
    cases = [
        (tmp_path / "notes.png", "cannot open the image"),
        (tmp_path / "pipe.png", r"is not a regular file \(a FIFO\)"),  # never read: no hang
        (red, "holds no processor"),
    ]
    for image, says in cases:
        with pytest.raises(ConfigError, match=says) as err:
            chat.cli([str(text_model), "--image", str(image)])
        assert err.value.key == "chat.image"
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20)  # PIL's own bomb check: the 8 x 8 image is one now
    with pytest.raises(ConfigError, match="DecompressionBombError") as err:  # issue 49: was a traceback
        chat.cli([str(text_model), "--image", str(red)])
    assert err.value.key == "chat.image" and "MAX_IMAGE_PIXELS" in err.value.hint


def test_plan_measures_the_image_tokens_per_row(tmp_path: Path, capsys: Any) -> None:
    """``mode=plan`` runs the processor over the first train rows with images: two 56-pixel images a row
    are 8 image tokens, more than the estimate's default of one image (4), and the line names the knob."""
    from tests.integration.test_image_rows_plan import plan

    path = shapes(tmp_path)[1]
    code, out, err = plan(tmp_path, capsys, "model=tiny_vlm", f"data.path={path}", f"data.eval_path={path}")
    assert code == 0, err[-2000:]
    assert (
        "# data: image tokens per row (measured): max 8, mean 8.0 on the first 2 train rows with images; the "
        "memory estimate counts 4 (model.image_tokens_per_row): more than it counts, set "
        "model.image_tokens_per_row=8" in out
    ), out
