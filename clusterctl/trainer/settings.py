"""What a training loop takes from the job spec, shared by the Contract and the framework adapters.

The checkpoint directory, interval and keep come from run.json when the loop
runs under clusterctl (./checkpoints, every 1000 steps, keep 2 by hand or
under torchrun); the step watcher (runtime/rank/stepwatch.py) is the one the
launcher installed, told that the loop now says which step it is, so there
is one step report per rank per step.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from clusterctl import envnames
from clusterctl.rundir import runjson
from clusterctl.rundir.runjson import CheckpointRecord, RunJson

DEFAULT_INTERVAL = 1000  # steps between saves when nothing says otherwise
WARMUP_STEPS = 5  # `interval: auto` measures this many steps before it chooses


def run_settings() -> RunJson | None:
    """run.json when running under clusterctl, else None."""
    run_dir = os.environ.get(envnames.RUN_DIR)
    return runjson.load_attempt(Path(run_dir)) if run_dir else None


def attempt() -> int:
    return int(os.environ.get(envnames.ATTEMPT, "0") or 0)


@dataclass(frozen=True)
class LoopSettings:
    """One loop's checkpoint settings: the spec's, or the arguments that override them."""

    directory: Path
    interval: int | None  # None: `interval: auto`, learnt from the step time (SaveSchedule)
    auto_interval_s: float | None
    keep: int
    asynchronous: bool
    spec_hash: str
    layout: dict[str, Any] | None
    steps_mode: str  # watchdog.steps
    memory_interval: int = 0  # checkpoint.memory_interval: steps between in-memory snapshots, 0: none
    run_id: str = ""  # the run directory's name: in-memory snapshots are kept per run


def loop_settings(
    *, directory: str | Path | None = None, interval: int | None = None, keep: int | None = None,
    asynchronous: bool | None = None,
) -> LoopSettings:
    run = run_settings()
    ckpt = run.checkpoint if run is not None else CheckpointRecord()
    run_dir = os.environ.get(envnames.RUN_DIR)
    default_dir = run.checkpoint_dir(Path(run_dir)) if run is not None and run_dir else Path("checkpoints")
    configured = ckpt.interval
    auto_s = ckpt.auto_interval_s if configured == "auto" and not interval else None
    steps = interval or (configured if isinstance(configured, int) else None)
    if steps is None and auto_s is None:
        steps = DEFAULT_INTERVAL
    return LoopSettings(
        directory=Path(directory or default_dir),
        interval=steps,
        auto_interval_s=auto_s,
        keep=keep or ckpt.keep,
        asynchronous=ckpt.async_ if asynchronous is None else asynchronous,
        spec_hash=run.spec_hash if run is not None else "",
        layout=dataclasses.asdict(run.parallel) if run is not None else None,
        steps_mode=run.watchdog.steps if run is not None else "auto",
        memory_interval=ckpt.memory_interval,
        run_id=Path(run_dir).name if run_dir else "",
    )


def attach_watch(rank: int, world: int, settings: LoopSettings, metrics_dir: str | Path | None = None) -> Any:
    """The step watcher, now fed by the loop's own step numbers (None with `watchdog.steps: off`)."""
    from clusterctl.runtime.rank import stepwatch

    watch = stepwatch.current() or stepwatch.install(
        rank, world, attempt(), str(metrics_dir or os.environ.get(envnames.ATTEMPT_DIR) or "") or None, settings.steps_mode,
    )
    if watch is not None:
        watch.from_contract = True  # the loop says which step it is; the hooks only time it
    return watch


class SaveSchedule:
    """When a save is due: every `interval` steps, or for `interval: auto` the Young/Daly seconds
    over the median step time, learnt after a few steps (`agree` makes every rank pick rank 0's)."""

    def __init__(self, settings: LoopSettings, agree: Callable[[int], int] | None = None, rank: int = 0) -> None:
        self.interval, self.auto_interval_s = settings.interval, settings.auto_interval_s
        self._agree, self._rank = agree, rank
        self._marks: list[float] = []

    def due(self, step: int) -> bool:
        """Whether step `step` (counted from 0) ends with a save."""
        if self.interval is None:
            self._learn()
        return self.interval is not None and (step + 1) % self.interval == 0

    def _learn(self) -> None:
        self._marks.append(time.perf_counter())
        if len(self._marks) <= WARMUP_STEPS:
            return
        gaps = sorted(b - a for a, b in zip(self._marks, self._marks[1:]))
        steps = max(1, round(float(self.auto_interval_s or 0) / max(gaps[len(gaps) // 2], 1e-6)))
        self.interval = self._agree(steps) if self._agree is not None else steps
        if self._rank == 0:
            print(f"clusterctl: checkpoint interval auto: every {self.interval} steps (~{self.auto_interval_s:.0f} s)", flush=True)
