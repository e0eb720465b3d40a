"""What hydratune uses of ``trl.experimental`` (ORPO, CPO/SimPO), pinned.

TRL says anything under ``trl.experimental`` may change or go in any release without deprecation. The
recipes that train on it import it through :func:`experimental` (no warning at every run: the pin is the
warning), and ``tests/unit/test_unpaired_reference_free.py`` fails loudly when the installed TRL no longer has
a class, a method with the parameters listed here, or a config field the recipes set; the same file checks
the losses themselves against the papers' formulas on a hand-computed batch.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: module -> class -> method -> its parameters after ``self`` (the loss and the batch metrics we rely on)
METHODS: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {
    "trl.experimental.orpo": {
        "ORPOTrainer": {
            "odds_ratio_loss": ("policy_chosen_logps", "policy_rejected_logps"),
            "concatenated_forward": ("model", "batch"),
            "get_batch_loss_metrics": ("model", "batch", "train_eval"),
        },
    },
    "trl.experimental.cpo": {
        "CPOTrainer": {
            "cpo_loss": ("policy_chosen_logps", "policy_rejected_logps"),
            "concatenated_forward": ("model", "batch"),
            "get_batch_loss_metrics": ("model", "batch", "train_eval"),
        },
    },
}
#: module -> config class -> the fields the recipes set
FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "trl.experimental.orpo": {"ORPOConfig": ("beta", "max_length")},
    "trl.experimental.cpo": {
        "CPOConfig": (
            "beta",
            "loss_type",
            "cpo_alpha",
            "simpo_gamma",
            "alpha",
            "label_smoothing",
            "max_length",
        )
    },
}


def experimental(module: str, *names: str) -> tuple[Any, ...]:
    """``names`` from ``trl.experimental.<module>``, imported without TRL's experimental-API warning."""
    from trl.import_utils import TRLExperimentalWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TRLExperimentalWarning)
        loaded = importlib.import_module(f"trl.experimental.{module}")
    return tuple(getattr(loaded, name) for name in names)
