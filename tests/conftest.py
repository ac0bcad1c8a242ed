"""Shared test set-up: the real Slurm test cluster (tests/slurmlab) for tests marked `slurm`."""

pytest_plugins = ["tests.slurmlab.plugin"]
