"""The file reader's bulk path (``analysis.parse.bulk``) reads exactly what the line path reads.

Every log here is parsed three ways: ``parse_file`` (bulk path), ``parse_file(bulk=False)``
(every line through the line state machine) and ``parse_lines`` on the same lines; the runs must
be equal field by field.  The generated logs mix the frequent line kinds with every variant the
bulk path must leave to the line path (glued, wrapped, non-ASCII, NaN values, counters going
back, interleaved timer blocks, prefixes of several launchers), in chunks and segments small
enough that records straddle their boundaries.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import LAB_LOGS
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from analysis.parse import bulk as bulk_path
from analysis.parse import keywords
from analysis.parse import reader as parse
from analysis.parse.columns import Column, json_text
from analysis.parse.rules import KW

REPO = Path(__file__).resolve().parents[1]
EXTERNAL = REPO / "tests" / "fixtures" / "external"
sys.path.insert(0, str(REPO / "benchmarks"))


def _three_ways(path: Path) -> list[dict]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    bulk = [r.to_dict() for r in parse.parse_file(path)]
    line = [r.to_dict() for r in parse.parse_file(path, bulk=False)]
    ref = [
        r.to_dict()
        for r in parse.parse_lines((x.decode("utf-8", "replace") for x in lines), str(path))
    ]
    assert bulk == line, f"{path.name}: bulk path differs from the line path"
    assert line == ref, f"{path.name}: file line path differs from parse_lines"
    return bulk


def _logs(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.log"))


@pytest.mark.parametrize(
    "path", _logs(LAB_LOGS) + _logs(EXTERNAL), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_corpus_bulk_equals_line_path(path):
    _three_ways(path)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks and segments of a few KB: records straddle their boundaries."""
    monkeypatch.setattr(parse, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(bulk_path, "SEG_START", 512)
    monkeypatch.setattr(bulk_path, "SEG_MIN", 256)
    monkeypatch.setattr(bulk_path, "SEG_MAX", 2048)


@pytest.mark.parametrize(
    "kind",
    ["dense", "ranks", "noise", "all-ranks", "interval1", "pipeline", "stamped", "compose"],
)
def test_generated_logs(tmp_path, kind, small_chunks):
    import loggen

    path = tmp_path / f"{kind}.log"
    if kind in ("stamped", "compose"):
        collector = "kubectl" if kind == "stamped" else "compose"
        written = loggen.write_dense(path, 0.3, LAB_LOGS, collector=collector)
    elif kind in ("dense", "interval1", "pipeline"):
        write = {"dense": loggen.write_dense, "interval1": loggen.write_interval1}.get(
            kind, loggen.write_pipeline
        )
        written = write(path, 0.3, LAB_LOGS)
    elif kind == "ranks":
        written = loggen.write_ranks(path, 0.3)
    elif kind == "all-ranks":
        written = loggen.write_all_ranks(path, 0.3)
    else:
        written = loggen.write_noise(path, 0.3)
    runs = _three_ways(path)
    assert len(runs) == 1
    run = runs[0]
    assert len(run["iterations"]) == written.iteration_lines
    assert run["iterations"][-1]["iteration"] == written.iterations
    assert len(run["timers"]) == written.timer_blocks
    assert len(run["memory"]) == written.memory_reports


@pytest.mark.parametrize("form", ["stamps", "compose", "compose-name"])
def test_collector_forms_on_some_lines(tmp_path, form):
    """What a collector writes, on some lines only: a time stamp on a third of them (too few
    for the file to be rewritten first), or ``docker compose``'s prefix on the lines of the
    node that prints the timer blocks, the other's keeping pdsh's (a pdsh-like name, or one
    pdsh's rule does not read as a host).  Lines of a timer block's stream with a stamp go on
    with the block: both readers read the same records, and as many as written."""
    import loggen

    plain = tmp_path / "dense.log"
    written = loggen.write_dense(plain, 0.3, LAB_LOGS)
    rnd = random.Random(7)
    head = "trainer  | " if form == "compose-name" else "node1-1  | "
    out = []
    for line in plain.read_text().splitlines():
        if form == "stamps" and rnd.random() < 0.35:
            line = "2026-11-28T10:00:00.5Z " + line
        elif form != "stamps" and line.startswith("node1: "):
            line = head + line[7:]
        out.append(line)
    path = tmp_path / f"{form}.log"
    path.write_text("\n".join(out) + "\n")
    runs = _three_ways(path)
    assert [len(r["iterations"]) for r in runs] == [written.iteration_lines]
    assert [len(r["timers"]) for r in runs] == [written.timer_blocks]


# -- generated mixtures -------------------------------------------------------------------

_PREFIXES = ["", "node0: ", "node1: ", "[default0]:", "[rank1]: ", " 3: ", "node1: [default0]:",
             "2026-11-28T10:00:00.5Z node1: ", "Nov 28 10:00:00 ", "node1-1  | ",
             "node0-1  | 2026-11-28T10:00:00.5Z node1: "]  # fmt: skip
_NUM = st.sampled_from(["84.77", "230.93", "0.01", "1.0", "5.866232E+00", "9.747E-04", "12"])
_BAD_NUM = st.sampled_from(["nan", "inf", "1,000.5", "", "0x10", "-0.0", "1e400", "٣"])


def _ds(draw) -> str:
    names = draw(
        st.sampled_from(
            [
                ("fwd", "bwd", "step"),
                ("fwd_microstep", "bwd_microstep"),
                ("forward", "backward"),
                ("fwd2", "bwd"),  # a digit in a name: the shape of ("fwd", "bwd")
                ("fwd", "bwd"),
            ]
        )
    )
    vals = [draw(_NUM) for _ in names]
    if draw(st.integers(0, 9)) == 0:
        vals[0] = draw(_BAD_NUM)
    body = " | ".join(f"{n}: {v}" for n, v in zip(names, vals, strict=True))
    head = draw(st.sampled_from(["[Rank 0] ", "[Rank 12] ", "", "[Rank 0] x "]))
    return f"{head}time (ms) | {body}"


def _iteration(draw, number: int, total: int) -> str:
    loss = draw(st.one_of(_NUM, _BAD_NUM)) if draw(st.integers(0, 9)) == 0 else draw(_NUM)
    unit = draw(st.sampled_from(["(ms)", "(ms)", "(ms)", "(s)", ""]))
    head = draw(st.sampled_from([" ", " ", " [2026-11-22 03:00:01] ", "x|"]))
    tail = draw(st.sampled_from([" |", " |", "", " | extra"]))
    return (
        f"{head}iteration {number:8d}/{total:8d} | consumed samples: {number * 8:12d} | "
        f"elapsed time per iteration {unit}: {draw(_NUM)} | lm loss: {loss} | loss scale: 1.0 "
        f"| number of skipped iterations:   0 | number of nan iterations:   0{tail}"
    )


def _block(draw) -> list[str]:
    kind = draw(st.sampled_from(["minmax", "max", "times"]))
    if kind == "minmax":
        out = ["(min, max) time across ranks (ms):"]
        out += [
            f"    {n} ....................: ({draw(_NUM)}, {draw(_NUM)})"
            for n in ("forward-backward", "optimizer")
        ]
    elif kind == "max":
        out = ["max time across ranks (ms):", f"    optimizer .....: {draw(_NUM)}"]
    else:
        out = ["times across ranks (ms):", "  forward-backward:"]
        out += [f"     rank  {r}: {draw(_NUM)}" for r in range(draw(st.integers(0, 3)))]
    if draw(st.integers(0, 5)) == 0:
        out.append(f"    odd line {draw(_BAD_NUM)}")
    return out


_NOISE = [
    "node0:1070:1100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    "UserWarning: something",
    "Connection reset by peer",
    "CUDA out of memory",
    "RuntimeError: boom",
    "Traceback (most recent call last):",
    '  File "x.py", line 1, in <module>',
    "ValueError: bad",
    "Killed",
    "[2026] [INFO] [launch.py:367:main] Process 1 exits successfully.",
    "ünïcode | x",
    "\x1b[31mred | x\x1b[0m",
    "nul\x00 | x",
    "memory (MB) odd",
    "[Rank 0] (after 5 iterations) memory (MB) | allocated: 1.5 | max allocated: 2.5 | "
    "reserved: 3.0 | max reserved: 4.0",
    "memory (MB) | allocated: nan | reserved: 3.0",
    "iteration=7 loss=1.0 elapsed_ms=9.0",
    "steps: 10 loss: 4.6757 iter time (s): 0.233 samples/sec: 34.389",
    "x" * 70_000 + " | long",
]


@st.composite
def _mixtures(draw) -> bytes:
    records: list[list[str]] = [["training ..."]]
    number, total = 0, draw(st.sampled_from([40, 1000]))
    for _ in range(draw(st.integers(1, 30))):
        what = draw(st.integers(0, 9))
        if what <= 3:
            records.append([_ds(draw)])
        elif what <= 5:
            step = draw(st.sampled_from([5, 5, 5, 0, -10]))
            number = max(1, number + step)
            records.append([_iteration(draw, number, total)])
        elif what <= 7:
            records.append(_block(draw))
        else:
            records.append([draw(st.sampled_from(_NOISE))])
    streams = draw(st.lists(st.sampled_from(_PREFIXES), min_size=1, max_size=3))
    # Each record goes to one stream; the streams' lines are interleaved line by line.
    queues: list[list[str]] = [[] for _ in streams]
    for rec in records:
        i = draw(st.integers(0, len(streams) - 1))
        queues[i].extend(streams[i] + line for line in rec)
    out: list[str] = []
    while any(queues):
        i = draw(st.sampled_from([k for k, q in enumerate(queues) if q]))
        take = draw(st.integers(1, 4))
        out.extend(queues[i][:take])
        del queues[i][:take]
    eol = draw(st.sampled_from(["\n", "\n", "\r\n"]))
    return (eol.join(out) + eol).encode("utf-8")


@settings(
    max_examples=300,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking these takes minutes
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(_mixtures())
def test_mixtures_bulk_equals_line_path(tmp_path, small_chunks, data):
    path = tmp_path / "mix.log"
    path.write_bytes(data)
    _three_ways(path)


# -- typed columns ----------------------------------------------------------------------------

_VALUES = {
    "f": st.one_of(
        st.none(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, -0.0, 1.0, 84.77, 230.93, 9.747e-04, 5.866232, 2.5e9, 1e-7]),
        st.integers(-5, 5),
    ),
    "i": st.one_of(
        st.none(),
        st.integers(-(2**70), 2**70),
        st.integers(-300, 300),
        st.sampled_from([-(2**63), 2**63 - 1, -128, 127, 0]),
        st.floats(allow_nan=False),
    ),
}


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a:
        return b != b
    return type(a) is type(b) and a == b and (not isinstance(a, float) or str(a) == str(b))


def _add(col: Column, batch: list, bulk: bool) -> None:
    """Add a batch one value at a time, or as an array when an array holds it (the bulk
    path's way): floats with NaN for None, ints with a None mask."""
    if bulk and col.kind == "f" and all(v is None or (type(v) is float and v == v) for v in batch):
        col.add_floats(np.array([math.nan if v is None else v for v in batch], dtype=float))
    elif bulk and col.kind == "i" and all(v is None or type(v) is int for v in batch):
        if all(v is None or abs(v) < 2**63 for v in batch):
            vals = np.array([0 if v is None else v for v in batch], dtype=np.int64)
            col.add_ints(vals, np.array([v is None for v in batch], dtype=bool))
            return
        col.extend(batch)
    else:
        col.extend(batch)


def assert_json_texts(col: Column, want: list, size: int) -> None:
    """The column's JSON texts, ``size`` at a time, are what ``json`` gives value by value; a
    value ``json`` refuses (a float that is not finite) makes both raise ``ValueError``."""

    def texts_or_error(texts) -> list[str] | type[ValueError]:
        try:
            return list(texts())
        except ValueError:
            return ValueError

    one_by_one = texts_or_error(lambda: (json_text(v) for v in want))
    blocks = texts_or_error(lambda: (t for b in col.json_texts(size=size) for t in b))
    assert blocks == one_by_one


def _batches(kind: str, size: int, count: int) -> st.SearchStrategy:
    """Batches of values of one kind, each with whether it is added as an array."""
    batch = st.tuples(st.lists(_VALUES[kind], max_size=size), st.booleans())
    return st.lists(batch, max_size=count)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["i", "f"]).flatmap(lambda k: st.tuples(st.just(k), _batches(k, 8, 6))))
