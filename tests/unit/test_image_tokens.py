"""The image tokens a processor makes of a row (issue 49): counted as the tokens each image expands into
(transformers' ``image_token_ids``), not its ``image_token_id``, which for Gemma 3 is the one
``<start_of_image>`` placeholder an image replaces (256 ``<image_soft_token>`` follow). Checked on the
bundled tiny VLM's processor and on the processors of the conf/model VLM families, each built offline
from transformers' own classes and the tiny tokenizer given the family's special tokens; the oracle is
the processor's own count (``_get_num_multimodal_tokens``; Idefics3's ``image_seq_len``)."""

from __future__ import annotations

from typing import Any

import pytest

from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.images import expanded_image_tokens, measured_image_tokens
from hydratune.components.data.rows import scratch_workers
from tests.support.data import ASSETS, TINY, write_jsonl
from tests.unit.test_data_images import BLUE, RED, placeholder_row, png

#: a chat template rendering image parts as ``image`` (the family's placeholder text)
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}{% else %}"
    "{% for p in m.content %}{% if p.type == 'image' %}IMAGE{% else %}{{ p.text }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}"
)
SIZES = [(40, 32), (64, 48)]  # (width, height) of the two images of a row


def tokenizer(**special: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY), extra_special_tokens=special)


def gemma3() -> Any:
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    tok = tokenizer(
        boi_token="<start_of_image>", eoi_token="<end_of_image>", image_token="<image_soft_token>"
    )
    template = TEMPLATE.replace("IMAGE", "<start_of_image>")
    return Gemma3Processor(Gemma3ImageProcessor(), tok, chat_template=template, image_seq_length=256)


def llava() -> Any:
    from transformers import CLIPImageProcessor, LlavaProcessor

    image = CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    return LlavaProcessor(
        image,
        tokenizer(image_token="<image>"),
        chat_template=TEMPLATE.replace("IMAGE", "<image>"),
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )


def tiny_vlm() -> Any:
    from hydratune.components.modeling.vision import load_processor

    return load_processor(str(ASSETS / "tiny_vlm"), None)


#: the families of conf/model's VLM options that build offline here (tiny_vlm: Idefics3, as SmolVLM). Not
#: here: Qwen2.5-VL / Qwen3-VL, whose processors need a video processor, which needs torchvision (not
#: installed)
PROCESSORS = {"tiny_vlm": tiny_vlm, "gemma3": gemma3, "llava": llava}


@pytest.fixture(scope="module")
def image_rows(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two rows of two images each (of SIZES), as training reads them (TRL's vision rows)."""
    root = tmp_path_factory.mktemp("images")
    png(root / "img" / "a.png", RED, SIZES[0])
    png(root / "img" / "b.png", BLUE, SIZES[1])
    rows = [placeholder_row(["img/a.png", "img/b.png"], k) for k in range(2)]
    data = ChatDataset(path=write_jsonl(root / "rows.jsonl", rows), images=True, eval_fraction=0.0)
    return data.load(scratch_workers())["train"]


@pytest.mark.parametrize("family", PROCESSORS)
def test_image_tokens_are_what_the_processor_expands_each_image_into(image_rows: Any, family: str) -> None:
    processor = PROCESSORS[family]()
    if family == "tiny_vlm":  # Idefics3's count adds the 3 tokens around each image: its own knob instead
        per_image = [processor.image_seq_len] * len(SIZES)
    else:
        sizes = [(h, w) for w, h in SIZES]
        per_image = processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens
    assert measured_image_tokens(processor, image_rows) == [sum(per_image)] * 2
    if family == "gemma3":  # its image_token_id is the placeholder: one an image
        assert per_image == [256, 256] and expanded_image_tokens(processor) != {processor.image_token_id}


@pytest.mark.parametrize("family", PROCESSORS)
def test_the_loss_mask_knows_every_token_an_image_expands_into(image_rows: Any, family: str) -> None:
    """NoImageTokenLoss keeps out of the loss every id an image expands into (Gemma 3's 256
    <image_soft_token>, which its image_token does not name), as well as the tokens around it."""
    from hydratune.components.text.batching import image_token_ids

    processor = PROCESSORS[family]()
    assert expanded_image_tokens(processor) <= image_token_ids(processor)
