"""Read what a run directory holds for the report: attempts, metrics, timelines, verdicts.

Everything is optional: a run that failed in preflight has no metrics and
perhaps no timeline, an old run has metrics without the wall clock `t` (it
is then the attempt's start plus the cumulative step time). Missing or torn
files give empty arrays and a note, never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clusterctl import rundir
from clusterctl.report.timeline import Timeline, read_timeline
from clusterctl.rundir import RunDir, read_json

_NUM = rb"([-+0-9.eE]+)"
# The trainer's line layout (trainer/loop.py: json.dumps of a dict built in this key order).
_METRIC = re.compile(
    rb'^\{"step": (-?\d+), "loss": ' + _NUM + rb'(?:, "loss_hex": "[^"\n]*")?, "step_s": ' + _NUM
    + rb', "compute_s": [-+0-9.eE]+, "tokens_per_s": ' + _NUM + rb'(?:, "t": ' + _NUM + rb')?(?:, "train_s": [-+0-9.eE]+)?'
    + rb'(?:, "total_steps": -?\d+)?(?:, "val_loss": ' + _NUM + rb')?(?:, "target_reached": \{[^\n]*\})?\}$',
    re.M,
)  # to the line's end: a key it does not know sends the file to json.loads rather than dropping what follows
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
    next_how: str | None = None
    next_time: float | None = None
    next_reason: str = ""
    verdict: dict[str, Any] | None = None
    metrics: Metrics = field(default_factory=Metrics)
    timeline: Timeline = field(default_factory=Timeline)


@dataclass
class RunData:
    run: RunDir
    name: str
    run_json: dict[str, Any]
    state: dict[str, Any]
    attempts: list[AttemptData]
    notes: list[str] = field(default_factory=list)


def _nan_floats(items: tuple[bytes, ...]) -> np.ndarray:
    return np.fromiter((float(x) if x else np.nan for x in items), np.float64, len(items))


def _metrics_slow(text: bytes) -> list[tuple[Any, ...]]:
    rows = []
    for line in text.split(b"\n"):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            continue
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


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _attempts(run: RunDir, notes: list[str]) -> list[AttemptData]:
    found: dict[int, AttemptData] = {}
    for e in run.events():
        n = e.get("attempt")
        if not isinstance(n, int) or n < 1:
            continue
        a = found.setdefault(n, AttemptData(n))
        kind = e.get("event")
        if e.get("job_id") is not None and not a.job_id:
            a.job_id = str(e["job_id"])
        if kind == rundir.EVENT_START:
            a.start = _num(e.get("time"))
        elif kind == rundir.EVENT_END:
            a.end = _num(e.get("time"))
            a.exit_code = e.get("exit") if isinstance(e.get("exit"), int) else None
            a.end_reason = str(e.get("verdict") or e.get("reason") or "")
        elif kind == rundir.EVENT_NEXT:
            a.next_how = str(e.get("how") or "") or None
            a.next_time = _num(e.get("time"))
            a.next_reason = str(e.get("reason") or "")
            if a.end is None:
                a.end = a.next_time
            if a.exit_code is None and isinstance(e.get("exit"), int):
                a.exit_code = e["exit"]
    for n in run.attempts():
        found.setdefault(n, AttemptData(n))
    for n, a in found.items():
        adir = run.attempt(n)
        info = read_json(adir / rundir.ATTEMPT_JSON) or {}
        a.hosts = [str(h) for h in info.get("hosts") or [] if isinstance(h, str)]
        a.job_id = a.job_id or str(info.get("job_id") or "")
        if a.start is None:
            a.start = _num(info.get("started"))
        a.verdict = read_json(adir / rundir.VERDICT)
        a.metrics = read_metrics(adir / rundir.METRICS, a.start)
        a.timeline = read_timeline(adir / rundir.TIMELINE)
        if a.metrics.t_derived:
            notes.append(f"attempt {n}: metrics.jsonl has no wall clock `t`; it is the attempt's start plus the summed step times")
        if a.timeline.slow_chunks:
            notes.append(f"attempt {n}: timeline.jsonl is not in the watch server's layout; read line by line (slower)")
    return [found[n] for n in sorted(found)]


def load_run(run: RunDir) -> RunData:
    """Everything the report shows, read once."""
    run_json = read_json(run.run_json) or {}
    state = read_json(run.path / rundir.STATE) or {}
    notes: list[str] = []
    attempts = _attempts(run, notes)
    if not attempts:
        notes.append("no attempt has started: nothing ran yet, or the job never left the queue")
    elif not any(a.metrics.step.size for a in attempts):
        notes.append("no metrics.jsonl with steps: the run did not train (it failed before its first step?)")
    if attempts and not any(not a.timeline.empty for a in attempts):
        notes.append("no timeline.jsonl records: step times and phases are not known")
    name = str(run_json.get("name") or state.get("run_id") or run.path.name)
    return RunData(run, name, run_json, state, attempts, notes)
