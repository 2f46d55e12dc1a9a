"""Hostfile grammar: DeepSpeed's `host slots=N`, stricter host names, errors with file:line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launchers.config.hostfile import HostfileError, load_hostfile, parse_hostfile_text

REPO = Path(__file__).resolve().parent.parent
ALLOWED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@pytest.mark.parametrize(
    ("name", "hosts", "world"),
    [("localhost", [("localhost", 2)], 2), ("2node", [("node1", 1), ("node2", 1)], 2)],
    ids=["localhost", "2node"],
)
def test_shipped_hostfiles(name: str, hosts: list[tuple[str, int]], world: int) -> None:
    path = REPO / "hostfiles" / name
    cluster = load_hostfile(path)
    assert [(h.name, h.slots) for h in cluster.hosts] == hosts
    assert cluster.world_size == world
    assert path.read_text().startswith("#"), "every hostfile starts with a header comment"


def test_comments_blank_lines_and_tabs_are_accepted() -> None:
    text = "# header\n\n  gpu-01.cluster_a\tslots=8  # trailing comment\r\ngpu-02 slots=8\n"
    cluster = parse_hostfile_text(text, "hf")
    assert [(h.name, h.slots) for h in cluster.hosts] == [("gpu-01.cluster_a", 8), ("gpu-02", 8)]
    assert cluster.world_size == 16
    assert cluster.text == text


BAD = [
    ("no-slots", "node1\n", 1, r"expected 'HOST slots=N', got 'node1'"),
    ("extra-token", "node1 slots=1 extra\n", 1, r"expected 'HOST slots=N'"),
    ("slots-spelled", "# c\nnode1 slot=2\n", 2, r"expected 'slots=N' after the host name"),
    ("duplicate", "a slots=1\nb slots=1\na slots=2\n", 3, r"duplicate host 'a' \(first at line 1"),
    ("slots-zero", "a slots=0\n", 1, r"slots must be an integer >= 1, got 0"),
    ("slots-negative", "a slots=-1\n", 1, r"slots must be an integer >= 1, got -1"),
    ("slots-letter", "a slots=x\n", 1, r"slots must be an integer >= 1, got 'x'"),
    ("slots-empty", "a slots=\n", 1, r"slots must be an integer >= 1, got ''"),
    ("semicolon", "a;reboot slots=1\n", 1, r"character ';' at position 2"),
    ("command-substitution", "$(id) slots=1\n", 1, r"character '\$' at position 1"),
    ("backticks", "`id` slots=1\n", 1, r"character '`' at position 1"),
    ("space-in-name", "my host slots=1\n", 1, r"expected 'HOST slots=N'"),
    ("newline-in-name", "no\nde slots=1\n", 1, r"expected 'HOST slots=N', got 'no'"),
    ("carriage-return-in-name", "no\rde slots=1\n", 1, r"character '\\r' at position 3"),
    ("unicode-name", "nöde slots=1\n", 1, r"character 'ö' at position 2"),
    ("unicode-space", "node\u00a0x slots=1\n", 1, r"character '\\xa0' at position 5"),
    ("leading-dash", "-oProxy slots=1\n", 1, r"starts with '-'"),
    ("empty-file", "", 1, r"no 'HOST slots=N' entry"),
    ("only-comments", "# one\n# two\n", 3, r"no 'HOST slots=N' entry"),
]


@pytest.mark.parametrize(("text", "line", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_hostfiles_name_file_and_line(text: str, line: int, message: str) -> None:
    with pytest.raises(HostfileError, match=rf"^hostfiles/bad:{line}: .*{message}"):
        parse_hostfile_text(text, "hostfiles/bad")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(HostfileError, match=r"nope: hostfile not found"):
        load_hostfile(tmp_path / "nope")


@given(st.text(max_size=200))
def test_parser_never_raises_anything_else_and_names_are_safe(text: str) -> None:
    try:
        cluster = parse_hostfile_text(text, "fuzz")
    except HostfileError as exc:
        assert str(exc).startswith("fuzz:")
        return
    for host in cluster.hosts:
        assert ALLOWED_NAME.fullmatch(host.name), host.name
        assert host.slots >= 1


@given(
    st.lists(
        st.tuples(st.from_regex(ALLOWED_NAME, fullmatch=True), st.integers(1, 64)),
        min_size=1,
        max_size=5,
        unique_by=lambda t: t[0],
    )
)
def test_valid_hostfiles_round_trip(entries: list[tuple[str, int]]) -> None:
    text = "".join(f"{name} slots={slots}\n" for name, slots in entries)
    cluster = parse_hostfile_text(text, "gen")
    assert [(h.name, h.slots) for h in cluster.hosts] == entries
