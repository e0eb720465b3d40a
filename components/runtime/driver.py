"""One loop protocol and one driver: how a run's optimizer steps are run, whatever runs them.

A recipe names its loop and hands it to ``Session.run(loop)``: ``TrainerLoop`` (``runtime/trainer_loop.py``)
(a transformers / TRL Trainer's), ``PPOLoop`` (PPO's own, ``components/rl/loop.py``) or ``StagedLoop`` (the
pipeline stages', ``components/runtime/pipeline_loop.py``). A loop implements only what is its own
(:class:`Loop`: resume, the steps, a checkpoint, an evaluation, the end); :func:`drive` owns what every loop
shares, written once: resuming from the checkpoint ``resume=`` pinned, the stop agreement after every step (a
signal on any rank: every rank stops after the same step, with a checkpoint), a checkpoint every
``train.save_every`` steps and at the last one, an evaluation every ``train.eval_every`` steps, a reward
server failing mid-run, closing the trackers, and the final save with the summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hydratune.components.config.errors import ServerError


@dataclass(frozen=True)
class StepDecision:
    """What the driver decided after a step, which the loop carries out: write a checkpoint of it, evaluate,
    stop (every rank agreed to, before the last step)."""

    save: bool = False
    evaluate: bool = False
    stop: bool = False


#: what a loop calls after each finished step: ``after_step(step)`` -> what to do now
AfterStep = Callable[[int], StepDecision]


@dataclass
class Final:
    """What a loop hands the driver to save as ``final/``: the model (whole on rank 0), the state dicts
    gathered from sharded weights (``"model"`` and each ``extra`` name; None: each module's own), and modules
    saved beside it (``final/<name>.safetensors``: PPO's value head)."""

    model: Any
    gathered: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    #: every rank generates together (tensor-parallel layers): the eval generations run on all of them
    generate_together: bool = False


class Loop(Protocol):
    """A training loop :func:`drive` runs."""

    #: the last step the run trains to (optimizer steps; PPO's iterations)
    max_steps: int
    #: the loop evaluates a held-out split every ``train.eval_every`` steps
    evaluates: bool

    def resume(self, checkpoint: str | None) -> int:
        """Restore ``checkpoint`` (None: a fresh start), and be ready to train; the last step done."""
        ...

    def train(self, done: int, after_step: AfterStep) -> dict[str, Any]:
        """Run the steps after ``done`` up to :attr:`max_steps`, calling ``after_step`` after each and doing
        what it decides (its checkpoint, evaluation, the stop); the run's metrics (``train_runtime`` ...)."""
        ...

    def last_step(self) -> int:
        """The last step that finished (what a checkpoint after a failure holds)."""
        ...

    def save(self, step: int) -> Any:
        """A checkpoint of ``step`` (a collective call)."""
        ...

    def finish(self, metrics: dict[str, Any]) -> Final:
        """After the last step (a collective call): the final evaluation, unless a signal came after the last
        step, into ``metrics``; the weights gathered for ``final/``."""
        ...


def decide(session: Any, loop: Loop, step: int) -> StepDecision:
    """After ``step``: stop if any rank was asked to (a collective call on every rank, every step); a
    checkpoint every ``train.save_every`` steps, at the last step when checkpoints are on, and before a
    stop; an evaluation every ``train.eval_every`` steps before the last (the end's own is the loop's
    ``finish``)."""
    t = session.ctx.train
    last = step >= loop.max_steps
    stop = session.interrupt.agreed() and not last  # a signal after the last step finishes final/ instead
    save = (bool(t.save_every) and (step % t.save_every == 0 or last)) or stop
    evaluate = loop.evaluates and bool(t.eval_every) and step % t.eval_every == 0 and not last and not stop
    return StepDecision(save=save, evaluate=evaluate, stop=stop)


def drive(session: Any, loop: Loop) -> dict[str, Any]:
    """Train ``loop`` from the pinned checkpoint to its last step, then save ``final/`` and the summary.

    On SIGTERM/SIGINT/SIGUSR1 (or a SLURM job's pre-emption signal, after which the launcher requeues the
    job) the current step finishes, every rank agrees, a checkpoint is written, the summary says how to
    resume and ``Interrupted`` is raised (the CLI exits 75); after the last step a signal finishes the final
    save instead. A reward server failing mid-step checkpoints the last finished step (``ServerFailed``)."""
    from hydratune.components.runtime.checkpoint import checkpoints_in
    from hydratune.components.runtime.resume import pinned
    from hydratune.components.runtime.startup import training_starts

    resume = pinned(session.ctx.cfg)  # resolved and checked before the model loaded (runtime/resume.py)
    first = loop.resume(resume)
    if resume:
        session.report["run"]["resumed from"] = resume
    stopped: list[int] = []

    def after_step(step: int) -> StepDecision:
        decision = decide(session, loop, step)
        stopped[:] = [step] if decision.stop else []
        return decision

    session.interrupt.install()  # through the final save too: a signal then finishes it
    training_starts()  # everything is built: the collector's start-up pause ends here
    try:
        try:
            metrics = loop.train(first, after_step)
        except ServerError as err:  # a server the run calls, mid-step: checkpoint the last finished step
            step = loop.last_step()
            raise session.server_failed(err, step, first, lambda: loop.save(step)) from None
        if stopped:
            saved = checkpoints_in(session.ctx.run_dir.path)
            raise session.stopped(stopped[0], str(saved[-1]) if saved else None, metrics)
        session.interrupt.finishing = True  # training is done: a signal now finishes final/
        return session.finish(loop.finish(metrics), metrics)
    finally:
        session.interrupt.uninstall()
        session.finish_trackers()
