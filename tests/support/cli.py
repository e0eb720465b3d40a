"""The one way tests run the ``hydratune`` command: one environment policy, one timeout, three kinds of run.

- :class:`Warm` (the session fixture ``hydratune`` in tests/conftest.py): a server that imported the heavy
  libraries once forks a child per command. The child is its own process (exit code, output on fds 1 and 2,
  cwd, environment, ``sys.path[0]`` = its cwd as ``python -m`` sets it, module state, its own process group),
  so a test sees what a user sees, without the ~8 s of imports a new interpreter pays. For every check of a
  command's exit code, output or run dir where the process start-up is not the point.
- :func:`fresh` / :func:`start`: a new interpreter (``python -m hydratune``), as a user starts it: for the
tests
  whose point is the process itself (start-up imports, the thread policy torch reads as it loads, signals
  sent to a running command, the installed entry point).
- :func:`in_process`: ``hydratune.recipes.cli.main`` in the test's own process (the launcher's workers still
start
  their own), for tests that patch hydratune's code before running the command.

Every command a test starts gets :func:`child_env` and at most :data:`TIMEOUT` seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: the one limit on a command run by a test (a hang fails the test instead of the CI run)
TIMEOUT = 600.0


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every command a test starts gets: the test session's, offline, one OpenMP thread
    (tests and their commands share 2 cores), no tokenizer threads, this checkout first on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "PYTEST_CURRENT_TEST")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def fresh(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``hydratune *args`` in a new interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "hydratune", *args],
        cwd=cwd,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


#: every command :func:`start` or :meth:`Warm.start` started, for :func:`kill_leftovers`
STARTED: list[Any] = []


def start(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``hydratune *args`` started in a new interpreter and a session of its own (a signal to its group
    reaches it and its workers only, like Ctrl-C in a terminal); stdout and stderr piped. Remembered:
    :func:`kill_leftovers` kills what a test left running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hydratune", *args],
        cwd=cwd,
        env=child_env({"PYTHONUNBUFFERED": "1", **(env or {})}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    STARTED.append(proc)
    return proc


def group_members(group: int) -> list[int]:
    """The processes of process group ``group`` (from /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group:  # state, ppid, pgrp, ...
                members.append(int(stat.parent.name))
    return members


def kill_running(proc: Any) -> None:
    """SIGKILL a command still running (:func:`start`'s or :meth:`Warm.start`'s) with its whole process group
    (its workers), and collect it."""
    _kill_group(proc.pid)
    proc.communicate()


def kill_leftovers() -> list[int]:
    """SIGKILL whatever the commands :func:`start` and :meth:`Warm.start` started left running: a command
    still running with its whole process group; of one that ended, the processes of its group it left
    (workers outliving their launcher). The pids killed."""
    killed = []
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:  # still our child: its pid, and so its group, is ours
            killed += [proc.pid, *(p for p in group_members(proc.pid) if p != proc.pid)]
            kill_running(proc)
            continue
        for pid in group_members(proc.pid):  # its pid may be reused; the orphans of its group are not
            if pid != proc.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
    return killed


def kill_mentioning(text: str) -> list[int]:
    """SIGKILL this user's processes whose command line contains ``text`` (a test's own temporary path):
    for what a test started outside its process groups, e.g. commands an sshd ran for it."""
    killed = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(cmdline.parent.name)
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if pid != os.getpid() and cmdline.parent.stat().st_uid == os.getuid() and text in line:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def finish(proc: subprocess.Popen[str], timeout: float = TIMEOUT) -> str:
    """Wait for a :func:`start`-ed command and return its stderr; on a timeout kill its whole process group
    (workers included) before failing, so a hung run leaves nothing behind."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


def finish_all(procs: list[subprocess.Popen[str]], timeout: float = TIMEOUT) -> list[str]:
    """:func:`finish` for several commands that run side by side, within one ``timeout`` together; every
    process group still running at the end (a failure, a timeout) is killed."""
    deadline = time.monotonic() + timeout
    try:
        return [finish(p, max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                kill_running(p)


def wait_for_step(
    where: Path,
    step: int,
    proc: subprocess.Popen[str] | list[subprocess.Popen[str]],
    timeout: float = TIMEOUT,
) -> None:
    """Block until a run has logged ``step`` (the processes are mid-training): the run dir ``where``, or
    some run under ``where/outputs``. Fails at once, with their stderr, if one of the processes ended (and
    kills the others)."""
    procs = proc if isinstance(proc, list) else [proc]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for metrics in [where / "metrics.jsonl", *where.glob("outputs/*/*/metrics.jsonl")]:
            lines = metrics.read_text().splitlines() if metrics.is_file() else []
            if any(json.loads(line).get("step", 0) >= step for line in lines if line.strip()):
                return
        if any(p.poll() is not None for p in procs):
            errs = finish_all(procs, timeout=30)
            raise AssertionError(
                f"a process ended before step {step}:\n" + "\n---\n".join(e[-2000:] for e in errs)
            )
        time.sleep(0.2)
    finish_all(procs, timeout=0.1)
    raise AssertionError(f"training never reached step {step}")


def in_process(*args: str) -> None:
    """``hydratune *args`` in this process (after a test composed its own configs: Hydra is reset first)."""
    from hydra.core.global_hydra import GlobalHydra

    from hydratune.recipes.cli import main

    GlobalHydra.instance().clear()
    main(list(args))


def sigterm_on(hook: str) -> None:
    """Make ``hook`` (``module.attr`` or ``module.Class:attr``) send this process SIGTERM when it is called
    (a :class:`Warm` prelude: the signal lands exactly there)."""
    signal_on(hook, signal.SIGTERM)


def signal_on(hook: str, signum: int) -> None:
    """Make ``hook`` (``module.attr`` or ``module.Class:attr``) send this process ``signum`` when called."""
    import importlib

    module, name = hook.rsplit(".", 1)
    owner: Any = importlib.import_module(module)
    if ":" in name:
        attr, name = name.split(":")
        owner = getattr(owner, attr)
    real = getattr(owner, name)

    def hooked(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signum)
        return real(*args, **kwargs)

    setattr(owner, name, hooked)


class Warm:
    """``hydratune`` commands forked from one warm server (see the module doc). ``Warm()`` starts it;
    ``close()`` stops it. One command at a time: ``warm(...)`` waits for it, ``warm.start(...)`` does not."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.cli", "--serve"],
            cwd=REPO,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lock = threading.Lock()
        self.scratch = Path(tempfile.mkdtemp(prefix="hydratune-warm-"))
        self.count = 0
        self.busy = False  # a command was sent and its answer not read (a test stopped while it ran)

    def __call__(
        self,
        *args: str,
        cwd: Path,
        env: dict[str, str] | None = None,
        timeout: float = TIMEOUT,
        input: str | None = None,
        prelude: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``hydratune *args`` in a forked child; ``prelude``: Python run in the child first (a hook, a
        resource limit). Raises :class:`subprocess.TimeoutExpired` past ``timeout``."""
        return self.start(*args, cwd=cwd, env=env, timeout=timeout, input=input, prelude=prelude).result()

    def start(
        self,
        *args: str,
        cwd: Path,
        env: dict[str, str] | None = None,
        timeout: float = TIMEOUT,
        input: str | None = None,
        prelude: str | None = None,
        tty: str | None = None,
    ) -> WarmProcess:
        """``hydratune *args`` in a forked child, not waited for: a handle like :func:`start`'s (``pid``, the
        command's process group; ``poll``, ``send_signal``, ``communicate``), remembered for
        :func:`kill_leftovers`. The server runs no other command until this one has ended. ``tty``: a
        terminal's device (a pseudo-terminal's slave) to be the command's stdin, stdout and stderr instead."""
        self.lock.acquire()
        try:
            self.count += 1
            files = {k: str(self.scratch / f"{self.count}.{k}") for k in ("out", "err", "in")}
            request = {
                "args": list(args),
                "cwd": str(cwd),
                "env": child_env(env),
                "timeout": timeout,
                "input": input,
                "prelude": prelude,
                "tty": tty,
                **files,
            }
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.busy = True
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the warm hydratune server died (exit {self.proc.wait()})")
        except BaseException:
            self.lock.release()
            raise
        return WarmProcess(self, request, json.loads(line)["pid"])

    def close(self) -> None:
        """Stop the server; a command still running (its test was stopped) is killed with its process group
        (workers included) first."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            if self.busy:
                self.proc.terminate()  # the server kills the command's group, then exits
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for leftover in self.scratch.iterdir():
            leftover.unlink()
        self.scratch.rmdir()


class WarmProcess:
    """A command :meth:`Warm.start` forked: what the tests use of :class:`subprocess.Popen` (``pid``,
    ``returncode``, ``poll``, ``send_signal``, ``kill``, ``communicate``). ``pid`` leads the command's own
    process group (its workers are in it); the server kills what is left of the group when it ends."""

    def __init__(self, warm: Warm, request: dict[str, Any], pid: int) -> None:
        self.warm, self.request, self.pid = warm, request, pid
        self.args = ["hydratune", *request["args"]]
        self.returncode: int | None = None
        self.answer: dict[str, Any] | None = None
        self.output: tuple[str, str] = ("", "")
        self.answered = threading.Event()  # not Thread.is_alive: a join a timeout interrupts marks it ended
        threading.Thread(target=self._read, daemon=True).start()
        STARTED.append(self)

    def _read(self) -> None:
        assert self.warm.proc.stdout is not None
        try:
            line = self.warm.proc.stdout.readline()
            self.answer = json.loads(line) if line else None
        finally:
            self.answer = self.answer or {"rc": -signal.SIGKILL, "timed_out": False}  # the server died
            self.answered.set()

    def poll(self) -> int | None:
        if self.returncode is None and self.answered.is_set():
            self._finish()
        return self.returncode

    def _finish(self) -> None:
        assert self.answer is not None
        paths = [Path(self.request[k]) for k in ("out", "err")]
        out, err = (p.read_text(errors="replace") if p.is_file() else "" for p in paths)
        for path in [*paths, Path(self.request["in"])]:
            path.unlink(missing_ok=True)
        self.output, self.returncode = (out, err), self.answer["rc"]
        self.warm.busy = False
        self.warm.lock.release()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the command (:class:`subprocess.TimeoutExpired` past ``timeout``); its stdout, stderr."""
        self.answered.wait(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.output

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def result(self) -> subprocess.CompletedProcess[str]:
        out, err = self.communicate()
        assert self.answer is not None
        if self.answer["timed_out"]:
            raise subprocess.TimeoutExpired(self.args, self.request["timeout"], out, err)
        return subprocess.CompletedProcess(self.args, self.answer["rc"], out, err)


# --- the server (python -m tests.support.cli --serve) ------------------------------------------------------
def _serve() -> None:
    """Import what the commands import, then fork one child per request line (JSON) on stdin; answer
    ``{"rc", "timed_out"}`` on stdout once the child and what it left in its process group are gone."""
    import importlib

    import accelerate  # noqa: F401
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401

    import hydratune.components.runtime.run
    import hydratune.recipes
    import hydratune.recipes.cli

    # and what every training command (and each rank of a launch it forks) imported itself, ~1.4 of a tiny
    # SFT run's 2.9 s in a forked command (measured): the trainers the recipes use (TRL's trainer base
    # imports wandb), DeepSpeed (accelerate's unwrapping imports it where it is installed; mlflow with it),
    # every component and recipe module (register_all: the command registers them again, idempotent) and the
    # tiny model's modeling code
    hydratune.recipes.register_all()
    for module in (
        "deepspeed",
        "hydratune.components.runtime.session",
        "transformers.models.llama.modeling_llama",
        *(f"trl.trainer.{name}_trainer" for name in ("sft", "dpo", "kto", "reward", "grpo")),
    ):
        importlib.import_module(module)

    protocol = sys.stdout
    running: list[int] = []

    def stop(signum: int, frame: Any) -> None:  # Warm.close() while a command runs: kill it, then exit
        for pid in running:
            _kill_group(pid)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    for line in sys.stdin:
        request = json.loads(line)
        protocol.flush()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _child(request)  # never returns
        with contextlib.suppress(OSError):  # the child does it too: whichever runs first
            os.setpgid(pid, pid)
        running[:] = [pid]
        protocol.write(json.dumps({"pid": pid}) + "\n")
        protocol.flush()
        rc, timed_out = _wait(pid, request["timeout"])
        running.clear()
        protocol.write(json.dumps({"rc": rc, "timed_out": timed_out}) + "\n")
        protocol.flush()


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _kill_group(pid)  # what the command left running in its group
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            _kill_group(pid)
            os.waitpid(pid, 0)
            return -signal.SIGKILL, True
        time.sleep(0.02)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the command (own process group, cwd, environment, argv, fds), run it."""
    code = 1
    try:
        os.setpgid(0, 0)
        stdin = os.open(os.devnull, os.O_RDONLY)
        if request["input"] is not None:
            Path(request["in"]).write_text(request["input"])
            stdin = os.open(request["in"], os.O_RDONLY)
        os.dup2(stdin, 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        if request.get("tty"):  # a terminal the test holds the other end of: the command's 0, 1 and 2
            terminal = os.open(request["tty"], os.O_RDWR | os.O_NOCTTY)
            for fd in (0, 1, 2):
                os.dup2(terminal, fd)
            os.close(terminal)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # what `python -m hydratune` puts first: the user's modules beside them
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["hydratune", *request["args"]]
        if request["prelude"]:
            exec(request["prelude"], {"__name__": "__prelude__"})
        from hydratune.recipes.cli import main

        try:
            main(list(request["args"]))
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
    except BaseException:  # reported as the command's failure, as an uncaught exception would be
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        import atexit

        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # what an interpreter runs at exit (logging's flush, trackers' close)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
