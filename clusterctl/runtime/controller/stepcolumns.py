"""The compute times of the steps every rank reported: one column a step, its peers' medians computed once (pure).

The straggler rule (straggler.py) sets each rank's compute time at each
step against its peers' median at that step. Recomputing those medians for
every window at every check took 2.3 s a check at 16,384 ranks (four checks
a second), so the watchdog fell behind once the rule started. A step's
medians do not change once every rank has reported it: here each step's
column is made once, when its last rank reports it, and the rule reads the
newest columns as one table.

A rank's first `skip` reports are its warm-up (watchdog.straggler_warmup)
and count towards no column. A step some rank never reports (a lost
datagram, a rank that skipped it) never completes and is forgotten once it
is `keep` steps older than the newest column.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from clusterctl.runtime.controller import straggler

HELD = 512  # compute times kept per rank: the columns' span, the straggler evidence's steps and room for skew


class StepColumns:
    def __init__(self, world: int, keep: int, skip: int) -> None:
        self.world = world
        self.keep = keep
        self.skip = skip
        self.recent: list[dict[int, float]] = [{} for _ in range(world)]  # rank -> step -> compute time (its last HELD)
        self._reports = [0] * world  # compute times each rank reported
        self._counts: dict[int, int] = {}  # step -> ranks past their warm-up that reported it
        self.steps: deque[int] = deque(maxlen=keep)
        # Each column is written twice, at i and i + keep of a 2 x keep ring, so the newest `keep` are always one
        # contiguous block of rows: a table is a view, never a copy (at 100,000 ranks a copy took 0.5 s).
        self._excess = np.zeros((2 * keep, world))
        self._base = np.zeros((2 * keep, world))
        self.made = 0  # columns made so far: the rule need not run again until this grows

    def add(self, rank: int, step: int, compute_s: float) -> None:
        """A rank's compute time at a step (a step reported twice counts once)."""
        mine = self.recent[rank]
        if step in mine:
            return
        mine[step] = compute_s
        if len(mine) > HELD:
            del mine[next(iter(mine))]
        self._reports[rank] += 1
        if self._reports[rank] <= self.skip:
            return
        count = self._counts.get(step, 0) + 1
        if count < self.world:
            self._counts[step] = count
            return
        self._counts.pop(step, None)
        self._make(step)

    def _make(self, step: int) -> None:
        values = np.fromiter((r[step] for r in self.recent), dtype=float, count=self.world)
        excess, base = straggler.column(values)
        self.steps.append(step)
        row = self.made % self.keep
        self._excess[row] = self._excess[row + self.keep] = excess
        self._base[row] = self._base[row + self.keep] = base
        self.made += 1
        if len(self._counts) > self.keep:  # steps that will never complete: forget those far behind this one
            for stale in [s for s in self._counts if s < step - self.keep]:
                del self._counts[stale]

    def table(self, steps: int) -> straggler.Excesses | None:
        """The newest `steps` columns (fewer when fewer are made), or None before the first."""
        have = min(steps, len(self.steps))
        if have == 0:
            return None
        end = (self.made - 1) % self.keep + 1 + (self.keep if self.made > self.keep else 0)
        return straggler.Excesses(list(self.steps)[-have:], self._excess[end - have : end], self._base[end - have : end])

    def value(self, rank: int, step: int) -> float:
        return self.recent[rank][step]
