"""A bare multi-node log says all that a run directory says, however its nodes are interleaved.

Users bring one file: pdsh's (or srun's, torchrun's) interleaving of every node's output, with no
``run.json``, ``.cmd`` or DeepSpeed config beside it. For every real multi-node run at hand, the
node streams are interleaved again (by random blocks and by single lines in random order, under
pdsh ``host: ``, srun `` 0: ``, ``[rankN]:`` and ``[defaultN]:`` prefixes), the sidecars are
dropped, and each summary row of ``analysis.report`` must equal the run directory's row field by
field. The runs:

- the two-node runs of ``tests/fixtures/lab-logs`` (per-node logs with ``.cmd``/``.json``);
- every run directory the test suite made before this module ran (real upstream runs: logs with
  Megatron's argument dump, from two or more nodes), found under pytest's base temporary
  directory; run the whole suite (or tests/test_e2e.py first) to include them;
- a pdsh ``launcher.log`` is also compared bare as the launcher itself interleaved it;
- the run directories under each path of ``INTERLEAVE_RUNS`` (``os.pathsep``-separated), e.g. a
  lab matrix: ``INTERLEAVE_RUNS=/tmp/lab pytest tests/test_parse_interleave.py -s``.

Exceptions, and only these: what only the run directory holds. ``run.json``'s interface
counters (``wire_bytes_per_iter``, ``wire_over_model``), ``netbench.json`` (``busbw_gbps_measured``
and what is computed from it: the inferred-bandwidth warning and the calibrated predictions),
the run directory's TensorBoard event files (``event_files``), ``run.json``'s link rate when no
name states it (``link_mbit``, ``setup_key``, and again the warning and predictions, which use
the link), and the bookkeeping fields (name, path, problems, the files' age
``since_last_write_s`` and the n/a reasons of the exempt fields); the n/a reasons of every other
field must match too.
``pytest -s`` prints the counts.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import LAB_LOGS

from analysis.parse.lines import COMPOSE, split_prefix
from analysis.report import build as report
from analysis.runs.load import NODE_SUFFIX
from analysis.theory.formulas import RATE_IN_NAME

STYLES: dict[str, Callable[[int, str], str]] = {
    "pdsh": lambda i, host: f"{host}: ",
    "srun": lambda i, host: f" {i}: ",
    "rank": lambda i, host: f"[rank{i}]:",
    "default": lambda i, host: f"[default{i}]:",
    "compose": lambda i, host: f"{host}-1  | ",
}
"""Prefix of stream ``i`` (host name ``host``) in each launcher's style (``compose``: ``docker
compose logs`` of one container per node)."""
_COMPOSE = re.compile(COMPOSE)

_T0 = datetime(2026, 11, 28, 10, 0, 0)
COLLECTORS: dict[str, Callable[[int], str]] = {
    # RFC 3339 with nanoseconds, trailing zeros dropped (Go's RFC3339Nano)
    "kubectl": lambda n: (
        (_T0 + timedelta(microseconds=1237 * n))
        .strftime("%Y-%m-%dT%H:%M:%S.%f")
        .rstrip("0")
        .rstrip(".")
        + "Z "
    ),
    "ts": lambda n: (_T0 + timedelta(milliseconds=37 * n)).strftime("%b %d %H:%M:%S "),
}
"""Time stamp before line ``n`` of a log collector: ``kubectl logs --timestamps`` (and ``docker
logs -t``), moreutils ``ts``."""

# event_files: the run directory's tensorboard/ folder, which a bare log has not;
# since_last_write_s: the files' modification time (a rewritten bare log is new).
ALWAYS_EXEMPT = ("name", "path", "problems", "event_files", "since_last_write_s")
# spec_hash: the identity of a configuration covers every setting of the setup, DeepSpeed's
# steps_per_print and wall_clock_breakdown included, which only the config beside a log gives
# when the log prints no config dump (the lab logs print none); provenance: run.json's versions
# and GPUs.
RUN_JSON_ONLY = ("wire_bytes_per_iter", "wire_over_model", "spec_hash", "provenance")
NETBENCH_ONLY = ("busbw_gbps_measured", "busbw_inferred_warning", "predicted_iter_ms",
                 "prediction_error")  # fmt: skip
REPEAT_ONLY = ("repeat_group", "repeat_round", "speedup_ci95_lo", "speedup_ci95_hi",
               "na_reasons.speedup")  # fmt: skip
"""A repeated matrix's grouping is in run.json alone (``"repeat"``), and with it the speedup's
interval against the baseline of the same round and the note that says so (``na_reasons.X``:
only the note of X is exempt, X itself is compared)."""
LINK_ONLY = ("link_mbit", "setup_key", "busbw_inferred_warning", "predicted_iter_ms",
             "prediction_error")  # fmt: skip

COUNTS: dict[str, int] = {"runs": 0, "interleavings": 0, "rows compared": 0, "fields compared": 0}


pytestmark = pytest.mark.usefixtures("strict_parse")


@dataclass
class Source:
    """Runs whose rows are compared together (one report: same groups, same baselines)."""

    label: str
    """Name in messages."""
    reference: list[Path]
    """Run directories, or per-node logs with their sidecars, as recorded."""
    streams: dict[str, list[list[str]]]
    """Run name -> its node streams (lines without launcher prefixes)."""
    hosts: dict[str, list[str]]
    """Run name -> host name of each stream ("" for the launching host's unprefixed lines)."""
    exempt: dict[str, set[str]]
    """Run name -> fields only the run directory can know."""
    recorded: dict[str, Path] = field(default_factory=dict)
    """Run name -> its pdsh ``launcher.log`` as the launcher interleaved it (compared bare too)."""


def _read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def split_streams(lines: list[str]) -> tuple[list[list[str]], list[str]]:
    """One log's lines by the node that printed them (outermost launcher prefix removed);
    unprefixed lines (the launching host's runner) are a stream of their own, host ``""``."""
    by_host: dict[str, list[str]] = {}
    for line in lines:
        key, _ = split_prefix(line)
        host = key.split("|", 1)[0]
        if host and line.startswith(f"{host}: "):
            line = line[len(host) + 2 :]
        else:
            host = ""
        by_host.setdefault(host, []).append(line)
    hosts = sorted(by_host, key=lambda h: (h != "", h))
    return [by_host[h] for h in hosts], hosts


def _has_argument_dump(paths: list[Path]) -> bool:
    return any("-- arguments --" in p.read_text(errors="replace") for p in paths)


def lab_logs_source(root: Path) -> Source | None:
    """The ``2n_*_node<N>.log`` pairs of the lab logs (with their sidecars)."""
    pairs: dict[str, list[Path]] = {}
    for log in sorted(root.glob("2n_*_node*.log")):
        m = NODE_SUFFIX.match(log.stem)
        if m:
            pairs.setdefault(m.group("stem"), []).append(log)
    if not pairs:
        return None
    files = [f for logs in pairs.values() for log in logs for f in root.glob(f"{log.stem}.*")]
    streams = {name: [_read(p) for p in logs] for name, logs in pairs.items()}
    hosts = {name: [f"node{i}" for i in range(len(logs))] for name, logs in pairs.items()}
    exempt = {name: _exempt(name, netbench=False) for name in pairs}
    return Source("lab-logs", files, streams, hosts, exempt)


def run_dir_source(label: str, run_dirs: list[Path]) -> Source | None:
    """Run directories whose logs come from two or more nodes and hold Megatron's argument dump
    (real upstream output), compared together; a name seen twice keeps its first directory."""
    src = Source(label, [], {}, {}, {})
    for run_dir in run_dirs:
        try:
            record = json.loads((run_dir / "run.json").read_text())
            name = record["name"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        nodes = sorted(p for p in run_dir.glob("node*.log"))
        launcher = run_dir / "launcher.log"
        if name in src.streams or _outcome_edited(record, [*nodes, launcher]):
            continue
        if len(nodes) >= 2 and _has_argument_dump(nodes):
            streams, hosts = [_read(p) for p in nodes], [p.stem for p in nodes]
        elif launcher.is_file() and _has_argument_dump([launcher]):
            streams, hosts = split_streams(_read(launcher))
            if sum(1 for h in hosts if h) < 2:
                continue  # one machine: nothing to interleave
            src.recorded[name] = launcher
        else:
            continue
        src.streams[name], src.hosts[name] = streams, hosts
        src.exempt[name] = _exempt(name, netbench=(run_dir / "netbench.json").is_file())
        if record.get("repeat"):
            src.exempt[name] |= set(REPEAT_ONLY)
        src.reference.append(run_dir)
    return src if src.reference else None


def _outcome_edited(record: dict, logs: list[Path]) -> bool:
    """Whether run.json's outcome was written by a test, not by the run: the executor appends
    its ``# run outcome`` marker to every log whenever it records a run as not completed, so a
    failed record whose logs lack the marker (``test_repeats`` fails runs that way) describes
    logs that never failed, and no bare log could say otherwise."""
    status = (record.get("outcome") or {}).get("status")
    if status in (None, "completed", "generated", "running"):
        return False
    return not any(b"# run outcome" in p.read_bytes() for p in logs if p.is_file())


def _exempt(name: str, netbench: bool) -> set[str]:
    out = set(ALWAYS_EXEMPT) | set(RUN_JSON_ONLY)
    if netbench:
        out |= set(NETBENCH_ONLY)
    if RATE_IN_NAME.search(name) is None:
        out |= set(LINK_ONLY)
    return out


def interleave(
    streams: list[list[str]], hosts: list[str], rnd: random.Random, mode: str, style: str
) -> list[str]:
    """pdsh-style interleaving: every stream keeps its own order; ``mode`` ``line`` takes one
    line of a random stream at a time, ``block`` a random run of 1-200 lines."""
    prefixes = []
    node = 0
    for host in hosts:
        if host:
            prefixes.append(STYLES[style.split("+")[0]](node, host))
            node += 1
        else:
            prefixes.append("")  # the launching host's own lines carry no prefix
    pos = [0] * len(streams)
    out: list[str] = []
    while True:
        live = [i for i, s in enumerate(streams) if pos[i] < len(s)]
        if not live:
            return out
        i = rnd.choice(live)
        n = 1 if mode == "line" else rnd.randint(1, 200)
        out += [prefixes[i] + line for line in streams[i][pos[i] : pos[i] + n]]
        pos[i] += n


def _collected(line: str, stamp: str, style: str) -> str:
    """``line`` with a collector's time stamp: first, or after docker compose's prefix."""
    m = _COMPOSE.match(line) if style.startswith("compose") else None
    k = m.end() if m else 0
    return line[:k] + stamp + line[k:]


def _rows(logdir: Path) -> dict[str, dict[str, Any]]:
    _runs, rows, _model = report.summarize(logdir, [])
    assert len({r.name for r in rows}) == len(rows), [r.name for r in rows]
    return {r.name: report.metrics.row_dict(r) for r in rows}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def compare_source(src: Source, tmp: Path, seed: int, modes=("line", "block")) -> list[str]:
    """Rows of every interleaving of ``src`` against its reference rows; mismatches in words."""
    ref_dir = tmp / f"{src.label}-reference"
    ref_dir.mkdir(parents=True)
    for i, item in enumerate(src.reference):
        if item.is_dir():
            shutil.copytree(item, ref_dir / f"r{i}" / item.name)
        else:
            shutil.copy2(item, ref_dir / item.name)
    reference = _rows(ref_dir)
    rnd = random.Random(seed)
    problems: list[str] = []
    COUNTS["runs"] += len(src.streams)
    variants = [(mode, style, "") for mode in modes for style in STYLES]
    # The same collected by kubectl or piped through ts: a time stamp before every line
    # (``docker compose logs -t``: after the container's prefix).
    variants += [("block", "pdsh", "kubectl"), ("line", "srun", "ts")]
    variants += [("line", "compose", "kubectl")]
    if src.recorded and set(src.recorded) == set(src.streams):
        variants.append(("recorded", "pdsh", ""))  # the launcher's own interleaving, bare
    for mode, style, collector in variants:
        style = f"{style}+{collector}" if collector else style
        bare = tmp / f"{src.label}-{mode}-{style}"
        bare.mkdir(parents=True)
        for name in src.streams:
            if mode == "recorded":
                shutil.copy2(src.recorded[name], bare / f"{name}.log")
            else:
                lines = interleave(src.streams[name], src.hosts[name], rnd, mode, style)
                if collector:
                    stamp = COLLECTORS[collector]
                    lines = [_collected(line, stamp(n), style) for n, line in enumerate(lines)]
                (bare / f"{name}.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
            COUNTS["interleavings"] += 1
        rows = _rows(bare)
        for name in src.streams:
            want, got = reference.get(name), rows.get(name)
            if want is None or got is None:
                problems.append(f"{src.label} {mode}/{style} {name}: row missing")
                continue
            COUNTS["rows compared"] += 1
            exempt = src.exempt[name]
            for col, value in want.items():
                if col in exempt:
                    continue
                other = got.get(col)
                if col == "na_reasons":  # the reasons of the compared fields
                    skip = exempt | {c.split(".", 1)[1] for c in exempt if "." in c}
                    value = {k: v for k, v in value.items() if k not in skip}
                    other = {k: v for k, v in (other or {}).items() if k not in skip}
                COUNTS["fields compared"] += 1
                if not _same(value, other):
                    problems.append(
                        f"{src.label} {mode}/{style} {name}.{col}: run directory {value!r}, "
                        f"bare log {other!r}"
                    )
    return problems


def _suite_run_dirs(base: Path) -> list[Path]:
    return sorted({p.parent for p in base.rglob("run.json") if "interleave" not in str(p)})


def test_bare_interleaved_logs_give_the_run_directory_rows(tmp_path, tmp_path_factory):
    lab = lab_logs_source(LAB_LOGS)
    assert lab is not None, f"no two-node run in {LAB_LOGS}"
    sources = [lab]
    suite = _suite_run_dirs(tmp_path_factory.getbasetemp())
    for i, run_dir in enumerate(suite):
        src = run_dir_source(f"suite{i}", [run_dir])
        if src is not None:
            sources.append(src)
    for j, extra in enumerate(
        p for p in os.environ.get("INTERLEAVE_RUNS", "").split(os.pathsep) if p
    ):
        dirs = sorted({p.parent for p in Path(extra).rglob("run.json")})
        src = run_dir_source(f"extra{j}", dirs)
        assert src is not None, f"INTERLEAVE_RUNS: no multi-node upstream run under {extra}"
        sources.append(src)
    problems: list[str] = []
    for k, src in enumerate(sources):
        problems += compare_source(src, tmp_path, seed=k)
    print(f"\ninterleaving check: {len(sources)} source(s) ({', '.join(s.label for s in sources)})"
          f"; {COUNTS}")  # fmt: skip
    assert not problems, "\n".join(problems[:40])
