"""Layering of the packages, read from the source with ``ast`` (nothing is imported):

- ``components/`` never imports ``recipes/``: not at module level, not inside a function, not under
  ``TYPE_CHECKING``, not by a module name in a string (``importlib.import_module("recipes.x")``, a
  ``--module recipes.x`` command);
- no import cycle among the ``components/`` modules, counting every import, lazy and type-only ones too;
- recipes do not import each other; only the entry points do (``python -m recipes`` runs the CLI, the CLI
  hands the launcher the worker's entry point).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: the only imports of one recipes/ module by another
ENTRY_POINTS = {("recipes.__main__", "recipes.cli"), ("recipes.cli", "recipes.worker")}


def modules(package: str, root: Path = REPO) -> dict[str, Path]:
    """{dotted module name: file} of every .py file under ``package``."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(module, line) of every import in the file, wherever it stands; ``from a import b`` counts as ``a.b``
    when that is a module, else as ``a``. Relative imports are resolved against ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in known else base, node.lineno))
    return found


def module_strings(path: Path, names: set[str]) -> list[tuple[str, int]]:
    """String literals that are exactly one of ``names`` (a module imported or run by its name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.value, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def graph(package: str, root: Path = REPO) -> dict[str, dict[str, int]]:
    """{module: {module of ``package`` it imports: first line}}."""
    mods = modules(package, root)
    edges: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        edges[name] = {}
        for target, line in imports(name, path, set(mods)):
            if target in mods and target != name:
                edges[name].setdefault(target, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def components_importing_recipes(root: Path = REPO) -> list[str]:
    recipes = set(modules("recipes", root))
    comps = modules("components", root)
    bad = []
    for name, path in comps.items():
        for target, line in imports(name, path, set(comps) | recipes):
            if target == "recipes" or target.startswith("recipes."):
                bad.append(f"{path.relative_to(root)}:{line} imports {target}")
        for text, line in module_strings(path, recipes):
            bad.append(f"{path.relative_to(root)}:{line} names the module {text!r}")
    return bad


def component_cycles(root: Path = REPO) -> list[str]:
    edges = graph("components", root)
    described = []
    for cycle in cycles(edges):
        members = set(cycle)
        arrows = [f"{a} -> {b} (line {edges[a][b]})" for a in cycle for b in sorted(edges[a]) if b in members]
        described.append("; ".join(arrows))
    return described


def recipes_importing_recipes(root: Path = REPO) -> list[str]:
    edges = graph("recipes", root)
    return [
        f"{a} imports {b} (line {line})"
        for a, targets in sorted(edges.items())
        for b, line in sorted(targets.items())
        if (a, b) not in ENTRY_POINTS and b != "recipes"
    ]


def test_components_never_import_recipes() -> None:
    found = components_importing_recipes()
    assert not found, "components/ must not depend on recipes/:\n" + "\n".join(found)


def test_no_import_cycle_among_components() -> None:
    found = component_cycles()
    assert not found, "import cycles among components/ modules:\n" + "\n".join(found)


def test_recipes_do_not_import_each_other() -> None:
    found = recipes_importing_recipes()
    assert not found, "recipes share code through components/, not each other:\n" + "\n".join(found)


def test_the_checks_see_lazy_type_only_and_string_imports(tmp_path: Path) -> None:
    """The helpers above catch what they are for (a check that sees nothing passes too)."""
    (tmp_path / "components").mkdir()
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "worker.py").write_text("")
    (tmp_path / "recipes" / "sft.py").write_text("")
    (tmp_path / "components" / "__init__.py").write_text("")
    (tmp_path / "components" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from components.b import B\n"
    )
    (tmp_path / "components" / "b.py").write_text(
        "def f():\n    from . import a\n    from recipes.worker import run_worker\n"
    )
    (tmp_path / "components" / "c.py").write_text(
        "import importlib\nimportlib.import_module('recipes.sft')\n"
    )
    assert components_importing_recipes(tmp_path) == [
        "components/b.py:3 imports recipes.worker",
        "components/c.py:2 names the module 'recipes.sft'",
    ]
    assert component_cycles(tmp_path) == [
        "components.a -> components.b (line 3); components.b -> components.a (line 2)"
    ]
