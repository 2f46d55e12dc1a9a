"""The emulated cluster on one machine: namespaces and shaped links (net, cluster), CPU budgets,
planted faults (faults), Slurm, the collective benchmark, a session of runs on the lab and its
bring-up. ``python -m launchers.lab``."""
