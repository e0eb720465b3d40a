"""``hydratune docs [--check]``: the documentation tables derived from conf/ and the components, written into
the checkout (README.md's option lists, docs/strategies.md's strategy table, docs/matrix.md, ARCHITECTURE.md's
contract tables read from the interface classes: ``components/commands/contracts.py``). A new option is its
YAML file, a new member of an interface its code: this command puts it in the docs, and
``tests/unit/test_options.py`` fails while the committed docs disagree.

README.md, docs/strategies.md and ARCHITECTURE.md hold the generated parts between markers, so the prose
around them stays hand-written::

    <!-- options:strategy -->`single` (default), `ddp`, ...<!-- /options -->        (README.md)
    <!-- strategies -->                                                              (docs/strategies.md)
    | strategy | what it is |
    ...
    <!-- /strategies -->
    <!-- contract:recipe --> ... <!-- /contract -->, <!-- capabilities --> ... <!-- /capabilities -->
                                                                                     (ARCHITECTURE.md)
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

OPTIONS = re.compile(r"<!-- options:(?P<group>\w+) -->.*?<!-- /options -->")
STRATEGIES = re.compile(r"<!-- strategies -->\n.*?<!-- /strategies -->", re.S)


def option_list(group: str) -> str:
    """A group's options as the README lists them: the default first (marked), then by name."""
    from hydratune.components.config.options import defaults, options

    default = defaults().get(group)
    names = sorted(options(group), key=lambda name: (name != default, name))
    return ", ".join(f"`{name}`" + (" (default)" if name == default else "") for name in names)


def strategy_table() -> str:
    """Every strategy option with its YAML's description: ``auto`` first, then the ladder's order."""
    from hydratune.components.config.options import options
    from hydratune.components.strategy import training_options

    described = options("strategy")
    names = [name for name in described if name not in training_options()] + list(training_options())
    rows = [f"| `{name}` | {described[name].description} |" for name in names]
    return "\n".join(["| strategy | what it is |", "| --- | --- |", *rows])


#: the hand-written pages that hold generated parts between markers
MARKED = ("README.md", "docs/strategies.md", "ARCHITECTURE.md")


def readme(text: str) -> str:
    """``text`` (README.md, docs/strategies.md, ARCHITECTURE.md) with every generated part regenerated."""
    from hydratune.components.commands.contracts import contracts

    text = contracts(text)
    text = OPTIONS.sub(
        lambda m: f"<!-- options:{m['group']} -->{option_list(m['group'])}<!-- /options -->", text
    )
    return STRATEGIES.sub(lambda _: f"<!-- strategies -->\n{strategy_table()}\n<!-- /strategies -->", text)


def generated(root: Path) -> dict[Path, str]:
    """{file: its content as generated} for the checkout at ``root``."""
    from hydratune.components.commands.matrix import markdown

    return {
        **{root / page: readme((root / page).read_text()) for page in MARKED},
        root / "docs" / "matrix.md": markdown(),
    }


def cli(args: list[str]) -> int:
    """Write the generated docs (or, with ``--check``, list the stale ones and exit 1)."""
    parser = argparse.ArgumentParser(prog="hydratune docs", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report the files that are out of date")
    parser.add_argument("root", nargs="?", default=".", help="the checkout (default: the current dir)")
    opts = parser.parse_args(args)
    written = generated(Path(opts.root))
    stale = {path: text for path, text in written.items() if not path.is_file() or path.read_text() != text}
    for path, text in stale.items():
        if opts.check:
            print(f"out of date: {path} (run: hydratune docs)")
        else:
            path.write_text(text)
            print(f"wrote {path}")
    return 1 if stale and opts.check else 0
