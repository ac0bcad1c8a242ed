"""The run's state (views/state.py) and run record (views/record.py), as plain dicts for the report.

The scheduler is never asked (derive without `jobs`): the run directory alone
decides. A run whose state or record cannot be worked out still gets its
plots; the page says why that section is missing.
"""

from __future__ import annotations

from typing import Any

from clusterctl.errors import ClusterctlError
from clusterctl.rundir import RunDir
from clusterctl.views import record as runrecord
from clusterctl.views import state as runstate

ATTEMPT_COLUMNS = ("attempt", "job_id", "nodes", "start", "end", "exit_code", "meaning", "steps")
SUMMARY_KEYS = ("state", "reason", "job_id", "step", "checkpoint", "goodput", "useful_gpu_hours", "startup_gpu_hours",
                "lost_gpu_hours", "other_gpu_hours", "allocated_gpu_hours", "exit_code", "submitted")


def run_state(run: RunDir) -> tuple[dict[str, Any] | None, str | None]:
    """(state as a dict, None) or (None, why it is not shown)."""
    try:
        return runstate.derive(run).as_dict(), None
    except ClusterctlError as exc:
        return None, f"run state not available: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - the plots are still worth showing
        return None, f"run state could not be derived ({type(exc).__name__}: {exc})"


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
    return {k: state.get(k) for k in SUMMARY_KEYS}


def run_record(run: RunDir) -> tuple[dict[str, Any] | None, str]:
    """(record, where it came from), or (None, why there is none)."""
    try:
        return runrecord.load(run), "clusterctl record"
    except ClusterctlError as exc:
        return None, exc.message
    except Exception as exc:  # noqa: BLE001 - the rest of the report is still worth showing
        return None, f"run record could not be assembled ({type(exc).__name__}: {exc})"