@example(("f", [([1.25, None], True), ([0.1], False), ([1e300], True), ([-0.0], True)]))
@example(("f", [([0.5, 0.0, -0.0, 0.0, -0.0, 0.0, None], True)]))
@example(("i", [([1, None], True), ([300], False), ([2**40, None], True), ([2**70], True)]))
@example(("i", [([2**63 - 1, 2**63 - 1], True)]))
def test_column_gives_back_what_was_put_in(args):
    """Whatever the values (decimals kept as int32, then a value that is not one; ints
    widened; values no array holds), added one by one or as arrays, a column gives them back
    exactly, one by one, at some rows, as floats and as JSON texts."""
    kind, batches = args
    col = Column(kind)
    want = []
    for batch, bulk in batches:
        _add(col, batch, bulk)
        want.extend(batch)
    assert len(col) == len(want)
    assert all(_same(a, b) for a, b in zip(col, want, strict=True))
    assert all(_same(col[i], want[i]) for i in range(len(want)))
    rows = np.arange(len(want))[::-2].copy()
    assert all(_same(a, want[i]) for a, i in zip(col.at(rows), rows.tolist(), strict=True))
    if all(v is None or (isinstance(v, int | float) and abs(v) < 2**53) for v in want):
        floats = np.array([math.nan if v is None else float(v) for v in want], dtype=float)
        np.testing.assert_array_equal(col.floats(), floats)
        np.testing.assert_array_equal(col.floats(rows), floats[rows])
    assert_json_texts(col, want, size=3)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["i", "f"]).flatmap(
        lambda k: st.tuples(
            st.just(k),
            st.lists(_VALUES[k], min_size=1, max_size=40).flatmap(
                lambda pool: st.lists(st.sampled_from(pool), min_size=65, max_size=400)
            ),
            st.booleans(),
        )
    )
)
@example(("f", [round(0.01 * (i % 37), 2) for i in range(300)] + [None, 1e300], True))
@example(("i", [i % 5 or None for i in range(200)] + [2**40], False))
def test_json_texts_of_blocks_with_repeated_values(args):
    """Blocks of more than 64 values with repeats (each distinct value formatted once) give
    the texts that ``json`` gives value by value."""
    kind, values, bulk = args
    col = Column(kind)
    _add(col, values, bulk)
    assert_json_texts(col, values, size=100)


def test_a_column_of_printed_decimals_keeps_four_bytes_a_value():
    """Timer values printed with up to two decimals take 4 bytes each, and come back exactly;
    a value that is not such a decimal turns the column to float64, the others unchanged."""
    values = [round(900 + 0.37 * i, 2) for i in range(1000)]
    col = Column("f", [12.5])  # (one decimal first: the column takes more when they come)
    col.add_floats(np.array(values))
    col.extend([None, 12.5])
    assert col.nbytes <= 4 * len(col) + 8 * 2  # (the two added one by one wait as a list)
    col.add_floats(np.array([1 / 3]))
    assert list(col) == [12.5, *values, None, 12.5, 1 / 3]
    assert col.nbytes == 8 * len(col)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["i", "f"]).flatmap(
        lambda k: st.tuples(st.just(k), _batches(k, 12, 2), _batches(k, 12, 2))
    )
)
@example(("f", [([0.5], True)], [([x / 100 for x in range(12)], True)]))
@example(("f", [([0.25], True)], [([1 / 3], True)]))
@example(("i", [([1, None], True)], [([3, None, 2**40], True)]))
def test_column_concat_gives_back_both(args):
    """``Column.concat`` (into an empty column or not, decimals of other scales, float64,
    other int widths, Python values) holds the values of both, exactly."""
    kind, first, second = args
    a, b = Column(kind), Column(kind)
    for col, batches in ((a, first), (b, second)):
        for batch, bulk in batches:
            _add(col, batch, bulk)
    want = [v for batch, _ in first + second for v in batch]
    a.concat(b)
    assert len(a) == len(want)
    assert all(_same(x, y) for x, y in zip(a, want, strict=True))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["i", "f"]).flatmap(
        lambda k: st.tuples(st.just(k), _batches(k, 12, 3), st.randoms(use_true_random=False))
    )
)
def test_column_take_gives_the_values_at_the_order(args):
    """``take(order)`` holds the values at ``order``, exactly, whatever the storage."""
    kind, batches, rnd = args
    col = Column(kind)
    for batch, bulk in batches:
        _add(col, batch, bulk)
    values = [v for batch, _ in batches for v in batch]
    order = list(range(len(values)))
    rnd.shuffle(order)
    got = col.take(np.array(order, dtype=np.int64))
    assert len(got) == len(order)
    assert all(_same(got[k], values[i]) for k, i in enumerate(order))
    if kind == "i" and all(v is None or (type(v) is int and abs(v) < 2**63) for v in values):
        assert col.ints(fill=-7).tolist() == [-7 if v is None else v for v in values]
        assert col.none_mask().tolist() == [v is None for v in values]


