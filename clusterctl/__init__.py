"""clusterctl: compile a job spec on the login node, run it on Slurm."""

__version__ = "0.1.0"
