"""A worker whose launcher was SIGKILLed gets the kernel's parent-death SIGINT once per thread of the dying
launcher, and ``getppid()`` still names the launcher until its last thread is gone: every one after the
first is that death again, not a second Ctrl-C, so the worker writes the checkpoint it announced instead of
killing itself in the middle of it (``components/distributed/interrupt.py``). Measured with a launcher of 9
threads SIGKILLed (its child's handler recording): SIGINT delivered twice, the first while ``getppid()`` was
still the launcher, its main thread a zombie ('Z')."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from hydratune.components.distributed import interrupt


@pytest.fixture
def zombie() -> Iterator[int]:
    """A child process that has exited and is not reaped yet (how a dying launcher's main thread looks)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited; left a zombie until reaped below
    yield pid
    os.waitpid(pid, 0)


def test_a_zombie_is_exiting_and_a_live_process_is_not(zombie: int) -> None:
    assert interrupt.exiting(zombie)
    assert not interrupt.exiting(os.getpid())


def second_sigint(monkeypatch, launcher: int) -> list[int]:
    """A worker whose first SIGINT started its checkpoint gets another while ``getppid()`` still names
    ``launcher``: the signals it then sends itself (none: it goes on checkpointing)."""
    killed: list[int] = []
    monkeypatch.setattr(interrupt, "_launcher", [launcher])
    monkeypatch.setattr(interrupt.os, "getppid", lambda: launcher)
    monkeypatch.setattr(interrupt.os, "kill", lambda pid, signum: killed.append(signum))
    monkeypatch.setattr(interrupt.signal, "signal", lambda signum, handler: None)
    handler = interrupt.GracefulInterrupt()
    handler.signum = signal.SIGINT  # the first parent-death SIGINT: stop after this step, with a checkpoint
    handler._handle(signal.SIGINT, None)
    return killed


def test_the_dying_launchers_next_sigint_does_not_kill_the_checkpointing_worker(monkeypatch, zombie) -> None:
    assert second_sigint(monkeypatch, zombie) == []


def test_a_second_ctrl_c_with_the_launcher_alive_still_stops_at_once(monkeypatch) -> None:
    assert second_sigint(monkeypatch, os.getpid()) == [signal.SIGINT]  # a live "launcher": this process
