"""The wheel ships every package and asset a run needs, all under the one ``hydratune`` namespace: built from
this checkout, installed on its own (unpacked into an empty folder put on the path, away from the checkout and
its editable install) with another project's top-level ``recipes``, ``conf`` and ``components`` packages
FIRST on the path (torchtune's real ``recipes`` when torchtune is installed: the README's test command
installs it beside hydratune), it runs the default job; so does the editable install of this checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

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
#: the repository's folders that install under the one namespace, and their installed package names
MAPPED = {"components": "hydratune.components", "recipes": "hydratune.recipes", "conf": "hydratune.conf"}
#: what another project's top-level packages of those names do when imported: leave a mark and fail
FOREIGN = (
    "open({mark!r}, 'a').write('{name}\\n')\nraise ImportError('another project\\'s {name} was imported')\n"
)


def repo_packages() -> set[str]:
    """Every package of the checkout as the wheel names it: ``components/data`` is
    ``hydratune.components.data``."""
    found = {"hydratune", "hydra_plugins.hydratune"}
    for folder, package in MAPPED.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rest = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((package, *rest)))
    return found


def foreign_packages(root: Path, mark: Path) -> Path:
    """``root`` holding another project's top-level ``recipes``, ``conf`` and ``components``: torchtune's
    own ``recipes`` when it is installed (its ``__init__`` raises on import), else a stand-in; each stand-in
    leaves a mark in ``mark`` and fails when imported."""
    root.mkdir()
    for name in MAPPED:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(FOREIGN.format(mark=str(mark), name=name))
    torchtune = torchtune_recipes()
    if torchtune is not None:
        shutil.rmtree(root / "recipes")
        shutil.copytree(torchtune, root / "recipes")
    (root / "recipes" / "generate.py").write_text("raise ImportError('torchtune recipes.generate')\n")
    return root


def torchtune_recipes() -> Path | None:
    """The folder of torchtune's top-level ``recipes`` package, when torchtune is installed here."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        files = distribution("torchtune").files or []
    except PackageNotFoundError:
        return None
    init = next((f for f in files if str(f) == "recipes/__init__.py"), None)
    return Path(str(init.locate())).parent if init is not None else None


def test_the_wheel_lists_every_package_and_installs_nothing_outside_its_namespace(tmp_path: Path) -> None:
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert declared == repo_packages(), "pyproject.toml [tool.setuptools] packages must list every package"
    if os.environ.get("CI") == "true":  # the README's test command installs torchtune beside hydratune
        assert torchtune_recipes() is not None, "torchtune (pip install --no-deps torchtune) is not installed"


def test_the_wheel_alone_runs_the_default_job_beside_another_projects_recipes(tmp_path: Path) -> None:
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
    for package in repo_packages():
        assert f"{package.replace('.', '/')}/__init__.py" in names, f"the wheel lacks the package {package}"
    assert {"hydratune/conf/strategy/zero3.yaml", "hydratune/components/assets/tiny/tokenizer.json"} <= set(
        names
    )
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"hydratune", "hydra_plugins"}, f"the wheel installs top-level names {sorted(tops)}"
    assert {n.split("/")[1] for n in names if n.startswith("hydra_plugins/")} == {"hydratune"}
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel installs by unpacking
    mark = tmp_path / "imported.txt"
    other = foreign_packages(tmp_path / "other", mark)
    run = tmp_path / "run"
    run.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{other}{os.pathsep}{site}", "HF_HUB_OFFLINE": "1"}
    probe = "import hydratune.components as c, hydratune.conf as f, hydratune.recipes as r\n"
    probe += "print(c.__file__, f.__file__, r.__file__)"
    where = subprocess.run([sys.executable, "-c", probe], cwd=run, env=env, capture_output=True, text=True)
    assert where.returncode == 0 and all(p.startswith(str(site)) for p in where.stdout.split()), where
    args = ["train.max_steps=3", "train.eval_generations=4", "train.write_plots=false"]
    job = subprocess.run(
        [sys.executable, "-m", "hydratune", *args],
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
    assert not mark.exists(), f"another project's packages were imported: {mark.read_text()}"


def test_the_editable_install_plans_beside_another_projects_packages(tmp_path: Path) -> None:
    """The checkout's own install (what the tests and a developer run) with the foreign packages first on the
    path: every check of a DPO run with LoRA passes and names hydratune's recipe."""
    if shutil.which("hydratune") is None:
        pytest.skip("hydratune is not installed in this environment (pip install -e .)")
    mark = tmp_path / "imported.txt"
    other = foreign_packages(tmp_path / "other", mark)
    env = {**os.environ, "PYTHONPATH": str(other), "HF_HUB_OFFLINE": "1"}
    plan = subprocess.run(
        [sys.executable, "-m", "hydratune", "mode=plan", "plan.config=true", "recipe=dpo", "peft=lora"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    assert "_target_: hydratune.recipes.dpo.DPO" in plan.stdout and "checks passed" in plan.stdout
    assert not mark.exists(), f"another project's packages were imported: {mark.read_text()}"
