"""Repeats as the unit: between-run intervals for iteration times and speedups.

A run's own interval (``metrics``) says how much its logging windows scatter. The same
configuration run again on a shared machine (or a cluster with other tenants) differs by more
than that. This module treats the runs of one spec in one setup group as repeats (``RepeatSet``)
and estimates with both spreads:

- **ms/iteration**: the geometric mean over repeats with the interval of the one-way
  random-effects model on the log of the run means, ``log m_i = mu + b_i + e_i`` (between-run
  ``b_i ~ N(0, tau^2)``, within-run ``e_i`` the relative error of run i's own mean, variance
  ``v``): ``Var(log m_i) = tau^2 + v``, so the scatter of the log run means holds both spreads,
  and ``exp(mean +- t(k-1) sd / sqrt(k))`` is the exact interval of the balanced model (the
  between-run mean square of the ANOVA; the runs of a matrix log the same windows). ``tau``
  alone is the moment estimate ``sd^2 - mean(v)`` (floored at 0). On the log scale because a
  loaded machine slows a run by a factor (three repeats measured 439, 1387 and 385 ms here: a
  linear interval reached below 0), and because the ratio of two such means is the speedup the
  report shows. Weighting runs by their own window variance instead (DerSimonian-Laird with the
  Hartung-Knapp interval) covered 93-94.5% in ``tests/test_repeats.py``'s simulations where
  equal weights cover 94.5-95.2%: five windows estimate a run's variance too loosely to weigh it.
- **speedups**: on the log of the run means, a linear model ``log t = strategy + round + e``
  fitted by least squares over every completed run of the setup group (``SpeedupModel``). The
  round term pairs the runs of one round of an interleaved matrix (a randomized complete block
  design: a drift of the machine that hits every strategy of a round alike cancels); ``e``'s
  variance, pooled over the group's strategies, is the between-run spread of a ratio and holds
  the within-run noise of each run mean too. Without rounds (repeats run apart, bare logs) the
  model has no round term (unpaired). The interval is ``exp(d +- t(df) se)`` with the residual
  degrees of freedom: pooling lets two rounds of six strategies give 5 df where one pair alone
  gives 1. Its assumption: on the log scale, repeats of each strategy scatter alike
  (``SpeedupModel.residual_sd`` per strategy shows how far that holds).

A set with one run has no between-run interval: its figures keep the within-run interval, and
``reference_spread`` finds the between-run spread of repeats recorded on the same setup.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from analysis.metrics.rows import RunMetrics
from analysis.metrics.speedup import speedup_interval
from analysis.metrics.stats import t95
from analysis.theory.units import number, percent

RANDOM_EFFECTS_METHOD = (
    "geometric mean over repeats, one-way random-effects interval on the log scale: t with "
    "repeats-1 df on the log run means, whose scatter holds the between-run and the within-run "
    "spread"
)
"""How the ms/iteration interval over repeats is computed (shown in the report)."""

PAIRED_METHOD = "paired by round (log t = strategy + round, residual pooled over the group)"
"""Speedup interval of runs of interleaved rounds."""

UNPAIRED_METHOD = "unpaired (log t = strategy, residual pooled over the group)"
"""Speedup interval of repeats without rounds in common."""


# ---------------------------------------------------------------------------- one configuration


@dataclass(frozen=True)
class RandomEffects:
    """Mean over repeats with a between-run interval (``RANDOM_EFFECTS_METHOD``)."""

    k: int
    """Repeats (run means) it is computed from."""
    mean: float
    """Geometric mean of the run means, ms (the run's own mean for one run)."""
    ci_lo: float | None
    """Lower bound of the 95% interval, ms; None when there is none (one run, one window)."""
    ci_hi: float | None
    """Upper bound."""
    arithmetic_mean: float
    """Arithmetic mean of the run means, ms."""
    spread: float | None
    """Sample sd of the log run means: the relative run-to-run spread as seen (between-run and
    within-run noise together; ~ the coefficient of variation); None for one repeat."""
    tau: float | None
    """Relative between-run sd net of the within-run errors (moment estimate, floored at 0);
    None for one repeat or unknown within-run errors."""
    within: float | None
    """Root mean square of the runs' own relative standard errors of the mean."""

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k({self.k}) must be >= 1")
        if self.mean <= 0:
            raise ValueError(f"mean({self.mean}) must be > 0 ms")


def random_effects(means: Sequence[float], variances: Sequence[float | None]) -> RandomEffects:
    """``RANDOM_EFFECTS_METHOD`` over run means (ms, > 0) and their within-run squared standard
    errors (ms^2; None where a run has no interval of its own: then ``tau`` is unknown)."""
    m = [float(x) for x in means]
    k = len(m)
    if k == 0:
        raise ValueError("no run means")
    if min(m) <= 0:
        raise ValueError(f"run means must be > 0 ms, got {min(m)}")
    logs = [math.log(x) for x in m]
    known = len(variances) == k and all(v is not None for v in variances)
    rel = statistics.fmean(v / x**2 for v, x in zip(variances, m, strict=True)) if known else None  # type: ignore[operator]
    within = math.sqrt(rel) if rel is not None else None
    center, arithmetic = statistics.fmean(logs), statistics.fmean(m)
    if k == 1:
        return RandomEffects(1, m[0], None, None, arithmetic, None, None, within)
    sd = statistics.stdev(logs)
    half = t95(k - 1) * sd / math.sqrt(k)
    tau = math.sqrt(max(0.0, sd * sd - rel)) if rel is not None else None
    return RandomEffects(k, math.exp(center), math.exp(center - half), math.exp(center + half),
                         arithmetic, sd, tau, within)  # fmt: skip


def within_variance(row: RunMetrics) -> float | None:
    """Squared standard error of a run's mean from its own 95% t-interval, or None."""
    if row.iter_ms_mean is None or row.iter_ms_ci95_hi is None or not row.iter_ms_n:
        return None
    if row.iter_ms_n < 2:
        return None
    return ((row.iter_ms_ci95_hi - row.iter_ms_mean) / t95(row.iter_ms_n - 1)) ** 2


# ---------------------------------------------------------------------------- sets of repeats


def timed(row: RunMetrics) -> bool:
    """A completed run with a steady-state time: the only kind that enters an estimate."""
    return row.status == "completed" and row.iter_ms_mean is not None and row.iter_ms_mean > 0


def set_key(row: RunMetrics) -> tuple[str, str]:
    """Runs with the same key are repeats of one spec: setup group and spec hash (``identity``;
    the name when neither run.json nor a resolved setup gave one)."""
    return row.setup_key, row.spec_hash or f"name:{row.name}"


@dataclass(frozen=True)
class RepeatSet:
    """The runs of one spec in one setup group: the unit of the report."""

    name: str
    """Run name (``<model>-<strategy>``; the first run's, when bare logs of one spec are named
    differently)."""
    strategy: str | None
    """Strategy."""
    setup_key: str
    """Setup group."""
    spec_hash: str | None
    """Spec hash shared by the runs (None for runs without run.json)."""
    runs: tuple[RunMetrics, ...]
    """Every run of the spec, timed or not, in discovery order."""
    estimate: RandomEffects | None
    """Over the timed runs; None when no run was timed."""

    @property
    def timed_runs(self) -> tuple[RunMetrics, ...]:
        """The runs that enter the estimate."""
        return tuple(r for r in self.runs if timed(r))

    @property
    def rounds(self) -> str:
        """``rounds 1, 2, 3`` of the timed runs, or ``no rounds`` (not an interleaved matrix)."""
        got = sorted({r.repeat_round for r in self.timed_runs if r.repeat_round is not None})
        return "rounds " + ", ".join(map(str, got)) if got else "no rounds"

    @property
    def between(self) -> bool:
        """Two or more timed repeats: the interval includes the run-to-run spread."""
        return self.estimate is not None and self.estimate.k >= 2


def repeat_sets(rows: Sequence[RunMetrics]) -> list[RepeatSet]:
    """Rows grouped into repeat sets, in the order of their first run."""
    groups: dict[tuple[str, str], list[RunMetrics]] = {}
    for r in rows:
        groups.setdefault(set_key(r), []).append(r)
    names: dict[tuple[str, str], int] = {}
    for (setup, _), runs in groups.items():
        names[(setup, runs[0].name)] = names.get((setup, runs[0].name), 0) + 1
    out = []
    for (setup, spec), runs in groups.items():
        name = runs[0].name
        if names[(setup, name)] > 1:  # two specs under one name: say which is which
            name += f" (spec {spec.removeprefix('setup:')[:8]})"
        good = [r for r in runs if timed(r)]
        est = None
        if len(good) == 1:  # one run: its own (within-run) interval
            one = good[0].iter_ms_mean or 0.0
            single = within_variance(good[0])
            rel = math.sqrt(single) / one if single else None
            est = RandomEffects(1, one, good[0].iter_ms_ci95_lo, good[0].iter_ms_ci95_hi, one,
                                None, None, rel)  # fmt: skip
        elif good:
            means = [r.iter_ms_mean or 0.0 for r in good]
            est = random_effects(means, [within_variance(r) for r in good])
        strategy = next((r.strategy for r in runs if r.strategy), None)
        out.append(RepeatSet(name, strategy, setup, runs[0].spec_hash, tuple(runs), est))
    return out


def same_round_speedups(rows: Sequence[RunMetrics]) -> list[RunMetrics]:
    """Per-run speedups of an interleaved matrix against the baseline run of the same round.

    ``speedup.compare`` relates every run to one baseline run; with repeats each run is set
    beside the baseline's repeat from its own round (same ``repeat_group`` and
    ``repeat_round``) when that one was timed, and ``na_reasons['speedup']`` says so.
    """
    index = {
        (r.setup_key, r.name, r.repeat_group, r.repeat_round): r
        for r in rows
        if timed(r) and r.repeat_group is not None
    }
    out = []
    for r in rows:
        base = index.get((r.setup_key, r.baseline, r.repeat_group, r.repeat_round))
        if base is None or r.iter_ms_mean is None or r.repeat_group is None:
            out.append(r)
            continue
        ratio, lo, hi = speedup_interval(base, r)
        na = dict(r.na_reasons)
        na["speedup"] = f"vs {base.name} of the same round ({r.repeat_round}): within-run interval"
        out.append(replace(r, speedup=ratio, speedup_ci95_lo=lo, speedup_ci95_hi=hi,
                           na_reasons=na))  # fmt: skip
    return out


# ---------------------------------------------------------------------------- speedups


@dataclass(frozen=True)
class Ratio:
    """``a / b`` of two repeat sets' iteration times (a speedup when ``a`` is the baseline)."""

    value: float
    """exp(difference of the estimated log means): the geometric mean of the per-round
    ratios when paired."""
    ci_lo: float | None
    """Lower bound of the 95% interval; None when no between-run interval exists."""
    ci_hi: float | None
    """Upper bound."""
    df: int | None
    """Residual degrees of freedom of the interval."""
    method: str
    """``PAIRED_METHOD``, ``UNPAIRED_METHOD``, or why there is no between-run interval."""
    pairs: int = 0
    """Rounds in which both ran (paired comparison)."""

    @property
    def between(self) -> bool:
        """The interval includes the run-to-run spread."""
        return self.ci_lo is not None

    @property
    def decided(self) -> bool:
        """The between-run interval excludes 1."""
        return (
            self.ci_lo is not None
            and self.ci_hi is not None
            and (self.ci_lo > 1.0 or self.ci_hi < 1.0)
        )


@dataclass(frozen=True)
class _Fit:
    """Least-squares fit of log run means on set (and round) indicators."""

    coef: np.ndarray
    """Coefficients: sets first, then rounds."""
    cov_unscaled: np.ndarray
    """Pseudo-inverse of X'X."""
    projector: np.ndarray
    """X^+ X: a contrast c is estimable when c X^+ X = c."""
    sigma: float
    """Residual standard deviation (log scale)."""
    df: int
    """Residual degrees of freedom."""
    residuals: dict[int, list[float]]
    """Set index -> its runs' residuals."""


def _fit(obs: list[tuple[int, int | None, float]], n_sets: int) -> _Fit | None:
    """Fit ``log t = set (+ round)`` to (set index, round index or None, log time)."""
    blocks = sorted({b for _, b, _ in obs if b is not None})
    col = {b: n_sets + i for i, b in enumerate(blocks)}
    x = np.zeros((len(obs), n_sets + len(blocks)))
    y = np.array([v for _, _, v in obs])
    for i, (s, b, _) in enumerate(obs):
        x[i, s] = 1.0
        if b is not None:
            x[i, col[b]] = 1.0
    coef, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    df = len(obs) - int(rank)
    if df < 1:
        return None
    resid = y - x @ coef
    sigma = math.sqrt(float(resid @ resid) / df)
    xtx_pinv = np.linalg.pinv(x.T @ x)
    by_set: dict[int, list[float]] = {}
    for (s, _, _), e in zip(obs, resid, strict=True):
        by_set.setdefault(s, []).append(float(e))
    return _Fit(coef, xtx_pinv, np.linalg.pinv(x) @ x, sigma, df, by_set)


@dataclass(frozen=True)
class SpeedupModel:
    """The log-scale model of one setup group's repeat sets (see the module docstring)."""

    sets: tuple[RepeatSet, ...]
    """The group's repeat sets."""
    paired: _Fit | None
    """Fit with a round term over the runs that share a round with another set."""
    unpaired: _Fit | None
    """Fit without a round term over every timed run."""
    index: dict[tuple[str, str], int] = field(default_factory=dict)
    """Set key -> column."""
    rounds: dict[tuple[int, int], set[tuple[str, int]]] = field(default_factory=dict)
    """Set index pair -> rounds both ran in (``(group, round)``)."""

    @property
    def residual_sd(self) -> dict[str, float]:
        """Set name -> root mean square residual of its runs (log scale, ~ relative spread),
        for sets with 2 or more runs in the fit used for pairs, else the unpaired fit."""
        fit = self.paired or self.unpaired
        if fit is None:
            return {}
        out = {}
        for i, res in fit.residuals.items():
            if len(res) >= 2:
                out[self.sets[i].name] = math.sqrt(statistics.fmean(e * e for e in res))
        return out

    @property
    def pooled(self) -> tuple[float, int, str] | None:
        """(residual sd on the log scale, df, method) of the fit used for pairs."""
        if self.paired is not None:
            return self.paired.sigma, self.paired.df, PAIRED_METHOD
        if self.unpaired is not None:
            return self.unpaired.sigma, self.unpaired.df, UNPAIRED_METHOD
        return None

    def ratio(self, a: RepeatSet, b: RepeatSet) -> Ratio | None:
        """``a / b`` with its between-run interval; None when either has no timed run."""
        if a.estimate is None or b.estimate is None:
            return None
        ia, ib = self.index[_key(a)], self.index[_key(b)]
        if not (a.between and b.between):
            single = a.name if not a.between else b.name
            return Ratio(
                _geo(a) / _geo(b), None, None, None,
                f"no between-run interval: {single} ran once (within-run noise only)",
            )  # fmt: skip
        pairs = len(self.rounds.get((min(ia, ib), max(ia, ib)), set()))
        fit, method = self.paired, PAIRED_METHOD
        if fit is None or not pairs or not _estimable(fit, ia, ib):
            fit, method, pairs = self.unpaired, UNPAIRED_METHOD, 0
        if fit is None or not _estimable(fit, ia, ib):
            return Ratio(_geo(a) / _geo(b), None, None, None,
                         "no between-run interval: no residual degrees of freedom")  # fmt: skip
        c = np.zeros(len(fit.coef))
        c[ia], c[ib] = 1.0, -1.0
        d = float(c @ fit.coef)
        se = fit.sigma * math.sqrt(max(float(c @ fit.cov_unscaled @ c), 0.0))
        half = t95(fit.df) * se
        return Ratio(math.exp(d), math.exp(d - half), math.exp(d + half), fit.df, method, pairs)


def _key(s: RepeatSet) -> tuple[str, str]:
    return s.setup_key, s.spec_hash or f"name:{s.name}"


def _geo(s: RepeatSet) -> float:
    return math.exp(statistics.fmean(math.log(r.iter_ms_mean or 1.0) for r in s.timed_runs))


def _estimable(fit: _Fit, ia: int, ib: int) -> bool:
    c = np.zeros(len(fit.coef))
    c[ia], c[ib] = 1.0, -1.0
    return bool(np.allclose(c @ fit.projector, c, atol=1e-8))


def speedup_model(sets: Sequence[RepeatSet]) -> SpeedupModel:
    """Fit the group's model: paired over runs whose (group, round) holds 2+ sets."""
    index = {_key(s): i for i, s in enumerate(sets)}
    obs: list[tuple[int, tuple[str, int] | None, float]] = []
    for i, s in enumerate(sets):
        for r in s.timed_runs:
            rnd = (r.repeat_group, r.repeat_round) if r.repeat_group else None
            obs.append((i, rnd, math.log(r.iter_ms_mean or 1.0)))  # type: ignore[arg-type]
    members: dict[tuple[str, int], set[int]] = {}
    for i, rnd, _ in obs:
        if rnd is not None:
            members.setdefault(rnd, set()).add(i)
    shared = {b for b, m in members.items() if len(m) >= 2}
    rounds: dict[tuple[int, int], set[tuple[str, int]]] = {}
    for b in shared:
        ms = sorted(members[b])
        for x in ms:
            for y in ms:
                if x < y:
                    rounds.setdefault((x, y), set()).add(b)
    block_id = {b: j for j, b in enumerate(sorted(shared))}
    paired_obs = [(i, block_id[b], v) for i, b, v in obs if b in shared]
    paired = _fit(paired_obs, len(sets)) if shared else None
    unpaired = _fit([(i, None, v) for i, _, v in obs], len(sets)) if obs else None
    return SpeedupModel(tuple(sets), paired, unpaired, index, rounds)


# ---------------------------------------------------------------------------- single runs


def reference_spread(sets: Sequence[RepeatSet], target: RepeatSet) -> tuple[float, str] | None:
    """Relative run-to-run spread (sd of the log run means) of repeats recorded on ``target``'s
    setup:
    the same strategy when it was repeated, else the median over the setup's repeated sets.
    Returns (relative spread, where it comes from), or None when nothing was repeated."""
    repeated = [
        s for s in sets if s.setup_key == target.setup_key and s.between and s is not target
    ]
    same = [s for s in repeated if s.strategy == target.strategy]
    pool = same or repeated
    if not pool:
        return None
    cvs = [s.estimate.spread for s in pool if s.estimate and s.estimate.spread is not None]
    if not cvs:
        return None
    runs = sum(s.estimate.k for s in pool if s.estimate)
    what = (
        f"{pool[0].name} repeated ({runs} runs)"
        if same and len(pool) == 1
        else f"median over {len(pool)} repeated spec(s) of this setup ({runs} runs)"
    )
    return statistics.median(cvs), what


# ---------------------------------------------------------------------------- one setup group


@dataclass(frozen=True)
class GroupRepeats:
    """A setup group seen as repeat sets, with speedups against its baseline set."""

    setup_key: str
    """Setup group."""
    sets: tuple[RepeatSet, ...]
    """Its repeat sets."""
    base: RepeatSet | None
    """The baseline set: the timed set named like the rows' ``baseline`` (chosen by
    ``speedup.compare``), the one with the most timed runs when several specs share that name."""
    model: SpeedupModel
    """The group's log-scale model."""
    speedups: dict[tuple[str, str], Ratio]
    """Set key -> baseline / set."""

    def speedup(self, s: RepeatSet) -> Ratio | None:
        """Baseline / ``s``, or None (``s`` is the baseline, or untimed, or no baseline)."""
        return self.speedups.get(_key(s))

    @property
    def repeated(self) -> bool:
        """Some spec of the group has two or more timed runs."""
        return any(s.between for s in self.sets)

    def ranked(self) -> list[RepeatSet]:
        """Timed sets, fastest mean first."""
        return sorted((s for s in self.sets if s.estimate), key=lambda s: s.estimate.mean)  # type: ignore[union-attr]


def group_repeats(rows: Sequence[RunMetrics]) -> GroupRepeats:
    """The repeat sets of one setup group's rows and their speedups."""
    sets = repeat_sets(rows)
    names = [r.baseline for r in rows if timed(r) and r.baseline]
    base_name = statistics.mode(names) if names else None
    candidates = [s for s in sets if s.runs[0].name == base_name and s.estimate is not None]
    base = max(candidates, key=lambda s: len(s.timed_runs)) if candidates else None
    model = speedup_model(sets)
    speedups = {}
    if base is not None:
        for s in sets:
            ratio = model.ratio(base, s) if s is not base else None
            if ratio is not None:
                speedups[_key(s)] = ratio
    key = rows[0].setup_key if rows else ""
    return GroupRepeats(key, tuple(sets), base, model, speedups)


def _interval(lo: float | None, hi: float | None, digits: int) -> str:
    return "" if lo is None or hi is None else f" [{number(lo, digits)}, {number(hi, digits)}]"


def _ratio_kind(r: Ratio) -> str:
    if not r.between:
        return "within-run only"
    if r.method == PAIRED_METHOD:
        return f"paired, {r.pairs} round(s), {r.df} df"
    return f"unpaired, {r.df} df"


def results_table(g: GroupRepeats) -> list[str]:
    """Markdown: one row per repeat set (the unit), and the notes on spreads and single runs."""
    if not g.sets:
        return []
    if not g.repeated:
        return [
            "Each spec here ran once: the intervals above cover within-run noise only (the "
            "scatter of a run's windows), not the run-to-run spread, which on a shared machine "
            "is larger; no repeats are recorded on this setup to say how large (`REPEAT=3` runs "
            "interleaved repeats and the report then gives between-run intervals).",
            "",
        ]
    lines = [
        "Repeats (one row per spec; every completed timed run of it is a repeat):",
        "",
        "| spec | strategy | runs timed | ms/iter over repeats [95% CI] | run-to-run spread | "
        "between-run (net) | within-run se | speedup [95% CI] | interval |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in g.sets:
        est = s.estimate
        runs = f"{len(s.timed_runs)}/{len(s.runs)} ({s.rounds})"
        if est is None:
            lines.append(f"| {s.name} | {s.strategy or '?'} | {runs} | n/a | | | | | |")
            continue
        spread = f"{est.spread:.1%}" if est.spread is not None else "one run"
        ratio = g.speedup(s)
        speed = (f"{ratio.value:.2f}x" + _interval(ratio.ci_lo, ratio.ci_hi, 2)) if ratio else ""
        kind = _ratio_kind(ratio) if ratio else ("baseline" if s is g.base else "")
        mean_kind = "" if s.between else " (within-run)"
        lines.append(
            f"| {s.name} | {s.strategy or '?'} | {runs} | {est.mean:,.1f}"
            f"{_interval(est.ci_lo, est.ci_hi, 0)}{mean_kind} | {spread} | {percent(est.tau)} | "
            f"{percent(est.within)} | {speed} | {kind} |"
        )
    lines += [
        "",
        f"Legend: ms/iter is the {RANDOM_EFFECTS_METHOD} (a spec that ran once: its own "
        "within-run interval). Spreads are relative (sd of the log run means, ~ coefficient of "
        "variation): run-to-run as seen; between-run (net) without the within-run error of each "
        "mean (moment estimate); within-run se, the typical relative standard error of one run's "
        "mean from its own windows. Speedup = baseline / spec, the ratio of the geometric means "
        f"(balanced rounds), interval from the repeats: {PAIRED_METHOD}, else {UNPAIRED_METHOD}.",
        "",
    ]
    pooled = g.model.pooled
    residual = g.model.residual_sd
    if pooled is not None and residual:
        per = ", ".join(f"{name} {sd:.1%}" for name, sd in residual.items())
        lines.append(
            f"- Between-run spread of a ratio, pooled over the group: {pooled[0]:.1%} (log-scale "
            f"residual sd, {pooled[1]} df); per spec (rms residual): {per}. The pooled interval "
            "assumes the specs scatter alike."
        )
        noisy = [name for name, sd in residual.items() if sd > pooled[0]]
        if noisy:
            lines.append(
                f"- {', '.join(noisy)} scattered more than the pool: "
                f"{'its' if len(noisy) == 1 else 'their'} speedup interval is likely narrower "
                "than it should be; more repeats would tell."
            )
    for s in g.sets:
        if s.estimate is not None and not s.between:
            lines.append(f"- {single_run_note(g.sets, s)}")
    lines.append("")
    return lines


def single_run_note(sets: Sequence[RepeatSet], s: RepeatSet) -> str:
    """What a set with one run can and cannot say about the run-to-run spread."""
    text = f"{s.name} ran once: its interval covers within-run noise only (its windows)"
    ref = reference_spread(sets, s)
    if ref is None:
        return text + (
            "; no repeats are recorded on this setup, so the run-to-run spread is unknown "
            "(`REPEAT=3` measures it)."
        )
    cv, where = ref
    return text + f"; repeats recorded on this setup scattered by {cv:.1%} run to run ({where})."


def first_of_each(rows: Sequence[RunMetrics]) -> list[RunMetrics]:
    """The first run of each repeat set among ``rows`` (one statement per spec, not per run)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for r in rows:
        if set_key(r) not in seen:
            seen.add(set_key(r))
            out.append(r)
    return out


def speed_findings(g: GroupRepeats) -> list[str]:
    """Fastest and slowest mean over repeats, and one statement per spec against the baseline
    from the between-run interval (nothing when no spec was repeated)."""
    out: list[str] = []
    ranked = g.ranked()
    if not g.repeated or not ranked:
        return out
    if len(ranked) >= 2:
        fast, slow = ranked[0], ranked[-1]
        assert fast.estimate is not None and slow.estimate is not None
        out.append(
            f"Fastest mean over repeats: **{fast.name}** ({fast.strategy}) at "
            f"{fast.estimate.mean:,.1f} ms/iteration ({fast.estimate.k} run(s)); slowest: "
            f"**{slow.name}** ({slow.strategy}) at {slow.estimate.mean:,.1f} ms "
            f"({slow.estimate.k} run(s))."
        )
    if g.base is None:
        return out
    for s in g.ranked():
        r = g.speedup(s)
        if r is None or r.ci_lo is None or r.ci_hi is None:
            continue
        where = f"between-run 95% interval {r.ci_lo:.2f}-{r.ci_hi:.2f}, {_ratio_kind(r)}"
        if r.ci_lo > 1.0:
            out.append(f"{s.name} is faster than {g.base.name}: {r.value:.2f}x ({where}).")
        elif r.ci_hi < 1.0:
            out.append(f"{s.name} is slower than {g.base.name}: {r.value:.2f}x ({where}).")
        else:
            out.append(
                f"{s.name} vs {g.base.name}: {r.value:.2f}x ({where}) includes 1: no measurable "
                "difference."
            )
    return out


def speed_recommendation(key: str, g: GroupRepeats) -> list[str]:
    """Names a winner only when the between-run interval of its speedup excludes 1."""
    ranked = g.ranked()
    if not ranked:
        return []
    best = ranked[0]
    base = g.base
    if base is None:
        return [
            f"- {key}: fastest mean {best.name} ({best.estimate.mean:,.1f} ms/iteration), but no "  # type: ignore[union-attr]
            "completed baseline to relate it to: no winner named."
        ]
    if not best.between or not base.between:
        spread = reference_spread(g.sets, best)
        known = (
            f"the run-to-run spread recorded on this setup is {spread[0]:.1%} ({spread[1]})"
            if spread
            else "the run-to-run spread on this setup is unknown"
        )
        return [
            f"- {key}: no measurable difference can be claimed: one run per spec gives no "
            "between-run interval, so no winner is named; the "
            f"fastest mean is {best.name} ({best.estimate.mean:,.1f} ms/iteration) and {known}. "  # type: ignore[union-attr]
            "Repeat the matrix (`REPEAT=3`) to separate them."
        ]
    if best is base:
        runner = ranked[1] if len(ranked) > 1 else None
        r = g.speedup(runner) if runner else None
        if runner is None or r is None or not r.decided:
            vs = f" and {runner.name}" if runner else ""
            why = (
                f" (speedup {r.value:.2f}x, interval {r.ci_lo:.2f}-{r.ci_hi:.2f})"
                if (r and r.between)
                else ""
            )
            return [
                f"- {key}: no measurable difference between {base.name}{vs}{why}: keep "
                f"**{base.strategy}**, the simplest, or collect more repeats."
            ]
        return [
            f"- {key}: for speed use **{base.strategy}** ({base.name}, {base.estimate.mean:,.1f} "  # type: ignore[union-attr]
            f"ms/iteration): the next fastest, {runner.name}, is slower ({r.value:.2f}x, "
            f"between-run interval {r.ci_lo:.2f}-{r.ci_hi:.2f})."
        ]
    r = g.speedup(best)
    if r is None:
        return []
    if not r.decided or r.value < 1.0:
        where = (
            f"interval {r.ci_lo:.2f}-{r.ci_hi:.2f}, {_ratio_kind(r)}"
            if r.between
            else _ratio_kind(r)
        )
        return [
            f"- {key}: no measurable difference: {best.name} has the lowest mean "
            f"({best.estimate.mean:,.1f} ms/iteration) but its speedup vs {base.name} is "  # type: ignore[union-attr]
            f"{r.value:.2f}x ({where}), which includes 1. Keep {base.name}, or repeat more."
        ]
    out = [
        f"- {key}: for speed use **{best.strategy}** ({best.name}, {best.estimate.mean:,.1f} "  # type: ignore[union-attr]
        f"ms/iteration): {r.value:.2f}x vs {base.name}, between-run 95% interval "
        f"{r.ci_lo:.2f}-{r.ci_hi:.2f} ({_ratio_kind(r)})."
    ]
    runner = next((s for s in ranked[1:] if s is not base), None)
    if runner is not None:
        gap = g.model.ratio(runner, best)
        if gap is not None and gap.between and not gap.decided:
            out.append(
                f"- {key}: {best.name} and {runner.name} cannot be told apart here "
                f"({runner.name} / {best.name} = {gap.value:.2f}x, interval "
                f"{gap.ci_lo:.2f}-{gap.ci_hi:.2f}): either is as fast."
            )
    return out


def to_json(rows: Sequence[RunMetrics]) -> list[dict[str, Any]]:
    """summary.json's ``"repeats"``: one entry per repeat set with its between-run figures."""
    out = []
    groups: dict[str, list[RunMetrics]] = {}
    for r in rows:
        groups.setdefault(r.setup_key, []).append(r)
    for group in groups.values():
        g = group_repeats(group)
        for s in g.sets:
            est, ratio = s.estimate, g.speedup(s)
            out.append(
                {
                    "setup_key": s.setup_key,
                    "name": s.name,
                    "strategy": s.strategy,
                    "spec_hash": s.spec_hash,
                    "runs": [r.path for r in s.runs],
                    "runs_timed": len(s.timed_runs),
                    "iter_ms_mean": est.mean if est else None,
                    "iter_ms_ci95_lo": est.ci_lo if est else None,
                    "iter_ms_ci95_hi": est.ci_hi if est else None,
                    "iter_ms_interval": (
                        RANDOM_EFFECTS_METHOD if s.between else "within-run only (one run)"
                    ),
                    "iter_ms_arithmetic_mean": est.arithmetic_mean if est else None,
                    "iter_ms_spread": est.spread if est else None,
                    "iter_ms_between_run_net": est.tau if est else None,
                    "iter_ms_within_run_se": est.within if est else None,
                    "baseline": g.base.name if g.base else None,
                    "speedup": ratio.value if ratio else None,
                    "speedup_ci95_lo": ratio.ci_lo if ratio else None,
                    "speedup_ci95_hi": ratio.ci_hi if ratio else None,
                    "speedup_interval": ratio.method if ratio else None,
                    "speedup_df": ratio.df if ratio else None,
                    "speedup_rounds_paired": ratio.pairs if ratio else None,
                }
            )
    return out


def label(row: RunMetrics) -> str:
    """A run's name in the report's tables: ``tiny-zero2 r2`` for round 2 of a repeated matrix."""
    return row.name + (f" r{row.repeat_round}" if row.repeat_round is not None else "")


def summary_line(key: str, g: GroupRepeats) -> str | None:
    """The executive summary's line for a group with repeats (None without repeats)."""
    ranked = g.ranked()
    if not g.repeated or not ranked:
        return None
    best = ranked[0]
    est = best.estimate
    assert est is not None
    line = (
        f"- **{key}**: fastest mean {best.name} ({best.strategy}), {est.mean:,.1f} ms/iteration "
        f"over {est.k} repeat(s)" + _interval(est.ci_lo, est.ci_hi, 0)
    )
    ratio = g.speedup(best)
    if ratio is not None and g.base is not None:
        line += f", {ratio.value:.2f}x vs {g.base.name}" + _interval(ratio.ci_lo, ratio.ci_hi, 2)
        line += "" if ratio.decided else " (no measurable difference)"
    return line
