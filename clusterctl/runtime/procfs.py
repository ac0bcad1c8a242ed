"""A process's state as /proc shows it: for the aggregator's view of its ranks and the fault injector."""

from __future__ import annotations


def process_state(pid: int) -> str:
    """The one-letter state from /proc/PID/stat (R, S, D, T, t, Z, ...), '' when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return text[text.rfind(")") + 2 :].split(" ", 1)[0]
