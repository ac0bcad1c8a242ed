"""Actions on runs: submit, cancel, requeue, and following a run until it ends."""
