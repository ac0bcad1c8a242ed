"""attempt-N/phase-times.json: how long the attempt's checkpoint saves and its load took, as its watchdog measured them.

    save        the longest save every rank finished (first rank in to last one out), seconds
    load        the same for the load the attempt began with
    load_from   what that load read: "durable" (a committed generation) or "memory" (host-memory snapshots)

The controller writes it as the attempt ends (a key it did not measure is
left out); a later attempt's controller reads every earlier one
(`run_longest`), so that its first save, and its one load, are judged by
this run's own times instead of the configured 15 minutes. An attempt begins
with its only load: without the earlier attempts' there is nothing to judge
it by. A load from host memory is no measure of one from the file system,
which a later attempt may need: only durable loads count.
"""

from __future__ import annotations

from pathlib import Path

from clusterctl.rundir.jsonio import read_json, write_json_atomic
from clusterctl.rundir.layout import PHASE_TIMES, RECORD, RunDir

LOAD_DURABLE = "durable"
LOAD_MEMORY = "memory"


def loaded_from(attempt_dir: Path) -> str | None:
    """What the attempt's resume read, from its run record (attempt-N/record.json, whose `recovery.resumed_from`
    trainer/runrecord.py's `resumed` writes): a committed generation, host memory, or None (from scratch, or no
    record: a script without the Contract or an adapter)."""
    record = read_json(attempt_dir / RECORD) or {}
    recovery = record.get("recovery")
    source = recovery.get("resumed_from") if isinstance(recovery, dict) else None
    if not isinstance(source, dict):
        return None
    return LOAD_MEMORY if source.get("memory") else LOAD_DURABLE


def write(attempt_dir: Path, longest: dict[str, float], load_from: str | None) -> None:
    """This attempt's measured saves and load (nothing when it measured none)."""
    record = {phase: round(seconds, 3) for phase, seconds in sorted(longest.items())}
    if not record:
        return
    if "load" in record:
        record["load_from"] = load_from
    write_json_atomic(attempt_dir / PHASE_TIMES, record)


def run_longest(run_dir: Path, before: int) -> dict[str, float]:
    """The longest save and durable load of the run's attempts numbered below `before`: {phase: seconds}."""
    longest: dict[str, float] = {}
    run = RunDir(Path(run_dir))
    for number in run.attempts():
        if number >= before:
            continue
        record = read_json(run.attempt(number) / PHASE_TIMES)
        if not isinstance(record, dict):
            continue
        for phase in ("save", "load"):
            seconds = record.get(phase)
            if phase == "load" and record.get("load_from") != LOAD_DURABLE:
                continue
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0:
                longest[phase] = max(float(seconds), longest.get(phase, 0.0))
    return longest
