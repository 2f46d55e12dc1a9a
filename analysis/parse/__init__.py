"""Parsing of training logs into typed runs. ``python -m analysis.parse LOG... --json``.

Its public face: ``reader`` (``parse_file``, ``parse_text``, ``parse_lines``, ``merge_runs``,
``strict``) and ``records`` (``ParsedRun`` and the record types the metrics read).
docs/parsing.md says what each module owns and how they fit.
"""
