"""The pre-flight doctor: reach every node the way the run will (transport), judge what its
probe found (verdicts), report and gate runs (check). ``python -m launchers.doctor``."""
