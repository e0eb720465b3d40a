"""The one exception type users see: a bad config, file or combination, reported before training."""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration problem the user must fix.

    ``key`` names the config key (``optimizer.lr``) or file at fault; ``hint`` says what to change.
    The CLI prints these as one paragraph and exits with code 2, without a traceback.
    """

    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None) -> None:
        self.key = key
        self.hint = hint
        super().__init__(message)

    def __str__(self) -> str:
        text = super().__str__()
        if self.key:
            text = f"[{self.key}] {text}"
        if self.hint:
            text = f"{text}\n  fix: {self.hint}"
        return text


#: exit code of a run stopped by a signal after checkpointing (EX_TEMPFAIL: "try again" — resume it)
EXIT_INTERRUPTED = 75


class Interrupted(Exception):
    """Raised after an interrupted run has checkpointed; the CLI exits with ``EXIT_INTERRUPTED``."""

    def __init__(self, signum: int, step: int, checkpoint: str | None) -> None:
        import signal

        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} at step {step}; checkpoint: {checkpoint or 'none'}")
