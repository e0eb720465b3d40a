"""PEFT components: which parameters train. Full, freeze, BitFit, and peft's LoRA/DoRA/IA3/prefix/p-tuning.

Every option has ``validate()`` (field checks, no torch), ``check_targets(names)`` (run against the
model built on the meta device, before weights load), ``apply(model) -> model`` (the model ready to
train), ``peft_config()`` (the ``peft.PeftConfig``, or None), ``is_adapter`` (saving writes the
adapter only) and ``trainable_params(arch)`` (what it trains, for the memory estimate). Nothing here
loads weights from a hub.

``selective.py`` holds the :class:`Peft` base and the options that train the model's own parameters (full,
freeze, BitFit), ``adapters.py`` the peft library's (LoRA, DoRA, IA3, prefix, p-tuning), ``targets.py`` what
both match module names with. This package re-exports every class under the ``_target_`` paths
``conf/peft/`` and saved run dirs name (``hydratune.components.peft.LoRA``).
"""

from hydratune.components.peft.adapters import (
    IA3,
    TASK_TYPES,
    Adapter,
    DoRA,
    LoRA,
    PrefixTuning,
    PromptLearning,
    PTuning,
    TargetedAdapter,
    merge_and_unload,
)
from hydratune.components.peft.selective import BitFit, Freeze, FullFineTune, Peft
from hydratune.components.peft.targets import (
    CLASSIFIER_HEADS,
    count_layers,
    decoder_layers,
    linear_leaf_names,
    matches,
    trainable_summary,
)

__all__ = [
    "CLASSIFIER_HEADS",
    "IA3",
    "TASK_TYPES",
    "Adapter",
    "BitFit",
    "DoRA",
    "Freeze",
    "FullFineTune",
    "LoRA",
    "PTuning",
    "Peft",
    "PrefixTuning",
    "PromptLearning",
    "TargetedAdapter",
    "count_layers",
    "decoder_layers",
    "linear_leaf_names",
    "matches",
    "merge_and_unload",
    "trainable_summary",
]
