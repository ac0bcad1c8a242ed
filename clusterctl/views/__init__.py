"""Read-only views of a run: its state, logs, run record, Chrome trace and report. None of them writes to a run."""
