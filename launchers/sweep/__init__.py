"""The sweep: which TP x PP x DP split, ZeRO stage, micro-batch size (and recompute, on GPU) is
fastest for a model on a cluster, and does it fit.

``space`` enumerates the configurations and resolves each with the same validation as a single
run; ``plan`` drops what the memory model says cannot fit, chooses the anchor runs that calibrate
the time model (``analysis.predict``) and predicts every configuration with an interval;
``loop`` measures the anchors, then the best predicted configurations, recalibrating after every
run, until the budget is spent (reusing completed runs; Ctrl-C keeps what finished), and writes
``<logs>/sweep.json``; ``command`` is ``python -m launchers sweep``. The report's sweep section
(``analysis.report.sweep``) reads that record with the runs' logs.
"""
