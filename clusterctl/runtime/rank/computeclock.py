"""The clock a rank times its compute with, so that stragglers are told apart fairly.

On real hardware each rank has its own GPU, and the wall time of its compute
is what a straggler stretches. Where emulated GPUs share real CPUs (sites with
`oversubscribe: true`: the local backend, the test cluster), a rank's wall
time also counts the time it waited for a CPU that an emulated peer held, and
that waiting shifts to whichever ranks happen to compute together: a rank run
at 1/1.5 of its speed from outside then looks only ~1.2x slower than its
peers, who speed up while it is stopped. There the clock leaves out the time
the thread waited on a run queue (/proc/thread-self/schedstat), so compute
time is what the rank itself spent: running, or stopped. Standard library only.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from clusterctl import envnames

_SCHEDSTAT = "/proc/thread-self/schedstat"


def _runqueue_wait_s() -> float:
    with open(_SCHEDSTAT, "rb") as fh:
        return int(fh.read().split()[1]) / 1e9


def compute_clock() -> Callable[[], float]:
    """time.perf_counter, or on an oversubscribed site perf_counter minus the calling thread's run-queue wait."""
    if os.environ.get(envnames.OVERSUBSCRIBED) != "1":
        return time.perf_counter
    try:
        _runqueue_wait_s()
    except (OSError, ValueError, IndexError):
        return time.perf_counter  # no scheduler statistics in this kernel: wall time it is

    def clock() -> float:
        return time.perf_counter() - _runqueue_wait_s()

    return clock
