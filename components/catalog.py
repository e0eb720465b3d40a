"""``hydratune ls``: the recipes, every config group with its options, and the shared experiments."""

from __future__ import annotations

from pathlib import Path

CONF = Path(__file__).resolve().parent.parent / "conf"


def describe(option: Path) -> str:
    """The first comment line of an option's YAML (skipping ``@package`` directives)."""
    for line in option.read_text().splitlines():
        text = line.lstrip("# ").rstrip()
        if line.startswith("#") and text and not text.startswith("@package"):
            return text
        if line and not line.startswith("#"):
            break
    return ""


def catalog(conf: Path = CONF) -> dict[str, dict[str, str]]:
    """{group: {option: description}} for every group folder in ``conf``."""
    return {
        group.name: {opt.stem: describe(opt) for opt in sorted(group.glob("*.yaml"))}
        for group in sorted(p for p in conf.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    }


def render(conf: Path = CONF) -> str:
    """A plain-text listing: recipes first, then the groups, experiments last."""
    cat = catalog(conf)
    order = ["recipe", *sorted(g for g in cat if g not in ("recipe", "experiment")), "experiment"]
    lines = []
    for group in order:
        if group not in cat:
            continue
        lines.append(f"{group}:" if group != "experiment" else "experiment:  (use with +experiment=<name>)")
        width = max((len(o) for o in cat[group]), default=0)
        lines += [f"  {opt:<{width}}  {desc}" for opt, desc in cat[group].items()]
        lines.append("")
    return "\n".join(lines)
