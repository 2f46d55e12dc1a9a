"""Check the what-if model across networks: calibrate on the runs of one link rate, predict the
same strategies at another, compare with what was measured there (both directions).

    python benchmarks/cross_network.py LOGS_A LOGS_B [LOGS ...] [--strategies a,b]

Each LOGS is a matrix of the same model on the emulated cluster at one link rate (e.g.
``make all-tiny NET=1gbit REPEAT=3 LOGS=logs/lab1000`` and ``NET=100mbit LOGS=logs/lab100``).
A matrix with repeats calibrates on the mean of its repeats, and is a target with its own
between-run spread: each error is printed beside that spread, and a prediction counts as right
when it falls inside the target's 95% between-run interval or within ``--max-error`` of its
mean. Matrices of one rate without repeats add calibration/target combinations instead. Prints
a table per combination and a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.metrics import repeats
from analysis.metrics import rows as metrics
from analysis.runs import load


@dataclass(frozen=True)
class Target:
    """What a matrix measured for one strategy: the mean over its repeats and their spread."""

    mean_ms: float
    """ms/iteration over the repeats (geometric mean, ``analysis.metrics.repeats``)."""
    ci_lo: float | None
    """Lower bound of the 95% interval (between-run with 2+ repeats, else within-run)."""
    ci_hi: float | None
    """Upper bound."""
    runs: int
    """Timed repeats."""
    cv: float | None
    """Relative run-to-run spread: sd of the log run means (None for one run)."""


def measured(logs: Path) -> tuple[dict[str, Target], float | None]:
    """Per strategy of a matrix: its repeats' mean and spread; and the link rate (Mbit/s)."""
    rows = [metrics.compute(run) for run in load.discover(logs)]
    out: dict[str, Target] = {}
    link = None
    for s in repeats.repeat_sets(rows):
        est = s.estimate
        if est is None or not s.strategy:
            continue
        if s.strategy in out and out[s.strategy].runs >= est.k:
            continue  # several specs of one strategy: the most repeated one
        out[s.strategy] = Target(est.mean, est.ci_lo, est.ci_hi, est.k, est.spread)
        link = link or s.timed_runs[0].link_mbit
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


@dataclass(frozen=True)
class Check:
    """One prediction against one target."""

    strategy: str
    """Strategy."""
    target: Target
    """What the target matrix measured."""
    predicted_ms: float
    """Predicted ms/iteration."""

    @property
    def error(self) -> float:
        """(predicted - measured mean) / measured mean."""
        return (self.predicted_ms - self.target.mean_ms) / self.target.mean_ms

    @property
    def inside(self) -> bool:
        """The prediction falls inside the target's 95% interval."""
        t = self.target
        return (
            t.ci_lo is not None and t.ci_hi is not None and t.ci_lo <= self.predicted_ms <= t.ci_hi
        )

    def right(self, max_error: float) -> bool:
        """Inside the target's interval, or within ``max_error`` of its mean."""
        return self.inside or abs(self.error) <= max_error


def compare(calibration: Path, target: Path) -> list[Check]:
    """A check for every strategy measured at the target and predicted from the calibration."""
    meas, link = measured(target)
    if link is None:
        raise SystemExit(f"{target}: no completed run with a known link rate")
    pred = predicted(calibration, link)
    return [Check(s, meas[s], pred[s]) for s in sorted(meas) if s in pred]


def _spread(t: Target) -> str:
    if t.cv is None:
        return "1 run"
    return f"{t.cv:.1%} ({t.runs})"


def main(argv: list[str] | None = None) -> int:
    """Every calibration/target combination across rates; exit 1 if a prediction is neither
    inside its target's interval nor within ``--max-error``."""
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
    checks: dict[str, list[Check]] = {}
    for cal, tgt in pairs:
        print(f"\ncalibrated on {cal} ({rates[cal]:g} Mbit/s), predicting {tgt} "
              f"({rates[tgt]:g} Mbit/s)")  # fmt: skip
        print(f"{'strategy':<10} {'measured ms [95% CI]':>24} {'run-to-run':>12} "
              f"{'predicted ms':>13} {'error':>8}  verdict")  # fmt: skip
        for c in compare(cal, tgt):
            if wanted is not None and c.strategy not in wanted:
                continue
            checks.setdefault(c.strategy, []).append(c)
            t = c.target
            ci = f"[{t.ci_lo:.0f}, {t.ci_hi:.0f}]" if t.ci_lo is not None else "[n/a]"
            verdict = (
                "inside the target's interval"
                if c.inside
                else f"within {args.max_error:.0%}"
                if c.right(args.max_error)
                else "miss"
            )
            print(f"{c.strategy:<10} {t.mean_ms:>12.1f} {ci:>11} {_spread(t):>12} "
                  f"{c.predicted_ms:>13.1f} {c.error:>+8.1%}  {verdict}")  # fmt: skip
    flat = [c for cs in checks.values() for c in cs]
    right = sum(c.right(args.max_error) for c in flat)
    inside = sum(c.inside for c in flat)
    errors = [abs(c.error) for c in flat]
    cvs = [c.target.cv for c in flat if c.target.cv is not None]
    print(f"\n{len(pairs)} calibration/target pair(s), {len(flat)} predictions: {right} right "
          f"({inside} inside the target's between-run interval, the rest within "
          f"{args.max_error:.0%}); median |error| {statistics.median(errors):.1%}, worst "
          f"{max(errors):.1%}" + (f"; targets' median run-to-run spread "
                                  f"{statistics.median(cvs):.1%}" if cvs else ""))  # fmt: skip
    for s, cs in sorted(checks.items()):
        worst = max(cs, key=lambda c: abs(c.error))
        print(f"  {s:<10} worst {abs(worst.error):.1%} over {len(cs)} pair(s) (target spread "
              f"{_spread(worst.target)}); right {sum(c.right(args.max_error) for c in cs)}"
              f"/{len(cs)}")  # fmt: skip
    return 0 if right == len(flat) else 1


if __name__ == "__main__":
    raise SystemExit(main())
