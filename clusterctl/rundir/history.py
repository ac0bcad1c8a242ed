"""attempts.jsonl: the run's history, its one format and its one fold.

Writers append events (`append`): the batch script (start, end, signal; its
shell function writes the same keys), the recovery step on the batch host
(end of an attempt whose batch script died, `next`: how the run goes on),
`clusterctl cancel` and `clusterctl requeue`. Every reader asks `read(run)`
(or `fold`, the pure part) and gets the same answer: each attempt with its
start, end, exit code, signal, the decision after it and who cancelled it,
and the run's position now (running, restarting, continued in job J,
stopped). state.json (what `submit` knew) and cancel.json (a cancel asked
for) are folded in here too, so nothing else reads them for the story.

Events, one JSON object per line (`time`: whole seconds since the epoch):

    start   attempt, job_id, master, nodes
    end     attempt, job_id, exit (null: no end recorded, see reason), srun_exit,
            committed_step, verdict (the controller's message), reason
    signal  attempt, job_id, signal (USR2, TERM, ...): the batch shell trapped it
    next    attempt, job_id, how (NEXT_*), exit, reason, exclude, counted, culprit_hosts,
            culprit_ranks, fault, signature (the verdict's: the next fault is judged against them),
            committed_step, next_job (continuation), hosts/replaced (allocation),
            width (allocation: an elastic job's change of nodes, dp and batch, each [before, after]),
            released (allocation: the nodes an elastic shrink gave back to Slurm),
            unelastic (the script failed at a shrunk width: the run shrinks no more),
            cancelled_by (the stop came from a cancel: `clusterctl cancel` or `scancel`)
    cancel  by, save                       `clusterctl cancel` was asked
    requeue by, next_job, exclude, overrides   `clusterctl requeue` continued the run
    grow    attempt, job_id, next_job, exclude, reason   an elastic job that shrank queued its full-size job;
            a `next` with grow_withdrawn (that job's id) cancelled it; with by (`clusterctl suspects
            --clear`), that job's exclusion changed (or it was queued then): a node it left out was cleared;
            next_job "" and refused (Slurm's reason): it could not be queued

A torn or foreign line is skipped. Keys are only ever added.

A cancel has one code: an attempt a cancel stopped (its `next` says who, or a
standalone run's end after `clusterctl cancel`) and the run it stopped read
89 (CANCELLED) here, whatever their events recorded: runs before 89 existed
recorded the code the stopped ranks or srun gave (80, 84, 85, 0).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.exitcodes import ExitCode, meaning
from clusterctl.rundir import attemptjson, jobid, layout, runjson, secretenv
from clusterctl.rundir.jsonio import read_json

EVENT_START = "start"
EVENT_END = "end"
EVENT_SIGNAL = "signal"
EVENT_NEXT = "next"
EVENT_CANCEL = "cancel"
EVENT_REQUEUE = "requeue"  # `clusterctl requeue` continued the run by hand
EVENT_GROW = "grow"  # an elastic job shrank in its allocation and queued its full-size job (next_job) at once
NEXT_ALLOCATION = "allocation"  # a new attempt inside the same allocation
NEXT_CONTINUATION = "continuation"  # a new job (next_job), submitted before this one ended
NEXT_REQUEUE = "requeue"  # scontrol requeue of this job
NEXT_SLURM = "slurm"  # Slurm requeued the job itself (preemption, scontrol requeue from outside)
NEXT_STOP = "stop"  # the run stops here (exit says why)
SCANCEL = "scancel"  # cancelled_by when Slurm cancelled the job (scancel, an admin) rather than clusterctl

# Where the run stands, as the history alone tells it (views/state.py adds the scheduler's word).
SUBMITTED = "submitted"  # no attempt has started (or a requeue's job has not)
RUNNING = "running"  # an attempt started and has not ended
ENDED = "ended"  # an attempt ended; the decision after it is not recorded (yet, or ever)
RESTARTING = "restarting"  # the next attempt starts in the same allocation
CONTINUED = "continued"  # the run goes on in another job (continuation, requeue)
STOPPED = "stopped"  # the run stopped here: `exit_code` and `reason` say why


def read_events(path: Path) -> list[dict[str, Any]]:
    """attempts.jsonl, oldest first; a torn or foreign line is skipped."""
    found: list[dict[str, Any]] = []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            found.append(event)
    return found


def append(run: layout.RunDir, event: str, **fields: Any) -> dict[str, Any]:
    """One line, one write with O_APPEND: concurrent writers (the batch script too) never tear lines."""
    record = {"event": event, **fields}
    record.setdefault("time", int(time.time()))
    data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(run.events_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    if event == EVENT_NEXT and fields.get("how") == NEXT_STOP:
        secretenv.remove(run.path)  # every stop is recorded here: a run that stopped keeps no secret on disk
    return record


@dataclass(frozen=True)
class Fault:
    """An attempt's fault that counted against restart.budget (recorded by the recovery step)."""

    code: int
    hosts: tuple[str, ...]  # its culprits' nodes
    committed_step: int | None  # the newest committed checkpoint when it ended
    job_id: str
    fault: str = ""  # whose fault its verdict said (rundir/verdict.FAULTS); "" before the key was recorded
    ranks: tuple[int, ...] = ()  # its culprits' ranks, primary first
    signature: str = ""  # the primary culprit's error, numbers aside (runtime/errorpatterns.signature)
    attempt: int = 0  # the attempt it ended


