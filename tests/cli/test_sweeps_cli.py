"""Sweeps and shared recipes through the command: `hydratune report` of a two-point sweep, `hydratune ls`,
and a recipe file of one's own from any path."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import group_options
from tests.integration.test_tracking import SHORT


def test_report_of_a_two_point_sweep(hydratune, tmp_path: Path) -> None:
    proc = hydratune("-m", "optimizer.lr=1e-3,3e-3", *SHORT, "data.max_samples=64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (sweep,) = tmp_path.glob("multirun/*/*")
    report = hydratune("report", str(sweep), cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    rows = [line for line in report.stdout.splitlines() if line.startswith("| ") and "optimizer.lr=" in line]
    assert len(rows) == 2
    assert "optimizer.lr=0.001" in rows[0] and "optimizer.lr=0.003" in rows[1]
    assert all("| ok |" in row for row in rows)
    assert (sweep / "report.png").stat().st_size > 0
    csv_rows = (sweep / "report.csv").read_text().splitlines()
    assert len(csv_rows) == 3 and csv_rows[0].startswith("job,overrides")


def test_ls_lists_every_option(hydratune, tmp_path: Path) -> None:
    proc = hydratune("ls", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for group, option in group_options():
        assert f"\n  {option} " in proc.stdout or f"\n  {option}\n" in proc.stdout, (group, option)


def test_own_recipe_file_from_any_path(hydratune, tmp_path: Path) -> None:
    mine = tmp_path / "my_recipes" / "experiment"
    mine.mkdir(parents=True)
    (mine / "my_lora.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /peft: lora\npeft:\n  r: 4\nrun_name: mine\n"
    )
    proc = hydratune(
        "--config-dir",
        str(tmp_path / "my_recipes"),
        "+experiment=my_lora",
        "mode=plan",
        "plan.config=true",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "checks passed" in proc.stdout and "run_name: mine" in proc.stdout and "r: 4" in proc.stdout
