"""The fast tiers' budget (tests/support/tiers.py) judges the tests, not the machine: it scales with the
calibration measured in the same run, and on CI it fails naming the slowest tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.tiers import FAST_BUDGET_S, REFERENCE_CALIBRATION_S, BudgetCheck, Tiers


def plugin(spent: float, calibration: float | None) -> Tiers:
    tiers = Tiers()
    tiers.calibration = calibration
    tiers.seconds.update({"unit-file::t": spent * 0.75, "integration-file::t": spent * 0.25})
    tiers.tier.update({"unit-file::t": "unit", "integration-file::t": "integration"})
    return tiers


def judge(spent: float, calibration: float | None) -> None:
    BudgetCheck.runtest(SimpleNamespace(plugin=plugin(spent, calibration)))  # type: ignore[arg-type]


def test_a_machine_twice_as_slow_gets_twice_the_budget(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    slow = 2 * REFERENCE_CALIBRATION_S
    assert plugin(0, slow).budget() == pytest.approx(2 * FAST_BUDGET_S)
    judge(1.5 * FAST_BUDGET_S, slow)  # within the slow machine's budget
    with pytest.raises(AssertionError, match=r"(?s)over their budget of .* on this machine.*unit-file::t"):
        judge(1.5 * FAST_BUDGET_S, REFERENCE_CALIBRATION_S)  # the same seconds at the reference speed


def test_off_ci_an_overrun_is_a_skip_not_a_failure(monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="busy"):
        judge(2 * FAST_BUDGET_S, REFERENCE_CALIBRATION_S)
