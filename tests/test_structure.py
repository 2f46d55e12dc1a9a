"""The shape of the code, read from the source with ``ast`` (nothing is imported): no import
circle among the project's modules, no underscore name taken from another module of the
project, no module over ``MAX_LINES`` lines, every subpackage saying in its ``__init__`` what
it owns. Every import counts, wherever it is written: at module level, inside a function, under
``if TYPE_CHECKING``.

The last test builds a small package with one fault of each kind and checks that each check
finds it, so a check that quietly finds nothing fails too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("analysis", "launchers")
MAX_LINES = 800


@dataclass
class Module:
    """One source file of the project, by dotted name."""

    name: str
    """Dotted name: ``analysis.parse.reader``; a package's ``__init__.py`` is the package."""
    path: Path
    """The file, relative to the root the packages were found in."""
    is_package: bool
    """Whether the file is a package's ``__init__.py``."""
    tree: ast.Module = field(repr=False)
    """The parsed source."""
    lines: int = 0
    """Number of lines in the file."""


@dataclass(frozen=True)
class Use:
    """One import of a project module (or of a name from it), where it is written."""

    importer: str
    """The module that imports."""
    target: str
    """The project module imported, or the module the name comes from."""
    name: str | None
    """The name taken from ``target`` (``from target import name``, ``target.name``), if any."""
    line: int
    """Line of the import (or of the attribute use) in the importer."""


def load_modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Module]:
    """Every ``.py`` file under ``root/<package>`` for each of ``packages``, parsed."""
    modules: dict[str, Module] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            text = path.read_text()
            tree = ast.parse(text, filename=str(path))
            rel = path.relative_to(root)
            modules[name] = Module(name, rel, is_package, tree, len(text.splitlines()))
    return modules


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module name of ``from <node.module> import ...`` written in ``module``."""
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]`` when the expression is a chain of names, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def uses(module: Module, modules: dict[str, Module]) -> Iterator[Use]:
    """Each import of a project module written anywhere in ``module``, and each attribute of an
    imported project module read as ``alias.name``."""
    bound: dict[str, str] = {}  # local name -> project module it stands for
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield Use(module.name, alias.name, None, node.lineno)
                    if alias.asname:
                        bound[alias.asname] = alias.name
                top = alias.name.split(".")[0]
                if not alias.asname and top in modules:
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            if base.split(".")[0] not in PACKAGES and base not in modules:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    yield Use(module.name, sub, None, node.lineno)
                    bound[alias.asname or alias.name] = sub
                    if _private(alias.name):
                        yield Use(module.name, base, alias.name, node.lineno)
                elif base in modules:
                    yield Use(module.name, base, alias.name, node.lineno)
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Attribute):
            continue
        parts = _dotted(node)
        if not parts or parts[0] not in bound:
            continue
        full = [*bound[parts[0]].split("."), *parts[1:]]
        # The longest prefix that is a project module; the next part is a name read from it.
        for k in range(len(full) - 1, 0, -1):
            owner = ".".join(full[:k])
            if owner in modules:
                if owner != module.name and _private(full[k]):
                    yield Use(module.name, owner, full[k], node.lineno)
                break


def import_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (itself left out)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module in modules.values():
        for use in uses(module, modules):
            if use.target != module.name:
                graph[module.name].add(use.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of two or more modules (Tarjan), as
    ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for group in groups:
        start = min(group)
        # Shortest way back to start inside the group (breadth first).
        prev: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & group):
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        v = prev[start]
        while v != start:
            path.append(v)
            v = prev[v]
        path.append(start)
        found.append(path[::-1])
    return sorted(found)


def private_uses(modules: dict[str, Module]) -> list[str]:
    """``importer:line takes _name from owner`` for each underscore name one project module
    takes from another."""
    found = set()
    for module in modules.values():
        for use in uses(module, modules):
            if use.name is not None and _private(use.name) and use.target != module.name:
                found.add(f"{module.path}:{use.line} takes {use.name} from {use.target}")
    return sorted(found)


def long_modules(modules: dict[str, Module], limit: int = MAX_LINES) -> list[str]:
    """``name: N lines`` for each module longer than ``limit`` lines."""
    return sorted(f"{m.name}: {m.lines} lines" for m in modules.values() if m.lines > limit)


def silent_packages(modules: dict[str, Module]) -> list[str]:
    """Subpackages (``analysis.parse``...) whose ``__init__.py`` has no docstring."""
    return sorted(
        m.name
        for m in modules.values()
        if m.is_package and "." in m.name and not ast.get_docstring(m.tree)
    )


MODULES = load_modules(REPO)


def test_the_walk_sees_every_module():
    assert {"analysis.parse", "launchers.cli", "launchers.config"} <= MODULES.keys()
    assert len(MODULES) > 40


def test_no_import_circle():
    found = cycles(import_graph(MODULES))
    assert not found, f"{len(found)} import circle(s):\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_underscore_name_taken_from_another_module():
    found = private_uses(MODULES)
    assert not found, f"{len(found)} private name(s) imported across modules:\n" + "\n".join(found)


def test_no_module_over_the_line_limit():
    found = long_modules(MODULES)
    assert not found, f"modules over {MAX_LINES} lines:\n" + "\n".join(found)


def test_every_subpackage_says_what_it_owns():
    found = silent_packages(MODULES)
    assert not found, f"subpackages whose __init__.py has no docstring: {found}"


def test_the_checks_find_one_fault_of_each_kind(tmp_path):
    """A package with a circle (through a function-level import), an underscore name taken in
    each way (``from m import _x``, relative, ``m._x`` after ``import``), a long module and a
    silent ``__init__``: each check reports it, and the clean modules give nothing."""
    pkg = tmp_path / "analysis"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": '"""Top."""\n',
        "a.py": "from analysis.sub import b\n\n_hidden = 1\n",
        "sub/__init__.py": "",
        "sub/b.py": "def f():\n    from analysis.sub.c import g\n    return g\n",
        "sub/c.py": "import analysis.a\n\ndef g():\n    return analysis.a._hidden\n",
        "sub/d.py": "from analysis.a import _hidden\nfrom . import b\nfrom .b import _x\n",
        "sub/e.py": "import analysis.sub.b as bee\n\ny = bee._y + bee.__name__.count('.')\n",
        "long.py": "x = 1\n" * (MAX_LINES + 1),
        "ok.py": "import os\nfrom analysis import a\n\nz = a.__doc__ or os.sep\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    modules = load_modules(tmp_path, ("analysis",))
    assert cycles(import_graph(modules)) == [
        ["analysis.a", "analysis.sub.b", "analysis.sub.c", "analysis.a"]
    ]
    assert [line.split(" ", 1)[1] for line in private_uses(modules)] == [
        "takes _hidden from analysis.a",  # c.py: analysis.a._hidden
        "takes _hidden from analysis.a",  # d.py: from analysis.a import _hidden
        "takes _x from analysis.sub.b",  # d.py: from .b import _x
        "takes _y from analysis.sub.b",  # e.py: bee._y
    ]
    assert long_modules(modules) == [f"analysis.long: {MAX_LINES + 1} lines"]
    assert silent_packages(modules) == ["analysis.sub"]
