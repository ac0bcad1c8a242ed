"""The straggler rule: the one rank the others wait for, judged from the time it loses over a window (pure).

A verdict excludes a node and starts a new job, so a wrong one costs more
than a late one. The rule therefore judges the time a rank LOSES, step by
step, against its peers, and only when that loss is real on every count below:

* It is steady. For each step of the window the rank's compute time is set
  against its peers' median at the same step, and the rank's excess is
  averaged over the window with its `trim(window)` largest and smallest
  excesses left out (a trimmed mean). A rank 1.5x slower on every step, and
  one that stalls 100 ms on one step in four, both lose a steady share and
  are found; one spike (a page-in, a garbage collection, a late batch) is
  left out and is nobody's straggler. A median alone would miss the
  staller: three steps in four look healthy.
* Or it recurs (`recurring`). A rank stopped 100 ms in every 300 ms on 20 ms
  steps stalls one step in ten: two steps of a 20-step window, which the
  trim leaves out as spikes, though the rank loses a third of its time. So
  its loss is also judged with every step counted, over the last
  `RECUR_WINDOWS` disjoint windows, against the same limits; and the stalls
  must come back: in each of those windows it stalled (took more than twice
  its peers' median) on `RECUR_STALLS` steps or more and lost more than the
  factor allows. A spike, or two, is in one window; a stall that comes back
  is in every one. Stalls rarer than that (one a window) are left alone.
* It is large against its peers: its compute time a step (the peers' median
  plus its loss) over the peers' is above `watchdog.straggler_factor`.
  Peers slowed together (a busy shared node, a slower phase of the
  script) move the per-step median with them: nobody loses anything.
* It is large in seconds: the rank computes at least
  `watchdog.straggler_min_compute_s` a step and loses at least
  `watchdog.straggler_min_lost_s` a step. Below these floors, timing jitter
  (the scheduler, the timer, a framework's bookkeeping) makes ratios of
  3-4x out of nothing: a 0.35 ms step that takes 1.45 ms is noise, not a
  slow GPU. bench/README.md ("straggler_jitter.py") has the jitter the
  defaults were set from.
* It is its node's (`stands_out`): it loses more than `STAND_OUT` times what
  any rank on another node loses. A loss shared across nodes (a machine or
  network under load, ranks contending for one resource) makes the per-step
  median move less than the factor, yet is nobody's node: seen on a clean
  run at 200 ms steps under load, a rank losing 0.0245 s a step beside a
  peer on another node that lost 0.0241. Its own node's other ranks may
  lose as much: a slow node slows all of them.

And it goes on: the same rank must stay the straggler for PERSIST_STEPS steps
(counted in its steps from the first window that named it, `named_from`,
not in the watchdog's checks), and the steps since it was first named, every
one counted, must pass the same limits (`confirmed`): a window still holding
a few spikes, or a spell that has ended, names nobody.

The watchdog (runtime/controller/watchdog.py) feeds it the ranks' compute times after
warm-up and asks `slowest`, then `confirmed`. Only peers are compared, within one attempt: a rank's
own earlier steps are no baseline, since a script's own phases and a
restart's first steps (warm or cold) change every rank's pace.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

TRIM_SHARE = 0.1  # of the window's steps, left out at each end of a rank's excesses: one-off spikes are no steady loss
RECUR_WINDOWS = 3  # disjoint windows in a row over which a recurring straggler's loss is judged, every step counted
RECUR_STALLS = 2  # stalled steps it shows in each of them: one is a spike
STAND_OUT = 2.0  # a straggler loses more than this many times what any rank on another node loses


@dataclass(frozen=True)
class Limits:
    """What a straggler must exceed: the factor over its peers and the two floors (seconds a step)."""

    factor: float
    min_compute_s: float
    min_lost_s: float


@dataclass(frozen=True)
class Standing:
    """One rank over the window: its peers' per-step median, what it lost a step over it, and its compute time."""

    rank: int
    peers_s: float  # the mean over the window of its peers' median compute time at each step
    lost_s: float  # its trimmed mean excess over that median, seconds a step (negative: faster)

    @property
    def compute_s(self) -> float:
        """Its own compute time a step, its spikes left out."""
        return self.peers_s + self.lost_s

    @property
    def ratio(self) -> float:
        return self.compute_s / self.peers_s if self.peers_s > 0 else float("inf")


