"""The tiny VLM in process (docs/vlm.md): forward and backward on generated images through its bundled
processor, model.freeze's parts left without gradients, and a short SFT run (text rows: image rows are the
data side's) whose checkpoints, final/ and export hold the processor, which plain transformers loads
offline and which gives the same greedy tokens on an image prompt as the run's own model."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from hydra.utils import instantiate

IMAGE_TOKEN = 603  # <image> in the bundled tokenizer
RED, BLUE = (230, 20, 20), (20, 20, 230)


def picture(rgb: tuple[int, int, int]) -> Any:
    """A generated 40 x 30 image of one colour (the processor resizes it to 56 pixels)."""
    from PIL import Image

    return Image.new("RGB", (40, 30), rgb)


def conversation(rgb: tuple[int, int, int], answer: str | None) -> list[dict[str, Any]]:
    user = {
        "role": "user",
        "content": [{"type": "image", "image": picture(rgb)}, {"type": "text", "text": "colour?"}],
    }
    return [user] + ([{"role": "assistant", "content": [{"type": "text", "text": answer}]}] if answer else [])


def batch(processor: Any, rgb: tuple[int, int, int], answer: str) -> dict[str, Any]:
    """One row as the processor makes it; labels only on the assistant's tokens (the template's
    generation markers), never on an image token."""
    row = processor.apply_chat_template(
        conversation(rgb, answer),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        return_tensors="pt",
    )
    mask = row.pop("assistant_masks").bool()
    row["labels"] = row["input_ids"].masked_fill(~mask, -100)
    return dict(row)


@pytest.fixture
def tiny_vlm(compose_cfg) -> tuple[Any, Any]:
    """model=tiny_vlm's component and its processor (with the run's tokenizer)."""
    model = instantiate(compose_cfg("model=tiny_vlm").model, _convert_="all")
    return model, model.build_processor(model.build_tokenizer())


def test_forward_and_backward_on_a_generated_image(tiny_vlm) -> None:
    """The image becomes 4 image tokens, none of them trained; the loss reaches every part (the tower's
    gradients are not zero: the pixels matter), and another colour changes the logits."""
    component, processor = tiny_vlm
    torch.manual_seed(0)
    model = component.build()
    red = batch(processor, RED, "red")
    ids, labels = red["input_ids"][0], red["labels"][0]
    assert int((ids == IMAGE_TOKEN).sum()) == 4 and not (labels[ids == IMAGE_TOKEN] != -100).any()
    assert processor.tokenizer.decode(labels[labels != -100]) == "red<|im_end|>"
    out = model(**red)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    family = component.vision_family
    for part in ("vision_tower", "projector", "language_model"):
        grads = [p.grad for n, p in model.named_parameters() if family.part_of(n) == part]
        assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads), part
    with torch.no_grad():
        blue = model(**batch(processor, BLUE, "red")).logits
    assert not torch.allclose(out.logits.detach(), blue)


def test_freeze_leaves_the_named_parts_without_gradients(tiny_vlm) -> None:
    """model.freeze=[vision_tower, projector]: their gradients stay None after a backward, the language
    model's are there."""
    component, processor = tiny_vlm
    frozen = dataclasses.replace(component, freeze=["vision_tower", "projector"])
    torch.manual_seed(0)
    model = component.build()
    assert frozen.apply_freeze(model) > 0
    model(**batch(processor, RED, "red")).loss.backward()
    family = component.vision_family
    grads = {part: [] for part in ("vision_tower", "projector", "language_model")}
    for name, param in model.named_parameters():
        grads[family.part_of(name)].append(param.grad)
    assert all(g is None for g in grads["vision_tower"] + grads["projector"])
    assert all(g is not None for g in grads["language_model"])


def greedy(model: Any, processor: Any, rgb: tuple[int, int, int]) -> list[int]:
    inputs = processor.apply_chat_template(
        conversation(rgb, None),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def test_checkpoints_final_and_export_hold_the_processor(run_recipe, tmp_path) -> None:
    """A run of the tiny VLM (model.freeze=[vision_tower]) saves the processor into its checkpoint and
    final/; the export holds it too, and AutoProcessor + AutoModelForImageTextToText load the export
    offline and answer an image prompt with the run's own greedy tokens. The frozen tower kept its init
    (the rows are text, so that alone proves little: the trainable count says the tower was frozen)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from hydratune.components.commands.export import export
    from hydratune.components.modeling.trained import TrainedRun

    ctx, _ = run_recipe(
        "model=tiny_vlm",
        "model.freeze=[vision_tower]",
        "train.max_steps=2",
        "train.save_every=2",
        "train.micro_batch_size=4",
        "train.probe_pairs=0",
        name="vlm",
    )
    run = ctx.run_dir.path
    # the session froze the tower (812,608 - its 105,792); text rows alone would leave it unchanged anyway
    assert "trainable 706,816 / 812,608 params" in (run / "summary.md").read_text()
    for folder in (run / "checkpoints" / "checkpoint-2", run / "final"):
        saved = AutoProcessor.from_pretrained(folder)
        assert type(saved).__name__ == "Idefics3Processor" and saved.image_seq_len == 4, folder
    trained, tokenizer = TrainedRun.open(run).load()
    processor = TrainedRun.open(run).processor(tokenizer)
    out = export(run, tmp_path / "export")
    plain_processor = AutoProcessor.from_pretrained(out)
    plain = AutoModelForImageTextToText.from_pretrained(out).eval()
    for rgb in (RED, BLUE):
        assert greedy(plain, plain_processor, rgb) == greedy(trained, processor, rgb)
    assert "AutoProcessor" in (out / "README.md").read_text()
    from hydratune.components.commands.chat import load

    assert type(load(out)[0]).__name__ == "Idefics3ForConditionalGeneration"  # chat on the export: text turns
    ctx.seed_everything()  # as build_model seeds before the init
    fresh = ctx.components.model.build()
    tower = "model.vision_model."
    before = {n: p for n, p in fresh.named_parameters() if n.startswith(tower)}
    after = dict(trained.named_parameters())
    assert before and all(torch.equal(p, after[n]) for n, p in before.items())
    assert not torch.equal(fresh.lm_head.weight, trained.lm_head.weight)  # the decoder did train
