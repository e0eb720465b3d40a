"""Print pip constraints pinning every dependency of pyproject.toml at its declared lower bound.

``scripts/version_legs.sh floors`` installs with them: the oldest versions hydratune says it works with,
tried. A requirement without a lower bound is left out (pip resolves it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement


def floor_pins(pyproject: Path, extras: tuple[str, ...] = ("dev",)) -> list[str]:
    """``name==lower`` for every requirement of the project and ``extras`` with a ``>=`` bound."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    pins: dict[str, str] = {}
    for text in reqs:
        req = Requirement(text)
        lows = [spec.version for spec in req.specifier if spec.operator in (">=", "==", "~=")]
        if lows:
            pins[req.name.lower()] = f"{req.name}=={lows[0]}"
    return sorted(pins.values())


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print("\n".join(floor_pins(root / "pyproject.toml")))
