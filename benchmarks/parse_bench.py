"""Throughput and memory of the log parser on large logs, next to a one-field perl scan.

For each log kind (``benchmarks/loggen.py``: ``noise`` = mostly NCCL chatter, ``dense`` = one
long two-node run replayed from a real lab log, ``ranks`` = 64 ranks with log interval 1, every
rank printing DeepSpeed's timers, ``all-ranks`` = 64 ranks with ``--timing-log-option all``,
``interval1`` = the last node's own log of the lab run at log interval 1, ``pipeline`` = the
lab's PP=2 run with a step line every step, ``stamped`` = the dense log as ``kubectl logs
--timestamps`` collects it, a time stamp before every line, ``compose`` = the dense log as
``docker compose logs`` collects it, a container's prefix before every line), it writes a log
of ``--size-mb`` MiB, then measures, each in its own process:

- ``parse_file``: MB/s (CPU time of the parse, and wall time), peak RSS of the process, the
  bytes the parsed records keep (per training iteration and per record), and whether what was
  parsed is what was written;
- ``python -m analysis.parse LOG --json > /dev/null``: MB/s and peak RSS;
- ``python -m analysis.report DIR`` on a directory holding the log: MB/s and peak RSS;
- ``perl -ne '...elapsed time per iteration (ms): ...'`` (average of one field): MB/s, and the
  ratio of the parser's CPU time to perl's on the same file, measured in the same run.

CPU times are user + system of the measured process (parse_file: of the parse call alone); on a
machine shared with other work, wall times are longer and vary more: both are printed.  The
peak RSS of a large log's parse varies by some tens of MiB from run to run (the 64-rank log of
1 GB: 379 to 416 MiB).  The library leaves glibc's allocator as it is; a process that must
hold less can fix its mmap threshold from the environment, ``MALLOC_MMAP_THRESHOLD_=131072``:
on that log's ``--json`` 412 -> 334 MiB, for about a third more CPU (page faults).

    python benchmarks/parse_bench.py [--size-mb 1024] [--logs noise,dense,ranks,...] [--dir DIR]
                                     [--keep] [--reuse] [--code DIR] [--skip-json] [--skip-report]

``--code DIR`` measures the parser of another checkout (e.g. ``git archive OLD | tar -x -C
DIR``) on the same logs: with ``--dir D --keep`` once, then ``--dir D --reuse --code DIR``,
both are measured on the very same files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import loggen  # noqa: E402

LAB = next(
    (p for p in (REPO / "tests" / "fixtures" / "lab-logs", REPO.parent / "shared" / "lab-logs")
     if p.is_dir()),
    REPO.parent / "shared" / "lab-logs",
)  # fmt: skip
"""The lab logs the dense, interval-1 and pipeline logs replay."""
CODE = REPO
"""The checkout whose parser is measured (``--code``)."""
KINDS = ("noise", "dense", "ranks", "all-ranks", "interval1", "pipeline", "stamped", "compose")
"""The log kinds (module doc), in the order measured."""
PERL = (
    r"$s+=$1,$n++ if /elapsed time per iteration \(ms\): ([\d.]+)/; "
    r'END{printf "%.3f %d\n",$s/$n,$n}'
)

_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from analysis.parse.reader import parse_file
c0, w0 = time.process_time(), time.perf_counter()
runs = parse_file(sys.argv[1])
cpu, wall = time.process_time() - c0, time.perf_counter() - w0
sizes = [r.nbytes() for r in runs]
print(json.dumps({
    "cpu": cpu, "wall": wall,
    "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "runs": len(runs),
    "iteration_lines": sum(len(r.iterations) for r in runs),
    "last_iteration": max((r.iterations[-1].iteration for r in runs if r.iterations), default=0),
    "timer_blocks": sum(len(r.timers) for r in runs),
    "memory_reports": sum(len(r.memory) for r in runs),
    "bytes": sum(sum(s.values()) for s in sizes),
    "bytes_by_table": {k: sum(s[k] for s in sizes) for k in sizes[0]} if sizes else {},
    "status": [r.status for r in runs],
}))
"""


