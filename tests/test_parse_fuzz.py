"""Property tests: the parser never raises, and launcher prefixes never change parsed values.

They run in strict mode (``analysis.parse.reader.strict``): an exception inside a line handler
propagates and fails the property instead of becoming an ``internal parser error`` problem.
Example counts are kept small enough for CI (whole file well under 60 s on 2 cores); each test
prints how many examples ran (``pytest -s`` shows them).
"""

from __future__ import annotations

import pytest
from conftest import LAB_LOGS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.parse import reader as parse
from analysis.parse.reader import parse_text


def _real_lines() -> list[str]:
    lines: list[str] = []
    for name in ("dp2.log", "pp2.log", "pp2_rmsnorm_wallclock_FAIL.log", "zero1.log"):
        lines.extend((LAB_LOGS / name).read_text(errors="replace").splitlines())
    return lines


REAL = _real_lines()
COUNTS: dict[str, int] = {}

_FAST = settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _count(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    print("\nhypothesis examples run:", dict(sorted(COUNTS.items())))


pytestmark = pytest.mark.usefixtures("strict_parse")


def test_strict_mode_lets_a_handler_exception_through(monkeypatch):
    """The premise of every property here: a handler bug is an exception in strict mode and a
    problem string (the run still parsed) otherwise."""

    def broken(self, *args, **kwargs):
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(parse.Core, "_iteration_text", broken)
    text = "training ...\n" + _ITER_LINES[0] + "\n"
    with pytest.raises(ZeroDivisionError, match="injected"):
        parse_text(text)
    with parse.strict(False):
        run = parse_text(text)[0]
    assert any("internal parser error ZeroDivisionError('injected')" in p for p in run.problems)


def _check(runs) -> None:
    assert runs, "at least one run"
    for run in runs:
        assert run.status in ("completed", "failed", "incomplete")
        run.to_dict()


@_FAST
@given(st.text(max_size=3000))
def test_arbitrary_text_never_raises(text):
    _count("arbitrary_text")
    _check(parse_text(text))


@_FAST
@given(st.binary(max_size=3000))
def test_binary_bytes_never_raise(data):
    _count("binary")
    _check(parse_text(data.decode("utf-8", errors="replace")))


_mutation = st.sampled_from(["keep", "truncate", "prefix", "dup", "junk", "glue"])


@_FAST
@given(
    st.lists(st.tuples(st.sampled_from(REAL), _mutation, st.integers(0, 400)), max_size=60),
    st.randoms(use_true_random=False),
)
def test_mutated_shuffled_real_lines_never_raise(items, rnd):
    _count("mutated_real_lines")
    out: list[str] = []
    for line, how, n in items:
        if how == "truncate":
            line = line[: n % (len(line) + 1)]
        elif how == "prefix":
            line = rnd.choice(["node1: ", "[rank0]: ", " 3: ", "[default1]:", "\x1b[31m"]) + line
        elif how == "dup":
            out.append(line)
        elif how == "junk":
            line = line[:n] + "\x00\ufffd|:(" + line[n:]
        elif how == "glue" and out:
            out[-1] += line
            continue
        out.append(line)
    rnd.shuffle(out)
    _check(parse_text("\n".join(out)))


_ITER_LINES = [ln for ln in REAL if " iteration " in ln and "|" in ln]
_PREFIX = st.sampled_from(
    ["", "node0: ", "gpu-7: ", "10.0.0.3: ", "[default0]:", "[rank5]: ", "0: ", " 12: ",
     "node1: [rank3]: ", "\x1b[32m"]
)  # fmt: skip


@_FAST
@given(st.lists(st.tuples(st.sampled_from(_ITER_LINES), _PREFIX), min_size=1, max_size=20))
def test_prefix_stripping_does_not_change_iteration_values(items):
    _count("prefix_invariance")

    def values(lines: list[str]):
        runs = parse_text("training ...\n" + "\n".join(lines))
        return [
            (i.iteration, i.elapsed_ms, i.lm_loss, i.samples_per_s, i.train_iters)
            for r in runs
            for i in r.iterations
        ]

    plain = values([line for line, _ in items])
    prefixed = values([prefix + line for line, prefix in items])
    assert prefixed == plain
