"""The wheel ships every package and asset a run needs: built from this checkout, installed on its own
(unpacked into an empty folder put first on the path, away from the checkout and its editable install),
it runs the default job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_LEFTOVERS = (
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "outputs",
    "multirun",
    "__pycache__",
    "tests",
)


def test_the_wheel_alone_runs_the_default_job(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a clean copy: a stale build/ in the checkout would hide a missing package
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    wheel = next(tmp_path.glob("hydratune-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    packages = {str(p.parent.relative_to(REPO)) for p in (REPO / "components").rglob("__init__.py")}
    for package in packages | {"recipes", "conf", "hydra_plugins/hydratune"}:
        assert f"{package}/__init__.py" in names, f"the wheel lacks the package {package}"
    assert {"conf/strategy/zero3.yaml", "components/assets/tiny/tokenizer.json"} <= set(names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel installs by unpacking
    run = tmp_path / "run"
    run.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    probe = "import components, conf, recipes; print(components.__file__, conf.__file__, recipes.__file__)"
    where = subprocess.run([sys.executable, "-c", probe], cwd=run, env=env, capture_output=True, text=True)
    assert where.returncode == 0 and all(p.startswith(str(site)) for p in where.stdout.split()), where
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes",
            "train.max_steps=3",
            "train.eval_generations=4",
            "train.write_plots=false",
        ],
        cwd=run,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    (run_dir,) = (run / "outputs").glob("*/*")
    result = json.loads((run_dir / "result.json").read_text())
    assert result["run"]["recipe"] == "sft" and (run_dir / "final" / "model.safetensors").is_file()
