"""The memory estimate's image tokens measured on the data (issue 36): ``strategy=auto`` and ``hydratune
estimate`` read a vision-language model's train rows before choosing (components/data/images.py measures)."""

from __future__ import annotations

from typing import Any


def estimate_image_tokens(cfg: Any, limit: int = 64) -> tuple[Any, str | None]:
    """The memory estimate's image tokens from the data (``strategy=auto``, ``hydratune estimate``): for a
    vision-language model with ``model.image_tokens_per_row`` unset and train rows with images, ``cfg``
    with it set to the most image tokens the model's processor makes of one of the first ``limit`` such
    rows (the rows read and checked as training reads them, through the prepared-data cache), and the line
    that says so; else ``cfg`` as it is and None (a text model, the knob given, no image rows), or a line
    saying why nothing was measured (a tokenizer or processor not at hand offline: the estimate then
    counts one image at the processor's default size)."""
    from omegaconf import open_dict

    from hydratune.components.config.errors import ConfigError
    from hydratune.components.data.images import measured_image_tokens, with_images
    from hydratune.components.data.prepare import prepare_data
    from hydratune.components.runtime.run import _instantiate

    if cfg.model.get("image_tokens_per_row") is not None:
        return cfg, None
    model = _instantiate(cfg, "model")
    if not getattr(model, "is_vision", False):
        return cfg, None
    data = with_images(_instantiate(cfg, "data"), model)
    if not getattr(data, "images", False):
        return cfg, None
    default = model.estimated_image_tokens()
    try:
        model.check_sources()
        tokenizer = model.build_tokenizer(convert=False)
        processor = model.build_processor(tokenizer)
    except ConfigError as err:
        return cfg, f"image tokens per row: {default} (one default image), not measured: {err.args[0]}"
    splits = prepare_data(data, tokenizer, 0).splits
    counts = measured_image_tokens(processor, splits["train"], limit) if splits.has_images else []
    if not counts:
        return cfg, None
    new = cfg.copy()
    with open_dict(new):
        new.model.image_tokens_per_row = max(counts)
    line = (
        f"image tokens per row: {max(counts):,} (the most on one of the first {len(counts)} train rows with "
        f"images, measured with the processor; one default image counts {default}): the estimate counts "
        f"{max(counts):,}, model.image_tokens_per_row=N sets it"
    )
    return new, line
