"""The one loop driver (components/runtime/driver.py) on a throwaway loop: an own-loop recipe's loop is the
``Loop`` protocol alone (resume, train calling ``after_step``, last_step, save, finish), and the driver
decides checkpoints, evaluations, the stop agreement on a signal, a failing server and the final save.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import OmegaConf

from hydratune.components.config.errors import Interrupted, ServerError
from hydratune.components.distributed.interrupt import GracefulInterrupt
from hydratune.components.runtime.driver import AfterStep, Final, drive


@dataclass
class CountingLoop:
    """A loop that counts: ``signal_at`` sends this process SIGTERM during that step, ``fail_at`` raises a
    server error in that step."""

    max_steps: int = 6
    evaluates: bool = True
    signal_at: int | None = None
    fail_at: int | None = None
    done: int = 0
    events: list[str] = field(default_factory=list)

    def resume(self, checkpoint: str | None) -> int:
        self.done = int(Path(checkpoint).name.split("-")[1]) if checkpoint else 0
        return self.done

    def train(self, done: int, after_step: AfterStep) -> dict[str, Any]:
        for step in range(done + 1, self.max_steps + 1):
            if step == self.fail_at:
                raise ServerError("the reward server answered 500")
            if step == self.signal_at:
                os.kill(os.getpid(), signal.SIGTERM)
            self.done = step
            decision = after_step(step)
            if decision.evaluate:
                self.events.append(f"evaluate {step}")
            if decision.save:
                self.save(step)
            if decision.stop:
                break
        return {"steps": self.done}

    def last_step(self) -> int:
        return self.done

    def save(self, step: int) -> str:
        self.events.append(f"save {step}")
        return f"checkpoint-{step}"

    def finish(self, metrics: dict[str, Any]) -> Final:
        self.events.append("finish")
        return Final(model="weights")


class FakeSession:
    """What the driver asks of a Session, recorded."""

    def __init__(self, tmp_path: Path, save_every: int = 2, eval_every: int = 3) -> None:
        train = OmegaConf.create({"save_every": save_every, "eval_every": eval_every})
        run_dir = SimpleNamespace(path=tmp_path)
        self.ctx = SimpleNamespace(cfg=OmegaConf.create({"resume": None}), train=train, run_dir=run_dir)
        self.report: dict[str, dict[str, Any]] = {"run": {}}
        self.interrupt = GracefulInterrupt()
        self.calls: list[str] = []

    def finish_trackers(self) -> None:
        self.calls.append("trackers closed")

    def finish(self, final: Final, metrics: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(f"final/ of {final.model}")
        return metrics

    def stopped(self, step: int, checkpoint: str | None, metrics: dict[str, Any]) -> Interrupted:
        self.calls.append(f"stopped after {step}")
        return Interrupted(self.interrupt.signum or 0, step, checkpoint)

    def server_failed(self, err: ServerError, step: int, first: int, save: Any) -> Exception:
        save()
        self.calls.append(f"server failed after {step} (first {first})")
        return RuntimeError(str(err))


def test_the_driver_decides_checkpoints_evaluations_and_the_end(tmp_path: Path) -> None:
    session, loop = FakeSession(tmp_path), CountingLoop()
    assert drive(session, loop) == {"steps": 6}
    # every 2 steps and the last; every 3 steps but the last (the end's evaluation is the loop's finish)
    assert loop.events == ["save 2", "evaluate 3", "save 4", "save 6", "finish"]
    assert session.calls == ["final/ of weights", "trackers closed"]
    assert session.interrupt.finishing and signal.getsignal(signal.SIGTERM) is not session.interrupt._handle


def test_a_signal_stops_every_loop_after_its_step_with_a_checkpoint(tmp_path: Path) -> None:
    session, loop = FakeSession(tmp_path, save_every=0), CountingLoop(signal_at=3)
    with pytest.raises(Interrupted) as stop:
        drive(session, loop)
    assert stop.value.step == 3 and stop.value.signum == signal.SIGTERM
    assert loop.events == ["save 3"]  # no checkpoints asked for, but the stop's; no step 4, no final/
    assert session.calls == ["stopped after 3", "trackers closed"]


def test_a_signal_at_the_last_step_finishes_final(tmp_path: Path) -> None:
    session, loop = FakeSession(tmp_path, save_every=0, eval_every=0), CountingLoop(signal_at=6)
    assert drive(session, loop) == {"steps": 6}
    assert loop.events == ["finish"] and session.calls == ["final/ of weights", "trackers closed"]
    assert session.interrupt.requested


def test_a_failing_server_checkpoints_the_last_finished_step(tmp_path: Path) -> None:
    session, loop = FakeSession(tmp_path, save_every=0, eval_every=0), CountingLoop(fail_at=4)
    with pytest.raises(RuntimeError, match="answered 500"):
        drive(session, loop)
    assert loop.events == ["save 3"] and session.calls == [
        "server failed after 3 (first 0)",
        "trackers closed",
    ]


def test_a_resumed_loop_continues_after_its_checkpoint(tmp_path: Path, monkeypatch) -> None:
    from hydratune.components.runtime import resume

    monkeypatch.setattr(resume, "pinned", lambda cfg: str(tmp_path / "checkpoint-4"))
    session, loop = FakeSession(tmp_path), CountingLoop()
    drive(session, loop)
    assert loop.events == ["save 6", "finish"]
    assert session.report["run"]["resumed from"] == str(tmp_path / "checkpoint-4")
