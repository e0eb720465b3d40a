"""Start-up of the command line and of every worker: process-wide defaults (:func:`process_defaults`), and
no full sweeps of the garbage collector.

Importing torch, transformers, TRL and datasets creates millions of long-lived objects, and each automatic
full collection on the way re-scans all of them: seven such sweeps of about 0.2 s each before the tiny
default's first step on a 2-core CPU, plus the one the HF Trainer runs as training starts
(``accelerator.free_memory``). So the command line pauses the collector while it imports and builds
(:func:`pause_gc`); when training starts it collects once, moves every survivor into the permanent
generation and turns the collector back on (:func:`training_starts`), so later collections scan only what
training allocates; when the run ends the survivors are handed back (:func:`run_ends`), so the models and
trainers of a finished run are collectable again (a sweep runs several jobs in one process). Reference
counting frees memory as usual throughout: only reference cycles wait. ``HYDRATUNE_PAUSE_GC=0`` in the
environment turns all of this off.
"""

from __future__ import annotations

import gc
import logging
import os

_state = "normal"  # normal | paused (collector off) | frozen (start-up objects in the permanent generation)


def process_defaults() -> None:
    """Set for the whole process, by the CLI as it is imported and by each worker as it starts: no
    tokenizers fork warnings (``TOKENIZERS_PARALLELISM=false`` unless set), and no FutureWarnings (library
    deprecation chatter, not the user's concern)."""
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=FutureWarning)
    quiet_third_party()


#: lines other libraries log that tell a hydratune user nothing: ``{logger name: the message's start}``.
#: bitsandbytes (imported by transformers, PEFT, TRL wherever it is installed), on a CPU with AVX-512 bf16,
#: without the optional ``kernels`` package, which hydratune neither needs nor installs; DeepSpeed (imported
#: by accelerate and TRL) on a host without a GPU, which plan's and the summary's device line already say
#: (and every GPU strategy refuses before load).
QUIET_LINES: dict[str, str] = {
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community: No module "
    "named 'kernels'",
    "DeepSpeed": "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect",
}


class DropLine(logging.Filter):
    """Drops one logger's records that start with ``start`` (the formatted message); every other passes."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


def quiet_third_party() -> None:
    """Each line of :data:`QUIET_LINES` dropped at its logger (set before the library imports: the logger is
    the same object then); everything else those loggers say still shows. Idempotent."""
    for name, start in QUIET_LINES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropLine) and f.start == start for f in logger.filters):
            logger.addFilter(DropLine(start))


def pause_gc() -> None:
    """Turn automatic collection off until training starts (the CLI and each worker call this first)."""
    global _state
    if os.environ.get("HYDRATUNE_PAUSE_GC", "1") == "0":
        return
    if _state == "normal" and gc.isenabled():
        gc.disable()
        _state = "paused"


def training_starts() -> None:
    """After :func:`pause_gc`: collect once, freeze the survivors, turn collection back on. Otherwise (a
    recipe run from a notebook or a test, or the second job of a sweep) nothing."""
    global _state
    if _state == "paused":
        gc.collect()
        gc.freeze()
        gc.enable()
        _state = "frozen"


def run_ends() -> None:
    """Undo both: collection on, frozen objects back in the collectable generations. Idempotent."""
    global _state
    if _state == "frozen":
        gc.unfreeze()
    elif _state == "paused":
        gc.enable()
    _state = "normal"
