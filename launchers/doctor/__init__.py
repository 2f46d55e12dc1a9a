"""The pre-flight doctor: probe every node, judge what it has. ``python -m launchers.doctor``."""