@dataclass
class AttemptHistory:
    """One attempt as attempts.jsonl tells it."""

    number: int
    job_id: str  # the scheduler's own id (SLURM_JOB_ID)
    start: float | None = None
    end: float | None = None  # its end event, else the decision after it; None while it runs
    exit_code: int | None = None  # None: running, or its end was never recorded
    end_reason: str = ""  # the controller's verdict line, or why no end was recorded
    signal: str | None = None  # the latest stop signal the batch shell trapped during it
    next: str | None = None  # how the run went on after it (NEXT_*)
    next_job: str | None = None
    next_reason: str = ""
    next_time: float | None = None
    width: dict[str, Any] | None = None  # an elastic shrink or growth that began the next attempt (nextattempt.width_change)
    cancelled_by: str | None = None  # it was stopped by a cancel: "clusterctl cancel", "scancel", ...
    committed_step: int | None = None  # the newest committed checkpoint its end recorded
    begun_by: dict[str, Any] | None = None  # the decision that began it (the previous attempt's `next`, a requeue)
    events: list[dict[str, Any]] = field(default_factory=list)  # its own events, in order (the Chrome trace shows them)

    @property
    def ended(self) -> bool:
        return self.end is not None or self.exit_code is not None or self.next is not None

    @property
    def meaning(self) -> str:
        """What its end meant, in a few words: running, the exit code's meaning, or who cancelled it."""
        if self.cancelled_by:
            return f"cancelled by {self.cancelled_by}"
        if not self.ended:
            return "running"
        if self.exit_code is None:
            return self.end_reason or meaning(None)
        return meaning(self.exit_code)


