"""Running a spec: the run directory (render, sbatch), execution through the deepspeed launcher, the
rank wrapper for srun/mpirun, memory limits."""
