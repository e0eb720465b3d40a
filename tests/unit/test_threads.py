"""The CPU thread policy (components/runtime/threads.py): the share of cores, and the environment set before
torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.runtime.threads import apply_thread_policy, threads_per_process

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("cores", "processes", "threads"), [(2, 1, 2), (16, 4, 4), (16, 3, 5), (2, 4, 1), (8, 0, 8)]
)
def test_each_local_process_gets_an_equal_share_of_the_cores(
    cores: int, processes: int, threads: int
) -> None:
    assert threads_per_process(cores, processes) == threads


def test_the_policy_sets_the_environment_unless_told_otherwise(monkeypatch) -> None:
    monkeypatch.setattr("components.runtime.threads.available_cores", lambda: 8)
    env: dict[str, str] = {}
    assert apply_thread_policy(2, env) == {"OMP_NUM_THREADS": "4", "OMP_WAIT_POLICY": "PASSIVE"} == env
    assert apply_thread_policy(1, {"OMP_NUM_THREADS": "3"}) == {}  # the user's choice stands
    assert apply_thread_policy(1, {"HYDRATUNE_THREAD_POLICY": "0"}) == {}  # turned off
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert apply_thread_policy(1, env)["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_summary_row_names_the_threads_and_the_wait_policy() -> None:
    from components.runtime.threads import describe_threads

    assert describe_threads(2, {"OMP_WAIT_POLICY": "PASSIVE"}) == "2 torch threads, OMP_WAIT_POLICY=PASSIVE"
    assert "the OpenMP runtime's default" in describe_threads(4, {})
    assert "policy off" in describe_threads(1, {"HYDRATUNE_THREAD_POLICY": "0", "OMP_WAIT_POLICY": "ACTIVE"})
