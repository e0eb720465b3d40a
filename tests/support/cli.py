"""The one way tests run the ``hydratune`` command: one environment policy, one timeout, three kinds of run.

- :class:`Warm` (the session fixture ``hydratune`` in tests/conftest.py): a server that imported the heavy
  libraries once forks a child per command. The child is its own process (exit code, output on fds 1 and 2,
  cwd, environment, ``sys.path[0]`` = its cwd as ``python -m`` sets it, module state, its own process group),
  so a test sees what a user sees, without the ~8 s of imports a new interpreter pays. For every check of a
  command's exit code, output or run dir where the process start-up is not the point.
- :func:`fresh` / :func:`start`: a new interpreter (``python -m recipes``), as a user starts it: for the tests
  whose point is the process itself (start-up imports, the thread policy torch reads as it loads, signals
  sent to a running command, the installed entry point).
- :func:`in_process`: ``recipes.cli.main`` in the test's own process (the launcher's workers still start
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
        [sys.executable, "-m", "recipes", *args],
        cwd=cwd,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


def start(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``hydratune *args`` started in a new interpreter and a session of its own (a signal to its group
    reaches it and its workers only, like Ctrl-C in a terminal); stdout and stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "recipes", *args],
        cwd=cwd,
        env=child_env({"PYTHONUNBUFFERED": "1", **(env or {})}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = TIMEOUT) -> str:
    """Wait for a :func:`start`-ed command and return its stderr; on a timeout kill its whole process group
    (workers included) before failing, so a hung run leaves nothing behind."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


def wait_for_step(cwd: Path, step: int, proc: subprocess.Popen[str], timeout: float = TIMEOUT) -> None:
    """Block until some run under ``cwd`` has logged ``step`` (the process is mid-training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for metrics in cwd.glob("outputs/*/*/metrics.jsonl"):
            lines = metrics.read_text().splitlines()
            if any(json.loads(line).get("step", 0) >= step for line in lines if line.strip()):
                return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    finish(proc, timeout=0.1)
    raise AssertionError("training never reached the step")


def in_process(*args: str) -> None:
    """``hydratune *args`` in this process (after a test composed its own configs: Hydra is reset first)."""
    from hydra.core.global_hydra import GlobalHydra

    from recipes.cli import main

    GlobalHydra.instance().clear()
    main(list(args))


def sigterm_on(hook: str) -> None:
    """Make ``hook`` (``module.attr`` or ``module.Class:attr``) send this process SIGTERM when it is called
    (a :class:`Warm` prelude: the signal lands exactly there)."""
    import importlib

    module, name = hook.rsplit(".", 1)
    owner: Any = importlib.import_module(module)
    if ":" in name:
        attr, name = name.split(":")
        owner = getattr(owner, attr)
    real = getattr(owner, name)

    def hooked(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    setattr(owner, name, hooked)


class Warm:
    """``hydratune`` commands forked from one warm server (see the module doc). One command at a time;
    :meth:`close` stops the server."""

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
        with self.lock:
            self.count += 1
            files = {k: str(self.scratch / f"{self.count}.{k}") for k in ("out", "err", "in")}
            request = {
                "args": list(args),
                "cwd": str(cwd),
                "env": child_env(env),
                "timeout": timeout,
                "input": input,
                "prelude": prelude,
                **files,
            }
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the warm hydratune server died (exit {self.proc.wait()})")
            answer = json.loads(line)
            out, err = (Path(files[k]).read_text(errors="replace") for k in ("out", "err"))
            for path in files.values():
                Path(path).unlink(missing_ok=True)
            if answer["timed_out"]:
                raise subprocess.TimeoutExpired(["hydratune", *args], timeout, out, err)
            return subprocess.CompletedProcess(["hydratune", *args], answer["rc"], out, err)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for leftover in self.scratch.iterdir():
            leftover.unlink()
        self.scratch.rmdir()


# --- the server (python -m tests.support.cli --serve) ------------------------------------------------------
def _serve() -> None:
    """Import what the commands import, then fork one child per request line (JSON) on stdin; answer
    ``{"rc", "timed_out"}`` on stdout once the child and what it left in its process group are gone."""
    import accelerate  # noqa: F401
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401

    import components.runtime.run  # noqa: F401
    import recipes.cli  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)  # never returns
        rc, timed_out = _wait(pid, request["timeout"])
        sys.stdout.write(json.dumps({"rc": rc, "timed_out": timed_out}) + "\n")
        sys.stdout.flush()


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
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # what `python -m recipes` puts first: the user's modules beside them
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["hydratune", *request["args"]]
        if request["prelude"]:
            exec(request["prelude"], {"__name__": "__prelude__"})
        from recipes.cli import main

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
