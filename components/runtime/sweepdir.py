"""A sweep dir is used once: a pinned ``hydra.sweep.dir`` that holds a sweep is refused, as a run dir that
holds a run is (components/runtime/resume.py ``check_run_dir``): the second sweep's points would write over
the first's (their ``.hydra/``, metrics, checkpoints, ``final/``)."""

from __future__ import annotations

from pathlib import Path

from hydratune.components.config.errors import ConfigError

SWEEP_FILE = "multirun.yaml"  # Hydra writes it into every sweep dir it starts


def check_sweep_dir(sweep_dir: Path) -> None:
    """Refuse ``sweep_dir`` when a sweep used it: Hydra's ``multirun.yaml``, or a point's run dir in it."""
    if not sweep_dir.is_dir():
        return
    points = sorted(p.name for p in sweep_dir.iterdir() if (p / ".hydra").is_dir())
    if not points and not (sweep_dir / SWEEP_FILE).exists():
        return
    found = [SWEEP_FILE] if (sweep_dir / SWEEP_FILE).exists() else []
    if points:
        found.append(f"point run dir(s) {', '.join(points[:5])}{' …' if len(points) > 5 else ''}")
    raise ConfigError(
        f"{sweep_dir.resolve()} holds a sweep already ({'; '.join(found)}): a new sweep there would write "
        "over its points' files",
        key="hydra.sweep.dir",
        hint="choose another hydra.sweep.dir (or leave it out: every sweep gets a timestamped one); to "
        "continue that sweep's points, run the same sweep with resume=true (into a new sweep dir)",
    )
