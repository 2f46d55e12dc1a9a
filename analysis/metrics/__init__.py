"""Per-run metrics (one row per run), timers and breakdowns, speedups, and repeats."""