def test_json_stream_equals_the_records(tmp_path):
    """``analysis.parse.reader --json`` writes record by record what ``to_dict`` gives."""
    import json

    import loggen

    logs = [
        *_logs(LAB_LOGS),
        tmp_path / "ranks.log",
        tmp_path / "dense.log",
        tmp_path / "missing.log",
    ]
    loggen.write_ranks(logs[-3], 0.2)
    loggen.write_dense(logs[-2], 0.5, LAB_LOGS)
    odd = tmp_path / "odd%name.log"
    odd.write_text("training ...\n[Rank 0] time (ms) | a%b: 1.5 | c: 2\n")
    logs.append(odd)
    text = "".join(parse._iter_json([str(p) for p in logs]))
    want = {
        "logs": [{"path": str(p), "runs": [r.to_dict() for r in parse.parse_file(p)]} for p in logs]
    }

    def typed(doc: str) -> object:  # 1 and 1.0 told apart, floats by their text
        return json.loads(doc, parse_int=lambda x: ("int", x), parse_float=lambda x: ("float", x))

    assert typed(text) == typed(json.dumps(want))


@pytest.mark.parametrize(
    ("a", "b"), [("node0", "node1"), ("gpu-host-a", "gpu-host-b")], ids=["short", "long"]
)
def test_interleaved_streams_bulk_attributes_per_stream(tmp_path, small_chunks, a, b):
    """Two nodes interleaved pdsh-style: node0 (rank 0) prints DeepSpeed's timers, node1 (the
    last rank) the iteration lines and Megatron's timer blocks.  The bulk path places each
    block among its own stream's iteration lines, as the line path does.
    (Host names of one length: the prefixes of one bulk step differ in their bytes alone,
    within 8 bytes or past them.)"""
    n = 3000
    lines = ["node0: training ...", "node1: training ..."]
    for i in range(1, n + 1):
        lines += [
            f"node0: [Rank 0] time (ms) | fwd: {10 + i % 7}.5 | bwd: 20.25 | step: 3.0",
            f"node1: [Rank 1] time (ms) | fwd: {11 + i % 5}.5 | bwd: 21.25 | step: 3.5",
            f"node1:  iteration {i:8d}/{n + 10:8d} | consumed samples: {8 * i:12d} | "
            f"elapsed time per iteration (ms): 84.7 | lm loss: 5.866232E+00 | loss scale: 1.0 "
            "| number of skipped iterations:   0 | number of nan iterations:   0 |",
            "node1: (min, max) time across ranks (ms):",
            f"node1:     forward-compute ................................: (40.{i % 9}, 41.5)",
            "node0: NCCL INFO chatter",
        ]
    lines = [x.replace("node0", a).replace("node1", b) for x in lines]
    path = tmp_path / "two-nodes.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    ds = [t for t in run["timers"] if t["source"] == "deepspeed"]
    by_rank = {r: [t["iteration"] for t in ds if t["rank"] == r] for r in (0, 1)}
    # node0 has no iteration line: its n blocks are iterations 1..n (one per iteration).
    assert by_rank[0] == list(range(1, n + 1))
    assert by_rank[1] == list(range(1, n + 1))
    megatron = [t["iteration"] for t in run["timers"] if t["source"] == "megatron"]
    assert megatron == list(range(1, n + 1))


@pytest.mark.parametrize(
    ("header", "line", "extra"),
    [
        ("max time across ranks (ms):", "forward-compute ......: {v}", "optimizer ......: 7{v}"),
        ("max time across ranks (ms):", "forward-compute ......: {v}", "optimizer ......: 1e+0{i}"),
        ("max time across ranks (ms):", "forward-compute ......: {v}", "optimizer ......: -{v}"),
        (
            "(min, max) time across ranks (ms):",
            "forward-compute ....: ({v}, 41.5)",
            "optimizer ....: ({v}, 9.{i})",
        ),
        ("times across ranks (ms):", "  forward-compute:", "  optimizer:"),
        # Whitespace that only the line path's text pattern matches (``\s``): an ASCII one
        # and a non-ASCII one between the two numbers.
        (
            "(min, max) time across ranks (ms):",
            "forward-compute ....: ({v}, 41.5)",
            "optimizer ....: ({v},\x1c9.{i})",
        ),
        (
            "(min, max) time across ranks (ms):",
            "forward-compute ....: ({v}, 41.5)",
            "optimizer ....: ({v},\u00a09.{i})",
        ),
    ],
)
def test_a_learned_timer_block_that_goes_on_is_read_whole(tmp_path, small_chunks, header, line,
                                                          extra):  # fmt: skip
    """A block printed in one piece is learned as a pattern; when the same block goes on with
    one more line of its stream (whatever byte that line ends with), the bulk path reads the
    block whole, as the line path does."""
    n = 2000  # past the set-up lines every line of which is read (``LATE_CONFIG_LINES``)
    lines = ["node1: training ..."]
    for i in range(1, n + 1):
        lines.append(
            f"node1:  iteration {i:8d}/{n + 10:8d} | consumed samples: {8 * i:12d} | "
            "elapsed time per iteration (ms): 84.7 | lm loss: 5.866232E+00 |"
        )
        pad = "" if header.startswith("times") else "    "
        lines += [f"node1: {header}", f"node1: {pad}{line.format(v=f'40.{i % 9}', i=i % 9)}"]
        if header.startswith("times"):
            lines.append(f"node1:     rank  0: 4{i % 9}.5")
        if i % 3 == 0:
            lines.append("node0: NCCL INFO chatter")
            lines.append(f"node1: {pad}{extra.format(v=f'5.{i % 7}', i=i % 9)}")
            if header.startswith("times"):
                lines.append(f"node1:     rank  0: 3{i % 9}.25")
        lines.append("node1: NCCL INFO Connected all rings")
    path = tmp_path / "blocks.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    blocks = [t for t in run["timers"] if t["source"] == "megatron"]
    assert len(blocks) == n
    names = [sorted(t["values_ms"]) for t in blocks]
    assert names[2] == ["forward-compute", "optimizer"] and names[0] == ["forward-compute"]


def test_iteration_lines_with_their_fields_in_another_order_keep_each_value(tmp_path):
    """Two iteration line forms with the same fields in another order, in one bulk step:
    each value stays with its field."""
    n = 8000  # most of them past the set-up lines (``LATE_CONFIG_LINES``)
    lines = ["node1: training ..."]
    for i in range(1, n + 1):
        first = f"consumed samples: {8 * i:12d}"
        second = f"elapsed time per iteration (ms): {80 + i % 7}.5"
        pair = (first, second) if i % 2 else (second, first)
        lines.append(
            f"node1:  iteration {i:8d}/{n + 10:8d} | {pair[0]} | {pair[1]} | lm loss: 5.8E+00 |"
        )
        lines.append("node1: NCCL INFO chatter")
    path = tmp_path / "orders.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    its = run["iterations"]
    assert len(its) == n
    assert [x["consumed_samples"] for x in its] == [8 * i for i in range(1, n + 1)]
    assert [x["elapsed_ms"] for x in its] == [80 + i % 7 + 0.5 for i in range(1, n + 1)]


# -- the keyword scan -------------------------------------------------------------------------


def _first_by_anchor(block: bytes, anchors, pos: int, end: int) -> int:
    """The keyword scan as a loop over every anchor byte (no switch to whole keywords)."""
    best = -1
    for anchor, checks in anchors:
        p = block.find(anchor, pos, end)
        while p >= 0:
            if not checks or any(p >= off and block.startswith(kw, p - off) for kw, off in checks):
                break
            p = block.find(anchor, p + 1, end)
        if p >= 0 and (best < 0 or p < best):
            best = p
    return best


_KW_PIECES = [
    "E", "T", "x", "xi", "xit", ")", "|", "K", "M", "*", "#", "Error", "Traceback", "Kill",
    "KILL", "exits", "ssh exited", "(ms)", "(s)", "MemAlloc", "Max_MA", "*** JOB", "NCCL INFO ",
    "NET/Socket ", "0x7f ", "\n", "iteration",
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_KW_PIECES), max_size=80), st.data(), st.sampled_from([1, 2, 8]))
def test_keyword_scan_equals_a_loop_over_anchor_bytes(pieces, data, misses):
    """Also when the scan searches a keyword whole after ``misses`` anchor bytes in a row."""
    block = "".join(pieces).encode()
    was = keywords._MISSES, keywords._DENSE_GAP
    keywords._MISSES, keywords._DENSE_GAP = misses, 1 << 20
    try:
        _check_keyword_scan(block, data)
    finally:
        keywords._MISSES, keywords._DENSE_GAP = was


def _check_keyword_scan(block: bytes, data) -> None:
    rare = keywords.Keywords(tuple(k for k in KW.keywords if k not in ("|", "(ms)", "(s)")))
    for kw, pipe in ((KW, False), (KW, True), (rare, False)):
        anchors = kw.pipe_anchors if pipe else kw.anchors
        pos = data.draw(st.integers(0, len(block)))
        # An end just after an anchor byte half of the time (a keyword cut by the end).
        cuts = [i + 1 for i in range(pos, len(block)) if block[i] in b"|)ETKM*#t"]
        end = data.draw(
            st.sampled_from(cuts)
            if cuts and data.draw(st.booleans())
            else st.integers(pos, len(block))
        )
        want = _first_by_anchor(block, anchors, pos, end)
        assert kw.first(block, pos, end, pipe, once=True) == want
        assert kw.first(block, pos, end, pipe) == want
        for step in range(pos, end, 7):  # successive calls over one buffer (remembered hits)
            assert kw.first(block, step, end, pipe) == _first_by_anchor(block, anchors, step, end)


