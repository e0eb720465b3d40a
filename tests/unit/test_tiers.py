"""The fast tiers' budget (tests/support/tiers.py) judges the tests, not the machine: it scales with the
calibration measured in the same run (at its start and as the budget is judged, the slower of the two), and on
CI it fails naming the slowest tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support import tiers
from tests.support.tiers import FAST_BUDGET_S, REFERENCE_CALIBRATION_S, BudgetCheck, Tiers


def judge(spent: float, at_start: float, at_end: float, monkeypatch) -> None:
    """BudgetCheck on ``spent`` seconds of the fast tiers, the machine calibrated at ``at_start`` seconds
    before the tests and at ``at_end`` after them."""
    plugin = Tiers()
    plugin.calibrations.append(at_start)
    plugin.seconds.update({"unit-file::t": spent * 0.75, "integration-file::t": spent * 0.25})
    plugin.tier.update({"unit-file::t": "unit", "integration-file::t": "integration"})
    monkeypatch.setattr(tiers, "calibrate", lambda: at_end)
    BudgetCheck.runtest(SimpleNamespace(plugin=plugin))  # type: ignore[arg-type]


def test_a_machine_twice_as_slow_gets_twice_the_budget(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    ref, slow = REFERENCE_CALIBRATION_S, 2 * REFERENCE_CALIBRATION_S
    judge(1.5 * FAST_BUDGET_S, slow, slow, monkeypatch)  # within the slow machine's budget
    judge(1.5 * FAST_BUDGET_S, ref, slow, monkeypatch)  # slowed down during the tests: the slower calibration
    over = rf"(?s)over their budget of {FAST_BUDGET_S:.0f} s on this machine.*unit-file::t"
    with pytest.raises(AssertionError, match=over):
        judge(1.5 * FAST_BUDGET_S, ref, ref, monkeypatch)  # the same seconds at the reference speed


def test_a_faster_reading_never_shrinks_the_budget(monkeypatch) -> None:
    """The calibration read 24% faster on 2026-12-07 while the tests were not: a faster machine keeps the
    reference budget."""
    monkeypatch.setenv("CI", "true")
    fast = REFERENCE_CALIBRATION_S / 2
    judge(0.9 * FAST_BUDGET_S, fast, fast, monkeypatch)  # within FAST_BUDGET_S, not within half of it


def test_off_ci_an_overrun_is_a_skip_not_a_failure(monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    ref = REFERENCE_CALIBRATION_S
    with pytest.raises(pytest.skip.Exception, match="busy"):
        judge(2 * FAST_BUDGET_S, ref, ref, monkeypatch)
