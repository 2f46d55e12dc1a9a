"""Check the what-if model across networks: calibrate on the runs of one link rate, predict the
same strategies at another, compare with what was measured there (both directions).

    python benchmarks/cross_network.py LOGS_A LOGS_B

LOGS_A and LOGS_B are matrices of the same model on the emulated cluster at two link rates
(e.g. ``make all-tiny NET=1gbit LOGS=logs/lab1000`` and ``NET=100mbit LOGS=logs/lab100``).
Prints a table per direction: strategy, measured ms/iteration, predicted, signed error.
"""

from __future__ import annotations

import argparse
import json
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
    """Both directions; exit 1 if any |error| exceeds ``--max-error``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs_a", type=Path)
    ap.add_argument("logs_b", type=Path)
    ap.add_argument("--max-error", type=float, default=0.20)
    args = ap.parse_args(argv)
    worst = 0.0
    for cal, tgt in ((args.logs_a, args.logs_b), (args.logs_b, args.logs_a)):
        print(f"\ncalibrated on {cal}, predicting {tgt}")
        print(f"{'strategy':<10} {'measured ms':>12} {'predicted ms':>13} {'error':>8}")
        for s, m, p, e in compare(cal, tgt):
            worst = max(worst, abs(e))
            print(f"{s:<10} {m:>12.1f} {p:>13.1f} {e:>+8.1%}")
    print(f"\nworst |error| {worst:.1%} (target {args.max_error:.0%})")
    return 0 if worst <= args.max_error else 1


if __name__ == "__main__":
    raise SystemExit(main())
