"""Vision-language models: which families are known, where their parts sit, and their processor.

A model is a vision-language model (VLM) when its config has a ``vision_config`` (the one rule; nothing
asks a class name). Every known family names its three parts by module prefix, as transformers 5 builds
``AutoModelForImageTextToText`` (checked against the meta-device models in tests/unit/test_vlm.py):

- ``vision_tower``: the image encoder (ViT / SigLIP / CLIP),
- ``projector``: what maps its features into the language model's embedding space (connector, merger),
- ``language_model``: the decoder and its output head.

``model.freeze`` names parts; LoRA's default leaves the vision tower and projector alone
(:func:`adapter_exclusion`). No torch at import; the processor helpers import transformers lazily.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError

PARTS = ("vision_tower", "projector", "language_model")
#: peft wraps the model: its parameter names start with this before the model's own
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class Family:
    """One VLM family: its model_type and the module prefixes of each part (the projector is matched
    first: Qwen's merger sits inside ``model.visual``)."""

    model_type: str
    vision_tower: tuple[str, ...]
    projector: tuple[str, ...]
    language_model: tuple[str, ...]

    def part_of(self, name: str) -> str | None:
        """The part a parameter or module name belongs to (peft's prefix removed), None for none."""
        name = name.removeprefix(PEFT_PREFIX)
        for part in ("projector", "vision_tower", "language_model"):
            if any(name == p or name.startswith(p + ".") for p in getattr(self, part)):
                return part
        return None

    def prefixes(self, parts: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        return tuple(p for part in parts for p in getattr(self, part))


_SIGLIP = (("model.vision_model",), ("model.connector",), ("model.text_model", "lm_head"))
_TOWER = (("model.vision_tower",), ("model.multi_modal_projector",), ("model.language_model", "lm_head"))
_QWEN = (("model.visual",), ("model.visual.merger",), ("model.language_model", "lm_head"))
_QWEN3 = (
    ("model.visual",),
    ("model.visual.merger", "model.visual.deepstack_merger_list"),
    ("model.language_model", "lm_head"),
)
FAMILIES: dict[str, Family] = {
    name: Family(name, *parts)
    for name, parts in (
        ("idefics3", _SIGLIP),
        ("smolvlm", _SIGLIP),
        ("llava", _TOWER),
        ("gemma3", _TOWER),
        ("qwen2_vl", _QWEN),
        ("qwen2_5_vl", _QWEN),
        ("qwen3_vl", _QWEN3),
    )
}


def in_vision_part(name: str) -> bool:
    """``name`` (a module or parameter, peft's prefix allowed) sits in a known family's vision tower or
    projector: what a search for the decoder's layers passes over (Qwen2.5-VL-7B's tower has 32 blocks, its
    decoder 28 layers)."""
    return any(family.part_of(name) in ("vision_tower", "projector") for family in FAMILIES.values())


def is_vision_config(config: Mapping[str, Any] | None) -> bool:
    """A config (config.json's keys) of a vision-language model: it has a ``vision_config``."""
    return bool(config) and config.get("vision_config") is not None


def family_of(config: Mapping[str, Any], key: str = "model.name_or_path") -> Family:
    """The known family of a VLM config; an unknown one is refused naming ``key``."""
    model_type = str(config.get("model_type", ""))
    if model_type not in FAMILIES:
        raise ConfigError(
            f"'{model_type}' is a vision-language model hydratune does not know the parts of",
            key=key,
            hint=f"use one of the families {', '.join(sorted(FAMILIES))}",
        )
    return FAMILIES[model_type]


def missing_processor_packages(model_type: str) -> list[str]:
    """The packages a VLM family's processor needs that are not installed, as transformers declares them:
    a processor with a video processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, SmolVLM) builds it with
    torchvision, which transformers' own mapping marks unavailable (its image processors fall back to PIL)."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    from transformers.utils import is_torchvision_available

    name = PROCESSOR_MAPPING_NAMES.get(model_type)
    processor = getattr(transformers, name, None) if isinstance(name, str) else None
    attributes = processor.get_attributes() if hasattr(processor, "get_attributes") else []
    return ["torchvision"] if "video_processor" in attributes and not is_torchvision_available() else []


def require_processor_packages(config: dict[str, Any], what: str, *, key: str, hint: str = "") -> None:
    """Refuse (before anything loads) a vision-language ``config`` whose processor needs a package that is not
    installed (``missing_processor_packages``), naming ``what``, ``key`` and the extra to install."""
    if not is_vision_config(config):
        return
    family = str(config.get("model_type", ""))
    missing = missing_processor_packages(family)
    if missing:
        raise ConfigError(
            f"{what} ({family}) needs {', '.join(missing)}, which is not installed: transformers builds its "
            "processor's video processor with it",
            key=key,
            hint="pip install 'hydratune[vision]' (torchvision, the release made for your torch)" + hint,
        )


def adapter_exclusion(family: Family) -> str:
    """peft's ``exclude_modules`` regex (full-matched against module names) for the vision tower and
    projector: LoRA's default adapts the language model only."""
    prefixes = "|".join(re.escape(p) for p in family.prefixes(("vision_tower", "projector")))
    return rf"(?:{prefixes})(?:\..*)?"


def check_parts(parts: list[str] | tuple[str, ...], key: str = "model.freeze") -> None:
    """Every name is a part; not all three (nothing would train)."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ConfigError(
            f"unknown part(s) {', '.join(map(str, unknown))}",
            key=key,
            hint=f"name parts among {', '.join(PARTS)}",
        )
    if set(parts) == set(PARTS):
        raise ConfigError("freezing every part trains nothing", key=key, hint="leave at least one part out")


def freeze(model: Any, family: Family, parts: list[str] | tuple[str, ...]) -> int:
    """``requires_grad=False`` on every parameter of ``parts`` (adapters inside them too); returns how many
    parameter tensors it froze. A name matching no part is left as the PEFT option set it."""
    frozen = 0
    for name, param in model.named_parameters():
        if family.part_of(name) in parts and param.requires_grad:
            param.requires_grad_(False)
            frozen += 1
    return frozen


def part_params(model: Any, family: Family) -> dict[str, tuple[int, int]]:
    """Per part: (parameters, of which trainable), tied parameters counted once."""
    out = {part: [0, 0] for part in PARTS}
    for name, param in model.named_parameters():
        part = family.part_of(name)
        if part is not None:
            out[part][0] += param.numel()
            out[part][1] += param.numel() if param.requires_grad else 0
    return {part: (total, trained) for part, (total, trained) in out.items()}


# ---- the processor --------------------------------------------------------------------------------------
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def has_processor(folder: str | Path) -> bool:
    """A local dir holding a saved processor (transformers 5 writes processor_config.json)."""
    return any((Path(folder).expanduser() / name).is_file() for name in PROCESSOR_FILES)


def load_processor(
    source: str, tokenizer: Any = None, *, revision: str | None = None, trust_remote_code: bool = False
) -> Any:
    """``AutoProcessor`` of ``source`` with ``tokenizer`` (set up for training: pad token, chat template)
    in place of the one it would load, so the processor and the run's tokenizer never differ."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(
            source, revision=revision, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"cannot load the processor of '{source}' ({err.__class__.__name__}: {err})",
            key="model.processor",
            hint="point model.processor (or model.name_or_path) at a dir holding processor_config.json",
        ) from None
    if not hasattr(processor, "image_processor"):
        raise ConfigError(
            f"'{source}' gives a {type(processor).__name__}, not an image processor",
            key="model.processor",
            hint="a vision-language model needs its processor (processor_config.json)",
        )
    if tokenizer is not None:
        processor.tokenizer = tokenizer
        if getattr(tokenizer, "chat_template", None):
            processor.chat_template = tokenizer.chat_template
    return processor


def save_processor(processor: Any, folder: Path) -> None:
    """The processor's own files into ``folder`` (beside the tokenizer the caller saved): the image
    processor's settings and the processor class, so ``AutoProcessor.from_pretrained(folder)`` loads."""
    processor.save_pretrained(folder)