@dataclass
class History:
    """The whole run as its history tells it, before any scheduler is asked."""

    attempts: list[AttemptHistory]
    position: str  # SUBMITTED, RUNNING, ENDED, RESTARTING, CONTINUED or STOPPED
    job: str | None  # the job the run is in now or waits for (the scheduler's own id)
    exit_code: int | None  # the latest recorded exit (of the attempt, or of the decision)
    reason: str  # the latest decision's or end's words
    cancelled_by: str | None  # who cancelled the run (a cancel event, or a cancel that stopped it)
    signal: str | None  # a stop signal trapped during the running attempt
    last_time: float | None  # the newest event's time
    jobs: list[str]  # every job the run has had, oldest first
    faults: tuple[Fault, ...]  # counted faults since the run was last requeued by hand
    exclude: list[str]  # the nodes the decisions made the run avoid (the latest list)
    committed_step: int | None  # the newest committed checkpoint an event recorded
    submission: str  # state.json `state`: rendered, dry-run, submitted, failed ("" when missing)
    submission_reason: str  # state.json `reason` of a failed submission
    submission_exit: int | None
    backend: str | None  # state.json `backend`
    cancel_asked: dict[str, Any] | None  # cancel.json: a cancel (or a requeue's hold) is in force
    preamble: list[dict[str, Any]] = field(default_factory=list)  # events before the first attempt (a stop before any start)
    grow_job: str | None = None  # an elastic run's full-size job, queued while a shrunk attempt trains, not yet begun
    grow_exclude: list[str] = field(default_factory=list)  # the nodes that queued job leaves out (its grow event's)
    grow_refused: bool = False  # the shrunk attempt's full-size job could not be queued (a grow event without next_job)
    excluded_since: dict[str, float] = field(default_factory=dict)  # each node of `exclude`: when the run began to avoid it
    unelastic: bool = False  # its script failed at a shrunk width (a `next` with unelastic): the run shrinks no more

    def attempt(self, number: int) -> AttemptHistory | None:
        for a in self.attempts:
            if a.number == number:
                return a
        return None

    @property
    def current(self) -> AttemptHistory | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def stopped(self) -> bool:
        """The run stopped for good (a `next` that stops it, or a standalone run's one end)."""
        return self.position == STOPPED

    @property
    def dry_run(self) -> bool:
        return self.submission in ("dry-run", "rendered") and not self.attempts and not self.jobs

    def avoided(self, spec_exclude: tuple[str, ...] | list[str] = (),
                forgiven: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Every node the run avoids now: the spec's, then all that later decisions added, less those `forgiven`
        since (suspects.forgiven of excluded_since: cleared, so usable again; never the spec's own)."""
        return list(dict.fromkeys([*spec_exclude, *(n for n in self.exclude if n not in forgiven)]))

    @property
    def cancel_by(self) -> str:
        """Who asked the whole run to stop (cancel.json), or "" while no cancel is in force."""
        return asker(self.cancel_asked)

    def open_attempts(self) -> list[AttemptHistory]:
        """Attempts that started and never recorded an end (their batch script died with them)."""
        return [a for a in self.attempts if a.start is not None and a.exit_code is None and a.end is None]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _cancelled_by(event: dict[str, Any]) -> str | None:
    """Who cancelled, from a `next` that stopped the run because of a cancel (older events say it in the reason)."""
    by = event.get("cancelled_by")
    if isinstance(by, str) and by:
        return by
    reason = str(event.get("reason") or "")
    if reason.startswith("stopped: the job was cancelled"):
        return SCANCEL
    for prefix in ("stopped: by ", "stopped by "):
        if reason.startswith(prefix):
            return reason[len(prefix):].split(" before ")[0] or "clusterctl cancel"
    return None


def fold(
    events: list[dict[str, Any]],
    state: dict[str, Any] | None = None,
    cancel: dict[str, Any] | None = None,
    standalone: bool = False,
) -> History:
    """The history from attempts.jsonl's events, state.json and cancel.json. Pure.

    A standalone batch script runs one attempt and decides nothing after it: its end is the run's end.
    """
    state = state or {}
    attempts: dict[int, AttemptHistory] = {}
    jobs: list[str] = []
    submitted = jobid.native(state.get("job_id"))
    if submitted:
        jobs.append(submitted)
    h = History([], SUBMITTED, submitted or None, None, "", None, None, None, jobs, (), [], None,
                str(state.get("state") or ""), str(state.get("reason") or ""), _int(state.get("exit_code")),
                state.get("backend") if isinstance(state.get("backend"), str) else None, cancel)
    faults: list[Fault] = []
    raw_jobs: list[Any] = []  # every event's job ids, made the scheduler's own once at the end
    owner = 0  # the attempt an event without one belongs to: the previous event's
    pending_begin: dict[str, Any] | None = None  # the decision that the next attempt's start follows
    for e in events:
        kind = e.get("event")
        when = _num(e.get("time"))
        if when is not None:
            h.last_time = when
        raw_jobs.append(e.get("job_id"))
        if "next_job" in e:
            raw_jobs.append(e["next_job"])
        if kind == EVENT_GROW:
            h.grow_job = jobid.native(e.get("next_job")) or None
            h.grow_exclude = [str(n) for n in e.get("exclude") or []]
            h.grow_refused = h.grow_job is None  # Slurm refused it (too few nodes but the avoided): a clear queues it
        elif h.grow_job and (jobid.native(e.get("job_id")) == h.grow_job or e.get("grow_withdrawn")):
            h.grow_job = None  # it began (its first event), or was withdrawn
        number = _int(e.get("attempt"))
        if number is not None:
            owner = number
        if owner > 0 and owner not in attempts:  # an attempt's first event (its start, or an end without one)
            attempts[owner] = AttemptHistory(owner, jobid.native(e.get("job_id")))
        a = attempts.get(owner) if owner > 0 else None
        (a.events if a is not None else h.preamble).append(e)
        if kind == EVENT_START and a is not None:
            a.start, a.job_id = when, jobid.native(e.get("job_id")) or a.job_id
            a.begun_by = pending_begin if pending_begin is not None else ({"how": "first attempt"} if owner == 1 else None)
            pending_begin = None
            h.position, h.job, h.signal = RUNNING, a.job_id or h.job, None
            h.exit_code, h.reason = None, ""
        elif kind == EVENT_END and a is not None:
            a.end = when
            a.exit_code = _int(e.get("exit"))
            a.end_reason = str(e.get("verdict") or e.get("reason") or "")
            if _int(e.get("committed_step")) is not None:
                a.committed_step = e["committed_step"]
            if standalone and h.cancelled_by and a.exit_code != 0:  # no recovery step to say so: the cancel ended it
                a.cancelled_by, a.exit_code = h.cancelled_by, int(ExitCode.CANCELLED)
            h.position, h.exit_code = (STOPPED if standalone else ENDED), a.exit_code
            h.reason = a.end_reason
            if standalone and not h.reason:
                h.reason = "every rank finished" if a.exit_code == 0 else f"exit {a.exit_code}: {meaning(a.exit_code)}"
        elif kind == EVENT_SIGNAL:
            name = str(e.get("signal") or "")
            h.signal = name
            if a is not None:
                a.signal = name
        elif kind == EVENT_NEXT:
            h.grow_refused = False  # the shrunk attempt ended: nothing waits to grow back
            how = str(e.get("how") or "") or None
            h.reason = str(e.get("reason") or "")
            if _int(e.get("exit")) is not None:
                h.exit_code = e["exit"]
            by = _cancelled_by(e) if how == NEXT_STOP else None
            if a is not None:
                a.next, a.next_job = how, jobid.native(e.get("next_job")) or None
                a.next_reason, a.next_time = h.reason, when
                a.width = e["width"] if isinstance(e.get("width"), dict) else None
                if a.end is None:
                    a.end = when
                if a.exit_code is None and _int(e.get("exit")) is not None:
                    a.exit_code = e["exit"]
                if by:
                    a.cancelled_by, a.exit_code = by, int(ExitCode.CANCELLED)
            if by:
                h.cancelled_by, h.exit_code = by, int(ExitCode.CANCELLED)
            if isinstance(e.get("exclude"), list):
                _set_exclude(h, e["exclude"], when)
            h.unelastic = h.unelastic or bool(e.get("unelastic"))
            if e.get("counted"):
                faults.append(Fault(int(e.get("exit") or 0), tuple(str(x) for x in e.get("culprit_hosts") or ()),
                                    _int(e.get("committed_step")), jobid.native(e.get("job_id")), str(e.get("fault") or ""),
                                    tuple(r for r in e.get("culprit_ranks") or () if isinstance(r, int)),
                                    str(e.get("signature") or ""), _int(e.get("attempt")) or 0))
            pending_begin = e
            if how == NEXT_ALLOCATION:
                h.position = RESTARTING
            elif how == NEXT_CONTINUATION:
                h.position, h.job = CONTINUED, jobid.native(e.get("next_job")) or h.job
            elif how in (NEXT_REQUEUE, NEXT_SLURM):
                h.position = CONTINUED
            else:
                h.position = STOPPED
        elif kind == EVENT_CANCEL:
            h.cancelled_by = str(e.get("by") or "clusterctl cancel")
        elif kind == EVENT_REQUEUE:
            faults = []  # `clusterctl requeue` gives the run a fresh budget
            h.position, h.job, h.cancelled_by = CONTINUED, jobid.native(e.get("next_job")) or h.job, None
            h.reason = f"requeued by hand as job {jobid.native(e.get('next_job'))}"
            if isinstance(e.get("exclude"), list):
                _set_exclude(h, e["exclude"], when)
            pending_begin = e
        if _int(e.get("committed_step")) is not None:
            h.committed_step = e["committed_step"]
    h.attempts = [attempts[n] for n in sorted(attempts)]
    jobs += [native for native in map(jobid.native, dict.fromkeys(raw_jobs)) if native]
    h.jobs = list(dict.fromkeys(jobs))
    h.faults = tuple(faults)
    return h


def _set_exclude(h: History, nodes: list[Any], when: float | None) -> None:
    """A decision's list of the nodes the run avoids; each keeps the time it first came into it."""
    h.exclude = [str(n) for n in nodes]
    h.excluded_since = {n: h.excluded_since.get(n, when or 0.0) for n in h.exclude}


def asker(cancel: dict[str, Any] | None) -> str:
    """cancel.json's `by` (written by `clusterctl cancel`, held by `requeue`), or "" where no cancel is in force."""
    return str(cancel.get("by") or "clusterctl cancel") if cancel is not None else ""


def cancel_asked_by(run: layout.RunDir) -> str:
    """Who asked the run to stop, from cancel.json alone: asked again just before a decision is carried out (the
    cancel may have come meanwhile) and where a process needs no more of the history than that."""
    return asker(read_json(run.path / layout.CANCEL))


def read(run: layout.RunDir, standalone: bool | None = None) -> History:
    """The run's history from its directory: attempts.jsonl, state.json, cancel.json and run.json's mode
    (`standalone`, when the caller has read run.json already).

    An attempt directory without a single event (its batch script died before it wrote the start) is an
    attempt too: it is listed with what its attempt.json says.
    """
    if standalone is None:
        plan = runjson.read(run.path)
        standalone = plan is not None and plan.standalone
    h = fold(read_events(run.events_file), read_json(run.path / layout.STATE), read_json(run.path / layout.CANCEL),
             standalone)
    known = {a.number for a in h.attempts}
    extra = [n for n in run.attempts() if n not in known]
    for n in extra:
        info = attemptjson.read(run.attempt(n)) or attemptjson.AttemptJson()
        h.attempts.append(AttemptHistory(n, jobid.native(info.job_id), info.started))
    if extra:
        h.attempts.sort(key=lambda a: a.number)
    return h
