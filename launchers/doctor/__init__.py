"""The pre-flight doctor: reach every node the way the run will (transport), judge what its
probe found (verdicts), report and gate runs (check), measure the links between node pairs
(links, with linkprobe on every node). ``python -m launchers.doctor``."""
