"""The one exception type users see: a bad config, file or combination, reported before training."""

from __future__ import annotations

from typing import Any


class ConfigError(Exception):
    """A configuration problem the user must fix.

    ``key`` names the config key (``optimizer.lr``) or file at fault; ``hint`` says what to change.
    The CLI prints these as one paragraph and exits with code 2, without a traceback.
    """

    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None) -> None:
        self.key = key
        self.hint = hint
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return rebuilt_error(self)

    def __str__(self) -> str:
        text = super().__str__()
        if self.key:
            text = f"[{self.key}] {text}"
        if self.hint:
            text = f"{text}\n  fix: {self.hint}"
        return text


def rebuilt_error(err: Exception) -> tuple[Any, ...]:
    """``__reduce__`` of an error whose ``__init__`` takes other arguments than its message: unpickled (a
    SLURM job's outcome, sent back through submitit) from its message and attributes, without ``__init__``."""
    return (_unpickled, (type(err), err.args), err.__dict__)


def _unpickled(cls: type[Exception], args: tuple[Any, ...]) -> Exception:
    err = Exception.__new__(cls)
    err.args = args
    return err


def print_error(err: ConfigError) -> None:
    """``err`` as one paragraph on stderr, no traceback (the CLI and every worker of a launched job)."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False).print(
        f"[bold red]hydratune: error:[/] {escape(str(err))}", soft_wrap=True
    )


#: exit code of a run stopped by a signal after checkpointing (EX_TEMPFAIL: "try again" — resume it)
EXIT_INTERRUPTED = 75
#: exit code of a rank (and its launcher) that stopped because another node went away mid-run
#: (EX_UNAVAILABLE: resume from the last whole checkpoint once every node is back)
EXIT_NODE_LOST = 69
#: exit code of a run stopped mid-run, after checkpointing, because a server it calls (``recipe.reward_url``)
#: failed or answered outside its contract (EX_PROTOCOL: a remote error): resume once the server answers
EXIT_SERVER_FAILED = 76


class ServerError(RuntimeError):
    """A server the run calls (the reward server) did not answer, or answered outside its contract. ``key``:
    the knob that names it."""

    key: str = "recipe.reward_url"


class ServerFailed(Exception):
    """Raised after a run whose server failed mid-run has checkpointed; the CLI exits with
    ``EXIT_SERVER_FAILED`` and says how to resume."""

    def __init__(self, reason: str, step: int, checkpoint: str | None) -> None:
        self.step, self.checkpoint = step, checkpoint
        super().__init__(f"{reason}; stopped after step {step}, checkpoint: {checkpoint or 'none'}")

    def __reduce__(self) -> tuple[Any, ...]:
        return rebuilt_error(self)


class Interrupted(Exception):
    """Raised after an interrupted run has checkpointed; the CLI exits with ``EXIT_INTERRUPTED``."""

    def __init__(self, signum: int, step: int, checkpoint: str | None) -> None:
        import signal

        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.requeued: Any = (
            None  # what the launcher did after the checkpoint (SLURM: distributed.slurm.Requeue)
        )
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} at step {step}; checkpoint: {checkpoint or 'none'}")

    def __reduce__(self) -> tuple[Any, ...]:
        return rebuilt_error(self)


class Diverged(ConfigError):
    """Training produced a non-finite loss; raised at the log step that shows it, before the next save."""

    def __init__(self, step: int, loss: float, last_finite_step: int | None, lr: float, clip: float) -> None:
        since = (
            f"the last finite loss was logged at step {last_finite_step}"
            if last_finite_step
            else "no finite loss was logged before"
        )
        fixes = [f"lower optimizer.lr (it is {lr:g})"]
        if not clip:
            fixes.append("clip gradients with train.max_grad_norm=1.0")
        fixes += ["prefer precision=bf16 over fp16", "then resume=true from the last checkpoint"]
        super().__init__(
            f"training diverged: the loss logged at step {step} is {loss} ({since}); stopped before saving",
            key="optimizer.lr",
            hint="; ".join(fixes) + " (train.skip_nonfinite_loss=true skips single bad steps instead)",
        )
        self.step = step


def yaml_error(err: Exception, path: object = None) -> ConfigError:
    """A YAML syntax error (``yaml.MarkedYAMLError``) as a ConfigError naming the file and the line."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = str(path or getattr(mark, "name", "") or "a config file")
    line = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return ConfigError(
        f"malformed YAML in {where}{line}: {f'{context}: ' if context else ''}{problem}",
        key=where,
        hint="fix the YAML there (quote values holding ':', '[' or '{'; indent with spaces)",
    )
