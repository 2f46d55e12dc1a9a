"""The emulated cluster on one machine: namespaces and shaped links, CPU budgets, Slurm, the
collective benchmark, and sessions of runs. ``python -m launchers.lab``."""
