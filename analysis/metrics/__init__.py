"""Per-run metrics (one row per run), timers and breakdowns, speedups, repeats, MFU and GPU memory
per rank (``hardware``), and the statistics (t quantiles, intervals, Welch) they use."""
