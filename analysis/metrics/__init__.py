"""Per-run metrics (one row per run), timers and breakdowns, speedups, repeats, and the statistics
(t quantiles, intervals, Welch) they use."""
