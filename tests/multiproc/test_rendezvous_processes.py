"""The multi-node pieces across real processes: the run-dir check does not race between nodes, and a
collective whose peer froze fails within launcher.collective_timeout (lost peer told apart)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

from hydratune.components.distributed.rendezvous import lost_peer
from hydratune.components.launcher import free_port


def probe_often(run_dir: str, tries: int, failures: Any) -> None:
    from hydratune.components.runtime.hydra_dirs import exit_unless_writable

    for _ in range(tries):
        try:
            exit_unless_writable(Path(run_dir), "hydra.run.dir")
        except SystemExit:
            with failures.get_lock():
                failures.value += 1


def frozen_peer(rank: int, port: int, found: Any, done: Any) -> None:
    """Rank 0 all-reduces; rank 1 never joins (a frozen node) and leaves once rank 0 has given up."""
    import time

    import torch
    import torch.distributed as dist

    from hydratune.components.distributed.group import start_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    assert start_process_group("cpu", timeout_s=2)
    if rank == 0:
        began = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1))
            found.put(("answered", 0.0))
        except Exception as err:
            found.put((lost_peer(err), time.monotonic() - began))
        done.set()
    else:
        done.wait(timeout=120)
    dist.destroy_process_group()


def test_the_run_dir_check_does_not_race_between_nodes(tmp_path: Path, capsys) -> None:
    """Two nodes check one run dir at the same moment, many times: never a false 'cannot create'."""
    context = multiprocessing.get_context("fork")
    failures = context.Value("i", 0)
    procs = [context.Process(target=probe_often, args=(str(tmp_path), 1500, failures)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert failures.value == 0, capsys.readouterr().err[-2000:]


def test_a_collective_whose_peer_froze_fails_within_the_collective_timeout() -> None:
    """The gloo group hydratune makes on CPU carries ``launcher.collective_timeout``: an all-reduce whose
    peer never comes fails after it (not torch's 30 minutes) and is told apart as a lost peer."""
    context = multiprocessing.get_context("spawn")
    found, done = context.Queue(), context.Event()
    port = free_port()
    procs = [context.Process(target=frozen_peer, args=(rank, port, found, done)) for rank in (0, 1)]
    for p in procs:
        p.start()
    try:
        reason, took = found.get(timeout=180)
    finally:
        done.set()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert reason is not None and "Timed out" in reason, reason
    assert took < 10, took
