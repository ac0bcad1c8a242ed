"""Rendering: a plan into the files of a run (job.sbatch, wrapper.sh, run.json), and a new run directory written whole."""
