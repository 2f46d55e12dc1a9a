"""DeepSpeed hostfiles: ``host slots=N`` lines, ``#`` comments, blank lines.

The grammar is DeepSpeed's own (``deepspeed/launcher/runner.py`` ``_parse_hostfile``), made
stricter because host names end up in ssh/pdsh command lines: a name is letters, digits, ``.``,
``_`` and ``-`` and starts with a letter or digit (so it cannot be read as an option). Every error
names the file and the line.
"""

from __future__ import annotations

import re
from pathlib import Path

from launchers.config.spec import Cluster, Host

HOSTFILE_DIR = Path(__file__).resolve().parents[2] / "hostfiles"
"""Hostfiles shipped with the project (``list`` shows them)."""

HOST_NAME_CHARS = "letters, digits, '.', '_', '-'"
_HOST_CHAR = re.compile(r"[A-Za-z0-9._-]")
_SLOTS = re.compile(r"slots=(.*)")
_BLANKS = re.compile(r"[ \t]+")


class HostfileError(ValueError):
    """A hostfile that DeepSpeed would misread or that is unsafe to pass to ssh."""


def check_host_name(name: str, where: str) -> None:
    """Refuse (``HostfileError``, naming ``where``) a host name ssh or pdsh could misread."""
    for index, char in enumerate(name):
        if not _HOST_CHAR.fullmatch(char):
            raise HostfileError(
                f"{where}: host name {name!r} has character {char!r} at position {index + 1}; "
                f"host names may contain only {HOST_NAME_CHARS}"
            )
    if not name[0].isalnum():
        raise HostfileError(
            f"{where}: host name {name!r} starts with {name[0]!r}; it must start with a letter "
            "or digit"
        )


def _parse_slots(token: str, where: str) -> int:
    match = _SLOTS.fullmatch(token)
    if match is None:
        raise HostfileError(f"{where}: expected 'slots=N' after the host name, got {token!r}")
    value = match.group(1)
    if not re.fullmatch(r"[+-]?[0-9]+", value):
        raise HostfileError(f"{where}: slots must be an integer >= 1, got {value!r}")
    slots = int(value)
    if slots < 1:
        raise HostfileError(f"{where}: slots must be an integer >= 1, got {slots}")
    return slots


def parse_hostfile_text(text: str, path: str = "<hostfile>") -> Cluster:
    """Parse hostfile text; ``path`` is only used in messages and recorded in the cluster."""
    hosts: list[Host] = []
    first_seen: dict[str, int] = {}
    lines = text.split("\n")
    for number, raw in enumerate(lines, start=1):
        where = f"{path}:{number}"
        line = raw.split("#", 1)[0].strip(" \t\r")
        if not line:
            continue
        tokens = _BLANKS.split(line)
        if len(tokens) != 2:
            raise HostfileError(f"{where}: expected 'HOST slots=N', got {line!r}")
        name, slots_token = tokens
        check_host_name(name, where)
        slots = _parse_slots(slots_token, where)
        if name in first_seen:
            raise HostfileError(
                f"{where}: duplicate host {name!r} (first at line {first_seen[name]})"
            )
        first_seen[name] = number
        hosts.append(Host(name, slots))
    if not hosts:
        raise HostfileError(f"{path}:{len(lines)}: no 'HOST slots=N' entry in the hostfile")
    return Cluster(hostfile=path, hosts=tuple(hosts), text=text)


def load_hostfile(path: str | Path) -> Cluster:
    """Read and parse a hostfile; a missing or unreadable file is a :class:`HostfileError`."""
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HostfileError(f"{shown}: hostfile not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HostfileError(f"{shown}: cannot read hostfile: {exc}") from None
    return parse_hostfile_text(text, shown)


def render_hostfile(cluster: Cluster) -> str:
    """The cluster's hostfile text: the original text when known, else one line per host."""
    if cluster.text:
        return cluster.text
    return "".join(f"{h.name} slots={h.slots}\n" for h in cluster.hosts)


def lab_directive(path: str | Path) -> tuple[int, str] | None:
    """``(nodes, link)`` of a hostfile that describes a lab (``# lab: nodes=2 link=100mbit``).

    A lab's addresses are assigned when it starts, so such a hostfile names no hosts: the line
    tells the launcher to build the lab and use the hostfile the lab writes.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        words = line.strip().removeprefix("#").split()
        if words[:1] == ["lab:"]:
            fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            try:
                return int(fields.get("nodes", "2")), fields.get("link", "100mbit")
            except ValueError:
                return None
    return None
