"""ARCHITECTURE.md's contract tables, read from the classes (``hydratune docs`` writes them, ``--check``
fails while they differ): what a group's interface declares, so the tables follow the code as it changes.

A group's interface is the base most of its options derive from (``Recipe``, ``Strategy``, ``Peft``...),
with the extensions its options mix in beside it from the same module (``ModelSplit``, ``OwnLoop``) and the
classes of the group's package that its class variables, fields or properties are declared as (a
description one of them holds, listed with its fields). Of each: its public class variables, described by
the ``#:`` comment above each (a variable right below another without its own comment shares it), its
properties and methods, described by the first sentence of their docstrings; nothing is listed by name
here. The pages hold them between markers::

    <!-- contract:recipe -->        one row per member of the group's interface classes
    ...
    <!-- /contract -->
    <!-- capabilities -->           one row per other group: its interface's members as a list
    ...
    <!-- /capabilities -->
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

CONTRACT = re.compile(r"<!-- contract:(?P<group>\w+) -->\n.*?<!-- /contract -->", re.S)
CAPABILITIES = re.compile(r"<!-- capabilities -->\n.*?<!-- /capabilities -->", re.S)
PROPERTIES = {"property", "cached_property", "functools.cached_property"}


@dataclass
class Member:
    """One public member of an interface class as its table shows it."""

    names: list[str]  # several: class variables sharing one ``#:`` comment
    kind: str  # "class variable" | "field" | "property" | "method"
    doc: str = ""
    line: int = field(default=0, compare=False)  # where its statement ends (comment sharing)

    @property
    def label(self) -> str:
        return ", ".join(f"`{name}`" for name in self.names)


def markdown(text: str) -> str:
    """rST prose as one markdown table cell: ``x`` and :role:`x` as `x`, one line, ``|`` escaped."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", " ".join(text.split()))
    return text.replace("``", "`").replace("|", "\\|")


def first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", paragraph, maxsplit=1)[0]


@functools.cache
def _module_tree(path: str) -> tuple[ast.Module, list[str]]:
    text = Path(path).read_text()
    return ast.parse(text, filename=path), text.splitlines()


def class_node(cls: type) -> tuple[ast.ClassDef, list[str]]:
    """The ``class`` statement of ``cls`` in its module's source, and the module's lines."""
    tree, lines = _module_tree(inspect.getsourcefile(cls) or "")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return node, lines
    raise LookupError(f"no class {cls.__name__} at the top of {cls.__module__}")


def comment_above(lines: list[str], statement: ast.stmt) -> str:
    """The ``#:`` comment lines right above ``statement`` (Sphinx's attribute comments), joined."""
    found: list[str] = []
    row = statement.lineno - 2
    while row >= 0 and lines[row].strip().startswith("#:"):
        found.insert(0, lines[row].strip()[2:].strip())
        row -= 1
    return " ".join(found)


def signature(function: ast.FunctionDef | ast.AsyncFunctionDef, *, bound: bool) -> str:
    """``name(a, b, *rest, **options)``: the parameters without their types and defaults, ``self`` /
    ``cls`` left out when ``bound``."""
    args = function.args
    names = [a.arg for a in [*args.posonlyargs, *args.args][1 if bound else 0 :]]
    names += [f"*{args.vararg.arg}"] if args.vararg else []
    names += [a.arg for a in args.kwonlyargs]
    names += [f"**{args.kwarg.arg}"] if args.kwarg else []
    return f"{function.name}({', '.join(names)})"


def members(cls: type, *, fields: bool = False) -> list[Member]:
    """The public members ``cls`` itself defines, in source order: class variables (``ClassVar`` or plain
    assignments), its dataclass fields when ``fields``, properties and methods."""
    node, lines = class_node(cls)
    found: list[Member] = []
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign | ast.Assign):
            targets = [statement.target] if isinstance(statement, ast.AnnAssign) else statement.targets
            names = [t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("_")]
            annotation = ast.unparse(statement.annotation) if isinstance(statement, ast.AnnAssign) else ""
            kind = "field" if annotation and not annotation.startswith("ClassVar") else "class variable"
            if not names or (kind == "field" and not fields):
                continue
            doc, last = comment_above(lines, statement), found[-1] if found else None
            if not doc and last and last.kind == kind and last.doc and last.line == statement.lineno - 1:
                last.names += names  # right below, no comment of its own: it shares the one above
                last.line = statement.end_lineno or statement.lineno
                continue
            found.append(Member(names, kind, doc, statement.end_lineno or statement.lineno))
        elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            decorators = {ast.unparse(d) for d in statement.decorator_list}
            if statement.name.startswith("_") or any(d.endswith((".setter", ".deleter")) for d in decorators):
                continue
            doc = first_sentence(ast.get_docstring(statement))
            if decorators & PROPERTIES:
                found.append(Member([statement.name], "property", doc))
            else:
                text = signature(statement, bound="staticmethod" not in decorators)
                found.append(Member([text], "method", doc))
    return found


