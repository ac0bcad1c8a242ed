"""A run's state: the one function that derives it, for every command that shows one.

Facts have one writer each (the batch script and the recovery step append to
attempts.jsonl, the controller writes verdict.json, rank 0 writes
metrics.jsonl, `submit` writes state.json); this module is their one reader.
The scheduler is asked at most once for all the runs shown, and only about
jobs the run directory cannot settle; a job it has forgotten is read from the
run directory alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clusterctl import hostlist, rundir
from clusterctl.backends.base import Backend, JobInfo
from clusterctl.checkpoint.generations import committed_steps
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import DESCRIPTIONS, ExitCode
from clusterctl.metricsfile import MetricsFile
from clusterctl.rundir import RunDir, read_json

LOCAL_PREFIX = "local-"  # the local backend's job ids as shown (backends/local.py)

# The states a run can be in (`status --json` key `state`).
PENDING = "pending"
STARTING = "starting"
TRAINING = "training"
RESTARTING = "restarting"
CONTINUED = "continued"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
STATES = (PENDING, STARTING, TRAINING, RESTARTING, CONTINUED, COMPLETED, FAILED, CANCELLED)
FINAL = (COMPLETED, FAILED, CANCELLED)


@dataclass
class Attempt:
    """One launch of all ranks, as the run directory tells it."""

    attempt: int
    job_id: str
    nodes: list[str]
    start: float | None
    end: float | None  # None while it runs
    exit_code: int | None
    meaning: str  # what the exit code meant, or why the attempt ended
    steps: int  # steps done in this attempt
    first_step: int | None = None
    last_step: int | None = None
    gpus: int = 0  # GPUs allocated to it (nodes x GPUs per node, spares included)
    kept_steps: int = 0  # its steps that the run kept (not redone after a restart)
    kept_s: float = 0.0  # wall time of the kept steps
    next: str | None = None  # how the run went on: rundir.NEXT_* (allocation, continuation, ...)
    next_job: str | None = None
    next_reason: str = ""  # why it went on that way (the recovery step's words)
    verdict: str = ""  # the controller's one-line verdict when it was not ok
    culprits: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunState:
    run: str
    path: Path
    name: str
    state: str  # one of STATES
    reason: str  # why: Slurm's pending reason, the verdict, the stop reason
    job_id: str | None  # the job the run is in now (or ended in)
    step: int | None
    loss: float | None
    tokens_per_s: float | None
    eta_s: float | None
    total_steps: int | None
    attempts: list[Attempt]
    checkpoint: int | None  # latest committed step
    goodput: float | None  # fraction of allocated GPU time spent in steps that were kept
    lost_gpu_hours: float | None
    allocated_gpu_hours: float | None
    exit_code: int | None
    submitted: float | None
    last_change: float | None
    backend: str | None = None

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
            attempt["job_id"] = display_job(attempt["job_id"], self.backend)
            attempt["next_job"] = display_job(attempt["next_job"], self.backend)
        return data


def meaning(code: int | None) -> str:
    """What an exit code meant (exitcodes.DESCRIPTIONS), for attempts tables."""
    if code is None:
        return "no exit recorded"
    try:
        return DESCRIPTIONS[ExitCode(code)][0]
    except (ValueError, KeyError):
        return f"exit {code}"


def native_job(job_id: Any) -> str:
    """Job ids as the batch script records them (SLURM_JOB_ID): `local-7` and `7` are the same job."""
    text = str(job_id or "").strip()
    return text.removeprefix(LOCAL_PREFIX) if text.removeprefix(LOCAL_PREFIX).isdigit() else text


def display_job(job_id: str | None, backend: str | None) -> str | None:
    if not job_id:
        return None
    return f"{LOCAL_PREFIX}{job_id}" if backend == "local" and job_id.isdigit() else job_id


@dataclass
class _Story:
    """The run as attempts.jsonl tells it, before the scheduler is asked."""

    job: str | None  # the job the run is in now, or is waiting for
    phase: str  # submitted | running | ended | restarting | continued | stopped
    attempt: int | None = None
    exit_code: int | None = None
    reason: str = ""
    cancelled_by: str | None = None
    signal: str | None = None
    last_time: float | None = None


def _story(state: dict[str, Any], events: list[dict[str, Any]], run_json: dict[str, Any]) -> _Story:
    # A standalone batch script runs one attempt and decides nothing after it: its end is the run's end.
    standalone = run_json.get("mode") == "standalone"
    story = _Story(job=native_job(state.get("job_id")) or None, phase="submitted")
    for e in events:
        kind = e.get("event")
        if isinstance(e.get("time"), (int, float)):
            story.last_time = float(e["time"])
        if kind == rundir.EVENT_START:
            story.phase, story.attempt, story.job, story.signal = "running", e.get("attempt"), native_job(e.get("job_id")), None
            story.exit_code, story.reason = None, ""
        elif kind == rundir.EVENT_END:
            story.phase, story.exit_code = "stopped" if standalone else "ended", e.get("exit")
            story.reason = str(e.get("verdict") or e.get("reason") or "")
            if standalone and not story.reason:
                story.reason = "training finished" if story.exit_code == 0 else f"exit {story.exit_code}: {meaning(story.exit_code)}"
        elif kind == rundir.EVENT_SIGNAL:
            story.signal = str(e.get("signal") or "")
        elif kind == rundir.EVENT_NEXT:
            how, story.reason = e.get("how"), str(e.get("reason") or "")
            story.exit_code = e.get("exit") if isinstance(e.get("exit"), int) else story.exit_code
            if how == rundir.NEXT_ALLOCATION:
                story.phase = "restarting"
            elif how == rundir.NEXT_CONTINUATION:
                story.phase, story.job = "continued", native_job(e.get("next_job"))
            elif how in (rundir.NEXT_REQUEUE, rundir.NEXT_SLURM):
                story.phase = "continued"
            else:
                story.phase = "stopped"
        elif kind == rundir.EVENT_CANCEL:
            story.cancelled_by = str(e.get("by") or "clusterctl cancel")
        elif kind == rundir.EVENT_REQUEUE:
            story.phase, story.job, story.cancelled_by = "continued", native_job(e.get("next_job")), None
            story.reason = f"requeued by hand as job {native_job(e.get('next_job'))}"
    return story


def wanted_job(run: RunDir) -> str | None:
    """The one job whose scheduler state the derivation needs, or None when the run directory settles it."""
    return _wanted(_story(run.read_state(), run.events(), read_json(run.run_json) or {}))


def _wanted(story: _Story) -> str | None:
    return None if story.phase == "stopped" or not story.job else story.job


def _attempts(run: RunDir, events: list[dict[str, Any]], run_json: dict[str, Any], now: float) -> list[Attempt]:
    found: dict[int, Attempt] = {}
    for e in events:
        number = e.get("attempt")
        if not isinstance(number, int) or number < 1:
            continue
        kind = e.get("event")
        if kind == rundir.EVENT_START:
            found[number] = Attempt(number, native_job(e.get("job_id")), [], _time(e), None, None, "running", 0)
            continue
        a = found.get(number)
        if a is None:
            continue
        if kind == rundir.EVENT_END:
            a.end = _time(e)
            a.exit_code = e.get("exit") if isinstance(e.get("exit"), int) else None
            a.meaning = meaning(a.exit_code) if a.exit_code is not None else str(e.get("reason") or meaning(None))
            a.verdict = str(e.get("verdict") or "")
        elif kind == rundir.EVENT_NEXT:
            a.next = e.get("how")
            a.next_job = native_job(e.get("next_job")) or None
            a.next_reason = str(e.get("reason") or "")
            if a.end is None:
                a.end = _time(e)
    gpn = int(run_json.get("gpus_per_node") or 0)
    for a in found.values():
        info = read_json(run.attempt(a.attempt) / rundir.ATTEMPT_JSON) or {}
        a.nodes = [str(h) for h in info.get("hosts") or []]
        allocated = info.get("nodelist")
        try:
            nodes = hostlist.count(allocated) if allocated else len(a.nodes) + int(info.get("spares") or 0)
        except ValueError:
            nodes = len(a.nodes)
        a.gpus = nodes * gpn
        verdict = read_json(run.attempt(a.attempt) / rundir.VERDICT) if a.exit_code != 0 else None  # 0: nothing to blame
        if verdict and not verdict.get("ok", True):
            a.verdict = a.verdict or str(verdict.get("message") or "")
            a.culprits = [c for c in verdict.get("culprits") or [] if isinstance(c, dict)]
    return [found[n] for n in sorted(found)]


def _time(event: dict[str, Any]) -> float | None:
    value = event.get("time")
    return float(value) if isinstance(value, (int, float)) else None


def _steps(run: RunDir, attempts: list[Attempt], keep_all_of_last: bool, committed: int | None) -> dict[str, Any] | None:
    """Fill steps and kept steps/time per attempt from metrics; the newest record of the run."""
    latest = None
    files = {a.attempt: MetricsFile(run.attempt(a.attempt) / rundir.METRICS) for a in attempts}
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


def _allocated_s(attempts: list[Attempt], now: float) -> float:
    """GPU-seconds allocated: each attempt from its start to the next attempt of the same job (the restart
    gap belongs to the allocation), else to its end, or now while it runs."""
    total = 0.0
    for i, a in enumerate(attempts):
        if a.start is None:
            continue
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        until = nxt.start if nxt is not None and nxt.job_id == a.job_id and nxt.start is not None else (a.end or now)
        total += max(0.0, until - a.start) * a.gpus
    return total


def derive(run: RunDir, jobs: Mapping[str, JobInfo | None] | None = None, now: float | None = None) -> RunState:
    """The run's state from its directory and, for the one job it cannot settle, the scheduler's answer.

    `jobs` maps job ids (either form) to what the scheduler said (None: it no longer knows the job); a job
    missing from `jobs` was not asked about, and the run directory alone decides.
    """
    return _derive(run, _Loaded.of(run), jobs, now)


@dataclass
class _Loaded:
    """What the derivation reads from a run directory before it asks the scheduler anything."""

    state: dict[str, Any]
    events: list[dict[str, Any]]
    run_json: dict[str, Any]

    @classmethod
    def of(cls, run: RunDir) -> "_Loaded":
        return cls(run.read_state(), run.events(), read_json(run.run_json) or {})

    def wanted(self) -> str | None:
        return _wanted(_story(self.state, self.events, self.run_json))


def _derive(run: RunDir, loaded: _Loaded, jobs: Mapping[str, JobInfo | None] | None, now: float | None) -> RunState:
    now = time.time() if now is None else now
    state, events, run_json = loaded.state, loaded.events, loaded.run_json
    story = _story(state, events, run_json)
    attempts = _attempts(run, events, run_json, now)
    asked = {native_job(k): v for k, v in (jobs or {}).items()}
    info = asked.get(story.job) if story.job else None
    known = story.job in asked
    ckpt_dir = run.checkpoint_dir(run_json)
    committed_list = committed_steps(ckpt_dir) if ckpt_dir.is_dir() else []
    recorded = [e["committed_step"] for e in events if isinstance(e.get("committed_step"), int)]
    # The directory is the truth; where the login node cannot see it, the batch host's last word is.
    committed = committed_list[0] if committed_list else (recorded[-1] if recorded else None)

    name, reason, exit_code = str(run_json.get("name") or state.get("name") or run.path.name), story.reason, story.exit_code
    job_gone = known and (info is None or info.finished)
    shown_job = display_job(story.job, state.get("backend"))
    current = attempts[-1] if attempts else None

    if state.get("state") == "failed" and not events:
        value, reason = FAILED, str(state.get("reason") or "submission failed")
        exit_code = state.get("exit_code")
    elif state.get("state") in ("dry-run", "rendered") and not events:
        value, reason = PENDING, "not submitted (a dry run): clusterctl requeue submits it"
    elif story.phase == "stopped":
        if story.cancelled_by or reason.startswith("stopped by") or reason.startswith("stopped:"):
            value = CANCELLED
            reason = reason or f"cancelled by {story.cancelled_by}"
        elif exit_code == 0:
            value = COMPLETED
        elif exit_code == ExitCode.PRE_TIMEOUT:
            value = CANCELLED
            reason = f"stopped at the time limit or preemption with a checkpoint committed ({reason}); clusterctl requeue continues it"
        else:
            value = FAILED
    elif job_gone or (info is not None and info.finished):
        slurm = f"{info.state}" if info is not None else "forgotten by the scheduler"
        if story.cancelled_by or (info is not None and info.state.startswith("CANCELLED")):
            value, reason = CANCELLED, f"cancelled by {story.cancelled_by}" if story.cancelled_by else f"job {shown_job} was cancelled ({slurm})"
        elif story.phase == "ended":  # the attempt's end is recorded; the decision after it never was
            value = COMPLETED if exit_code == 0 else FAILED
            reason = (f"attempt {story.attempt} ended with exit {exit_code} ({reason or meaning(exit_code)}), then job {shown_job}"
                      f" ended ({slurm}) before the run's next step was decided (see {rundir.BATCH_LOG.format(job=story.job)})")
        else:
            value = FAILED
            where = f"attempt {story.attempt}" if story.phase == "running" else "the run"
            reason = (f"job {shown_job} ended ({slurm}) and {where} recorded no end: its batch script died with it"
                      f" (see {rundir.BATCH_LOG.format(job=story.job)})")
    elif story.phase in ("continued", "submitted"):
        if info is not None and info.state == "PENDING":
            value = CONTINUED if story.phase == "continued" else PENDING
            why = info.reason or "no reason given"
            reason = (f"continues as job {shown_job}, pending ({why})" if value == CONTINUED
                      else f"Slurm's reason: {why}{_REASONS.get(why.split(',')[0], '')}")
        elif info is not None:
            value, reason = STARTING, f"job {shown_job} is {info.state}: the batch script starts the next attempt"
        else:
            value = CONTINUED if story.phase == "continued" else PENDING
            reason = reason or "waiting for the scheduler"
    elif story.phase in ("restarting", "ended"):
        value = RESTARTING
        reason = reason or f"attempt {story.attempt} ended with exit {exit_code}: deciding how to go on"
    else:  # running
        verdict = read_json(run.attempt(story.attempt) / rundir.VERDICT) if story.attempt else None
        if verdict and not verdict.get("ok", True):
            value, reason = RESTARTING, f"{verdict.get('message')}: stopping the ranks"
        elif current is not None and (run.attempt(current.attempt) / rundir.METRICS).exists():
            value, reason = TRAINING, ""
        else:
            value, reason = STARTING, f"attempt {story.attempt}: preflight and rendezvous"
        if story.signal:
            reason = f"{story.signal} received: saving a checkpoint and stopping"

    keep_all = value in (TRAINING, COMPLETED, STARTING)
    latest = _steps(run, attempts, keep_all, committed)
    if value in (TRAINING, STARTING) and current is not None:
        current.meaning = "running"
    allocated = _allocated_s(attempts, now)
    world = int(run_json.get("world_size") or 0)
    kept = sum(a.kept_s for a in attempts) * world
    total = latest.get("total_steps") if latest else None
    eta = None
    if value == TRAINING and latest and isinstance(total, int) and current and current.steps:
        per_step = (latest.get("train_s") or 0) / current.steps or float(latest.get("step_s") or 0)
        eta = max(0, total - latest["step"] - 1) * per_step
    changes = [t for t in (story.last_time, latest.get("t") if latest else None) if isinstance(t, (int, float))]
    return RunState(
        run=run.path.name,
        path=run.path,
        name=name,
        state=value,
        reason=reason,
        job_id=display_job(story.job, state.get("backend")),
        step=latest["step"] if latest else None,
        loss=latest.get("loss") if latest else None,
        tokens_per_s=latest.get("tokens_per_s") if latest else None,
        eta_s=eta,
        total_steps=total if isinstance(total, int) else None,
        attempts=attempts,
        checkpoint=committed,
        goodput=round(kept / allocated, 4) if allocated > 0 else None,
        lost_gpu_hours=round(max(0.0, allocated - kept) / 3600, 4) if allocated > 0 else None,
        allocated_gpu_hours=round(allocated / 3600, 4) if allocated > 0 else None,
        exit_code=exit_code,
        submitted=_submitted(run),
        last_change=max(changes) if changes else None,
        backend=state.get("backend"),
    )


def _submitted(run: RunDir) -> float | None:
    try:
        return (run.path / rundir.RUN_JSON).stat().st_mtime
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


def is_run(path: Path) -> bool:
    return (path / rundir.STATE).is_file() or (path / rundir.RUN_JSON).is_file()


def list_runs(root: Path) -> list[RunDir]:
    """The run directories under a runs root, newest first (by run id's time stamp, then name)."""
    try:
        entries = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and is_run(p)]
    except OSError:
        return []
    return [RunDir(p) for p in sorted(entries, key=_newest_key, reverse=True)]


