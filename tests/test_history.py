"""The run's history, folded once (rundir/history.py): one table of recorded histories, every way a run goes.

Each case is attempts.jsonl as the batch script, the recovery step and the
commands write it (plus state.json and cancel.json), and what the fold must
say: where the run stands, the job it is in, each attempt's end and meaning,
who cancelled it, the faults counted against the budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clusterctl.rundir import RunDir, history
from clusterctl.rundir.history import CONTINUED, ENDED, RESTARTING, RUNNING, STOPPED, SUBMITTED, fold

T = 1_800_000_000


def start(n: int, job: str = "100", at: int = 0) -> dict[str, Any]:
    return {"event": "start", "attempt": n, "job_id": job, "time": T + at, "master": "n1:29500", "nodes": 2}


def end(n: int, code: int | None, job: str = "100", at: int = 10, **more: Any) -> dict[str, Any]:
    return {"event": "end", "attempt": n, "job_id": job, "exit": code, "time": T + at, **more}


def nxt(n: int, how: str, code: int, reason: str, job: str = "100", at: int = 10, **more: Any) -> dict[str, Any]:
    return {"event": "next", "attempt": n, "job_id": job, "how": how, "exit": code, "reason": reason, "time": T + at, **more}


SUBMITTED_STATE = {"state": "submitted", "backend": "slurm", "job_id": "100"}

CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]], dict[str, Any] | None, dict[str, Any]]] = [
    # name, state.json, events, cancel.json, what the fold says
    ("pending", SUBMITTED_STATE, [], None,
     {"position": SUBMITTED, "job": "100", "attempts": [], "jobs": ["100"]}),
    ("dry run", {"state": "dry-run", "backend": "local"}, [], None,
     {"position": SUBMITTED, "job": None, "dry_run": True}),
    ("failed submission", {"state": "failed", "backend": "slurm", "reason": "Invalid account", "exit_code": 65}, [], None,
     {"dry_run": False, "submission": "failed", "submission_reason": "Invalid account", "submission_exit": 65}),
    ("training", SUBMITTED_STATE, [start(1)], None,
     {"position": RUNNING, "attempts": [(1, "100", None, "running", None)], "begun_by": ["first attempt"]}),
    ("restarting in the allocation", SUBMITTED_STATE,
     [start(1), end(1, 82, verdict="rank 3 on n2 hung"),
      nxt(1, "allocation", 82, "exit 82 (hang); restarting in the allocation", counted=True, culprit_hosts=["n2"],
          committed_step=29, exclude=["n2"])], None,
     {"position": RESTARTING, "attempts": [(1, "100", 82, "hang verdict", "allocation")], "exclude": ["n2"],
      "faults": [(82, ("n2",), 29, "100")], "committed_step": 29}),
    ("restarted", SUBMITTED_STATE,
     [start(1), end(1, 82), nxt(1, "allocation", 82, "restarting", counted=True, culprit_hosts=["n2"]), start(2, at=12)],
     None, {"position": RUNNING, "attempts": [(1, "100", 82, "hang verdict", "allocation"), (2, "100", None, "running", None)],
            "begun_by": ["first attempt", "allocation"]}),
    ("continued in a new job", SUBMITTED_STATE,
     [start(1), end(1, 85), nxt(1, "continuation", 85, "stopped before the time limit", next_job="101")], None,
     {"position": CONTINUED, "job": "101", "jobs": ["100", "101"], "faults": [],
      "attempts": [(1, "100", 85, "pre-timeout or preempted, checkpoint committed", "continuation")]}),
    ("completed", SUBMITTED_STATE, [start(1), end(1, 0), nxt(1, "stop", 0, "training finished")], None,
     {"position": STOPPED, "exit_code": 0, "reason": "training finished", "cancelled_by": None,
      "attempts": [(1, "100", 0, "success", "stop")]}),
    ("budget spent", SUBMITTED_STATE, [start(1), end(1, 87), nxt(1, "stop", 87, "restart.budget 0 is spent")], None,
     {"position": STOPPED, "exit_code": 87, "attempts": [(1, "100", 87, "restart budget exhausted or no progress", "stop")]}),
    ("cancelled by clusterctl cancel", SUBMITTED_STATE,
     [start(1), {"event": "cancel", "by": "clusterctl cancel", "save": True, "time": T + 5}, end(1, 89),
      nxt(1, "stop", 89, "stopped: by clusterctl cancel", cancelled_by="clusterctl cancel")],
     {"by": "clusterctl cancel", "save": True},
     {"position": STOPPED, "cancelled_by": "clusterctl cancel", "cancel_asked": {"by": "clusterctl cancel", "save": True},
      "exit_code": 89, "attempts": [(1, "100", 89, "cancelled by clusterctl cancel", "stop")]}),
    # Runs from before 89 recorded what the stopped ranks or srun gave; a cancel still reads as one, with its one code.
    ("cancelled by scancel, as main wrote it before cancelled_by", SUBMITTED_STATE,
     [start(1), end(1, 85), nxt(1, "stop", 85, "stopped: the job was cancelled (scancel)")], None,
     {"position": STOPPED, "cancelled_by": "scancel", "exit_code": 89, "attempts": [(1, "100", 89, "cancelled by scancel", "stop")]}),
    ("an older cancel recorded as srun's 84", SUBMITTED_STATE,
     [start(1), end(1, 84, srun_exit=137), nxt(1, "stop", 84, "stopped: by clusterctl cancel", cancelled_by="clusterctl cancel")],
     None, {"exit_code": 89, "faults": [], "attempts": [(1, "100", 89, "cancelled by clusterctl cancel", "stop")]}),
    ("an older cancel before the rendezvous, recorded as 80", SUBMITTED_STATE,
     [start(1), end(1, 80, verdict="the job was stopped from outside (scancel, clusterctl cancel or the time limit) before"
                                   " the rendezvous completed: 1 of 2 ranks had arrived; no node is blamed"),
      nxt(1, "stop", 80, "stopped: the job was cancelled (scancel)", cancelled_by="scancel")],
     None, {"exit_code": 89, "faults": [], "attempts": [(1, "100", 89, "cancelled by scancel", "stop")]}),
    ("stopped before the next job started", SUBMITTED_STATE,
     [start(1), end(1, 85), nxt(1, "continuation", 85, "continuing", next_job="101"),
      {"event": "cancel", "by": "clusterctl cancel", "time": T + 20},
      nxt(0, "stop", 89, "stopped by clusterctl cancel before this job started", job="101", at=30, cancelled_by="clusterctl cancel")],
     {"by": "clusterctl cancel"},
     {"position": STOPPED, "cancelled_by": "clusterctl cancel", "preamble_events": ["next"], "job": "101", "exit_code": 89,
      "attempts": [(1, "100", 85, "pre-timeout or preempted, checkpoint committed", "continuation")]}),
    ("stopped before the next job started, as main wrote it with exit 0", SUBMITTED_STATE,
     [start(1), end(1, 85), nxt(1, "continuation", 85, "continuing", next_job="101"),
      {"event": "cancel", "by": "clusterctl cancel", "time": T + 20},
      nxt(0, "stop", 0, "stopped by clusterctl cancel before this job started", job="101", at=30, cancelled_by="clusterctl cancel")],
     {"by": "clusterctl cancel"}, {"position": STOPPED, "cancelled_by": "clusterctl cancel", "exit_code": 89}),
    ("requeued by hand", SUBMITTED_STATE,
     [start(1), end(1, 82), nxt(1, "stop", 87, "no progress", counted=True, culprit_hosts=["n2"]),
      {"event": "requeue", "by": "clusterctl requeue", "next_job": "102", "exclude": ["n2", "n3"], "time": T + 60},
      start(2, job="102", at=70)], None,
     {"position": RUNNING, "job": "102", "faults": [], "exclude": ["n2", "n3"], "jobs": ["100", "102"],
      "begun_by": ["first attempt", "requeue"]}),
    ("the batch script died", SUBMITTED_STATE, [start(1), start(2, job="101", at=40)], None,
     {"open": [1, 2], "position": RUNNING}),
    ("its end recorded by the next job", SUBMITTED_STATE,
     [start(1), end(1, None, reason="no end was recorded: the batch script of job 100 died with it", recorded_by="101")],
     None, {"position": ENDED, "open": [],
            "attempts": [(1, "100", None, "no end was recorded: the batch script of job 100 died with it", None)]}),
    ("local job ids", {"state": "submitted", "backend": "local", "job_id": "local-7"}, [start(1, job="7")], None,
     {"job": "7", "jobs": ["7"]}),
]


@pytest.mark.parametrize("name, state, events, cancel, says", CASES, ids=[c[0] for c in CASES])
def test_the_fold_says_where_the_run_stands(
    name: str, state: dict[str, Any], events: list[dict[str, Any]], cancel: dict[str, Any] | None, says: dict[str, Any]
) -> None:
    h = fold(events, state, cancel)
    for key, want in says.items():
        if key == "attempts":
            got = [(a.number, a.job_id, a.exit_code, a.meaning, a.next) for a in h.attempts]
        elif key == "faults":
            got = [(f.code, f.hosts, f.committed_step, f.job_id) for f in h.faults]
        elif key == "begun_by":
            got = [None if a.begun_by is None else a.begun_by.get("how") or a.begun_by.get("event") for a in h.attempts]
        elif key == "open":
            got = [a.number for a in h.open_attempts()]
        elif key == "preamble_events":
            got = [e["event"] for e in h.preamble]
        else:
            got = getattr(h, key)
        assert got == want, f"{name}: {key}"


def test_a_standalone_run_that_clusterctl_cancel_stopped_reads_cancelled() -> None:
    """No recovery step records the cancel: the batch script's one end (srun's 143 made 84) follows the cancel event."""
    events = [start(1), {"event": "cancel", "by": "clusterctl cancel", "save": False, "time": T + 5},
              end(1, 84, at=6, srun_exit=143)]
    h = fold(events, SUBMITTED_STATE, {"by": "clusterctl cancel"}, standalone=True)
    (a,) = h.attempts
    assert (h.position, h.exit_code, a.exit_code, a.meaning) == (STOPPED, 89, 89, "cancelled by clusterctl cancel")
    finished = fold([start(1), end(1, 0)], SUBMITTED_STATE, standalone=True)  # no cancel: its end is its own
    assert (finished.exit_code, finished.attempts[0].cancelled_by) == (0, None)


def test_every_event_belongs_to_its_attempt_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    (tmp_path / "state.json").write_text(json.dumps(SUBMITTED_STATE))
    lines = [json.dumps(e) for e in (start(1), {"event": "signal", "attempt": 1, "job_id": "100", "signal": "USR2", "time": T + 3})]
    (tmp_path / "attempts.jsonl").write_text("\n".join(lines) + '\n{"event": "end", "attem\n')
    history.append(run, history.EVENT_END, attempt=1, job_id="100", exit=85, time=T + 9)
    h = history.read(run)
    (a,) = h.attempts
    assert [e["event"] for e in a.events] == ["start", "signal", "end"] and a.signal == "USR2" and a.exit_code == 85
    assert h.position == ENDED


def test_an_attempt_directory_without_events_is_an_attempt_too(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    (tmp_path / "state.json").write_text(json.dumps(SUBMITTED_STATE))
    run.attempt(1).mkdir()
    (run.attempt(1) / "attempt.json").write_text(json.dumps({"job_id": "100", "attempt": 1, "started": T}))
    (a,) = history.read(run).attempts
    assert (a.number, a.job_id, a.start, a.ended) == (1, "100", T, False)


def test_nothing_else_parses_attempts_jsonl() -> None:
    """One reader of the run's history: only rundir/history.py opens the events file or splits its lines."""
    package = Path(__file__).resolve().parents[1] / "clusterctl"
    readers = sorted(
        str(p.relative_to(package)) for p in package.rglob("*.py")
        if ("events_file" in p.read_text() or "ATTEMPTS" in p.read_text()) and p.name not in ("history.py", "layout.py")
    )
    assert readers == ["render/runfiles.py", "render/scripts.py"], readers  # they create it and tell the batch script its name
