"""Running a spec: the run directory (render, sbatch), execution through the deepspeed launcher
(execute; the GPUs of a CUDA run's nodes, ``gpus``) and the verdict of its logs, the rank
wrapper for srun/mpirun, cgroup limits (memory, CPU), and the matrix of runs that survives bad
runs."""
