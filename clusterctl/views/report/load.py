"""Read what a run directory holds for the report: attempts, metrics, timelines, verdicts.

Everything is optional: a run that failed in preflight has no metrics and
perhaps no timeline, an old run has metrics without the wall clock `t` (it
is then the attempt's start plus the cumulative step time). Missing or torn
files give empty arrays and a note, never an exception.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clusterctl import rundir
from clusterctl.rundir import RunDir, attemptjson, history, runjson, timeline
from clusterctl.rundir import metrics as metricsfile
from clusterctl.rundir import verdict as verdictfile
from clusterctl.rundir.verdict import Verdict
from clusterctl.views.report.timeline import READ_BYTES, STRETCHES, Timeline, read_timeline

# The metrics writer's layout (rundir/metrics.py), read by a pattern built from its definition.
_METRIC = metricsfile.pattern(
    required=("step", "loss", "step_s", "compute_s", "tokens_per_s"),
    capture=("step", "loss", "step_s", "tokens_per_s", "t", "val_loss"),
)  # whole lines: a key it does not know sends the file to json.loads rather than dropping what follows
METRIC_FIELDS = ("step", "loss", "step_s", "tokens_per_s", "t", "val_loss")


@dataclass
class Metrics:
    """Rank 0's per-step records of one attempt; `t` (wall clock at the step's end) is always filled."""

    step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    loss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tokens_per_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    val_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))  # NaN where the step had no validation
    t_derived: bool = False  # t came from the attempt's start + cumulative step time


@dataclass
class AttemptData:
    number: int
    job_id: str = ""
    hosts: list[str] = field(default_factory=list)
    start: float | None = None
    end: float | None = None
    exit_code: int | None = None
    end_reason: str = ""
    meaning: str = ""  # what its end meant (rundir/history.py)
    cancelled_by: str | None = None  # a cancel stopped it (rundir/history.py: its code is then 89, whatever verdict.json says)
    next_how: str | None = None
    next_time: float | None = None
    next_reason: str = ""
    verdict: Verdict | None = None
    metrics: Metrics = field(default_factory=Metrics)
    timeline: Timeline = field(default_factory=Timeline)


@dataclass
class RunData:
    run: RunDir
    name: str
    attempts: list[AttemptData]
    notes: list[str] = field(default_factory=list)


def _nan_floats(items: tuple[bytes, ...]) -> np.ndarray:
    return np.fromiter((float(x) if x else np.nan for x in items), np.float64, len(items))


def _metrics_slow(text: bytes) -> list[tuple[Any, ...]]:
    rows = []
    for rec in metricsfile.records(text):
        vals = []
        for key in METRIC_FIELDS[1:]:
            v = rec.get(key)
            vals.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan)
        rows.append((rec["step"], *vals))
    return rows


def read_metrics(path: Path, start: float | None) -> Metrics:
    """metrics.jsonl as arrays; the fast pattern for the trainer's layout, json.loads where it differs."""
    try:
        text = path.read_bytes()
    except OSError:
        return Metrics()
    expected = text.count(b'\n{"step":') + (1 if text.startswith(b'{"step":') else 0)
    found = _METRIC.findall(text)
    if found and len(found) == expected:
        step, loss, step_s, tps, t, val = zip(*found)
        m = Metrics(np.fromiter(map(int, step), np.int64, len(step)), _nan_floats(loss), _nan_floats(step_s),
                    _nan_floats(tps), _nan_floats(t), _nan_floats(val))
    else:
        rows = _metrics_slow(text)
        if not rows:
            return Metrics()
        cols = list(zip(*rows))
        m = Metrics(np.array(cols[0], np.int64), *(np.array(c, np.float64) for c in cols[1:]))
    missing = np.isnan(m.t)
    if missing.any():
        base = start if start is not None else 0.0
        derived = base + np.cumsum(np.nan_to_num(m.step_s))
        m.t = np.where(missing, derived, m.t)
        m.t_derived = True
    return m


def timeline_shares(sizes: dict[int, int], budget: int | None = None) -> dict[int, int]:
    """Each attempt's part of the bytes the report parses: all of every file while they fit in `budget`
    (READ_BYTES), else the budget split by size, so that a long run's report takes as long as a short one's."""
    budget = READ_BYTES if budget is None else budget
    total = sum(sizes.values())
    if total <= budget:
        return dict(sizes)
    return {k: max(1, budget * v // total) for k, v in sizes.items()}


def _attempts(run: RunDir, notes: list[str]) -> list[AttemptData]:
    found = []
    attempts = history.read(run).attempts
    sizes = {}
    for h in attempts:
        with contextlib.suppress(OSError):
            sizes[h.number] = timeline.size(run.attempt(h.number) / rundir.TIMELINE)
    shares = timeline_shares(sizes)
    for h in attempts:
        a = AttemptData(h.number, h.job_id, start=h.start, end=h.end, exit_code=h.exit_code, end_reason=h.end_reason, meaning=h.meaning,
                        cancelled_by=h.cancelled_by, next_how=h.next, next_time=h.next_time, next_reason=h.next_reason)
        adir = run.attempt(h.number)
        info = attemptjson.read(adir) or attemptjson.AttemptJson()
        a.hosts = list(info.hosts)
        a.job_id = a.job_id or info.job_id
        if a.start is None:
            a.start = info.started
        a.verdict = verdictfile.read(adir)
        a.metrics = read_metrics(adir / rundir.METRICS, a.start)
        a.timeline = read_timeline(adir / rundir.TIMELINE, shares.get(h.number))
        if a.timeline.read_share < 1:
            notes.append(f"attempt {h.number}: timeline.jsonl ({a.timeline.size / 1e6:,.0f} MB) was read in "
                         f"{STRETCHES} evenly spaced stretches, {a.timeline.read_share:.0%} of it, from its start to its end; "
                         "step times and phases are those stretches', deaths and verdicts are read whole")
        if a.metrics.t_derived:
            notes.append(f"attempt {h.number}: metrics.jsonl has no wall clock `t`; it is the attempt's start plus the summed step times")
        if a.timeline.slow_chunks:
            notes.append(f"attempt {h.number}: timeline.jsonl is not in the watch server's layout; read line by line (slower)")
        found.append(a)
    return found


def load_run(run: RunDir) -> RunData:
    """Everything the report shows, read once."""
    notes: list[str] = []
    attempts = _attempts(run, notes)
    if not attempts:
        notes.append("no attempt has started: nothing ran yet, or the job never left the queue")
    elif not any(a.metrics.step.size for a in attempts):
        notes.append("no metrics.jsonl with steps: the run did not train (it failed before its first step?)")
    if attempts and not any(not a.timeline.empty for a in attempts):
        notes.append("no timeline.jsonl records: step times and phases are not known")
    plan = runjson.read(run.path)
    return RunData(run, (plan.name if plan else "") or run.path.name, attempts, notes)
