"""A data preparation killed as a process (SIGKILL mid-write) leaves nothing that a later run reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hydratune.components.data import prepared_cache
from tests.integration.test_datacache import prepare, status
from tests.support.data import multi_turn, write_jsonl

REPO = Path(__file__).resolve().parents[2]


def test_a_killed_preparation_leaves_nothing_that_is_read(tmp_path: Path) -> None:
    """SIGKILL a process while it writes the entry: nothing is in place, the lock is free, and the next
    run prepares it from scratch and succeeds."""
    data = Path(write_jsonl(tmp_path / "big.jsonl", multi_turn(6000, seed=1)))
    cache = tmp_path / "cache"
    script = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); "
        "from tests.integration.test_datacache import prepare; from pathlib import Path; "
        f"prepare(Path({str(data)!r}), Path({str(cache)!r}), num_proc=1)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(cache.rglob("work/tokens-*.arrow")):  # the rows are written, the tokens begin
            assert proc.poll() is None, "the preparation ended before it could be killed"
            assert time.monotonic() < deadline, "no shard written in time"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert prepared_cache.entries(cache) == []  # nothing was put in place
    assert list((cache / prepared_cache.STAGING).glob("*"))  # it was killed mid-write
    prepared = prepare(data, cache)
    assert status(prepared) == "miss" and len(prepared.splits["train"]) == 5400
    assert [
        p.name.split(".")[0] for p in (cache / prepared_cache.STAGING).iterdir()
    ] == []  # leftovers removed
    assert status(prepare(data, cache)) == "hit"
