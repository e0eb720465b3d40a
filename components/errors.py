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
