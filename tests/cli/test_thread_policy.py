"""The CPU thread policy in fresh interpreters: the command and a worker set OMP_NUM_THREADS /
OMP_WAIT_POLICY before torch is imported (torch reads them as it loads)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.data import REPO

TWO_CORES = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or shutil.which("taskset") is None, reason="needs two cores and taskset"
)


# torch reads OMP_NUM_THREADS when it loads: its thread count shows whether the policy came first. The
# command stops where it first asks for torch (the environment is then what torch would load under): what
# follows in the plan is not this test's, and skipping it saves ~4 s a probe
PROBE = """
import importlib.abc, sys
class Stop(BaseException):
    pass
class AtTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            print("stopped where torch is first asked for")
            raise Stop
sys.meta_path.insert(0, AtTorch())
from hydratune.recipes.cli import main
try:
    main(sys.argv[1:])
except (SystemExit, Stop):
    pass
import os, torch
wait = os.environ.get("OMP_WAIT_POLICY") or "spin=" + str(os.environ.get("GOMP_SPINCOUNT"))
print(os.environ.get("OMP_NUM_THREADS"), wait, torch.get_num_threads())
"""


def probe(tmp_path: Path, *args: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "HYDRATUNE_THREAD"))}
    proc = subprocess.run(
        ["taskset", "-c", "0,1", sys.executable, "-c", PROBE, *args],
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "stopped where torch is first asked for" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    return proc.stdout.split()[-3:]


@TWO_CORES
def test_the_command_sets_the_policy_before_torch_is_imported(tmp_path: Path) -> None:
    plan = ["mode=plan", "strategy=ddp", "launcher.nproc_per_node=2"]  # 2 cores ÷ 2 local processes
    threads, wait, torch_threads = probe(tmp_path, *plan)
    assert threads == torch_threads == "1" and wait in ("PASSIVE", "spin=10000")  # as the machine is now
    assert probe(tmp_path, *plan, HYDRATUNE_THREAD_POLICY="0") == [
        "None",
        "spin=None",
        "2",
    ]  # torch's default
    assert probe(tmp_path, *plan, OMP_NUM_THREADS="2") == ["2", "spin=None", "2"]
    assert probe(tmp_path, *plan, OMP_WAIT_POLICY="ACTIVE") == ["1", "ACTIVE", "1"]  # yours stands


@TWO_CORES
def test_a_worker_sets_the_policy_before_torch_is_imported(tmp_path: Path) -> None:
    """A worker started by hand (no OMP_NUM_THREADS from the command): its share from LOCAL_WORLD_SIZE."""
    code = (
        "import hydratune.recipes.worker as w\n"
        "try:\n    w.run_worker('.')  # no frozen config here: fails right after the policy\n"
        "except FileNotFoundError:\n    pass\n"
        "import os, torch; print(os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads())"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "HYDRATUNE_THREAD"))}
    proc = subprocess.run(
        ["taskset", "-c", "0,1", sys.executable, "-c", code],
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(REPO), "LOCAL_WORLD_SIZE": "2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.split()[-2:] == ["1", "1"], proc.stdout + proc.stderr[-2000:]
