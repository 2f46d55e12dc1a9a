"""What the model says without a log: the resolved setup of a run (``RunSetup``), GPT formulas
(parameters, FLOPs, memory), the collectives each strategy issues and their bytes, the per-rank
costs the time model uses, the steady-state rule, the presets reader, the number format, and the
dense peak TFLOP/s per GPU model and dtype (``hardware``)."""
