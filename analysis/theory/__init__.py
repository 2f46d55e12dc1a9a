"""What the model says without a log: GPT formulas (parameters, FLOPs, memory), the collectives each
strategy issues and their bytes, and the per-rank costs the time model uses."""
