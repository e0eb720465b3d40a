"""Reward functions the tests name on the command line (``recipe.reward._target_=tests.support.rewards.<f>``,
``recipe.reward_funcs=[tests.support.rewards.<f>]``)."""

from __future__ import annotations

import os
import signal

from hydratune.components.rewards import text_of

CALLS = {"n": 0}  # brevity_then_sigterm's count (a test resets it)


def brevity(prompts: list, completions: list, **_) -> list[float]:
    """Shorter completions score higher (0 for an empty one, -1 for 20+ characters).

    A random-init model cannot do sums, so exact match gives PPO nothing to climb; what it *can* learn
    within a few dozen iterations is to stop early (one token, EOS, at the first position). The reward
    is dense (every character counts), so the improvement shows without any SFT first. Text or chat
    messages (GRPO) both work."""
    return [-min(len(text_of(c)), 20) / 20 for c in completions]


def brevity_then_sigterm(prompts: list, completions: list, **columns) -> list[float]:
    """``brevity``, and a SIGTERM to this process on the second call: iteration 2 is the last one."""
    CALLS["n"] += 1
    if CALLS["n"] == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    return brevity(prompts, completions)


def constant(prompts: list, completions: list, **_) -> list[float]:
    """1.0 for every completion (what a value baseline absorbs)."""
    return [1.0] * len(completions)


def by_keyword(completions: list, answer: list, **_) -> list[float]:
    """1.0 where the answer is in the completion: no ``prompts`` parameter (the recipes call by keyword)."""
    return [float(str(a) in text_of(c)) for c, a in zip(completions, answer, strict=True)]


def misnamed(answer: list, completion: list) -> list[float]:
    """A function no recipe can call as a reward (no ``completions`` parameter)."""
    return [0.0 for _ in completion]