def limits(settings: Any) -> Limits:
    """The limits a run's watchdog settings set (rundir/runjson.WatchdogRecord, or the spec's section)."""
    return Limits(settings.straggler_factor, settings.straggler_min_compute_s, settings.straggler_min_lost_s)


def trim(window: int) -> int:
    """Steps left out at each end of a window's excesses: `TRIM_SHARE` of it, at least one, never half."""
    return min((window - 1) // 2, max(1, int(window * TRIM_SHARE)))


def peer_medians(values: np.ndarray) -> np.ndarray:
    """For each value, the median of all the others (one sort for all of them, not one per rank)."""
    n = len(values)
    if n < 2:
        return values.astype(float)  # nobody else: no excess
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    position = np.empty(n, dtype=np.intp)
    position[order] = np.arange(n)
    low, high = (n - 2) // 2, (n - 1) // 2  # the middle of the n - 1 others
    a = np.where(low < position, ranked[low], ranked[low + 1])
    b = np.where(high < position, ranked[high], ranked[high + 1])
    return (a + b) / 2


@dataclass(frozen=True)
class Found:
    """Every rank's standing over one span, as arrays by rank: the rule reads 100,000 ranks at once."""

    peers_s: np.ndarray
    lost_s: np.ndarray

    def __len__(self) -> int:
        return len(self.lost_s)

    def __getitem__(self, rank: int) -> Standing:
        return Standing(rank, float(self.peers_s[rank]), float(self.lost_s[rank]))

    def __iter__(self) -> Iterator[Standing]:
        return (self[r] for r in range(len(self)))

    def past(self, limits: Limits) -> np.ndarray:
        """Which ranks are past every limit (is_straggler, for all of them)."""
        compute = self.peers_s + self.lost_s
        return ((compute >= limits.min_compute_s) & (self.lost_s >= limits.min_lost_s)
                & (self.lost_s > (limits.factor - 1.0) * self.peers_s))

    def most_lost(self, mask: np.ndarray | None = None) -> float:
        """The most any rank (of `mask`) lost a step."""
        chosen = self.lost_s if mask is None else self.lost_s[mask]
        return float(chosen.max()) if chosen.size else float("-inf")


@dataclass(frozen=True)
class Excesses:
    """Each rank's excess over its peers' median at each step of a span, and that median: each step's column
    computed once, from which every window's standing is read."""

    steps: list[int]
    excess: np.ndarray  # [i, rank]: its compute time at steps[i] minus its peers' median there (a step a row)
    base: np.ndarray  # [i, rank]: that median

    @classmethod
    def of_columns(cls, steps: Sequence[int], excess: Sequence[np.ndarray], base: Sequence[np.ndarray]) -> Excesses:
        """A table from per-step columns (each indexed by rank)."""
        return cls(list(steps), np.stack(list(excess)), np.stack(list(base)))

    def found(self, lo: int = 0, hi: int | None = None, trimmed: int = 0) -> Found:
        """Every rank's standing over steps[lo:hi], its `trimmed` largest and smallest excesses left out."""
        return _found(self.excess, self.base, lo, hi, trimmed)

    def standing(self, rank: int, lo: int = 0, hi: int | None = None, trimmed: int = 0) -> Standing:
        """The rank's standing over steps[lo:hi] (the same arithmetic as `found`, for its row alone)."""
        one = _found(self.excess[:, rank : rank + 1], self.base[:, rank : rank + 1], lo, hi, trimmed)
        return Standing(rank, float(one.peers_s[0]), float(one.lost_s[0]))

    def stalls(self, rank: int, lo: int = 0, hi: int | None = None) -> int:
        """How many of steps[lo:hi] took the rank more than twice its peers' median: stalls, not a slowdown."""
        return int((self.excess[lo:hi, rank] > self.base[lo:hi, rank]).sum())


def _found(excess: np.ndarray, base: np.ndarray, lo: int, hi: int | None, trimmed: int) -> Found:
    hi = excess.shape[0] if hi is None else hi
    kept = np.sort(excess[lo:hi], axis=0)[trimmed : hi - lo - trimmed] if trimmed else excess[lo:hi]
    return Found(base[lo:hi].mean(axis=0), kept.mean(axis=0))


def column(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One step's excesses and peers' medians, by rank, from every rank's compute time at that step."""
    base = peer_medians(values)
    return values - base, base


def excesses(compute: Sequence[Mapping[int, float]], steps: Sequence[int]) -> Excesses:
    """compute[rank][step], that rank's compute time at that step, set against its peers' median at each of `steps`."""
    columns = [column(np.array([c[step] for c in compute], dtype=float)) for step in steps]
    world = len(compute)
    if not columns:
        return Excesses([], np.zeros((0, world)), np.zeros((0, world)))
    return Excesses.of_columns(steps, [e for e, _ in columns], [b for _, b in columns])


def standings(compute: Sequence[Mapping[int, float]], steps: Sequence[int], trimmed: int | None = None) -> Found:
    """Each rank's standing over `steps` (compute[rank][step]: that rank's compute time at that step), its
    `trimmed` (default `trim(len(steps))`) largest and smallest excesses left out."""
    k = trim(len(steps)) if trimmed is None else trimmed
    return excesses(compute, steps).found(trimmed=k)


def node_ids(nodes: Sequence[str]) -> np.ndarray:
    """Each rank's node as a number (ranks by index), for comparing losses across nodes at once."""
    index: dict[str, int] = {}
    return np.array([index.setdefault(n, len(index)) for n in nodes], dtype=np.intp)


def recurring(table: Excesses, window: int, limits: Limits, nodes: np.ndarray | Sequence[str] = ()) -> Standing | None:
    """The rank whose loss over the last `RECUR_WINDOWS` disjoint windows of the table's steps, every step counted,
    is past every limit, with `RECUR_STALLS` stalls and a loss past the factor in each of those windows (the one
    that lost the most when several are); None when no rank is, or the table holds fewer windows. See the module's
    doc."""
    end = len(table.steps)
    if end < RECUR_WINDOWS * window:
        return None
    start = end - RECUR_WINDOWS * window
    factor_only = Limits(limits.factor, 0.0, 0.0)
    windows = [(start + i * window, start + (i + 1) * window) for i in range(RECUR_WINDOWS)]
    overall = table.found(start)
    candidates = np.flatnonzero(overall.past(limits))
    past = [whole for whole in (overall[int(r)] for r in candidates)
            if stands_out(whole, overall, nodes)
            and all(table.stalls(whole.rank, lo, hi) >= RECUR_STALLS
                    and is_straggler(table.standing(whole.rank, lo, hi), factor_only) for lo, hi in windows)]
    return max(past, key=lambda s: (s.lost_s, -s.rank)) if past else None


def is_straggler(s: Standing, limits: Limits) -> bool:
    """Past every limit: the floors in seconds and the factor over its peers."""
    return (
        s.compute_s >= limits.min_compute_s
        and s.lost_s >= limits.min_lost_s
        and s.lost_s > (limits.factor - 1.0) * s.peers_s
    )


def stands_out(s: Standing, found: Found, nodes: np.ndarray | Sequence[str]) -> bool:
    """Its loss is its node's: no rank on another node loses `1 / STAND_OUT` of it or more (`nodes[rank]`: each
    rank's node, or node_ids of them; none known, every loss is taken as its node's)."""
    if len(nodes) == 0:
        return True
    ids = nodes if isinstance(nodes, np.ndarray) else node_ids(nodes)
    others = ids != ids[s.rank]
    return not others.any() or s.lost_s > STAND_OUT * max(0.0, found.most_lost(others))


def slowest(found: Found, limits: Limits, nodes: np.ndarray | Sequence[str] = ()) -> Standing | None:
    """The straggler that lost the most time a step, or None when no rank is past every limit, or the one that is
    loses no more than ranks on other nodes (stands_out)."""
    past = found.past(limits)
    if not past.any():
        return None
    worst = found[int(np.argmax(np.where(past, found.lost_s, -np.inf)))]  # the first of equal losses: the lowest rank
    return worst if stands_out(worst, found, nodes) else None


def named_from(table: Excesses, rank: int, window: int, limits: Limits) -> int:
    """The step from which `rank` has been past every limit at each step, counted back from the newest: the
    window ending at that step and at every later one of the table's last 2 x window steps names it. Persistence
    is thus counted in the ranks' steps, not in the watchdog's checks: a node reports its ranks' steps once a
    second, so a check can see many new steps at once, and a straggler shown by them is named at the step it
    showed, not a check later."""
    k = trim(window)
    steps = table.steps
    lo = max(0, len(steps) - 2 * window)
    first = steps[-1]
    for end in range(len(steps), lo + window - 1, -1):
        if not is_straggler(table.standing(rank, end - window, end, trimmed=k), limits):
            break
        first = steps[end - 1]
    return first


def confirmed(table: Excesses, rank: int, since: int, limits: Limits, window: int) -> Standing | None:
    """The suspect's standing over the steps of the table's last window after `since` (when it was first named),
    every one counted, when it is past every limit there too: its loss goes on, it did not just happen once in
    the window."""
    start = len(table.steps) - window
    newer = [i for i in range(start, len(table.steps)) if table.steps[i] > since]
    if not newer:
        return None
    found = table.standing(rank, newer[0], newer[-1] + 1)
    return found if is_straggler(found, limits) else None


def describe(s: Standing, window: int, since: Standing, newer: int, limits: Limits, peers_lost_s: float) -> str:
    """The verdict's reason: what was compared, over which steps, and the limits it passed."""
    return (
        f"lost {s.lost_s:.3g} s a step against its peers' median compute time at each of the last {window} steps"
        f" ({s.compute_s:.3g} s a step against their {s.peers_s:.3g} s: {s.ratio:.2f}x, its {trim(window)} largest"
        f" and smallest losses left out; its peers lost {peers_lost_s:.3g} s a step at most), and {since.lost_s:.3g} s"
        f" a step over the {newer} steps since it was first named; past watchdog.straggler_factor {limits.factor:g},"
        f" straggler_min_compute_s {limits.min_compute_s:g} s and straggler_min_lost_s {limits.min_lost_s:g} s"
    )


def describe_recurring(s: Standing, window: int, stalls: int, limits: Limits, peers_lost_s: float) -> str:
    """A recurring straggler verdict's reason: its loss over the windows, and on how few steps it came."""
    steps = RECUR_WINDOWS * window
    return (
        f"lost {s.lost_s:.3g} s a step against its peers' median compute time at each step, every step counted, over"
        f" the last {RECUR_WINDOWS} windows of {window} steps ({s.compute_s:.3g} s a step against their"
        f" {s.peers_s:.3g} s: {s.ratio:.2f}x; its peers lost {peers_lost_s:.3g} s a step at most): it stalls, {stalls}"
        f" of its {steps} steps took more than twice its peers', {RECUR_STALLS} or more in each window;"
        f" past watchdog.straggler_factor {limits.factor:g}, straggler_min_compute_s {limits.min_compute_s:g} s and"
        f" straggler_min_lost_s {limits.min_lost_s:g} s"
    )
