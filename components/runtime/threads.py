"""CPU thread policy: one share of the cores per local process, and how a waiting OpenMP thread waits, chosen
by what the machine is doing when the command starts.

torch's default is one OpenMP thread per core that spins a while before it sleeps (libgomp's
``GOMP_SPINCOUNT`` of 300,000 rounds; ``OMP_WAIT_POLICY=ACTIVE`` spins for good). Measured on the 2-core CPU
(``bench/threads_cpu.py``, docs/benchmarks.md "OpenMP wait policy on a CPU"): on a quiet machine a step of
the demo's tiny model takes 0.63x as long with a spin as with ``PASSIVE`` (threads that sleep at once);
beside another torch process that spins, ``ACTIVE`` took 73x as long, torch's default 3.4x, a spin of
10,000 rounds 1.4x. So, unless ``OMP_NUM_THREADS`` is set: a machine quiet at launch (fewer than half its
cores running other work) gets a brief spin (``GOMP_SPINCOUNT=10000``: the quiet speed, a bounded loss if
a neighbour comes later), a busy one ``OMP_WAIT_POLICY=PASSIVE``; a wait setting of yours
(``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) stands. Set before torch is imported: the CLI once the config is
composed (``launcher.nproc_per_node``), a worker from ``LOCAL_WORLD_SIZE`` (it inherits the command's
choice). ``HYDRATUNE_THREAD_POLICY=0`` turns this off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, MutableMapping

from hydratune.components.distributed.workers import available_cores

#: the spin (rounds) of a waiting OpenMP thread on a machine quiet at launch
QUIET_SPIN = "10000"
#: why the wait was chosen, for the summary (workers inherit it with the choice)
WHY = "HYDRATUNE_THREAD_WAIT"
WAIT_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def threads_per_process(cores: int, local_processes: int) -> int:
    """An equal share of the cores for each process on this node, at least one."""
    return max(1, cores // max(1, local_processes))


def running_elsewhere(samples: int = 8, interval: float = 0.005) -> float:
    """Cores running other work right now: the runnable tasks of ``/proc/loadavg`` less this process,
    averaged over ``samples`` reads (the 1-minute load average less one where it cannot be read)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, IndexError, ValueError):
            return max(0.0, os.getloadavg()[0] - 1)
        if i + 1 < samples:
            time.sleep(interval)
    return max(0.0, sum(counts) / len(counts))


def choose_wait(cores: int, busy: Callable[[], float] = running_elsewhere) -> tuple[dict[str, str], str]:
    """(the wait setting, why): a brief spin on a machine quiet at launch, ``PASSIVE`` on a busy one."""
    others = busy()
    seen = f"{others:.1f} of {cores} cores running other work at launch"
    if others < cores / 2:
        return {"GOMP_SPINCOUNT": QUIET_SPIN}, f"a brief spin: {seen}"
    return {"OMP_WAIT_POLICY": "PASSIVE"}, f"passive: {seen}"


def apply_thread_policy(
    local_processes: int,
    environ: MutableMapping[str, str] = os.environ,
    busy: Callable[[], float] = running_elsewhere,
) -> dict[str, str]:
    """Set ``OMP_NUM_THREADS`` and the wait (``choose_wait``, unless yours is set) unless the user chose
    ``OMP_NUM_THREADS`` or turned the policy off; returns what was set (empty when nothing was)."""
    if environ.get("HYDRATUNE_THREAD_POLICY", "1") == "0" or environ.get("OMP_NUM_THREADS"):
        return {}
    cores = available_cores()
    chosen = {"OMP_NUM_THREADS": str(threads_per_process(cores, local_processes))}
    if not any(environ.get(k) for k in WAIT_KEYS):
        wait, why = choose_wait(cores, busy)
        chosen.update(wait)
        chosen[WHY] = why
    environ.update(chosen)
    return chosen


def describe_threads(threads: int, environ: MutableMapping[str, str] = os.environ) -> str:
    """The summary's ``cpu threads`` row: torch's ``threads`` and the OpenMP wait in effect (and why)."""
    set_ = [f"{k}={environ[k]}" for k in WAIT_KEYS if environ.get(k)]
    policy = ", ".join(set_) if set_ else "OMP_WAIT_POLICY unset (the OpenMP runtime's default)"
    if environ.get("HYDRATUNE_THREAD_POLICY", "1") == "0":
        return f"{threads} torch threads, {policy}; hydratune's thread policy off (HYDRATUNE_THREAD_POLICY=0)"
    why = f" ({environ[WHY]})" if environ.get(WHY) else ""
    return f"{threads} torch threads, {policy}{why}"
