"""Graceful interruption: SIGTERM / SIGINT / SIGUSR1 (SLURM pre-emption) finish the current step,
write a checkpoint and stop; a second signal exits at once."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Any

from transformers import TrainerCallback

SIGNALS = tuple(s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None)


class GracefulInterrupt(TrainerCallback):
    """Turns the first signal into 'save and stop after this step'; the second one kills."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> GracefulInterrupt:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # second signal: no more grace
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        name = signal.Signals(signum).name
        print(
            f"\nhydratune: {name} received: finishing this step and writing a checkpoint "
            f"(send {name} again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.requested:
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.uninstall()
