"""Notations both sides parse, standard library only: Slurm hostlists, CPU lists, durations and counts, ports."""
