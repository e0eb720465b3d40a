"""CPU thread policy: OpenMP threads that wait passively, one share of the cores per local process.

torch's default is one OpenMP thread per core, spinning while it waits (``OMP_WAIT_POLICY=ACTIVE`` in
effect): with anything else on the cores (another process, the launcher's other ranks) the spinning threads
collapse training. Unless ``OMP_NUM_THREADS`` is set, the command sets ``OMP_WAIT_POLICY=PASSIVE`` and
(cores available to the process ÷ local processes) threads, before torch is imported: the CLI once the
config is composed (``launcher.nproc_per_node``), a worker from ``LOCAL_WORLD_SIZE``. Environment variables
are read when torch loads its OpenMP runtime, so later changes would not count. ``HYDRATUNE_THREAD_POLICY=0``
turns this off.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from components.distributed.workers import available_cores


def threads_per_process(cores: int, local_processes: int) -> int:
    """An equal share of the cores for each process on this node, at least one."""
    return max(1, cores // max(1, local_processes))


def apply_thread_policy(
    local_processes: int, environ: MutableMapping[str, str] = os.environ
) -> dict[str, str]:
    """Set ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` unless the user chose ``OMP_NUM_THREADS`` or turned
    the policy off; returns what was set (empty when nothing was)."""
    if environ.get("HYDRATUNE_THREAD_POLICY", "1") == "0" or environ.get("OMP_NUM_THREADS"):
        return {}
    threads = threads_per_process(available_cores(), local_processes)
    chosen = {"OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    environ.update(chosen)
    return chosen


def describe_threads(threads: int, environ: MutableMapping[str, str] = os.environ) -> str:
    """The summary's ``cpu threads`` row: torch's ``threads`` and the OpenMP wait policy in effect."""
    wait = environ.get("OMP_WAIT_POLICY")
    policy = f"OMP_WAIT_POLICY={wait}" if wait else "OMP_WAIT_POLICY unset (the OpenMP runtime's default)"
    if environ.get("HYDRATUNE_THREAD_POLICY", "1") == "0":
        return f"{threads} torch threads, {policy}; hydratune's thread policy off (HYDRATUNE_THREAD_POLICY=0)"
    return f"{threads} torch threads, {policy}"