# -- finishing a run: timer tables joined and sorted -----------------------------------------


def test_tables_joined_value_by_value_equal_tables_joined_by_arrays(tmp_path, monkeypatch):
    """Timer tables joined value by value give the runs that tables joined by their arrays
    (shared, of other scales and int widths) give."""
    import loggen

    from analysis.parse import columns

    logs = [*_logs(LAB_LOGS), *_logs(EXTERNAL), tmp_path / "ranks.log"]
    loggen.write_ranks(logs[-1], 0.3)
    logs.append(tmp_path / "dense.log")
    loggen.write_dense(logs[-1], 0.5, LAB_LOGS)
    fast = [[r.to_dict() for r in parse.parse_file(p)] for p in logs]

    def concat(self, other):  # value by value: no arrays shared
        for v in other:
            self.append(v)

    monkeypatch.setattr(columns.Column, "concat", concat)
    slow = [[r.to_dict() for r in parse.parse_file(p)] for p in logs]
    for p, a, b in zip(logs, fast, slow, strict=True):
        assert a == b, p.name


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("ab"),
            st.one_of(st.integers(0, 9), st.none(), st.integers(2**31 - 3, 2**31 + 3)),
        ),
        max_size=30,
    ),
    st.sampled_from([1, 2, 3, 1 << 16]),
)
@example([("a", 5), ("b", None), ("a", 2)], 1 << 16)
@example([("a", 1), ("a", 2), ("b", 3), ("a", 0), ("a", 4)], 2)
def test_timer_table_sorted_by_line_is_a_stable_sort(blocks, piece):
    """Blocks of two groups, each group's own blocks in or out of line order (a block with
    no line sorts as line 0), looked at a few blocks at a time or all at once."""
    from analysis.parse import records
    from analysis.parse.records import TimerBlock, TimerTable

    given_blocks = [
        TimerBlock("deepspeed", {name: float(i)}, None, i, line)
        for i, (name, line) in enumerate(blocks)
    ]
    table = TimerTable(given_blocks)
    old = records._BLOCKS_AT_A_TIME
    records._BLOCKS_AT_A_TIME = piece
    try:
        table.sort_by_line()
    finally:
        records._BLOCKS_AT_A_TIME = old
    assert list(table) == sorted(given_blocks, key=lambda b: b.line or 0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=32, max_size=80),  # (7/8 of the blocks or more)
    st.lists(st.one_of(st.integers(0, 45), st.none()), min_size=1, max_size=2),
    st.lists(st.one_of(st.integers(0, 45), st.none()), max_size=2),
)
@example(list(range(1, 33)), [5], [0, 33])
@example([3] * 32, [3, None], [3])
def test_timer_table_sorted_by_line_inserts_into_a_stretch_in_order(stretch, before, after):
    """Most blocks already in line order (DeepSpeed's, one a step) and a few of another group
    printed before and after them (Megatron's): the few are inserted where a stable sort puts
    them, equal lines kept in table order."""
    from analysis.parse.records import TimerBlock, TimerTable

    given_blocks = (
        [TimerBlock("megatron", {"fwd": float(i)}, None, i, line) for i, line in enumerate(before)]
        + [TimerBlock("deepspeed", {"step": float(i)}, 0, i, line) for i, line in
           enumerate(sorted(stretch))]
        + [TimerBlock("megatron", {"fwd": -float(i)}, None, i, line) for i, line in
           enumerate(after)]
    )  # fmt: skip
    table = TimerTable(given_blocks)
    table.sort_by_line()
    assert list(table) == sorted(given_blocks, key=lambda b: b.line or 0)


_ODD_HEADS = [
    "node1: abc",  # a word glued to "iteration"
    "node1: a | ",
    "node1: iteration 7/ 9 ",
    "node1: [Rank 1] time (ms) ",
    "node1: [Rank 1] memory (MB) ",
    "node1: # run outcome ",
    "node1: \x07 ",
    "node1: é ",
    "node1: ",  # (no odd head: the line as printed, for contrast)
    "\tnode1:  ",
    "node1: node0: ",
    "node1: [default0]: x ",
]


