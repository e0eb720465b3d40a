"""Regenerate the bundled tiny vision-language model (deterministic, offline): components/assets/tiny_vlm/.

    python scripts/make_tiny_vlm.py

An Idefics3 (SmolVLM-256M's architecture) config with tiny dims, no weights (``model.init=auto`` builds it
at random), and its processor assembled from the bundled tiny BPE tokenizer (components/assets/tiny) plus
Idefics3's image special tokens and a default ``Idefics3ImageProcessor`` (56-pixel images, no splitting:
4 image tokens per image). Idefics3 was picked over Qwen2-VL / Qwen2.5-VL because their processors need a
video processor, which needs torchvision (not a dependency); Idefics3's and LLaVA's need only PIL.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "components" / "assets"
TINY, OUT = ASSETS / "tiny", ASSETS / "tiny_vlm"
#: Idefics3Processor's special tokens; the row/col tags mark the tiles of a split image (6 x 6 at most)
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
TILE_TOKENS = [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
IMAGE_SIZE, PATCH, SCALE = 56, 14, 2  # (56 / 14)^2 = 16 patches, pixel-shuffled by 2: 4 image tokens

# ChatML like model=tiny's; a message's content is a string or a list of parts: text parts are written,
# image parts (type image / image_url) become <image>, which the processor expands to the image's tokens.
# The assistant's content and its <|im_end|> sit inside {% generation %}: assistant-only loss trains them
# and nothing else (never an image token).
CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}{{- '<image>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}{{- render(message['content']) + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + render(message['content']) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def tiny_vlm_config(vocab_size: int, image_token_id: int) -> dict:
    """config.json of the tiny Idefics3: model=tiny's text dims (Llama), a 2-layer SigLIP-style tower."""
    from transformers import Idefics3Config

    text = json.loads((TINY / "config.json").read_text())
    text.update(vocab_size=vocab_size, max_position_embeddings=512)
    text.pop("transformers_version", None)
    vision = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "num_channels": 3,
    }
    config = Idefics3Config(
        text_config=text,
        vision_config=vision,
        scale_factor=SCALE,
        image_token_id=image_token_id,
        tie_word_embeddings=True,
        pad_token_id=text["pad_token_id"],
    )
    return json.loads(config.to_json_string(use_diff=True))


def main(out: Path = OUT) -> None:
    """Write the bundled dir (``out``: elsewhere, to compare with what is shipped)."""
    from transformers import AutoTokenizer, Idefics3ImageProcessor, Idefics3Processor

    tokenizer = AutoTokenizer.from_pretrained(TINY)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS + TILE_TOKENS})
    tokenizer.model_max_length = 512  # image tokens make rows longer than model=tiny's 256
    images = Idefics3ImageProcessor(
        do_image_splitting=False,
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
    )
    seq_len = (IMAGE_SIZE // PATCH) ** 2 // SCALE**2
    processor = Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=seq_len, chat_template=CHAT_TEMPLATE
    )
    config = tiny_vlm_config(len(tokenizer), tokenizer.convert_tokens_to_ids("<image>"))
    with tempfile.TemporaryDirectory() as tmp:
        processor.save_pretrained(tmp)
        (Path(tmp) / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        saved = Path(tmp) / "tokenizer_config.json"  # loading flags of this machine, not the tokenizer's
        keys = json.loads(saved.read_text())
        for key in ("is_local", "local_files_only", "name_or_path", "_name_or_path"):
            keys.pop(key, None)
        saved.write_text(json.dumps(keys, indent=2, sort_keys=True) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(tmp, out)
    out.chmod(0o755)
    for path in out.iterdir():
        path.chmod(0o644)
    print(f"wrote {out}: vocab {len(tokenizer)}, {seq_len} image tokens per image")


if __name__ == "__main__":
    main()
