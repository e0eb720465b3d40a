"""Tools the tests name (``recipe.tools=[tests.support.tools.add]``): a good one and one of each fault."""

from __future__ import annotations

import threading

RELEASE = threading.Event()  # ``hang`` waits for it (the test sets it once the timeout has been reported)


def add(a: int, b: int) -> str:
    """Add two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return str(a + b)


def scaled(a: int, factor: int = 1) -> str:
    """A number times a factor (bound by the config, hidden from the model).

    Args:
        a: the number
        factor: the factor
    """
    return str(a * factor)


def boom(a: int) -> str:
    """Always raises.

    Args:
        a: a number
    """
    raise ZeroDivisionError(f"cannot divide {a} by zero")


def number(a: int) -> int:  # type: ignore[return-value]
    """Returns an int, not a string.

    Args:
        a: a number
    """
    return a


def hang(a: int) -> str:
    """Waits until the test releases it.

    Args:
        a: a number
    """
    RELEASE.wait(60)
    return "late"


def undocumented(a: int) -> str:
    return str(a)


class Counter:
    """A counter the model steps; its reward is the count. ``episodes`` counts the resets this instance had:
    1 in every episode when each rollout gets a fresh instance."""

    def __init__(self, start: int = 0) -> None:
        self.start, self.count, self.episodes = start, start, 0

    def reset(self, **row) -> None:
        self.count = self.start
        self.episodes += 1

    def step(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: how much to add
        """
        self.count += by
        return f"{self.count} (episode {self.episodes})"

    def get_reward(self) -> float:
        return float(self.count)


class NoReset:
    def step(self, by: int) -> str:
        """Step.

        Args:
            by: how much
        """
        return str(by)


class Fixed:
    def reset(self, prompt: list) -> None:  # takes the prompt only: a row's answer column has nowhere to go
        pass

    def step(self, by) -> str:  # no type hint, no docstring: the model could not be told how to call it
        return str(by)
