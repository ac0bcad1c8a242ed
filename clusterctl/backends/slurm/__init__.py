"""The Slurm backend: sbatch to submit; the scheduler query (squeue/scontrol, or pyslurm) for everything else."""