def _newest_key(path: Path) -> tuple[str, str]:
    stamp = "-".join(path.name.split("-")[-3:-1])  # <name>-YYYYmmdd-HHMMSS-<hex>
    return (stamp if len(stamp) == 15 else "", path.name)


def derive_one(run: RunDir, backend_for: Callable[[str], Backend] | None) -> RunState:
    """One run's state, read once, with at most one scheduler question (none when it cannot be asked)."""
    return derive_many([run], backend_for)[0][0]


def derive_many(
    runs: Sequence[RunDir], backend_for: Callable[[str], Backend] | None, now: float | None = None
) -> tuple[list[RunState], list[str]]:
    """Every run's state with one scheduler query per backend for all of them; notes say what could not be asked."""
    loaded = [(run, _Loaded.of(run)) for run in runs]
    wanted: dict[str, list[str]] = {}
    for _run, facts in loaded:
        job = facts.wanted()
        if job:
            wanted.setdefault(str(facts.state.get("backend") or "slurm"), []).append(job)
    answers: dict[str, JobInfo | None] = {}
    notes: list[str] = []
    for name, jobs in sorted(wanted.items()):
        if backend_for is None:
            continue
        try:
            answers.update(backend_for(name).info_many(sorted(set(jobs))))
        except ClusterctlError as exc:
            notes.append(f"the {name} scheduler could not be asked ({exc.message}); states come from the run directories alone")
    return [_derive(run, facts, answers, now) for run, facts in loaded], notes
