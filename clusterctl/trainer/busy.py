"""Busy compute for the reference trainer's `--step-compute-s`: work, never sleep.

A step that must take S seconds of compute does a fixed amount of CPU work,
not a sleep, so that a rank slowed from outside (stopped a fraction of the
time by SIGSTOP/SIGCONT, or sharing its CPUs with other processes) takes
proportionally longer — which is what a straggler looks like.

The work is counted in units: a fixed loop of integer arithmetic, about a
millisecond each, deterministic and pure Python. A unit this short leaves the
interpreter free to hand the GIL to other threads (the heartbeat's liveness
beat) at its usual switch interval. `calibrate` measures how many units this
process completes per wall-clock second with the CPU share it has now;
`spin(round(seconds * rate))` then takes about `seconds` as long as that share
holds. Standard library only.
"""

from __future__ import annotations

import time

UNIT_ITERATIONS = 4000  # about 0.3-1 ms of CPython on current CPUs
WARMUP_S = 0.02


def _unit(seed: int) -> int:
    x = seed
    for i in range(UNIT_ITERATIONS):
        x = (x * 1103515245 + i) & 0xFFFFFFFF
    return x


def spin(units: int) -> int:
    """Run `units` units of work; returns a checksum (so the work is observable)."""
    x = 1
    for _ in range(max(0, int(units))):
        x = _unit(x)
    return x


def calibrate(seconds: float = 0.4) -> float:
    """Units completed per wall-clock second, measured over about `seconds`."""
    deadline = time.perf_counter() + WARMUP_S
    x = 1
    while time.perf_counter() < deadline:
        x = _unit(x)
    units = 0
    start = time.perf_counter()
    while True:
        x = _unit(x)
        units += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return units / elapsed