@pytest.mark.parametrize("chunks", ["default", "small"])
def test_iteration_heads_the_line_path_reads_otherwise(tmp_path, monkeypatch, chunks):
    """Iteration lines whose text before ``iteration`` makes the line path read them otherwise
    (a glued word, a bar, another keyword, a control or non-ASCII byte, odd prefixes), among
    thousands of plain ones the bulk path takes: both paths give the same runs."""
    if chunks == "small":
        monkeypatch.setattr(parse, "CHUNK_BYTES", 4096)
        monkeypatch.setattr(bulk_path, "SEG_START", 512)
        monkeypatch.setattr(bulk_path, "SEG_MIN", 256)
        monkeypatch.setattr(bulk_path, "SEG_MAX", 2048)
    n = 2400
    lines = ["node0: training ...", "node1: training ..."]
    for i in range(1, n + 1):
        head = _ODD_HEADS[(i // 20) % len(_ODD_HEADS)] if i % 20 == 10 else "node1:  "
        lines += [
            f"node0: [Rank 0] time (ms) | fwd: {10 + i % 7}.5 | bwd: 20.25 | step: 3.0",
            f"{head}iteration {i:8d}/{n + 10:8d} | consumed samples: {8 * i:12d} | "
            f"elapsed time per iteration (ms): 84.7 | lm loss: 5.866232E+00 | loss scale: 1.0 "
            "| number of skipped iterations:   0 | number of nan iterations:   0 |",
            "node0: NCCL INFO chatter",
        ]
    path = tmp_path / "odd-heads.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    assert len(run["iterations"]) > n // 2


def test_blocks_of_one_source_read_in_pieces(monkeypatch):
    """``TimerTable.blocks_of`` converts a few blocks at a time: the blocks of the source,
    in order, with their values, for one group and for several."""
    from analysis.parse import records
    from analysis.parse.records import TimerBlock, TimerTable

    blocks = [
        TimerBlock(
            "deepspeed" if i % 3 else "megatron",
            {"fwd" if i % 2 else "bwd": float(i)},
            i % 4 or None,
            i,
            10 * i,
        )
        for i in range(40)
    ]
    table = TimerTable(blocks)
    monkeypatch.setattr(records, "_BLOCKS_AT_A_TIME", 3)
    for source in ("deepspeed", "megatron"):
        assert list(table.blocks_of(source)) == [b for b in blocks if b.source == source]
    only = TimerTable([b for b in blocks if b.source == "megatron" and "bwd" in b.values_ms])
    assert list(only.blocks_of("megatron")) == list(only)


_ALLOC_LINES = [
    "node0: [Rank 0] MemAllocated={a}GB MaxMemAllocated={b}GB CA=34.6GB MaxCA=36.0GB",
    "node0: MemAllocated={a} GB MaxMemAllocated={b} GB",  # no rank
    "node0: [Rank 0] MemAllocated=abc MaxMemAllocated=",  # no values: read on
    "node0: [Rank 0] MemAllocated={a}GB MaxMemAllocated={b}GB iteration",
    "node0: [Rank 3] MemAllocated={a}GB MaxMemAllocated={b}GB time (ms)",
    "node0: [Rank 0] MemAllocated={a}GB MaxMemAllocated={b}GB memory (MB)",
    "node0: [Rank 0] MemAllocated={a}GB é MaxMemAllocated={b}GB",
]


@pytest.mark.parametrize("chunks", ["default", "small"])
def test_deepspeed_memory_lines_read_in_bulk_as_the_line_path_reads_them(
    tmp_path, monkeypatch, chunks
):
    """DeepSpeed's ``MemAllocated=`` lines every few steps: once a few were read, the bulk
    path reads them, each form as the line path does (a line another branch reads, or one
    whose values do not match, is left to the line path)."""
    if chunks == "small":
        monkeypatch.setattr(parse, "CHUNK_BYTES", 4096)
        monkeypatch.setattr(bulk_path, "SEG_START", 512)
        monkeypatch.setattr(bulk_path, "SEG_MIN", 256)
        monkeypatch.setattr(bulk_path, "SEG_MAX", 2048)
    n = 12000  # most of them past the set-up lines (``LATE_CONFIG_LINES``)
    lines = ["node0: training ...", "node1: training ..."]
    for i in range(1, n + 1):
        lines += [
            f"node0: [Rank 0] time (ms) | fwd: {10 + i % 7}.5 | bwd: 20.25 | step: 3.0",
            f"node1:  iteration {i:8d}/{n + 10:8d} | consumed samples: {8 * i:12d} | "
            f"elapsed time per iteration (ms): 84.7 | lm loss: 5.866232E+00 |",
        ]
        if i % 3 == 0:
            form = _ALLOC_LINES[(i // 3) % len(_ALLOC_LINES)]
            lines.append(form.format(a=f"{i % 50}.{i % 7}", b=f"{i % 60}.5"))
    path = tmp_path / "alloc.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    got = [m for m in run["memory_other"] if m["kind"] == "deepspeed"]
    assert len(got) > n // 3 * 3 // len(_ALLOC_LINES)


def _iteration_line(i: int, total: int, prefix: str = "node1: ") -> str:
    """A Megatron iteration line of a long two-node run."""
    return (
        f"{prefix} iteration {i:8d}/{total:8d} | consumed samples: {8 * i:12d} | "
        "elapsed time per iteration (ms): 84.7 | lm loss: 5.866232E+00 |"
    )


_LONG_RUN = 3000
"""Iterations of a long two-node run: past the set-up lines every line of which is read
(``LATE_CONFIG_LINES``)."""


def _long_run(path: Path, lines_of: Callable[[int], list[str]]) -> dict:
    """The run of a long two-node log whose iteration ``i`` prints ``lines_of(i)``, read both
    ways (``_three_ways``)."""
    lines = ["node0: training ...", "node1: training ..."]
    for i in range(1, _LONG_RUN + 1):
        lines += lines_of(i)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    return run


# Lines holding a keyword the lines read in bulk do not need (an error, a kill, a launcher
# exit): among the lines a bulk step takes (where it changes nothing: ``Core._dispatch``
# reads them by their kind first), and on their own, where the line path must read them.
_DIRTY_LINES = {
    "deepspeed name": ["node1: [Rank 0] time (ms) | fwd: {v} | Killed: 2.0"],
    "deepspeed prefix": ["Killed: [Rank 0] time (ms) | fwd: {v} | bwd: 2.0"],
    "iteration head": [
        "node1: Killed iteration {i:8d}/{t:8d} | consumed samples: {s:12d} | "
        "elapsed time per iteration (ms): {v} | lm loss: 5.866232E+00 |"
    ],
    "timer line": [
        "node1: (min, max) time across ranks (ms):",
        "node1:     forward-compute ....: ({v}, 41.5)",
        "node1:     Killed ....: ({v}, 9.0)",
    ],
    "memory prefix": [
        "Killed: [Rank 0] (after {i} iterations) memory (MB) | allocated: {v} | "
        "max allocated: 2.5 | reserved: 3.0 | max reserved: 4.0"
    ],
    "memalloc": ["node1: [Rank 0] MemAllocated={v}GB Killed MaxMemAllocated=2.5GB"],
    "error closing a block": [
        "node1: (min, max) time across ranks (ms):",
        "node1:     forward-compute ....: ({v}, 41.5)",
        "node1: RuntimeError: boom {i}",
    ],
    "traceback inside a block": [
        "node1: (min, max) time across ranks (ms):",
        "node0: Traceback (most recent call last):",
        "node1:     forward-compute ....: ({v}, 41.5)",
    ],
    "killed": ["node0: Killed"],
    "see_memory_usage": [
        "node0: [2026] [INFO] [utils.py:1] MA {v} GB         Max_MA 2.5 GB         CA 3.0 GB"
        "         Max_CA 4 GB"
    ],
}


@pytest.mark.parametrize("form", sorted(_DIRTY_LINES))
def test_lines_holding_other_keywords_read_as_the_line_path_reads_them(tmp_path, form):
    """Every few iterations lines holding a keyword that lines read in bulk do not need:
    both paths give the same runs."""
    n = _LONG_RUN

    def lines_of(i: int) -> list[str]:
        out = [
            f"node0: [Rank 0] time (ms) | fwd: {10 + i % 7}.5 | bwd: 20.25 | step: 3.0",
            _iteration_line(i, n + 10),
            "node1: (min, max) time across ranks (ms):",
            f"node1:     forward-compute ....: (4{i % 9}.5, 41.5)",
            f"node1: [Rank 0] MemAllocated={i % 50}.5GB MaxMemAllocated=2.5GB",
            "node0: NCCL INFO chatter",
        ]
        # From halfway, when the bulk path reads the rest (a failure may make the line path
        # read all after it).
        if i % 5 == 0 and i > n // 2:
            v = f"{i % 50}.{i % 7}"
            out += [x.format(i=i, t=n + 10, s=8 * i, v=v) for x in _DIRTY_LINES[form]]
        return out

    run = _long_run(tmp_path / "dirty.log", lines_of)
    assert len(run["iterations"]) == n


_LINE_ENDS = {"bare": "", "CR": "\r", "space": " ", "tabs": " \t \t", "many spaces": " " * 9}


@pytest.mark.parametrize("others", [1, 30])
@pytest.mark.parametrize("form", sorted(_LINE_ENDS))
def test_iteration_lines_with_whitespace_after_the_last_bar_are_read_in_bulk(
    tmp_path, monkeypatch, form, others
):
    """Iteration lines that end in whitespace after their last ``|`` (a CR of a log written on
    Windows, trailing spaces: the few the bulk path steps back over one by one, and more) are
    read in bulk, as the line path reads them; among few other lines (a search of the text
    finds them) and among many (a search of each line that ends in ``|``)."""
    n, end = _LONG_RUN, _LINE_ENDS[form]

    def lines_of(i: int, total: int = n + 10) -> list[str]:
        return [
            _iteration_line(i, total) + end,
            f"node0: [Rank 0] time (ms) | fwd: {10 + i % 7}.5 | bwd: 20.25 | step: 3.0",
            *[f"node0: NCCL INFO chatter of channel {c:02d}/{others}" for c in range(others)],
        ]

    run = _long_run(tmp_path / "ends.log", lines_of)
    assert len(run["iterations"]) == n
    assert run["iterations"][-1]["iteration"] == n


_ODD_VALUES = [
    "1.2.3",
    "1e",
    "--1",
    "+",
    ".",
    "e5",
    "1e5",
    "-.5",
    "+5.",
    "1E+05",
    "5-",
    "1e5e5",
    "1e999",
]
"""Values of an iteration line made of the bytes of numbers: some read as numbers, some not."""


@pytest.mark.parametrize("value", _ODD_VALUES)
def test_iteration_values_made_of_number_bytes_read_as_the_line_path_reads_them(tmp_path, value):
    """An iteration line's learned pattern takes any run of the bytes of a number as a value,
    and ``float()`` then decides: lines whose value is not a number are read by the line path,
    in bulk steps as in the line path."""
    n = _LONG_RUN

    def lines_of(i: int) -> list[str]:
        v = value if i % 7 == 0 and i > n // 2 else f"{80 + i % 9}.5"
        return [
            f"node1:  iteration {i:8d}/{n + 10:8d} | consumed samples: {8 * i:12d} | "
            f"elapsed time per iteration (ms): {v} | lm loss: 5.866232E+00 |",
            f"node0: [Rank 0] time (ms) | fwd: {10 + i % 7}.5 | bwd: 20.25",
        ]

    run = _long_run(tmp_path / "odd.log", lines_of)
    assert run["iterations"][-1]["iteration"] == n
    odd = [it for it in run["iterations"] if it["iteration"] % 7 == 0 and it["iteration"] > n // 2]
    try:
        want = float(value)
    except ValueError:
        want = math.nan
    got = {it["elapsed_ms"] for it in odd}
    # A number is read; a value that is none, or not finite, is not.
    assert got == ({want} if math.isfinite(want) else {None})


_DS_HEADS = {
    # Launcher prefixes of three widths, interleaved.
    "prefix widths": [
        "n1: [Rank 1] time (ms) | fwd: {v} | bwd: 20.25",
        "node22: [Rank 22] time (ms) | fwd: {v} | bwd: 21.25",
        "gpu-node-333: [Rank 333] time (ms) | fwd: {v} | bwd: 22.25",
    ],
    # Ranks of 1 to 7 digits, and of 8 (which the line path reads).
    "rank widths": [
        "node1: [Rank 5] time (ms) | fwd: {v} | bwd: 20.25",
        "node1: [Rank 4321] time (ms) | fwd: {v} | bwd: 21.25",
        "node1: [Rank 7654321] time (ms) | fwd: {v} | bwd: 22.25",
        "node1: [Rank 87654321] time (ms) | fwd: {v} | bwd: 23.25",
    ],
    # No prefix, then another line with the head twice at two offsets the step looks at.
    "two heads": [
        "[Rank 0] time (ms) | fwd: {v} | bwd: 20.25",
        "node1: [Rank 1] time (ms) | fwd: {v} | bwd: 21.25",
        "[Rank 2] time (ms) | fwd: {v} |[Rank 3] time (ms) | bwd: 22.25",
    ],
}


@pytest.mark.parametrize("form", sorted(_DS_HEADS))
def test_deepspeed_lines_are_read_in_bulk_at_every_offset_and_rank_width(tmp_path, form):
    """DeepSpeed's lines are looked for at the offsets of ``[Rank`` seen before: prefixes of
    several widths, ranks of several widths, a line without a prefix are all read in bulk, as
    the line path reads them."""
    n, heads = _LONG_RUN, _DS_HEADS[form]

    def lines_of(i: int) -> list[str]:
        v = f"{10 + i % 7}.5"
        return [_iteration_line(i, n + 10), *(h.format(v=v) for h in heads), "n1: NCCL INFO"]

    run = _long_run(tmp_path / "heads.log", lines_of)
    ds = [t for t in run["timers"] if t["source"] == "deepspeed"]
    ranks = {t["rank"] for t in ds}
    assert len(ds) == n * len(heads)
    assert ranks == {int(h.split("[Rank ")[1].split("]")[0]) for h in heads}


def _rank_ms(i: int, t: int, r: int) -> str:
    """Rank ``r``'s time of timer ``t`` at iteration ``i``: the lowest and the highest at
    other ranks from one iteration to the next, some of them printed by two ranks."""
    return f"{100 + 3 * t + (r * 37 + i * 11) % (30 + 7 * t)}.{(r + i) % 10}"


def _all_ranks_head(i: int, n: int) -> list[str]:
    """Rank 0's DeepSpeed line, then the last rank's iteration line ``i`` of a run of ``n``
    and the header of its ``times across ranks`` block."""
    return [
        f" 0: [Rank 0] time (ms) | fwd: {10 + i % 7}.5 | bwd: 20.25 | step: 3.0",
        _iteration_line(i, n + 10, prefix="63: "),
        "63: times across ranks (ms):",
    ]


@pytest.mark.parametrize("ranks", [64, 4])
def test_rank_blocks_with_zeros_of_both_signs_read_as_the_line_path_reads_them(tmp_path, ranks):
    """``times across ranks`` of a timer that did not run, printed ``0.00`` by some ranks and
    ``-0.00`` by others: the (min, max) the bulk path keeps are the line path's, each zero's
    sign too (``min`` keeps the first of equal values; NumPy's reduction need not), in blocks
    of many values (reduced with NumPy) and of a few (with Python's ``min`` and ``max``)."""
    n, rs = 300, range(ranks)
    lines = [" 0: training ...", "63: training ..."]
    for i in range(1, n + 1):
        lines += [
            *_all_ranks_head(i, n),
            "63:   forward-backward:",
            *[f"63:      rank {r:2d}: {_rank_ms(i, 0, r)}" for r in rs],
            "63:   optimizer:",
            # (-0.00 first or last: NumPy's reduction and ``min`` keep other ones.)
            *[
                f"63:      rank {r:2d}: {'-0.00' if r == i % 2 * (ranks - 1) else '0.00'}"
                for r in rs
            ],
        ]
    path = tmp_path / "zeros.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    (line,) = [r.to_dict() for r in parse.parse_file(path, bulk=False)]
    got = [t["values_ms"] for t in run["timers"] if t["source"] == "megatron"]
    want = [t["values_ms"] for t in line["timers"] if t["source"] == "megatron"]
    assert len(got) == n
    assert repr(got) == repr(want)  # (``==`` takes -0.0 for 0.0)
    assert {repr(v["optimizer"][0]) for v in got} == {"0.0", "-0.0"}


def _blocks_read(path: Path, lines: list[str], n: int) -> None:
    """``lines`` written to ``path`` read as the line path reads them, its ``n`` Megatron
    blocks (iteration 11's ``forward-backward`` (22.5, 34.25))."""
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    megatron = [t for t in run["timers"] if t["source"] == "megatron"]
    assert len(megatron) == n
    assert megatron[10]["values_ms"]["forward-backward"] == [22.5, 34.25]  # iteration 11


# What comes after every 7th block of node1 in a pdsh log (rank 0's DeepSpeed line of node0 and
# then node1's next iteration line come after every block): node1's lines that close it for
# certain or may not, node0's lines, lines of no stream that look like node1's.
_AFTER_HOST_BLOCK = {
    "nothing": None,
    "its NCCL line ending in a digit": "node1: node1:1070:1100 [0] NCCL INFO via NET/Socket/0",
    "its line after a tab": "node1:\tNCCL INFO Connected all rings",
    "its timer line": "node1:     optimizer-inner ........................: (1.25, 2.5)",
    # (node1|node2's line does not close node1's block: the timer line after it goes on it.)
    "its line with a second label, then its timer line": "node1: node2: NCCL INFO ring\n"
    "node1:     optimizer-inner ........................: (1.25, 2.5)",
    "its line with an srun label, then its timer line": "node1:  12: NCCL INFO ring\n"
    "node1:     optimizer-inner ........................: (1.25, 2.5)",
    "its line that is not ASCII": "node1: \u00e9tape NCCL INFO",
    "its line of digits": "node1: 12345",
    "its empty line": "node1: ",
    "a line indented before its label": "  node1: NCCL INFO Connected all rings",
    # (Another host of a label as long as node1's, then node1's timer line: it goes on.)
    "another host's line, then its timer line": "node9: (shared) NCCL INFO ring\n"
    "node1:     optimizer-inner ........................: (1.25, 2.5)",
    "node0's timer line": "node0:     optimizer-inner ........................: (1.25, 2.5)",
    "node0's line inside the block": "node0: NCCL INFO Connected all rings",
}


@pytest.mark.parametrize("host", ["node1", "gpu-node-0012.cluster"])
@pytest.mark.parametrize("after", sorted(_AFTER_HOST_BLOCK))
def test_blocks_of_one_host_are_read_at_once(tmp_path, monkeypatch, after, host):
    """Two nodes through pdsh: node1's iteration line and ``(min, max)`` block, node0's
    DeepSpeed line, every iteration.  node1's blocks of a step are read at once (one pattern,
    its next line found among the lines that start with its label), up to one whose next line
    may not close it for certain or may not be node1's; each reads as the line path reads it."""
    n = 8000
    lines = ["node0: training ...", "node1: training ..."]
    for i in range(1, n + 1):
        block = [
            "node1: (min, max) time across ranks (ms):",
            f"node1:     forward-backward .......................: (2{i % 9}.5, 3{i % 7}.25)",
            f"node1:     optimizer ..............................: ({i % 5}.5, 9.{i % 10})",
        ]
        extra = _AFTER_HOST_BLOCK[after] if i % 7 == 0 else None
        if extra is not None and after == "node0's line inside the block":
            block.insert(2, extra)
            extra = None
        lines += [
            _iteration_line(i, n + 10, prefix="node1: "),
            *block,
            f"node0: [Rank 0] time (ms) | fwd: {10 + i % 7}.5 | bwd: 20.25 | step: 3.0",
            *([extra] if extra is not None else []),
        ]
    # (A label longer than a word, too; node9 as long as it.)
    lines = [x.replace("node1", host).replace("node9", host[:-1] + "9") for x in lines]
    _blocks_read(tmp_path / "pdsh.log", lines, n)


# Lines inside every 7th block of the 64-rank log: none; another rank's (srun prints a long
# block in pieces, between which other ranks' lines come); one of the block's own rank with
# its label spelled otherwise (the line path reads it as the block's own: it closes it); one
# of another rank that is too long (the line path truncates it).
_INSIDE = {
    "nothing": None,
    "another rank's line": " 5: UserWarning: c10d::allreduce_: an autograd kernel was not found",
    "its own rank's line": " 63:  NCCL INFO Connected all rings",
    "an over-long line": " 5: " + "x" * 70_000,
}


@pytest.mark.parametrize("inside", sorted(_INSIDE))
def test_blocks_of_every_rank_are_read_in_bulk(tmp_path, inside):
    """64 ranks with ``--timing-log-option all``: the last rank prints its iteration line,
    then a ``times across ranks`` block of every rank's time for each timer, and rank 0's
    DeepSpeed line comes before the next iteration line, which closes the block.  A block is
    one record of 131 lines (195 here): the bulk path takes such a log (it is not chatter)
    and reads the blocks by the pattern learned from the first one (the line that closes it
    came after another stream's line), with other ranks' lines among a block's lines too, as
    the line path reads them."""
    n, ranks = 300, 64
    lines = [" 0: training ...", "63: training ..."]
    for i in range(1, n + 1):
        lines += _all_ranks_head(i, n)
        # (A timer printed twice in a block: the line path takes the min and max of both.)
        for t, name in enumerate(("forward-backward", "optimizer", "forward-backward")):
            lines.append(f"63:   {name}:")
            lines += [f"63:      rank {r:2d}: {_rank_ms(i, t, r)}" for r in range(ranks)]
        if _INSIDE[inside] and i % 7 == 0:
            lines.insert(len(lines) - 100 - i % 50, _INSIDE[inside])
    path = tmp_path / "all-ranks.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    megatron = [t for t in run["timers"] if t["source"] == "megatron"]
    if inside == "its own rank's line":
        return  # (the blocks it cuts are read line by line: equal is all there is to check)
    assert [t["iteration"] for t in megatron] == list(range(1, n + 1))
    for t in megatron:
        for name, ks in (("forward-backward", (0, 2)), ("optimizer", (1,))):
            ms = [float(_rank_ms(t["iteration"], k, r)) for k in ks for r in range(ranks)]
            assert t["values_ms"][name] == [min(ms), max(ms)]


# Lines after every 7th timer block of one node's own log (no launcher prefixes): the line
# right after a block decides whether it closes there.
_AFTER_BARE_BLOCK = {
    "nothing": None,
    "an empty line": "",
    "a line ending in a digit": "[W1122 ProcessGroupNCCL.cpp:1232] Warning: step 12",
    "another stream's line": "node0: NCCL INFO Connected all rings",
    "an srun label, then a timer line": " 12: NCCL INFO Connected all rings\n"
    "    optimizer-inner ................................: (1.25, 2.5)",
    "a line that is not ASCII": "\u00a0NCCL INFO Connected all rings",
    "a timer line": "    optimizer-inner ................................: (1.25, 2.5)",
    "a tab": "\tNCCL INFO Connected all rings",
    "a timer line indented by one space": " optimizer-inner ..........: (1.25, 2.5)",
    # Lines of another stream do not close the block: its next line does.
    "another stream's line, then a timer line": "node0: NCCL INFO Connected all rings\n"
    "    optimizer-inner ................................: (1.25, 2.5)",
    # (The line path reads text: its label pattern takes a no-break space for whitespace.)
    "a label after a no-break space, then a timer line": "\u00a012: NCCL INFO ring\n"
    "    optimizer-inner ................................: (1.25, 2.5)",
    "a value out of range": "",
}


@pytest.mark.parametrize("after", sorted(_AFTER_BARE_BLOCK))
def test_blocks_of_one_bare_stream_are_read_at_once(tmp_path, monkeypatch, after):
    """One node's own log at log interval 1: an iteration line, then its ``(min, max)`` block,
    closed by the next iteration line.  The blocks of a step are read at once (one pattern,
    no launcher prefixes), up to one the line after which does not close for certain; each
    reads as the line path reads it."""
    n = 3000
    lines = ["training ..."]
    for i in range(1, n + 1):
        lines += [
            _iteration_line(i, n + 10, prefix=""),
            "(min, max) time across ranks (ms):",
            f"    forward-backward ...............................: (2{i % 9}.5, 3{i % 7}.25)",
            f"    optimizer ......................................: ({i % 5}.5, 9.{i % 10})",
        ]
        if _AFTER_BARE_BLOCK[after] is not None and i % 7 == 0:
            if after == "a value out of range":
                lines[-1] = lines[-1].replace("9.", "1e999")
            else:
                lines.append(_AFTER_BARE_BLOCK[after])
    _blocks_read(tmp_path / "node1.log", lines, n)


# PipelineEngine step lines of other forms, every 11th step.
# PipelineEngine step lines of other forms, every 11th step: forms the pattern of a step reads
# as ``to_float`` does (a value that is not finite, no samples/sec, text and tabs around), and
# each form that sends a step's step lines to be read one by one.
_STEPS_FORMS = {
    "read at once": (
        "node0: steps: {i} loss: nan iter time (s): 0.250 samples/sec: 32.000",
        "node0: steps: {i} loss: 3.5000 iter time (s): 0.250",
        "node0: [Rank 0] steps:\t{i}\tloss: inf iter time (s): 1e-1 samples/sec: 3.2e1 x",
    ),
    "a value float() does not read": (
        "node0: steps: {i} loss: 3.5000 iter time (s): abc samples/sec: 32.000",
    ),
    "a comma": ("node0: steps: {i} loss: 1,5 iter time (s): 0.250 samples/sec: 32.000",),
    "an iteration line": (
        "node0: steps: {i} loss: 3.5 iteration {i}/ 99999 | iter time (s): 0.25 samples/sec: 1.0",
    ),
    "a carriage return": ("node0: steps: {i} loss: 3.5 iter time (s): 0.25 samples/sec: 1.0\r",),
    "two records": (
        "node0: steps: {i} loss: 3.5 iter time (s): 0.2 steps: {i} loss: 3.5 iter time (s): 0.3",
    ),
    "no iter time": ("node0: steps: {i} loss: 3.5000 samples/sec: 32.000",),
    "a step of 19 digits or more": (
        "node0: steps: 9{i:019d} loss: 3.5 iter time (s): 0.25",
        "node0: steps: {i:019d} loss: 3.5 iter time (s): 0.25",
    ),
}


@pytest.mark.parametrize("forms", sorted(_STEPS_FORMS))
def test_pipeline_step_lines_of_every_step_are_read_in_bulk(tmp_path, monkeypatch, forms):
    """A pipeline run at ``steps_per_print`` 1 and log interval 1 (what the launcher writes
    for PP with ``--log-interval 1``): rank 0's DeepSpeed line and ``steps:`` line, then the
    last stage's iteration line, every step.  The step lines are read in bulk (each ended a
    bulk step, 400 B of progress for a look at 16 KB or more: 1.4 MB/s), their forms as the
    line path reads them, and each DeepSpeed line goes with the steps before it."""
    n = 6000
    lines = ["node0: training ...", "node1: training ..."]
    for i in range(1, n + 1):
        step = f"node0: steps: {i} loss: {3 + i % 97 / 100:.4f} iter time (s): 0.{200 + i % 50} "
        step += f"samples/sec: {34 + i % 13 / 10:.3f}"
        if i % 11 == 0:
            step = _STEPS_FORMS[forms][(i // 11) % len(_STEPS_FORMS[forms])].format(i=i)
        lines += [
            f"node0: [Rank 0] time (ms) | fwd_microstep: {10 + i % 7}.5 | bwd_microstep: 20.25",
            step,
            _iteration_line(i, n + 10),
        ]
    path = tmp_path / "pp.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    steps = run["pipeline_steps"]
    if forms not in (
        "an iteration line",
        "two records",
        "a step of 19 digits or more",
        "no iter time",
    ):
        assert [s["step"] for s in steps] == list(range(1, n + 1))  # (the others: as read)
    assert steps[1] == {"step": 2, "loss": 3.02, "iter_ms": 202.0, "samples_per_s": 34.2,
                        "line": 7}  # fmt: skip


def test_bulk_steps_that_end_at_once_hand_stretches_to_the_line_path(tmp_path):
    """A line the bulk path does not take every other line: each bulk step would take one
    line for a look at many; the line path reads stretches of them instead, as it reads
    them."""
    n = 20000
    lines = ["node1: training ..."]
    for i in range(1, n + 1):
        lines += [_iteration_line(i, n + 10), f"node1: barrier took 0.{i % 10} (s)"]
    path = tmp_path / "short.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    assert len(run["iterations"]) == n


@pytest.mark.parametrize("form", ["two writes", "one write", "CR"])
def test_mpirun_tagged_logs_are_read_in_bulk(tmp_path, form):
    """``mpirun --tag-output``: every write of a rank tagged (``python -u`` writes a line's
    text, then its newline: the tag twice on one physical line).  The lines put back together
    are read in bulk (the tag is a launcher prefix: each rank a stream, its timer blocks closed
    by its own next line), with a line cut by another rank's write every 50 iterations.  All
    as ``parse_lines`` reads them."""
    n = 3000
    tag = "[1,{}]<stdout>:".format
    end = {"two writes": tag(1), "one write": "", "CR": "\r" + tag(1) + "\r"}[form]
    lines = [tag(0) + "training ...", tag(1) + "training ..."]
    for i in range(1, n + 1):
        ds = f"[Rank 0] time (ms) | fwd: {10 + i % 7}.5 | bwd: 20.25 | step: 3.0"
        it = _iteration_line(i, n + 10, prefix="")
        if i % 50 == 0:  # rank 1's line cut by rank 0's write
            lines.append(tag(1) + it[:40] + tag(0) + ds + tag(0))
            lines.append(tag(1) + it[40:] + tag(1))
        else:
            lines += [tag(0) + ds + tag(0), tag(1) + it + end]
        lines += [
            tag(1) + "(min, max) time across ranks (ms):" + end,
            tag(1) + f"    forward-backward .......: (2{i % 9}.5, 3{i % 7}.25)" + end,
        ]
    path = tmp_path / "tagged.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    assert [it["iteration"] for it in run["iterations"]] == list(range(1, n + 1))
    assert sum(t["source"] == "megatron" for t in run["timers"]) == n


_MEM_FORMS = {
    "plain": "",
    "no iteration count": " {r:2d}: [Rank {r}] memory (MB) | allocated: 1.5 | max allocated: 2.5",
    "a value that is not a number": " {r:2d}: [Rank {r}] (after {i} iterations) memory (MB) | "
    "allocated: nan | max allocated: 2.5 | reserved: 3.0 | max reserved: 4.0",
    "an exponent": " {r:2d}: [Rank {r}] (after {i} iterations) memory (MB) | "
    "allocated: 2e3 | max allocated: 2.5 | reserved: 3.0 | max reserved: 4.0",
    "fields in another order": " {r:2d}: [Rank {r}] (after {i} iterations) memory (MB) | "
    "reserved: 3.0 | allocated: 1{r}.5 | max reserved: 4.0 | max allocated: 2.5",
    "another field": " {r:2d}: [Rank {r}] (after {i} iterations) memory (MB) | "
    "allocated: 1.5 | cached: 2.5",
    "non-ASCII": " {r:2d}: [Rank {r}] (after {i} iterations) memory (MB) | "
    "allocated: 1.5 | max allocated: 2.5 | réserved: 3.0",
    # (One piece for the line path: its key ``allocated: 1.5 max allocated``.)
    "no bar between fields": " {r:2d}: [Rank {r}] (after {i} iterations) memory (MB) | "
    "allocated: 1.5 max allocated: 2.5",
}


@pytest.mark.parametrize("form", sorted(_MEM_FORMS))
def test_memory_reports_of_many_ranks_read_in_bulk_as_the_line_path_reads_them(
    tmp_path, monkeypatch, form
):
    """Megatron's memory report of each of 64 ranks every few iterations: read in bulk, and
    with one report of another form among them, as the line path reads them."""
    import loggen

    n, ranks = 600, 64
    lines = [f"{r:2d}: training ..." for r in range(ranks)]
    for i in range(1, n + 1):
        lines.append(
            f" 0:  iteration {i:8d}/{n + 10:8d} | consumed samples: {8 * i:12d} | "
            "elapsed time per iteration (ms): 84.7 | lm loss: 5.866232E+00 |"
        )
        if i % 2 == 0:
            for r in range(ranks):
                mb = (f"{r}{i % 7}.{i % 10}", f"{r + i}.5", f"3{r}.0", f"{i}.25")
                lines.append(loggen.memory_report(r, i, mb))
            if i % 50 == 0 and _MEM_FORMS[form]:
                lines.append(_MEM_FORMS[form].format(r=i % ranks, i=i))
    path = tmp_path / "memory.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    assert len(run["memory"]) >= n // 2 * ranks
    first = run["memory"][ranks]  # rank 0 after iteration 4
    assert (first["rank"], first["after_iteration"], first["allocated_mb"]) == (0, 4, 4.4)


def test_memory_reports_that_start_late_are_read_in_bulk(tmp_path, monkeypatch):
    """Bulk steps stop looking for memory reports after some found none (most runs print one),
    and look again once the line path has read one: reports of 64 ranks every other
    iteration that start after megabytes of other lines are read in bulk as well."""
    import loggen

    n, ranks, late = 4300, 64, 4000
    lines = [f"{r:2d}: training ..." for r in range(ranks)]
    for i in range(1, n + 1):
        lines.append(
            f" 0:  iteration {i:8d}/{n + 10:8d} | consumed samples: {8 * i:12d} | "
            "elapsed time per iteration (ms): 84.7 | lm loss: 5.866232E+00 |"
        )
        lines += [f"{r:2d}: [Rank {r}] time (ms) | fwd: {10 + i % 7}.5 | bwd: 2.25" for r in (0, 1)]
        lines += [f"{r:2d}: NCCL INFO Channel 00/0 : 0[0] -> 1[0] via NET/Socket/0" for r in (0, 1)]
        if i > late and i % 2 == 0:
            for r in range(ranks):
                lines.append(loggen.memory_report(r, i, (f"{r}.5", f"{i}.5", "3.0", "4.25")))
    path = tmp_path / "late.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = _three_ways(path)
    assert len(run["memory"]) == (n - late) // 2 * ranks


def test_deepspeed_lines_of_one_shape_each_keep_their_own_values(tmp_path):
    """Lines of one shape (the line without its digits) whose numbers would even out over a
    group: one with a digit in a name, one with a value without any.  Neither is read in bulk
    with another line's numbers."""
    n = _LONG_RUN

    def lines_of(i: int) -> list[str]:
        out = [
            f"node0: [Rank 0] time (ms) | fwd: {10 + i % 7} | bwd: {i % 5}",
            _iteration_line(i, n + 10),
        ]
        if i % 100 == 0:
            out += [
                "node0: [Rank 0] time (ms) | fwd1: 2 | bwd: 3",
                "node0: [Rank 0] time (ms) | fwd: 5 | bwd: ",
            ]
        return out

    run = _long_run(tmp_path / "shapes.log", lines_of)
    assert len([t for t in run["timers"] if t["source"] == "deepspeed"]) >= n


def test_a_line_of_a_timer_block_printed_in_one_piece_is_read_as_nothing_else(tmp_path):
    """Every line of a timer block read by its learned pattern (printed in one piece) belongs
    to the block, not only its first: a later one whose name reads as DeepSpeed's
    ``MemAllocated=`` line (read in bulk once a few were printed) is not taken as one."""
    n = _LONG_RUN

    def lines_of(i: int) -> list[str]:
        out = [
            f"node0: [Rank 0] time (ms) | fwd: {10 + i % 7}.5 | bwd: 2.25",
            _iteration_line(i, n + 10),
            "node1: (min, max) time across ranks (ms):",
            f"node1:     forward-compute ................................: (40.{i % 9}, 41.5)",
            f"node1:     MemAllocated=1.5GB MaxMemAllocated=2.5GB ....: (1.0, 2.{i % 7})",
            "node1:     optimizer ......................................: (3.0, 3.5)",
            "node1: data loader ready",  # (closes the block right after it: in one piece)
        ]
        if i % 100 == 1:
            out.append(f"node0: step {i} MemAllocated=0.{i % 9}GB MaxMemAllocated=0.9GB")
        return out

    run = _long_run(tmp_path / "inside.log", lines_of)
    assert len(run["memory_other"]) == n // 100


_WIDTHS = [
    "{i}.{d}",
    "{i}.{k:03d}",
    "{k}.",
    ".{k}",
    "{i}.{k:03d}{d}{d}1",
    "{k}123456789.{d}01",
    "1234567890{d}.{k}",
]


@pytest.mark.parametrize(
    "forms", [_WIDTHS, [*_WIDTHS, "1234567890123456{d}.5"]], ids=["widths", "more digits"]
)
def test_deepspeed_values_of_every_width_read_as_float_reads_them(tmp_path, monkeypatch, forms):
    """DeepSpeed values of one shape (digits and one dot) with any number of decimals, none
    before the dot, none after it, up to 15 digits (read as integers, each divided by its
    power of ten) and more (which a double does not hold: read as decimals): each read in
    bulk as ``float()`` reads it, whichever line the shape was learned from."""
    n = _LONG_RUN

    def value(i: int, j: int) -> str:
        return forms[(i + j) % len(forms)].format(i=i, k=i % 997, d=i % 10)

    def lines_of(i: int) -> list[str]:
        line = f"node0: [Rank 0] time (ms) | fwd: {value(i, 0)} | bwd: {value(i, 3)}"
        return [line, _iteration_line(i, n + 10)]

    run = _long_run(tmp_path / "widths.log", lines_of)
    ds = [t for t in run["timers"] if t["source"] == "deepspeed"]
    assert len(ds) >= n
    assert [t["values_ms"]["fwd"] for t in ds[:n]] == [float(value(i, 0)) for i in range(1, n + 1)]


@pytest.mark.parametrize(
    "odd",
    [
        "node0: [Rank 0] (after {i} iterations) memory (MB) | allocated2: 1.5 | max allocated: 2.5",
        "node1:  iteration {i:8d}/{t:8d} | consumed sample2s: {s:12d} | "
        "elapsed time per iteration (ms): 84.7 | lm loss: 5.866232E+00 |",
    ],
    ids=["memory report", "iteration line"],
)
def test_a_line_of_a_learned_shape_with_a_digit_in_a_name(tmp_path, odd):
    """A line of a shape read before (the line without its digits) but with a digit in a
    name, which the line path reads as another name: read as the line path reads it (a
    memory report's name once made the bulk path fail with a KeyError)."""
    n = _LONG_RUN

    def lines_of(i: int) -> list[str]:
        out = [
            _iteration_line(i, n + 10),
            f"node0: [Rank 0] (after {i} iterations) memory (MB) | allocated: {i % 50}.5 | "
            "max allocated: 2.5",
        ]
        if i % 500 == 0:  # in place of the line of its kind
            out[-1 if "memory" in odd else -2] = odd.format(i=i, t=n + 10, s=8 * i)
        return out

    run = _long_run(tmp_path / "names.log", lines_of)
    assert len(run["iterations"]) == n
