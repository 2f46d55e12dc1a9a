"""What a node already provides (its own PyTorch, its ``pip freeze``), and what a wheelhouse may
then leave out: the dependency closure, computed from the wheels' own metadata.

``make wheelhouse TORCH=system`` leaves out torch, torchvision and every distribution that only
they require; ``HAVE=<file>`` (the node's ``pip freeze`` or ``pip list --format=freeze``) also
leaves out what the node has, and what only that requires. The graph comes from pip's resolution
report (``pip install --dry-run --report``: each wheel's ``Requires-Dist``), so it holds exactly
the distributions pip would install for the target.

Standard library only, as :mod:`launchers.config.wheelhouse`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TORCH = ("torch", "torchvision")
"""What a node's own PyTorch provides (``launchers.config.torch_check.NOT_PINNED_HERE``)."""


class ProvidedError(ValueError):
    """A freeze file or a resolution report that cannot be read; says where and what to do."""


def normalize(name: str) -> str:
    """PEP 503 form of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


_FREEZE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([^\s;#]+)|@\s*\S+)?\s*$")
"""``name==version``, ``name @ url`` (pip freeze of a direct install) or a bare ``name``."""


def read_have(path: Path) -> dict[str, str | None]:
    """``{normalized name: version or None}`` of a node's ``pip freeze`` output (``name==version``
    lines; ``name @ url`` and a bare ``name`` give no version; ``-e`` lines and comments are
    skipped). A line of another form is an error naming the file and the line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProvidedError(f"HAVE={path}: cannot read it ({exc.strerror}): give the node's "
                            "`python3 -m pip freeze` output saved to a file") from None  # fmt: skip
    out: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#")[0].strip()
        if not line or line.startswith(("-e ", "--")):
            continue
        match = _FREEZE.match(line)
        if not match:
            raise ProvidedError(
                f"{path}:{number}: {raw.strip()!r} is not a `pip freeze` line (name==version, "
                "name @ url or a name alone): regenerate it with `python3 -m pip freeze` on the "
                "node"
            )
        out[normalize(match.group(1))] = match.group(2)
    return out


_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?([^;]*)(?:;(.*))?$")
_EXTRA = re.compile(r"""\bextra\s*==\s*['"]([^'"]+)['"]""")


@dataclass(frozen=True)
class Edge:
    """One ``Requires-Dist`` line of a wheel."""

    name: str
    """Normalized name of the distribution required."""
    extras: frozenset[str]
    """The extras it is required with (``name[a,b]``)."""
    when_extra: frozenset[str]
    """The required-by's extras that make this line count (empty: always). Other markers are
    taken as true: a line the target does not need names nothing pip resolved, or keeps a
    distribution that could have been left out, never the reverse."""


def edge(line: str) -> Edge:
    """An :class:`Edge` from a ``Requires-Dist`` value (``pydantic<3,>=2.0; extra == "x"``)."""
    match = _REQUIREMENT.match(line)
    if not match:
        raise ProvidedError(f"Requires-Dist {line!r}: not a requirement")
    extras = frozenset(normalize(e) for e in (match.group(2) or "").split(",") if e.strip())
    when = frozenset(normalize(e) for e in _EXTRA.findall(match.group(4) or ""))
    return Edge(normalize(match.group(1)), extras, when)


@dataclass(frozen=True)
class Resolved:
    """A distribution of pip's resolution."""

    name: str
    """Normalized name."""
    version: str
    """The version pip chose."""
    requires: tuple[Edge, ...]
    """Its ``Requires-Dist``."""
    extras: frozenset[str]
    """The extras requested on the command line (``requested_extras``)."""


def from_report(report: dict) -> dict[str, Resolved]:
    """``{name: Resolved}`` from ``pip install --dry-run --report`` JSON (its ``install`` list)."""
    out = {}
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        if "name" not in meta or "version" not in meta:
            raise ProvidedError(f"pip's report: an entry without name/version ({item!r:.120})")
        name = normalize(meta["name"])
        out[name] = Resolved(
            name,
            meta["version"],
            tuple(edge(r) for r in meta.get("requires_dist") or ()),
            frozenset(normalize(e) for e in item.get("requested_extras") or ()),
        )
    return out


def reach(graph: dict[str, Resolved], roots: set[str], stop: set[str]) -> set[str]:
    """Every distribution of ``graph`` that ``roots`` need, following ``Requires-Dist`` (with the
    extras each is required with), never entering ``stop``."""
    extras: dict[str, set[str]] = {}
    todo = [(r, frozenset(graph[r].extras)) for r in sorted(roots) if r in graph and r not in stop]
    while todo:
        name, wanted = todo.pop()
        seen = extras.get(name)
        if seen is not None and wanted <= seen:
            continue
        extras[name] = (seen or set()) | set(wanted)
        for e in graph[name].requires:
            active = not e.when_extra or bool(e.when_extra & extras[name])
            if active and e.name in graph and e.name not in stop:
                todo.append((e.name, e.extras))
    return set(extras)


@dataclass(frozen=True)
class Split:
    """What a wheelhouse holds and what it leaves to the node."""

    keep: set[str]
    """Needed and not provided: downloaded."""
    torch: set[str]
    """torch, torchvision and what they require that the pins do not (TORCH=system), whether or
    not the node's freeze lists it."""
    node: set[str]
    """The rest of what the node has (HAVE) and what only that requires."""


def split(
    graph: dict[str, Resolved], roots: set[str], *, torch_system: bool, have: set[str]
) -> Split:
    """:class:`Split` of the resolved ``graph`` for ``roots`` (the pins and pip): what neither the
    node's PyTorch (``torch_system``) nor the node's packages (``have``) provide, counting only
    what is reached without passing through them."""
    stop = (set(TORCH) if torch_system else set()) | (have & set(graph))
    keep = reach(graph, roots, stop)
    through_torch = reach(graph, set(TORCH), set()) if torch_system else set()
    rest = set(graph) - keep
    torch = (rest & through_torch) | (set(TORCH) & rest) if torch_system else set()
    return Split(keep, torch, rest - torch)
