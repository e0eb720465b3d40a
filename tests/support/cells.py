"""The multi-process cells of the support matrix, each launched once per test session and read by every test
of it: ``components/commands/matrix.py``'s ``RUN_IN_TESTS`` says how each cell is launched (its overrides,
whether a second launch resumes it, whether a one-process run is its oracle) and what it shows.

A launch is the real ``hydratune`` command, forked from the tier's warm server
(:class:`tests.support.cli.Warm`: its own process group, killed with whatever it left when it ends) with
``launcher.start_method=fork``: the workers start from the warm command instead of importing torch,
transformers and DeepSpeed again (~30 s of a ~40 s launch on 2 loaded cores). How the workers start is not
what the cells' tests check; the signal, multi-node and pipeline tests start theirs the default way (spawn,
from a new interpreter).
"""

from __future__ import annotations

import functools
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hydratune.components.commands.matrix import QUIET, REWARD_MODEL, RUN_IN_TESTS, Cell, Trained
from tests.support.cli import Warm
from tests.support.runs import read_jsonl

FORK = "launcher.start_method=fork"


def name(cell: Cell) -> str:
    """``sft-zero3-lora``: the recipe, the strategy and what differs from the defaults."""
    defaults = ((cell.peft, "none"), (cell.quantization, "none"), (cell.precision, "fp32"))
    return "-".join([cell.recipe, cell.strategy, *(value for value, default in defaults if value != default)])


def command(cell: Cell, root: Path, reward_model: Path | None = None) -> list[str]:
    """The overrides of the cell's launch, as ``RUN_IN_TESTS`` gives them (no run dir, no start method):
    ``{root}`` is ``root``, ``{reward_model}`` the reward model's run dir."""
    trained = RUN_IN_TESTS[cell]
    fill = {"root": root, "reward_model": reward_model}
    return [*QUIET, *cell.overrides(), *(o.format(**fill) for o in trained.overrides)]


class LaunchFailed(AssertionError):
    pass


def check(proc: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    if proc.returncode != 0:
        raise LaunchFailed(f"{what} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc


def forked(warm: Warm, run: Path, *args: str, what: str = "") -> subprocess.CompletedProcess[str]:
    """``hydratune *args`` into the run dir ``run`` (its parent the cwd), forked from ``warm``, its workers
    forked from it (:data:`FORK`); :class:`LaunchFailed`, with the stderr, when it fails."""
    run.parent.mkdir(parents=True, exist_ok=True)
    return check(warm(*args, FORK, f"hydra.run.dir={run}", cwd=run.parent), what or str(run))


@dataclass
class CellRun:
    """One cell's launch: its run dir, what it printed; the resumed and one-process runs on first use."""

    cells: Cells
    cell: Cell
    trained: Trained
    root: Path
    args: list[str]
    run: Path
    out: str  # stdout (the workers' too)
    err: str

    @functools.cached_property
    def resumed(self) -> Path:
        """The run resumed from its ``checkpoint-<trained.resume>``, to the end (a second launch)."""
        assert self.trained.resume is not None, f"{name(self.cell)} is not resumed in RUN_IN_TESTS"
        resumed = self.root / "resumed"
        checkpoint = self.run / "checkpoints" / f"checkpoint-{self.trained.resume}"
        self.cells.launch(f"{name(self.cell)} resumed", resumed, *self.args, f"resume={checkpoint}")
        return resumed

    @functools.cached_property
    def one_process(self) -> tuple[Path, str]:
        """The one-process run of the same batches (strategy ``single``) and its stdout."""
        assert self.trained.one_process is not None, f"{name(self.cell)} has no one-process run"
        single = Cell(self.cell.recipe, "single", self.cell.peft, self.cell.quantization, self.cell.precision)
        args = [*QUIET, *single.overrides()]
        args += [o.format(root=self.root) for o in self.trained.overrides] + list(self.trained.one_process)
        run = self.root / "single"
        return run, self.cells.launch(f"{name(self.cell)} on one process", run, *args).stdout

    def config(self, key: str) -> Any:
        """A setting of the run as it ran (``train.max_steps``)."""
        return OmegaConf.select(OmegaConf.load(self.run / ".hydra" / "config.yaml"), key)


class Cells:
    """``cells[cell]``: the cell's :class:`CellRun`, launched the first time a test asks (a failed launch
    fails every test of the cell, with its stderr, without launching again). Every launch counted in
    ``launches``."""

    def __init__(self, root: Path, warm: Warm) -> None:
        self.root, self.warm = root, warm
        self.runs: dict[Cell, CellRun | LaunchFailed] = {}
        self.launches: list[str] = []

    def launch(self, what: str, run: Path, *args: str) -> subprocess.CompletedProcess[str]:
        self.launches.append(what)
        return forked(self.warm, run, *args, what=what)

    @functools.cached_property
    def reward_model(self) -> Path:
        """A reward model for the PPO cells that score with one (``{reward_model}``)."""
        run = self.root / "reward_model" / "run"
        self.launch("the reward model", run, *QUIET, *REWARD_MODEL)
        return run

    def __getitem__(self, cell: Cell) -> CellRun:
        if cell not in self.runs:
            trained = RUN_IN_TESTS[cell]
            root = self.root / name(cell)
            needs = any("{reward_model}" in o for o in trained.overrides)
            args = command(cell, root, self.reward_model if needs else None)
            try:
                run = root / "run"
                proc = self.launch(name(cell), run, *args)
                self.runs[cell] = CellRun(self, cell, trained, root, args, run, proc.stdout, proc.stderr)
            except LaunchFailed as failed:
                self.runs[cell] = failed
        got = self.runs[cell]
        if isinstance(got, LaunchFailed):
            raise got
        return got


def result(run: Path) -> dict:
    return json.loads((run / "result.json").read_text())


def records(run: Path) -> list[dict]:
    return read_jsonl(run / "metrics.jsonl")


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in records(run) if "loss" in r]