@dataclass
class Measure:
    """One measured process."""

    cpu: float
    """User + system CPU seconds."""
    wall: float
    """Wall seconds."""
    rss_mib: float
    """Peak resident set size, MiB."""
    out: str = ""
    """What it printed."""


def _run(cmd: list[str], stdout: int | None = subprocess.PIPE) -> Measure:
    """Run ``cmd`` and measure it (its own rusage, through wait4)."""
    w0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, cwd=CODE)
    out = proc.stdout.read().decode() if proc.stdout else ""  # type: ignore[union-attr]
    err = proc.stderr.read().decode() if proc.stderr else ""  # type: ignore[union-attr]
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}: {err[-2000:]}")
    return Measure(
        usage.ru_utime + usage.ru_stime, time.perf_counter() - w0, usage.ru_maxrss / 1024, out
    )


def _write(kind: str, path: Path, size_mb: float) -> loggen.Written:
    if kind == "noise":
        return loggen.write_noise(path, size_mb)
    if kind in ("dense", "interval1", "pipeline", "stamped", "compose"):
        if not LAB.is_dir():
            raise SystemExit(f"the {kind} log replays {LAB}, which is not there")
        if kind == "interval1":
            return loggen.write_interval1(path, size_mb, LAB)
        if kind == "pipeline":
            return loggen.write_pipeline(path, size_mb, LAB)
        collector = {"stamped": "kubectl", "compose": "compose"}.get(kind, "")
        return loggen.write_dense(path, size_mb, LAB, collector=collector)
    if kind == "all-ranks":
        return loggen.write_all_ranks(path, size_mb)
    return loggen.write_ranks(path, size_mb)


