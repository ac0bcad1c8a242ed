"""The run's state (clusterctl.runstate) and run record (clusterctl.runrecord), as plain dicts for the report.

Both are read through guarded imports: the report still works where either
module is older or missing, and then leaves its section out. The scheduler is
never asked (derive without `jobs`): the run directory alone decides.
"""

from __future__ import annotations

import importlib
from typing import Any

from clusterctl import rundir
from clusterctl.errors import ClusterctlError
from clusterctl.rundir import RunDir, read_json

ATTEMPT_COLUMNS = ("attempt", "job_id", "nodes", "start", "end", "exit_code", "meaning", "steps")
RECORD = "record.json"


def run_state(run: RunDir) -> tuple[dict[str, Any] | None, str | None]:
    """(state as a dict, None) or (None, why it is not shown)."""
    try:
        runstate = importlib.import_module("clusterctl.runstate")
    except ImportError as exc:
        return None, f"run state not available ({exc})"
    derive = getattr(runstate, "derive", None)
    if derive is None:
        return None, "run state not available (clusterctl.runstate has no derive)"
    try:
        state = derive(run)
    except ClusterctlError as exc:
        return None, f"run state not available: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - the plots are still worth showing
        return None, f"run state could not be derived ({type(exc).__name__}: {exc})"
    data = state.as_dict() if hasattr(state, "as_dict") else dict(vars(state))
    return data, None


def attempts_table(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The attempts as rows of ATTEMPT_COLUMNS (nodes joined)."""
    rows = []
    for a in state.get("attempts") or []:
        row = {k: a.get(k) for k in ATTEMPT_COLUMNS}
        row["nodes"] = ",".join(map(str, a.get("nodes") or []))
        rows.append(row)
    return rows


def summary(state: dict[str, Any]) -> dict[str, Any]:
    """The state's headline fields."""
    keys = ("state", "reason", "job_id", "step", "checkpoint", "goodput", "lost_gpu_hours", "allocated_gpu_hours",
            "exit_code", "submitted")
    return {k: state.get(k) for k in keys}


def run_record(run: RunDir) -> tuple[dict[str, Any] | None, str]:
    """(record, where it came from): clusterctl.runrecord.load when it exists, else the latest attempt's record.json."""
    try:
        runrecord = importlib.import_module("clusterctl.runrecord")  # optional, written alongside
    except ImportError:
        runrecord = None
    load = getattr(runrecord, "load", None) if runrecord is not None else None
    if load is not None:
        try:
            record = load(run)
        except ClusterctlError as exc:
            return None, exc.message
        except Exception as exc:  # noqa: BLE001 - the rest of the report is still worth showing
            return None, f"run record could not be assembled ({type(exc).__name__}: {exc})"
        if isinstance(record, dict):
            return record, "clusterctl record"
    for n in reversed(run.attempts()):
        record = read_json(run.attempt(n) / getattr(rundir, "RECORD", RECORD))
        if record is not None:
            return record, f"attempt-{n}/{RECORD}"
    return None, "no run record"
