"""The multi-process tier's shared things: the session's warm server for the commands whose start-up is not
the point (:class:`tests.support.cli.Warm`), the support matrix's multi-process cells, each launched once
per session (:class:`tests.support.cells.Cells`), and no process left behind by any test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cells import Cells
from tests.support.cli import Warm, kill_leftovers


@pytest.fixture(scope="session")
def warm(hydratune: Warm) -> Warm:
    """The session's one warm server (tests/conftest.py's ``hydratune``), under the name this tier's helpers
    take it by."""
    return hydratune


@pytest.fixture(scope="session")
def cells(warm: Warm, tmp_path_factory: pytest.TempPathFactory) -> Cells:
    return Cells(tmp_path_factory.mktemp("cells"), warm)


@pytest.fixture(autouse=True)
def nothing_left_running() -> Iterator[None]:
    """After every test, pass or fail: the process groups it started (``tests.support.cli.start``) are
    killed, workers included."""
    yield
    if killed := kill_leftovers():
        print(f"killed {len(killed)} process(es) the test left running: {killed}")