def bench(
    kind: str, folder: Path, size_mb: float, json_too: bool, report_too: bool, reuse: bool = False
) -> dict:
    """Write one log (``reuse``: unless it was written before) and measure everything on it;
    returns the figures."""
    run_dir = folder / kind
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{kind}.log"
    counts = folder / f"{kind}.written.json"  # (outside the run directory the report reads)
    t0 = time.perf_counter()
    if reuse and path.exists() and counts.exists():
        written = loggen.Written(**json.loads(counts.read_text()))
    else:
        written = _write(kind, path, size_mb)
        counts.write_text(json.dumps(asdict(written)))
    size = path.stat().st_size
    mb = size / 1e6
    print(
        f"[{kind}] wrote {size / 2**20:.0f} MiB, {written.iterations} iterations, "
        f"{written.lines} lines ({written.noise_lines / written.lines:.0%} chatter) in "
        f"{time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    res: dict = {"log": kind, "mb": mb, "iterations": written.iterations}
    perl = _run(["perl", "-ne", PERL, str(path)])
    res["perl_mb_s"] = mb / perl.cpu
    child = _run([sys.executable, "-c", _CHILD, str(path), str(CODE)])
    got = json.loads(child.out)
    res |= {
        "parse_mb_s": mb / got["cpu"],
        "parse_wall_mb_s": mb / got["wall"],
        "parse_rss_mib": child.rss_mib,
        "ratio_to_perl": got["cpu"] / perl.cpu,
        "bytes_per_iteration": got["bytes"] / max(1, got["last_iteration"]),
        "bytes_per_record": got["bytes"]
        / max(1, got["iteration_lines"] + got["timer_blocks"] + got["memory_reports"]),
        "bytes_by_table": got["bytes_by_table"],
    }
    want = (written.iteration_lines, written.timer_blocks, written.memory_reports)
    have = (got["iteration_lines"], got["timer_blocks"], got["memory_reports"])
    res["as_written"] = have == want and got["runs"] == 1
    print(
        f"[{kind}] parse_file {res['parse_mb_s']:.0f} MB/s CPU "
        f"({res['parse_wall_mb_s']:.0f} wall), "
        f"peak RSS {child.rss_mib:.0f} MiB, {res['bytes_per_iteration']:.1f} B/iteration, "
        f"{res['bytes_per_record']:.1f} B/record; perl {res['perl_mb_s']:.0f} MB/s CPU, "
        f"ratio {res['ratio_to_perl']:.1f}x; records "
        f"{'as written' if res['as_written'] else f'MISMATCH: parsed {have}, wrote {want}'}",
        flush=True,
    )
    if json_too:
        with open(os.devnull, "wb") as null:
            js = _run(
                [sys.executable, "-m", "analysis.parse", str(path), "--json"], stdout=null.fileno()
            )
        res |= {
            "json_mb_s": mb / js.cpu,
            "json_wall_mb_s": mb / js.wall,
            "json_rss_mib": js.rss_mib,
        }
        print(f"[{kind}] --json {res['json_mb_s']:.0f} MB/s CPU "
              f"({res['json_wall_mb_s']:.0f} wall), peak RSS {js.rss_mib:.0f} MiB",
              flush=True)  # fmt: skip
    if report_too:
        out = folder / f"{kind}-report"
        rep = _run([sys.executable, "-m", "analysis.report", str(run_dir), "--out", str(out)])
        res |= {"report_mb_s": mb / rep.cpu, "report_wall_mb_s": mb / rep.wall,
                "report_rss_mib": rep.rss_mib}  # fmt: skip
        print(f"[{kind}] analysis.report {res['report_mb_s']:.0f} MB/s CPU "
              f"({res['report_wall_mb_s']:.0f} wall), peak RSS {rep.rss_mib:.0f} MiB",
              flush=True)  # fmt: skip
        shutil.rmtree(out, ignore_errors=True)
    return res


def _table(results: list[dict]) -> str:
    def cell(r: dict, key: str, fmt: str = ".0f") -> str:
        return format(r[key], fmt) if key in r else "-"

    head = (
        "| log | size MB | iterations | parse_file MB/s CPU (wall) | RSS MiB | --json MB/s CPU "
        "(wall) | RSS MiB | report MB/s CPU (wall) | RSS MiB | B/iteration | B/record | "
        "perl MB/s | parse/perl |\n" + "|---" * 13 + "|"
    )
    rows = [
        f"| {r['log']} | {r['mb']:.0f} | {r['iterations']} | {cell(r, 'parse_mb_s')} "
        f"({cell(r, 'parse_wall_mb_s')}) | {cell(r, 'parse_rss_mib')} | {cell(r, 'json_mb_s')} "
        f"({cell(r, 'json_wall_mb_s')}) | {cell(r, 'json_rss_mib')} | {cell(r, 'report_mb_s')} "
        f"({cell(r, 'report_wall_mb_s')}) | {cell(r, 'report_rss_mib')} | "
        f"{cell(r, 'bytes_per_iteration', '.1f')} | {cell(r, 'bytes_per_record', '.1f')} | "
        f"{cell(r, 'perl_mb_s')} | {cell(r, 'ratio_to_perl', '.1f')}x |"
        for r in results
    ]
    return "\n".join([head, *rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=1024.0, help="log size in MiB (default 1024)")
    ap.add_argument(
        "--logs", default=",".join(KINDS), help=f"which logs (comma-separated: {', '.join(KINDS)})"
    )
    ap.add_argument("--dir", type=Path, help="where to write the logs (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the logs")
    ap.add_argument("--reuse", action="store_true", help="measure the logs already in --dir")
    ap.add_argument(
        "--code", type=Path, help="measure the parser of this checkout (default: this one)"
    )
    ap.add_argument("--skip-json", action="store_true", help="do not time --json")
    ap.add_argument("--skip-report", action="store_true", help="do not time analysis.report")
    ap.add_argument("--out-json", type=Path, help="also write the figures here")
    ns = ap.parse_args(argv)
    unknown = sorted(set(ns.logs.split(",")) - set(KINDS))
    if unknown:
        ap.error(f"--logs: no log kind {', '.join(unknown)} (the kinds: {', '.join(KINDS)})")
    global CODE
    CODE = (ns.code or REPO).resolve()
    folder = ns.dir or Path(tempfile.mkdtemp(prefix="parse-bench-"))
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; parser of {CODE}",
        flush=True,
    )
    results = []
    try:
        for kind in ns.logs.split(","):
            results.append(
                bench(kind, folder, ns.size_mb, not ns.skip_json, not ns.skip_report, ns.reuse)
            )
    finally:
        if not ns.keep and not ns.reuse:  # (logs measured again are kept for the next run)
            shutil.rmtree(folder, ignore_errors=True)
    print(_table(results))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if ns.out_json:
        ns.out_json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["as_written"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
