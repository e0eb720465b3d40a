"""The CPU thread policy (components/runtime/threads.py): the share of cores, and the environment set before
torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydratune.components.runtime.threads import apply_thread_policy, threads_per_process

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("cores", "processes", "threads"), [(2, 1, 2), (16, 4, 4), (16, 3, 5), (2, 4, 1), (8, 0, 8)]
)
def test_each_local_process_gets_an_equal_share_of_the_cores(
    cores: int, processes: int, threads: int
) -> None:
    assert threads_per_process(cores, processes) == threads


def test_the_policy_sets_the_environment_unless_told_otherwise(monkeypatch) -> None:
    """A quiet machine at launch: a brief spin; a busy one (half its cores or more running other work):
    passive waits; a wait setting, thread count or off switch of the user's stands."""
    from hydratune.components.runtime.threads import QUIET_SPIN, WHY

    monkeypatch.setattr("hydratune.components.runtime.threads.available_cores", lambda: 8)
    env: dict[str, str] = {}
    chosen = apply_thread_policy(2, env, busy=lambda: 1.5)
    assert chosen == env and env["OMP_NUM_THREADS"] == "4" and env["GOMP_SPINCOUNT"] == QUIET_SPIN
    assert (
        "OMP_WAIT_POLICY" not in env
        and env[WHY] == "a brief spin: 1.5 of 8 cores running other work at launch"
    )
    env = {}
    apply_thread_policy(1, env, busy=lambda: 4.0)
    assert (
        env["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in env and env["OMP_NUM_THREADS"] == "8"
    )
    assert env[WHY].startswith("passive: 4.0 of 8 cores")
    assert apply_thread_policy(1, {"OMP_NUM_THREADS": "3"}) == {}  # the user's choice stands
    assert apply_thread_policy(1, {"HYDRATUNE_THREAD_POLICY": "0"}) == {}  # turned off
    for yours in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "0"}):
        env = dict(yours)
        assert apply_thread_policy(1, env, busy=lambda: 0.0) == {"OMP_NUM_THREADS": "8"} and env == {
            **yours,
            "OMP_NUM_THREADS": "8",
        }


def test_running_elsewhere_counts_other_runnable_tasks() -> None:
    """On this machine, right now: a number of cores, this process left out (a busy loop beside it counts)."""
    import subprocess
    import sys

    from hydratune.components.runtime.threads import running_elsewhere

    quiet = running_elsewhere()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        busy = running_elsewhere(samples=20)
    finally:
        spinner.kill()
    assert quiet >= 0.0 and busy >= 0.8, (quiet, busy)  # the busy loop is runnable in every read


def test_the_summary_row_names_the_threads_and_the_wait_policy() -> None:
    from hydratune.components.runtime.threads import WHY, describe_threads

    assert describe_threads(2, {"OMP_WAIT_POLICY": "PASSIVE"}) == "2 torch threads, OMP_WAIT_POLICY=PASSIVE"
    assert describe_threads(2, {"GOMP_SPINCOUNT": "10000", WHY: "a brief spin: 0.2 of 2 cores"}) == (
        "2 torch threads, GOMP_SPINCOUNT=10000 (a brief spin: 0.2 of 2 cores)"
    )
    assert "the OpenMP runtime's default" in describe_threads(4, {})
    assert "policy off" in describe_threads(1, {"HYDRATUNE_THREAD_POLICY": "0", "OMP_WAIT_POLICY": "ACTIVE"})