def options_of(group: str) -> list[type]:
    """The component classes of every option of ``group`` (the recipes register as
    ``hydratune.recipes.register_all()`` imports them: the CLI and the tests do)."""
    from hydratune.components import register_all
    from hydratune.components.config.registry import REGISTRY

    register_all()
    if not REGISTRY.get(group):
        raise LookupError(f"no option of {group} is registered (hydratune.recipes.register_all() first)")
    return list(REGISTRY[group].values())


def interface(group: str) -> list[type]:
    """``group``'s interface classes: the base most of its options derive from (when several tie, the one
    deriving from all the others, else the most general), the extensions its options mix in beside it from
    the same module (not its subclasses), its own bases from the group's package (the parallel keys of a
    strategy), then the classes of the group's package that their members are declared as."""
    options = options_of(group)
    counts = Counter(
        base for cls in options for base in cls.__mro__ if base.__module__.startswith("hydratune.components.")
    )
    most = max(counts.values())
    ties = [b for b, n in counts.items() if n == most]
    chain = [b for b in ties if all(issubclass(b, other) for other in ties)]  # a core over its own bases
    core = chain[0] if chain else min(ties, key=lambda b: len(b.__mro__))
    package = f"hydratune.components.{group}."
    extensions = [
        b for b in counts if b.__module__ == core.__module__ and b not in options and not issubclass(b, core)
    ]
    bases = [b for b in core.__mro__[1:] if b.__module__.startswith(package)]  # its keys declared apart
    found = [core, *sorted(extensions, key=lambda b: class_node(b)[0].lineno), *bases]
    for cls in found:  # grows while it is read: a description may name another
        for member in members(cls, fields=True):
            for named in declared_types(cls, member):
                mine = named.__module__ == core.__module__ or named.__module__.startswith(package)
                if mine and named not in found and named not in options:
                    found.append(named)
    return found


def declared_types(cls: type, member: Member) -> list[type]:
    """The classes a class variable, field or property of ``cls`` is declared as (by the names in its
    annotation, looked up in its module)."""
    if member.kind == "method":
        return []
    node, _ = class_node(cls)
    annotations = [
        ast.unparse(s.annotation if isinstance(s, ast.AnnAssign) else s.returns)
        for s in node.body
        if (isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id in member.names)
        or (isinstance(s, ast.FunctionDef) and s.name in member.names and s.returns is not None)
    ]
    namespace = vars(sys.modules[cls.__module__])
    named = [namespace.get(word) for text in annotations for word in re.findall(r"\w+", text)]
    return [n for n in named if isinstance(n, type)]


def member_table(group: str) -> str:
    """One row per member of ``group``'s interface classes, each class introduced by a row of its own."""
    rows = ["| member | what it is |", "| --- | --- |"]
    options, classes = options_of(group), interface(group)
    for cls in classes:
        rows.append(f"| **`{cls.__name__}`** | {markdown(first_sentence(cls.__doc__))} |")
        # a description, or a base of the core declaring keys apart (the parallel keys): its fields too
        described = cls in classes[0].__mro__[1:] or not any(cls in option.__mro__ for option in options)
        rows += [f"| {m.label} | {markdown(m.doc)} |" for m in members(cls, fields=described)]
    return "\n".join(rows)


def capability_table(groups: list[str]) -> str:
    """One row per group: its interface classes with their members (class variables and properties, then
    methods)."""
    rows = ["| group | interface | declares |", "| --- | --- | --- |"]
    for group in groups:
        for cls in interface(group):
            listed = members(cls)
            facts = ", ".join(m.label for m in listed if m.kind != "method")
            calls = ", ".join(m.label for m in listed if m.kind == "method")
            rows.append(f"| {group} | `{cls.__name__}` | {'; '.join(p for p in (facts, calls) if p)} |")
    return "\n".join(rows)


def contracts(text: str) -> str:
    """``text`` with its contract tables regenerated; the capabilities table lists every component group
    without a contract table of its own in ``text``, in ``conf/config.yaml``'s order."""
    from hydratune.components import register_all
    from hydratune.components.config.options import defaults
    from hydratune.components.config.registry import REGISTRY

    if not (CONTRACT.search(text) or CAPABILITIES.search(text)):
        return text
    register_all()
    own = set(re.findall(r"<!-- contract:(\w+) -->", text))
    rest = [g for g in defaults() if g in REGISTRY and g not in own]
    text = CONTRACT.sub(
        lambda m: f"<!-- contract:{m['group']} -->\n{member_table(m['group'])}\n<!-- /contract -->", text
    )
    return CAPABILITIES.sub(
        lambda _: f"<!-- capabilities -->\n{capability_table(rest)}\n<!-- /capabilities -->", text
    )
