"""The model component's vision-language side: :class:`VisionLanguage`, the part of ``CausalLM``
(components/model.py) that a config with a ``vision_config`` brings in. Its family, the knobs only a VLM
takes (``freeze``, ``processor``, ``image_tokens_per_row``) checked, its parts described for ``mode=plan``,
the image tokens the estimate counts, LoRA's exclusion, the parts frozen, its processor built. The
mechanics (families, parts, freezing, loading a processor) are vision.py's; no weight is read here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.modeling.vision import Family


class VisionLanguage:
    """What the model component does for a vision-language model (and says "not one" for a text model).
    A base of the frozen ``CausalLM`` dataclass, which provides the knobs and the two readers below."""

    # the host component's knobs and readers (CausalLM): its config.json's keys, where it loads from
    name_or_path: str
    tokenizer: str | None
    revision: str | None
    trust_remote_code: bool
    processor: str | None
    freeze: list[str]
    image_tokens_per_row: int | None
    config_dict: Callable[[], dict[str, Any]]
    source_dir: Callable[[], str]

    @property
    def vision_family(self) -> Family | None:
        """The VLM family of this model (None for a text model); an unknown VLM is refused."""
        from hydratune.components.modeling.vision import family_of, is_vision_config

        config = self.config_dict()
        return family_of(config) if is_vision_config(config) else None

    @property
    def accepts_images(self) -> bool:
        """Image rows are read for this model (``components/data/images.py``): a vision-language one."""
        return self.is_vision

    @property
    def is_vision(self) -> bool:
        from hydratune.components.modeling.vision import is_vision_config

        return is_vision_config(self.config_dict())

    def check_vision_packages(self) -> None:
        """The packages the family's processor needs (``vision.missing_processor_packages``) are installed:
        else transformers' ImportError would come once the run builds the processor."""
        from hydratune.components.modeling.vision import require_processor_packages

        require_processor_packages(
            self.config_dict(),
            str(self.name_or_path),
            key="model.name_or_path",
            hint=", or a VLM whose processor needs none (model=tiny_vlm, gemma3_4b, llava1_5_7b)",
        )

    def check_vision_knobs(self) -> None:
        """``freeze``, ``processor`` and ``image_tokens_per_row`` belong to vision-language models: refused
        for text models (naming the key), freeze's parts checked; no weight is read."""
        from hydratune.components.modeling.hub import is_local
        from hydratune.components.modeling.vision import PARTS, check_parts, has_processor

        if not isinstance(self.freeze, list | tuple):
            raise ConfigError(f"must be a list of parts, got {self.freeze!r}", key="model.freeze")
        check_parts(self.freeze)  # unknown names first: the same message for text and vision models
        given = [k for k in ("freeze", "processor") if getattr(self, k)]
        given += ["image_tokens_per_row"] if self.image_tokens_per_row is not None else []
        if given and not self.config_dict():
            raise ConfigError(
                f"model.{given[0]} needs the config of {self.name_or_path} (which parts it has), and it is "
                "neither shipped, local, cached nor reachable",
                key=f"model.{given[0]}",
                hint="use a shipped option (model=qwen2_5_vl_7b, ...), a local dir, or reach the hub",
            )
        if given and self.vision_family is None:
            raise ConfigError(
                f"{self.name_or_path} is a text model (its config has no vision_config): "
                f"model.{given[0]} applies to vision-language models only",
                key=f"model.{given[0]}",
                hint=f"drop it, or pick a vision-language model (model=tiny_vlm, model=qwen2_5_vl_7b, ...); "
                f"parts: {', '.join(PARTS)}",
            )
        if self.processor and is_local(self.processor) and not has_processor(self.processor):
            raise ConfigError(
                f"{self.processor} holds no processor (processor_config.json / preprocessor_config.json)",
                key="model.processor",
                hint="point it at a dir a processor was saved to (a VLM's export or final/), or drop it",
            )

    def estimated_image_tokens(self) -> int | None:
        """The image tokens per row the memory estimate counts: ``model.image_tokens_per_row``, else one
        image at the processor's default size; None for a text model or a family the estimate lacks."""
        if self.image_tokens_per_row is not None:
            return self.image_tokens_per_row
        if self.vision_family is None:
            return None
        from hydratune.components.memory.arch import Arch

        try:
            vision = Arch.from_dict(self.config_dict()).vision
        except (KeyError, TypeError, ValueError):
            return None
        return vision.default_image_tokens if vision is not None else None

    def describe_vision(self) -> str | None:
        """A VLM's parts for ``mode=plan`` and the summary (from its config numbers, no weights): the
        parameters of the vision tower, projector and language model, what ``freeze`` keeps frozen, the
        image tokens the estimate assumes per row; None for a text model."""
        from hydratune.components.memory.arch import Arch, param_counts

        family = self.vision_family
        if family is None:
            return None
        try:
            arch = Arch.from_dict(self.config_dict())
        except (KeyError, TypeError, ValueError) as err:
            return f"a vision-language model ({family.model_type}); its parts are not counted: {err}"
        v = arch.vision
        assert v is not None
        language = param_counts(arch).total - v.params
        tokens = self.image_tokens_per_row
        said = (
            f"{tokens} (model.image_tokens_per_row)"
            if tokens is not None
            else (
                f"{v.default_image_tokens} (one {v.image_size}-pixel image; set model.image_tokens_per_row)"
            )
        )
        return (
            f"a vision-language model ({family.model_type}): vision tower {v.tower:,} params "
            f"({v.num_layers} layers of {v.hidden_size}), projector {v.projector:,}, language model "
            f"{language:,}; frozen: {', '.join(self.freeze) or 'none'} (model.freeze); image tokens per "
            f"row for the estimate: {said}"
        )

    def adapter_exclusion(self) -> str | None:
        """peft's ``exclude_modules`` regex for a VLM (its vision tower and projector), None for text."""
        from hydratune.components.modeling.vision import adapter_exclusion

        family = self.vision_family
        return adapter_exclusion(family) if family is not None else None

    def apply_freeze(self, model: Any) -> int:
        """Freeze the parts ``freeze`` names (after PEFT, which sets what trains); returns the tensors
        frozen."""
        from hydratune.components.modeling.vision import freeze

        family = self.vision_family
        if not self.freeze or family is None:
            return 0
        return freeze(model, family, self.freeze)

    def build_processor(self, tokenizer: Any = None) -> Any:
        """A VLM's processor (its image processor + ``tokenizer``, the run's), None for a text model."""
        if not self.is_vision:
            return None
        from hydratune.components.modeling.vision import load_processor

        source = self.processor or self.tokenizer or self.source_dir()
        return load_processor(
            source, tokenizer, revision=self.revision, trust_remote_code=self.trust_remote_code
        )
