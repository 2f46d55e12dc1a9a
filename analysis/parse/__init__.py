"""Parsing of training logs into typed runs: the line machine (runs, failures, streams), the bulk
reader of high-volume lines, the records it produces. ``python -m analysis.parse LOG... --json``."""
