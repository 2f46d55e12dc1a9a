"""The statistics every figure with an interval uses: the Student-t quantile of a 95% interval,
the summary of a sample with its t-interval, and Welch's difference of two means.

The quantile is scipy's exact one at the actual degrees of freedom (``scipy.special.stdtrit``:
the inverse of Student's t distribution that ``scipy.stats.t.ppf`` calls; ``scipy.stats``
itself takes a second to import), a fractional Welch df included: no table rows, no rounding.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtrit


def t95(df: float) -> float:
    """Two-sided 95% Student-t critical value at ``df`` degrees of freedom (any real df >= 1, a
    Welch-Satterthwaite df included): ``stdtrit(df, 0.975)``, exact to double precision."""
    if not df >= 1:
        raise ValueError(f"df({df}) must be >= 1")
    return float(stdtrit(df, 0.975))


@dataclass(frozen=True)
class Stats:
    """Summary of samples with a t-interval for the mean."""

    n: int
    """Number of samples."""
    mean: float
    """Arithmetic mean."""
    median: float
    """Median."""
    std: float | None
    """Sample standard deviation (n-1); None for n < 2."""
    ci_lo: float | None
    """Lower bound of the 95% t-interval of the mean; None for n < 2."""
    ci_hi: float | None
    """Upper bound."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n({self.n}) must be >= 1")

    @property
    def sem(self) -> float | None:
        """Standard error of the mean."""
        return None if self.std is None else self.std / math.sqrt(self.n)


EXACT_UP_TO = 100_000
"""Samples up to which ``describe`` uses ``statistics`` (correctly rounded, each value a Python
float, its ``stdev`` summing exact fractions); above, numpy (the mean and standard deviation to
within a few units in the last place, in a few bytes per value: a log-interval-1 run of 2M
iterations kept 54 MB of floats and much more for the exact sums)."""


def describe(samples: Sequence[float] | np.ndarray) -> Stats:
    """Mean, median, std, 95% CI = mean ± t95(n-1) * std / sqrt(n)."""
    n = len(samples)
    if not n:
        raise ValueError("no samples")
    if n > EXACT_UP_TO:
        a = np.asarray(samples, dtype=float)
        mean, median = math.fsum(a) / n, float(np.median(a))
    else:
        values = [float(x) for x in samples]
        mean, median = statistics.fmean(values), statistics.median(values)
        if n < 2:
            return Stats(1, mean, median, None, None, None)
    std = sample_std(a if n > EXACT_UP_TO else values)  # (converted once)
    half = t95(n - 1) * std / math.sqrt(n)
    return Stats(n, mean, median, std, mean - half, mean + half)


def sample_std(samples: Sequence[float] | np.ndarray) -> float:
    """Sample standard deviation (n - 1) of two or more values: ``statistics.stdev`` up to
    ``EXACT_UP_TO`` values, numpy above."""
    if len(samples) > EXACT_UP_TO:
        return float(np.std(np.asarray(samples, dtype=float), ddof=1))
    return statistics.stdev([float(x) for x in samples])


def welch(a: tuple[float, float, int], b: tuple[float, float, int]) -> tuple[float, float, float]:
    """Welch's unequal-variance comparison of two means from ``(mean, sem, n)`` each:
    ``(mean_b - mean_a, se, df)`` with ``se = sqrt(sem_a^2 + sem_b^2)`` and the
    Welch-Satterthwaite ``df = se^4 / (sem_a^4 / (n_a - 1) + sem_b^4 / (n_b - 1))``
    (``n_a + n_b - 2`` when both spreads are 0): Welch (1947), Biometrika 34, 28-35;
    Satterthwaite (1946), Biometrics Bulletin 2, 110-114. The same statistic as
    ``scipy.stats.ttest_ind_from_stats(..., equal_var=False)``, which returns only the t and p
    (scipy 1.17), not the df and standard error an interval needs."""
    (ma, sa, na), (mb, sb, nb) = a, b
    se = math.sqrt(sa**2 + sb**2)
    if se == 0:
        return mb - ma, 0.0, float(na + nb - 2)
    df = se**4 / (sa**4 / (na - 1) + sb**4 / (nb - 1))
    return mb - ma, se, df
