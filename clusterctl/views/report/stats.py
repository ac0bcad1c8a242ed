"""The report's figures, computed once from the loaded arrays: step times, phases, heatmap, throughput.

Warm-up: the first WARMUP_STEPS steps of each attempt (counted from the
lowest step any rank reported in that attempt: a restarted attempt warms up
again from its resumed step). Their step times are shown apart in the plot
and left out of the steady figures (p50/p90/max per rank); outliers in the
steady interval are kept, never clipped.

A phase lasts from its record's `at` (the rank's clock, or `t` where a
record has none) until the same rank's next phase record; a rank's last
phase of an attempt lasts until its process ended (the `gone` record) when
that is known, else it is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.verdict import Verdict
from clusterctl.views.report.load import AttemptData, RunData
from clusterctl.views.report.timeline import CATEGORIES, SAVE, Timeline

WARMUP_STEPS = 5
HEATMAP_COLUMNS = 1200  # at most this many step bins: about one per pixel column of the plot
HEATMAP_ROWS = 512  # at most this many rank rows
SERIES_POINTS = 2000  # line plots are binned to about this many points


@dataclass
class StepTimes:
    """Per rank: steady step times' p50/p90/max and count, its mean compute time, and the warm-up times kept for the
    plot."""

    ranks: np.ndarray  # rank numbers, ascending
    p50: np.ndarray
    p90: np.ndarray
    max: np.ndarray
    count: np.ndarray
    steady: list[np.ndarray]  # per rank, every steady step time (outliers included)
    warmup: list[np.ndarray]  # per rank, the warm-up step times
    compute_mean: np.ndarray  # per rank, its mean compute time over its steady steps (NaN: none recorded)


@dataclass
class Heatmap:
    """Attempts side by side on the x axis (a restart's steps do not hide the ones before it), each failed one
    followed by a grey gap: where its ranks stopped reporting."""

    matrix: np.ndarray  # rows: rank bins, columns: step bins: compute time / the step's median over ranks; NaN: no record
    width: int  # x runs from 0 to this: every attempt's steps, one after the other, and the gaps
    ranks_per_row: int
    rank_lo: int
    spans: list[tuple[int, int, int, int]] = field(default_factory=list)  # (attempt, x where it starts, its first step, last)

    def x_of(self, attempt: int, step: int) -> float | None:
        """Where an attempt's step ends on the x axis."""
        for number, x0, first, last in self.spans:
            if number == attempt:
                return float(x0 + min(max(step, first), last) - first + 1)
        return None


@dataclass
class Figures:
    steps: StepTimes | None
    phases: np.ndarray  # (ranks, len(CATEGORIES)) seconds
    phase_ranks: np.ndarray
    heatmap: Heatmap | None
    saves: list[list[tuple[float, float]]] = field(default_factory=list)  # per attempt: (start, seconds)
    first_step_at: list[float | None] = field(default_factory=list)  # per attempt: when its first step began
    verdicts: list[VerdictMark] = field(default_factory=list)  # failed verdicts, for every plot to mark


@dataclass(frozen=True)
class VerdictMark:
    """A failed verdict where the plots mark it: when (wall clock), at which step, and whom it blamed."""

    attempt: int
    t: float | None
    step: int | None
    code: int | None
    ranks: tuple[int, ...]

    @property
    def label(self) -> str:
        blamed = ", ".join(map(str, self.ranks))
        return f"{self.code}" + (f": rank {blamed}" if blamed else "")


def warmup_mask(steps: np.ndarray) -> np.ndarray:
    """True for the step records of one attempt that are warm-up."""
    if steps.size == 0:
        return np.zeros(0, bool)
    return steps < steps.min() + WARMUP_STEPS


def step_times(attempts: list[AttemptData]) -> StepTimes | None:
    """Per-rank step-time figures over all attempts, warm-up apart."""
    ranks_l, secs_l, warm_l, compute_l = [], [], [], []
    for a in attempts:
        tl = a.timeline
        if tl.step_rank.size == 0:
            continue
        ranks_l.append(tl.step_rank)
        secs_l.append(tl.step_s)
        warm_l.append(warmup_mask(tl.step_step))
        compute_l.append(tl.step_compute_s if tl.step_compute_s.size == tl.step_s.size else np.full(tl.step_s.size, np.nan))
    if not ranks_l:
        return None
    rank = np.concatenate(ranks_l)
    secs = np.concatenate(secs_l)
    warm = np.concatenate(warm_l)
    compute = np.concatenate(compute_l)
    order = np.argsort(rank, kind="stable")
    rank, secs, warm, compute = rank[order], secs[order], warm[order], compute[order]
    ranks, starts = np.unique(rank, return_index=True)
    bounds = list(starts[1:]) + [rank.size]
    p50, p90, mx, count, steady, warmup, compute_mean = [], [], [], [], [], [], []
    for lo, hi in zip(starts, bounds):
        s, w = secs[lo:hi], warm[lo:hi]
        st = s[~w]
        steady.append(st)
        warmup.append(s[w])
        count.append(st.size)
        timed = compute[lo:hi][~w]
        timed = timed[np.isfinite(timed) & (timed > 0)]
        compute_mean.append(timed.mean() if timed.size else np.nan)
        if st.size:
            q = np.percentile(st, [50, 90])
            p50.append(q[0])
            p90.append(q[1])
            mx.append(st.max())
        else:
            p50.append(np.nan)
            p90.append(np.nan)
            mx.append(np.nan)
    return StepTimes(ranks, np.array(p50), np.array(p90), np.array(mx), np.array(count), steady, warmup,
                     np.array(compute_mean))


def _phase_durations(tl: Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rank, category, start, seconds) of every phase record of one attempt, ordered by rank then time."""
    if tl.phase_rank.size == 0:
        z = np.zeros(0)
        return z.astype(np.int32), z.astype(np.int8), z, z
    order = np.lexsort((tl.phase_at, tl.phase_rank))
    rank, cat, at = tl.phase_rank[order], tl.phase_cat[order], tl.phase_at[order]
    part = tl.phase_part[order] if tl.phase_part.size == tl.phase_rank.size else np.zeros(rank.size, np.int32)
    nxt = np.empty_like(at)
    nxt[:-1] = at[1:]
    last = np.ones(rank.size, bool)
    last[:-1] = rank[1:] != rank[:-1]
    gone = np.array([tl.gone.get(int(r), np.nan) for r in rank[last]])
    nxt[last] = gone  # NaN: the rank's end is unknown, so its last phase is not counted
    cut = np.zeros(rank.size, bool)
    cut[:-1] = ~last[:-1] & (part[1:] != part[:-1])
    nxt[cut] = np.nan  # a stretch's last phase: where it ended lies in the bytes not read
    dur = np.clip(np.nan_to_num(nxt - at, nan=0.0), 0.0, None)
    return rank, cat, at, dur


def phase_totals(attempts: list[AttemptData]) -> tuple[np.ndarray, np.ndarray, list[list[tuple[float, float]]]]:
    """Seconds per rank and category over all attempts, and each attempt's save intervals (lowest rank)."""
    per: dict[int, np.ndarray] = {}
    saves: list[list[tuple[float, float]]] = []
    for a in attempts:
        rank, cat, at, dur = _phase_durations(a.timeline)
        intervals: list[tuple[float, float]] = []
        if rank.size:
            uniq, inverse = np.unique(rank, return_inverse=True)
            sums = np.zeros((uniq.size, len(CATEGORIES)))
            np.add.at(sums, (inverse, cat.astype(np.intp)), dur)
            for i, r in enumerate(uniq):
                per[int(r)] = per.get(int(r), 0) + sums[i]
            pick = (rank == uniq[0]) & (cat == SAVE)
            intervals = list(zip(at[pick].tolist(), dur[pick].tolist()))
        saves.append(intervals)
    ranks = np.array(sorted(per), dtype=np.int64)
    table = np.array([per[int(r)] for r in ranks]) if per else np.zeros((0, len(CATEGORIES)))
    return ranks, table, saves


def relative_to_step_median(step: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Each value over the median of its step's values (all ranks' records of that step)."""
    if step.size == 0:
        return value.astype(np.float64)
    _, group = np.unique(step, return_inverse=True)
    order = np.lexsort((value, group))
    counts = np.bincount(group)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    ordered = value[order]
    median = (ordered[starts + (counts - 1) // 2] + ordered[starts + counts // 2]) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(median[group] > 0, value / median[group], np.nan)


def heatmap(attempts: list[AttemptData]) -> Heatmap | None:
    """Rank x step matrix of each rank's compute time over its step's median (step time where compute is not
    recorded): under DDP every rank's step time is the same, the compute time is what tells the straggler.
    The max per bin, so that one slow step in a bin still shows."""
    xs, ranks, values, spans = [], [], [], []
    width = 0
    total = sum(int(a.timeline.step_step.max() - a.timeline.step_step.min()) + 1 for a in attempts if a.timeline.step_rank.size)
    for a in attempts:
        t = a.timeline
        if not t.step_rank.size:
            continue
        compute = t.step_compute_s if t.step_compute_s.size == t.step_s.size else np.full(t.step_s.size, np.nan)
        value = np.where(np.isfinite(compute) & (compute > 0), compute, t.step_s)
        first, last = int(t.step_step.min()), int(t.step_step.max())
        xs.append(width + t.step_step - first)
        ranks.append(t.step_rank)
        values.append(relative_to_step_median(t.step_step, value))  # a redone step: compared with its own attempt's peers
        spans.append((a.number, width, first, last))
        width += last - first + 1
        if a.verdict is not None and not a.verdict.ok:
            width += max(1, total // 25)  # the grey gap, wide enough to see: where the ranks stopped reporting
    if not xs:
        return None
    x, rank, secs = np.concatenate(xs), np.concatenate(ranks), np.concatenate(values)
    keep = np.isfinite(secs)
    x, rank, secs = x[keep], rank[keep], secs[keep]
    if rank.size == 0:
        return None
    cols = min(HEATMAP_COLUMNS, width)
    r_lo, r_hi = int(rank.min()), int(rank.max()) + 1
    per_row = max(1, -(-(r_hi - r_lo) // HEATMAP_ROWS))
    rows = -(-(r_hi - r_lo) // per_row)
    col = (x * cols) // width
    row = (rank - r_lo) // per_row
    flat = np.full(rows * cols, -np.inf)
    np.maximum.at(flat, row * cols + col, secs)
    matrix = flat.reshape(rows, cols)
    matrix[np.isneginf(matrix)] = np.nan
    return Heatmap(matrix, width, per_row, r_lo, spans)


def first_step_at(a: AttemptData) -> float | None:
    """When the attempt's first step began: its first metrics record's end minus its step time."""
    m = a.metrics
    if m.step.size:
        return float(m.t[0] - (m.step_s[0] if np.isfinite(m.step_s[0]) else 0.0))
    if a.timeline.phase_at.size:
        return float(a.timeline.phase_at.min())
    return None


def verdict_marks(data: RunData) -> list[VerdictMark]:
    """Each failed verdict with the step it came at (the last step rank 0 finished before it) and its culprits."""
    marks = []
    for a in data.attempts:
        v = a.verdict
        if v is None or v.ok or cancelled(a):  # a cancel blames nobody: nothing to mark
            continue
        when = v.time or a.end  # 0: a verdict.json that did not say when
        m = a.metrics
        step = None
        if m.step.size:
            before = np.flatnonzero(m.t <= when) if when is not None else np.zeros(0, np.int64)
            step = int(m.step[before[-1]]) if before.size else int(m.step[0])
        elif a.timeline.step_step.size:
            step = int(a.timeline.step_step.max())
        ranks = tuple(int(c["rank"]) for c in v.culprits if isinstance(c.get("rank"), int))
        marks.append(VerdictMark(a.number, float(when) if when is not None else None, step, v.code, ranks))
    return marks


def figures(data: RunData) -> Figures:
    ranks, table, saves = phase_totals(data.attempts)
    return Figures(step_times(data.attempts), table, ranks, heatmap(data.attempts), saves,
                   [first_step_at(a) for a in data.attempts], verdict_marks(data))


def binned(x: np.ndarray, y: np.ndarray, points: int = SERIES_POINTS) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, mean, min, max) per bin of consecutive points, for plotting long series at screen resolution."""
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size <= points:
        return x, y, y, y
    per = -(-x.size // points)
    n = x.size // per * per
    xs, ys = x[:n].reshape(-1, per), y[:n].reshape(-1, per)
    out = (xs.mean(1), ys.mean(1), ys.min(1), ys.max(1))
    if n < x.size:
        tail_x, tail_y = x[n:], y[n:]
        out = tuple(np.append(o, v) for o, v in zip(out, (tail_x.mean(), tail_y.mean(), tail_y.min(), tail_y.max())))  # type: ignore[assignment]
    return out


def _r(value: Any, digits: int = 4) -> float | None:
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return round(v, digits) if np.isfinite(v) else None


def headline(data: RunData, fig: Figures) -> dict[str, Any]:
    """The figures printed to the terminal and shown at the top of the page (JSON-ready)."""
    out: dict[str, Any] = {"run": data.run.path.name, "name": data.name, "attempts": len(data.attempts)}
    steps_all = [a.metrics for a in data.attempts if a.metrics.step.size]
    if steps_all:
        last = steps_all[-1]
        out["last_step"] = int(last.step[-1])
        out["final_loss"] = _r(last.loss[-1])
        vals = np.concatenate([m.val_loss for m in steps_all])
        finite = vals[np.isfinite(vals)]
        out["final_val_loss"] = _r(finite[-1]) if finite.size else None
        out["best_val_loss"] = _r(finite.min()) if finite.size else None
        tps = np.concatenate([m.tokens_per_s for m in steps_all])
        tps = tps[np.isfinite(tps)]
        out["tokens_per_s_median"] = _r(np.median(tps), 1) if tps.size else None
    st = fig.steps
    per_rank: dict[str, Any] = {}
    if st is not None:
        for i, r in enumerate(st.ranks):
            per_rank[str(int(r))] = {"p50": _r(st.p50[i]), "p90": _r(st.p90[i]), "max": _r(st.max[i]),
                                     "steady_steps": int(st.count[i]), "warmup_steps": int(st.warmup[i].size)}
        out["slowest_rank"] = slowest_rank(st)
    out["step_time_s"] = per_rank
    out["warmup_steps_per_attempt"] = WARMUP_STEPS
    out["phases_s"] = {str(int(r)): {c: _r(fig.phases[i, j], 3) for j, c in enumerate(CATEGORIES)}
                       for i, r in enumerate(fig.phase_ranks)}
    out["verdicts"] = [verdict_summary(a) for a in data.attempts if a.verdict is not None]
    out["notes"] = list(data.notes)
    return out


def slowest_rank(st: StepTimes) -> dict[str, Any] | None:
    """The rank with the largest mean compute time, against the median rank's: under DDP every rank's step time is
    the same (the others wait for the slow one), its compute time is its own, and a mean counts stalls on some steps
    that a median hides. By steady step time p50 where no compute time was recorded."""
    by, values = (("mean compute time", st.compute_mean) if np.isfinite(st.compute_mean).any()
                  else ("steady step time p50", st.p50))
    finite = np.isfinite(values)
    if not finite.any():
        return None
    median = float(np.median(values[finite]))
    slow = int(np.nanargmax(values))
    return {"rank": int(st.ranks[slow]), "by": by, "seconds": _r(values[slow]), "p50": _r(st.p50[slow]),
            "vs_median": _r(values[slow] / median, 3) if median > 0 else None}


def cancelled(a: AttemptData) -> bool:
    """A cancel stopped the attempt, as its history says (rundir/history.py decides, for old runs too)."""
    return bool(a.cancelled_by) or a.exit_code == ExitCode.CANCELLED


def verdict_summary(a: AttemptData) -> dict[str, Any]:
    """One verdict row: `status` is ok, failed or cancelled. A cancelled attempt's row says cancelled with code 89 as
    its attempts row does, even where an older verdict.json said otherwise (the rendezvous passed: ok; stopped
    before it: 80): that verdict is quoted in the message."""
    v = a.verdict or Verdict(False, 0, "")
    culprits = [{k: c.get(k) for k in ("rank", "host", "gpu", "reason") if k in c} for c in v.culprits]
    ok, code, message = v.ok, v.code, v.message
    status = "ok" if ok else "failed"
    if cancelled(a):
        status = "cancelled"
        if code != ExitCode.CANCELLED:
            message = f"{a.meaning} (verdict.json: code {code}, {message})" if message else a.meaning
            code = int(ExitCode.CANCELLED)
    return {"attempt": a.number, "ok": ok, "status": status, "code": code, "message": message, "culprits": culprits}
