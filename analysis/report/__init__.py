"""The report: markdown, figures, summary.json and the console table.

``python -m analysis.report LOGDIR``."""
