"""A run's state: the one function that derives it, for every command that shows one.

Facts have one writer each (the batch script and the recovery step append to
attempts.jsonl, the controller writes verdict.json, rank 0 writes
metrics.jsonl, `submit` writes state.json). The history (rundir/history.py)
is their one fold; this module adds what the scheduler says, the metrics and
the checkpoints, and names the state. The scheduler is asked at most once
for all the runs shown, and only about jobs the run directory cannot settle;
a job it has forgotten is read from the run directory alone.

Goodput (docs/guide/day-to-day.md says the same): the allocated GPU time of
each attempt (from its start to the next attempt's start in the same job,
else to its end, times the allocation's GPUs, spares included) is split into

* useful:   the steps the run kept, times the world size;
* start-up: from each attempt's start to the start of its first step (an
            attempt still starting: all of its time so far);
* lost:     steps a later attempt redid, attempts that failed before
            their first step, and a failed attempt's time from its last step
            to its end (every GPU waiting for the verdict, then the teardown:
            a rank hung in a save idles all of them until it is named);
* other:    the rest: checkpoint saves and evaluations between steps, idle
            spare nodes, the wind-down after the last step of an attempt
            that finished, stopped to save or was cancelled, the gap before
            a restart, and an attempt that finished without reporting a step
            (its time cannot be split).

`goodput` is useful / allocated; it is unknown (null) for a run that never
reported a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.backends.base import Backend, JobInfo
from clusterctl.checkpoint.generations import committed_steps
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode, meaning
from clusterctl.rundir import attemptjson, history, jobid, layout, runjson
from clusterctl.rundir import verdict as verdictfile
from clusterctl.rundir.history import History
from clusterctl.rundir.layout import RunDir
from clusterctl.rundir.metrics import MetricsFile
from clusterctl.rundir.verdict import Verdict
from clusterctl.syntax import hostlist

# The states a run can be in (`status --json` key `state`).
PENDING = "pending"
STARTING = "starting"
TRAINING = "training"
RESTARTING = "restarting"
STOPPING = "stopping"  # a verdict that restarts nothing (the script's own error, 88): its ranks are being stopped
CONTINUED = "continued"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
DRY_RUN = "dry-run"  # rendered and never submitted: `clusterctl requeue` submits it
STATES = (PENDING, STARTING, TRAINING, RESTARTING, STOPPING, CONTINUED, COMPLETED, FAILED, CANCELLED, DRY_RUN)
FINAL = (COMPLETED, FAILED, CANCELLED)
GOING = (PENDING, STARTING, TRAINING, RESTARTING, STOPPING, CONTINUED)  # the runs plain `status` shows


@dataclass
class Attempt:
    """One launch of all ranks, as the run directory tells it."""

    attempt: int  # its number, from 1 (attempt-N/)
    job_id: str  # the job it ran in, as the user sees it (local-N on the local backend)
    nodes: list[str]  # the hosts it ran on
    start: float | None  # when it started (seconds since the epoch)
    end: float | None  # when it ended; None while it runs
    exit_code: int | None  # the attempt's exit code (ExitCode); None while it runs or when no end was recorded
    meaning: str  # what the exit code meant, why the attempt ended, or who cancelled it
    steps: int  # steps done in this attempt
    first_step: int | None = None  # the first step it reported (after a restart: the committed step + 1)
    last_step: int | None = None  # the last step it reported
    gpus: int = 0  # GPUs allocated to it (nodes x GPUs per node, spares included)
    kept_steps: int = 0  # its steps that the run kept (not redone after a restart)
    kept_s: float = 0.0  # wall time of the kept steps
    next: str | None = None  # how the run went on: history.NEXT_* (allocation, continuation, ...)
    next_job: str | None = None  # the job the run went on in (a continuation, a requeue)
    next_reason: str = ""  # why it went on that way (the recovery step's words)
    width: dict[str, Any] | None = None  # an elastic change of width after it: nodes, dp, grad_accum, ... [before, after]
    verdict: str = ""  # the controller's one-line verdict when it was not ok
    culprits: list[dict[str, Any]] = field(default_factory=list)  # the verdict's culprits: rank, host, gpu, reason
    cancelled_by: str | None = None  # a cancel stopped it: `clusterctl cancel`, `scancel`
    startup_s: float | None = None  # from its start to its first step's start (None: unknown)
    steps_s: float = 0.0  # wall time of all its steps
    last_step_t: float | None = None  # when its last step ended (None: unknown)


@dataclass
class RunState:
    run: str  # the run id (its directory's name)
    path: Path  # the run directory
    name: str  # the spec's name
    state: str  # one of STATES
    reason: str  # why: Slurm's pending reason, the verdict, the stop reason
    job_id: str | None  # the job the run is in now (or ended in)
    step: int | None  # the newest step reported, in any attempt
    loss: float | None  # rank 0's loss at that step, where the script reports one
    tokens_per_s: float | None  # over the recent steps, where the script reports tokens
    eta_s: float | None  # seconds to total_steps at the recent pace
    total_steps: int | None  # the steps the run will take, where the script says
    attempts: list[Attempt]  # every attempt, oldest first
    checkpoint: int | None  # latest committed step
    goodput: float | None  # useful (kept steps) / allocated GPU time; None when no step was reported
    lost_gpu_hours: float | None  # steps redone and attempts that ended before their first step
    allocated_gpu_hours: float | None  # GPU time allocated to the attempts (spares included)
    exit_code: int | None  # the run's exit code once it stopped
    submitted: float | None  # when it was submitted (seconds since the epoch)
    last_change: float | None  # when anything of it last changed: an event, a step, a verdict
    backend: str | None = None  # slurm or local
    useful_gpu_hours: float | None = None  # the steps the run kept, times the world size
    startup_gpu_hours: float | None = None  # each attempt's start to its first step
    other_gpu_hours: float | None = None  # saves, evaluations, idle spares, wind-down, restart gaps
    step_s: float | None = None  # seconds a step over the current attempt's steps (the step watcher's, no record() needed)
    grow_job: str | None = None  # an elastic run shrunk: its full-size job, queued to take over when it starts

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunState":
        """Back from `status --json` (a login node's answer, shown here)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known = Attempt.__dataclass_fields__
        fields["attempts"] = [Attempt(**{k: v for k, v in a.items() if k in known}) for a in data.get("attempts") or []]
        fields["path"] = Path(str(data.get("path", "")))
        return cls(**fields)

    def as_dict(self) -> dict[str, Any]:
        """`status --json`: job ids as the user sees them (local-N on the local backend)."""
        data = asdict(self)
        data["path"] = str(self.path)
        for attempt in data["attempts"]:
            attempt["job_id"] = jobid.display(attempt["job_id"], self.backend)
            attempt["next_job"] = jobid.display(attempt["next_job"], self.backend)
        data["grow_job"] = jobid.display(self.grow_job, self.backend) if self.grow_job else None
        return data


def wanted_job(run: RunDir) -> str | None:
    """The one job whose scheduler state the derivation needs, or None when the run directory settles it."""
    return _wanted(history.read(run))


def _wanted(h: History) -> str | None:
    return None if h.stopped or not h.job else h.job


def _attempts(run: RunDir, h: History, run_json: runjson.RunJson) -> list[Attempt]:
    found = []
    for a in h.attempts:
        info = attemptjson.read(run.attempt(a.number)) or attemptjson.AttemptJson()
        nodes = list(info.hosts)
        try:
            count = hostlist.count(info.nodelist) if info.nodelist else len(nodes) + info.spares
        except ValueError:
            count = len(nodes)
        shown = Attempt(a.number, a.job_id, nodes, a.start, a.end, a.exit_code, a.meaning, 0,
                        gpus=count * run_json.gpus_per_node, next=a.next, next_job=a.next_job,
                        next_reason=a.next_reason, width=a.width, verdict=a.end_reason if a.exit_code not in (None, 0) else "",
                        cancelled_by=a.cancelled_by)
        given = verdictfile.read(run.attempt(a.number)) if a.exit_code != 0 else None  # 0: nothing to blame
        if given is not None and not given.ok:
            shown.verdict = shown.verdict or given.message
            shown.culprits = given.culprits
        found.append(shown)
    return found


def _steps(run: RunDir, attempts: list[Attempt], keep_all_of_last: bool, committed: int | None) -> dict[str, Any] | None:
    """Fill steps, kept steps and times per attempt from metrics; the newest record of the run."""
    latest = None
    files = {a.attempt: MetricsFile(run.attempt(a.attempt) / layout.METRICS) for a in attempts}
    try:
        firsts = {n: f.first() for n, f in files.items()}
        for i, a in enumerate(attempts):
            f = files[a.attempt]
            first, last = firsts[a.attempt], f.last()
            if first is None or last is None:
                continue
            latest = last
            a.first_step, a.last_step = first["step"], last["step"]
            a.steps = a.last_step - a.first_step + 1
            a.steps_s = f.time_through(a.last_step)
            a.last_step_t = _num(last.get("t"))
            began = _num(first.get("t"))
            if began is not None and a.start is not None:
                a.startup_s = max(0.0, began - float(first.get("step_s") or 0.0) - a.start)
            later = [firsts[b.attempt]["step"] for b in attempts[i + 1 :] if firsts[b.attempt] is not None]
            if later:  # the next attempt that trained resumed from its first step: what came after is redone
                upto = min(later) - 1
            elif keep_all_of_last and i == len(attempts) - 1:
                upto = a.last_step
            else:  # the run stopped or waits for a new attempt: it resumes from the latest committed checkpoint
                upto = committed if committed is not None else a.first_step - 1
            upto = min(upto, a.last_step)
            if upto >= a.first_step:
                a.kept_steps = upto - a.first_step + 1
                a.kept_s = f.time_through(upto)
    finally:
        for f in files.values():
            f.close()
    return latest


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


WOUND_DOWN = (None, ExitCode.OK, ExitCode.PRE_TIMEOUT, ExitCode.CANCELLED)  # ends whose last minutes are a save


@dataclass(frozen=True)
class Goodput:
    """GPU-seconds of the run, split as the module's docstring says."""

    allocated: float = 0.0
    useful: float = 0.0
    startup: float = 0.0
    lost: float = 0.0

    @property
    def other(self) -> float:
        return max(0.0, self.allocated - self.useful - self.startup - self.lost)


def goodput(attempts: list[Attempt], world: int, running: int | None, now: float) -> Goodput:
    """The split of the allocated GPU time; `running` is the attempt still going (its start-up is not lost yet)."""
    allocated = useful = startup = lost = 0.0
    for i, a in enumerate(attempts):
        if a.start is None:
            continue
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        until = nxt.start if nxt is not None and nxt.job_id == a.job_id and nxt.start is not None else (a.end or now)
        span = max(0.0, until - a.start)
        allocated += span * a.gpus
        useful += a.kept_s * world
        lost += max(0.0, a.steps_s - a.kept_s) * world
        if a.steps:
            startup += min(span, a.startup_s or 0.0) * a.gpus
        elif a.attempt == running:
            startup += span * a.gpus
        elif a.exit_code != 0:
            lost += span * a.gpus
        if a.steps and a.exit_code not in WOUND_DOWN and a.end is not None and a.last_step_t is not None:
            lost += max(0.0, min(a.end, until) - a.last_step_t) * a.gpus  # the wait for its verdict, and the teardown
    return Goodput(allocated, useful, min(startup, allocated), min(lost, allocated))


def derive(run: RunDir, jobs: Mapping[str, JobInfo | None] | None = None, now: float | None = None) -> RunState:
    """The run's state from its directory and, for the one job it cannot settle, the scheduler's answer.

    `jobs` maps job ids (either form) to what the scheduler said (None: it no longer knows the job); a job
    missing from `jobs` was not asked about, and the run directory alone decides.
    """
    plan = runjson.read(run.path) or runjson.RunJson()
    return _derive(run, plan, history.read(run, plan.standalone), jobs, now)


def _derive(
    run: RunDir, run_json: runjson.RunJson, h: History, jobs: Mapping[str, JobInfo | None] | None, now: float | None
) -> RunState:
    now = time.time() if now is None else now
    attempts = _attempts(run, h, run_json)
    asked = {jobid.native(k): v for k, v in (jobs or {}).items()}
    info = asked.get(h.job) if h.job else None
    ckpt_dir = run_json.checkpoint_dir(run.path)
    try:
        committed_list = committed_steps(ckpt_dir) if ckpt_dir.is_dir() else []
    except PermissionError:  # another user's run shared with us, its checkpoints kept private
        committed_list = []
    # The directory is the truth; where the login node cannot see it (or we may not), the batch host's last word is.
    committed = committed_list[0] if committed_list else h.committed_step

    name = run_json.name or run.path.name
    shown_job = jobid.display(h.job, h.backend)
    current = attempts[-1] if attempts else None
    running = h.position == history.RUNNING and h.current is not None  # only then do the attempt's files count
    given = verdictfile.read(run.attempt(h.current.number)) if running and h.current else None
    trains = running and current is not None and (run.attempt(current.attempt) / layout.METRICS).exists()
    value, reason, exit_code, cancelled_by = classify(h, info, h.job in asked, given, trains)
    if cancelled_by and current is not None and current.end is None:  # KillWait ended its batch script before it
        current.exit_code, current.meaning, current.cancelled_by = exit_code, reason, cancelled_by  # recorded the end

    keep_all = value in (TRAINING, COMPLETED, STARTING)
    latest = _steps(run, attempts, keep_all, committed)
    if value in (TRAINING, STARTING) and current is not None:
        current.meaning = "running"
    if value == COMPLETED and latest is None:
        reason = "the command finished (exit 0) without reporting a training step"
    elif value == COMPLETED and not reason.startswith("attempt"):
        reason = f"training finished at step {latest['step']}" if latest else reason
    split = goodput(attempts, run_json.world_size, current.attempt if value in (STARTING, TRAINING) and current else None, now)
    total = latest.get("total_steps") if latest else None
    eta = per_step = None
    if latest and current and current.steps:
        per_step = (latest.get("train_s") or 0) / current.steps or float(latest.get("step_s") or 0) or None
    if value == TRAINING and latest and isinstance(total, int) and per_step:
        eta = max(0, total - latest["step"] - 1) * per_step
    changes = [t for t in (h.last_time, latest.get("t") if latest else None) if isinstance(t, (int, float))]
    trained = any(a.steps for a in attempts)

    def hours(seconds: float) -> float | None:
        return round(seconds / 3600, 6) if split.allocated > 0 else None

    return RunState(
        run=run.path.name,
        path=run.path,
        name=name,
        state=value,
        reason=reason,
        job_id=shown_job,
        step=latest["step"] if latest else None,
        loss=latest.get("loss") if latest else None,
        tokens_per_s=latest.get("tokens_per_s") if latest else None,
        eta_s=eta,
        total_steps=total if isinstance(total, int) else None,
        attempts=attempts,
        checkpoint=committed,
        goodput=round(split.useful / split.allocated, 4) if split.allocated > 0 and trained else None,
        lost_gpu_hours=hours(split.lost),
        allocated_gpu_hours=hours(split.allocated),
        exit_code=exit_code,
        submitted=_submitted(run),
        last_change=max(changes) if changes else None,
        backend=h.backend,
        useful_gpu_hours=hours(split.useful),
        startup_gpu_hours=hours(split.startup),
        other_gpu_hours=hours(split.other),
        step_s=round(per_step, 6) if per_step else None,
        grow_job=h.grow_job if not h.stopped else None,
    )


def classify(h: History, info: JobInfo | None, known: bool, given: Verdict | None,
             trains: bool) -> tuple[str, str, int | None, str]:
    """The run's state machine (pure): (state, reason, exit code, who cancelled it where a job gone without
    recording its end was cancelled) from the folded history, the scheduler's answer for its job (`known`: the
    scheduler was asked), the current attempt's verdict, and whether that attempt has reported steps."""
    reason, exit_code = h.reason, h.exit_code
    job_gone = known and (info is None or info.finished)
    shown_job = jobid.display(h.job, h.backend)
    batch_log = layout.BATCH_LOG.format(job=h.job)
    cancelled_by = ""

    if h.submission == "failed" and not h.attempts:
        value, reason = FAILED, h.submission_reason or "submission failed"
        exit_code = h.submission_exit
    elif h.dry_run:
        value, reason = DRY_RUN, "not submitted (a dry run): clusterctl requeue submits it"
    elif h.stopped:
        if h.cancelled_by or exit_code == ExitCode.CANCELLED:  # a cancelled run has one code, whatever its ranks exited with
            value, exit_code = CANCELLED, int(ExitCode.CANCELLED)
            who = f"cancelled by {h.cancelled_by}" if h.cancelled_by else "cancelled"
            reason = who + (f" ({reason})" if reason and not reason.startswith("stopped") else "")
        elif exit_code == 0:
            value = COMPLETED
        elif exit_code == ExitCode.PRE_TIMEOUT:
            value = CANCELLED
            reason = f"stopped at the time limit or preemption with a checkpoint committed ({reason}); clusterctl requeue continues it"
        else:
            value = FAILED
    elif job_gone or (info is not None and info.finished):
        slurm = f"{info.state}" if info is not None else "forgotten by the scheduler"
        if h.cancelled_by or exit_code == ExitCode.CANCELLED or (info is not None and info.state.startswith("CANCELLED")):
            value, exit_code = CANCELLED, int(ExitCode.CANCELLED)
            who = h.cancelled_by or history.SCANCEL
            reason, cancelled_by = f"cancelled by {who}", who
        elif h.position == history.ENDED:  # the attempt's end is recorded; the decision after it never was
            value = COMPLETED if exit_code == 0 else FAILED
            reason = (f"attempt {h.current.number if h.current else '?'} ended with exit {exit_code} ({reason or meaning(exit_code)}),"
                      f" then job {shown_job} ended ({slurm}) before the run's next step was decided (see {batch_log})")
        else:
            value = FAILED
            where = f"attempt {h.current.number}" if h.position == history.RUNNING and h.current else "the run"
            reason = f"job {shown_job} ended ({slurm}) and {where} recorded no end: its batch script died with it (see {batch_log})"
    elif h.position in (history.CONTINUED, history.SUBMITTED):
        if info is not None and info.state == "PENDING":
            value = CONTINUED if h.position == history.CONTINUED else PENDING
            why = info.reason or "no reason given"
            reason = (f"continues as job {shown_job}, pending ({why})" if value == CONTINUED
                      else f"Slurm's reason: {why}{_REASONS.get(why.split(',')[0], '')}")
        elif info is not None:
            value, reason = STARTING, f"job {shown_job} is {info.state}: the batch script starts the next attempt"
        else:
            value = CONTINUED if h.position == history.CONTINUED else PENDING
            reason = reason or "waiting for the scheduler"
    elif h.position in (history.RESTARTING, history.ENDED):
        value = STOPPING if h.position == history.ENDED and exit_code == ExitCode.SCRIPT_ERROR else RESTARTING
        number = h.current.number if h.current else "?"
        reason = reason or f"attempt {number} ended with exit {exit_code}: deciding how to go on"
    else:  # running
        if given is not None and not given.ok and given.code == ExitCode.SCRIPT_ERROR:  # restarts nothing (recovery.py)
            value, reason = STOPPING, f"{given.message}: stopping the ranks, then the run"
        elif given is not None and not given.ok and given.code != ExitCode.CANCELLED:  # a cancel restarts nothing
            value, reason = RESTARTING, f"{given.message}: stopping the ranks"
        elif trains:
            value, reason = TRAINING, ""
        else:
            value, reason = STARTING, f"attempt {h.current.number if h.current else '?'}: preflight and rendezvous"
        if h.signal:
            reason = f"{h.signal} received: saving a checkpoint and stopping"

    return value, reason, exit_code, cancelled_by


def _submitted(run: RunDir) -> float | None:
    try:
        return run.run_json.stat().st_mtime
    except OSError:
        return None


# What Slurm's commonest pending reasons mean to the person waiting.
_REASONS = {
    "Priority": " (other jobs come first)",
    "Resources": " (waiting for nodes to free up)",
    "ReqNodeNotAvail": " (a node the job needs is down, drained or reserved)",
    "Dependency": " (waiting for the job before it to end)",
    "BeginTime": " (not before its begin time)",
    "PartitionNodeLimit": " (more nodes than the partition allows)",
    "PartitionTimeLimit": " (a longer time than the partition allows)",
    "QOSMaxJobsPerUserLimit": " (your QOS's job limit)",
    "AssocGrpGRES": " (your account's GPU limit)",
    "JobHeldUser": " (held: scontrol release JOBID)",
    "JobHeldAdmin": " (held by an admin)",
}


def derive_one(run: RunDir, backend_for: Callable[[str], Backend] | None) -> RunState:
    """One run's state, read once, with at most one scheduler question (none when it cannot be asked)."""
    return derive_many([run], backend_for)[0][0]


def derive_many(
    runs: Sequence[RunDir], backend_for: Callable[[str], Backend] | None, now: float | None = None
) -> tuple[list[RunState], list[str]]:
    """Every run's state with one scheduler query per backend for all of them; notes say what could not be asked."""
    loaded = []
    for run in runs:
        plan = runjson.read(run.path) or runjson.RunJson()
        loaded.append((run, plan, history.read(run, plan.standalone)))
    wanted: dict[str, list[str]] = {}
    for _run, _plan, h in loaded:
        job = _wanted(h)
        if job:
            wanted.setdefault(h.backend or "slurm", []).append(job)
    answers: dict[str, JobInfo | None] = {}
    notes: list[str] = []
    for name, jobs in sorted(wanted.items()):
        if backend_for is None:
            continue
        try:
            answers.update(backend_for(name).info_many(sorted(set(jobs))))
        except ClusterctlError as exc:
            notes.append(f"the {name} scheduler could not be asked ({exc.message}); states come from the run directories alone")
    return [_derive(run, plan, h, answers, now) for run, plan, h in loaded], notes
