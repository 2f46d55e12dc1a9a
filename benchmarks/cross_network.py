"""Check the what-if model across networks: calibrate on the runs of one link rate, predict the
same strategies at another, compare with what was measured there (both directions).

    python benchmarks/cross_network.py LOGS_A LOGS_B [LOGS ...] [--strategies a,b]

Each LOGS is a matrix of the same model on the emulated cluster at one link rate (e.g.
``make all-tiny NET=1gbit LOGS=logs/lab1000`` and ``NET=100mbit LOGS=logs/lab100``); repeat
matrices of a rate add calibration/target combinations, which shows how much of the error is
the runs' own repeatability. Prints a table per combination (strategy, measured ms/iteration,
predicted, signed error) and a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis import load, metrics


def measured(logs: Path) -> tuple[dict[str, float], float | None]:
    """Steady-state ms/iteration per strategy of a matrix, and its link rate (Mbit/s)."""
    rows = [metrics.compute(run) for run in load.discover(logs)]
    out: dict[str, float] = {}
    link = None
    for r in rows:
        if r.status == "completed" and r.iter_ms_mean is not None and r.strategy:
            out[r.strategy] = r.iter_ms_mean
            link = link or r.link_mbit
    return out, link


def predicted(calibration: Path, link_mbit: float) -> dict[str, float]:
    """Predictions of ``python -m analysis.predict CALIBRATION --link R --json`` per strategy."""
    res = subprocess.run(
        [sys.executable, "-m", "analysis.predict", str(calibration), "--link",
         f"{link_mbit:g}mbit", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    doc = json.loads(res.stdout)
    out: dict[str, float] = {}
    for p in doc["predictions"]:
        setup = p["setup"]
        if setup.get("link_mbit") == link_mbit and p.get("iter_ms") is not None:
            out.setdefault(setup["strategy"], p["iter_ms"])
    return out


def compare(calibration: Path, target: Path) -> list[tuple[str, float, float, float]]:
    """(strategy, measured, predicted, error) for every strategy measured at the target."""
    meas, link = measured(target)
    if link is None:
        raise SystemExit(f"{target}: no completed run with a known link rate")
    pred = predicted(calibration, link)
    return [(s, meas[s], pred[s], (pred[s] - meas[s]) / meas[s]) for s in sorted(meas) if s in pred]


def main(argv: list[str] | None = None) -> int:
    """Every calibration/target combination across rates; exit 1 if any |error| exceeds
    ``--max-error``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", type=Path, nargs="+", help="matrices (two or more, >= 2 rates)")
    ap.add_argument("--max-error", type=float, default=0.20)
    ap.add_argument("--strategies", help="comma-separated strategies to check (default: all)")
    args = ap.parse_args(argv)
    wanted = set(args.strategies.split(",")) if args.strategies else None
    rates = {logs: measured(logs)[1] for logs in args.logs}
    pairs = [(a, b) for a in args.logs for b in args.logs if rates[a] != rates[b]]
    if not pairs:
        raise SystemExit("need matrices at two or more link rates")
    errors: dict[str, list[float]] = {}
    for cal, tgt in pairs:
        print(f"\ncalibrated on {cal}, predicting {tgt}")
        print(f"{'strategy':<10} {'measured ms':>12} {'predicted ms':>13} {'error':>8}")
        for s, m, p, e in compare(cal, tgt):
            if wanted is None or s in wanted:
                errors.setdefault(s, []).append(e)
                print(f"{s:<10} {m:>12.1f} {p:>13.1f} {e:>+8.1%}")
    flat = [abs(e) for es in errors.values() for e in es]
    within = sum(e <= args.max_error for e in flat)
    print(f"\n{len(pairs)} calibration/target pair(s), {len(flat)} predictions: {within} within "
          f"{args.max_error:.0%}, median |error| {statistics.median(flat):.1%}, worst "
          f"{max(flat):.1%}")  # fmt: skip
    for s, es in sorted(errors.items()):
        worst = max(abs(e) for e in es)
        print(f"  {s:<10} worst {worst:.1%} over {len(es)} pair(s)")
    return 0 if within == len(flat) else 1


if __name__ == "__main__":
    raise SystemExit(main())
