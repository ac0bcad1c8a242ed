"""What the Lightning and Hugging Face adapters share: the Contract's duties, for a loop a framework runs.

A framework owns its loop, its checkpoint format and its resume; an adapter
(lightning.py, hf.py) hooks into it and, through this class, does what the
Contract does for a plain loop:

* one step report per rank per optimizer step, with the step counted from 0
  (a framework's `global_step` counts steps done: step = global_step - 1) and
  the values it logs (loss...) in rank 0's metrics.jsonl;
* the phases `load` (while a resume loads), `save` (while a checkpoint is
  written: its time is not the next step's);
* saves every `checkpoint.interval` steps (or `auto`), and on a stop request
  (pre-timeout, preemption, `clusterctl requeue`) a save, then exit 85; both
  decided by every rank together in one tiny all-reduce a step;
* the framework's checkpoint files committed as a generation
  (checkpoint/filesets.py): `clusterctl checkpoints` lists them and
  `resume_path()` is the newest committed one.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Callable, NoReturn

from clusterctl.checkpoint.filesets import commit_files
from clusterctl.checkpoint.generations import Generation, latest_committed
from clusterctl.runtime import heartbeat as heartbeats
from clusterctl.runtime.stoprequest import StopRequest, agree_max, exit_stopped
from clusterctl.trainer.settings import SaveSchedule, attach_watch, attempt, loop_settings


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


class FrameworkLoop:
    """One rank's side of a framework's training loop under clusterctl (or by hand: ./checkpoints)."""

    def __init__(self, framework: str, *, directory: str | Path | None = None, interval: int | None = None,
                 keep: int | None = None) -> None:
        self.framework = framework
        self.settings = loop_settings(directory=directory, interval=interval, keep=keep)
        self.directory = self.settings.directory
        # The framework has not joined its process group yet: the launcher's variables say who we are.
        self.rank, self.world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
        self.heartbeat = heartbeats.shared(self.rank, attempt())
        self.watch = attach_watch(self.rank, self.world, self.settings)
        self.stop = StopRequest(self.rank)
        self.schedule = SaveSchedule(self.settings, rank=self.rank)
        self.owner = secrets.token_hex(4)  # this writer's temporaries are known dead to retention
        self.last_committed: int | None = None

    # --- resume ------------------------------------------------------------------
    def resume_generation(self) -> Generation | None:
        """The newest committed generation (None: start from scratch); its load is the phase `load`."""
        generation = latest_committed(self.directory) if self.directory.is_dir() else None
        if self.rank == 0:
            where = f"resuming from step {generation.step} ({generation.path})" if generation else "no committed checkpoint: from scratch"
            print(f"clusterctl: {where}", flush=True)
        if generation is not None:
            self.heartbeat.phase("load")
            self.last_committed = generation.step
        return generation

    def steps_begin(self) -> None:
        """Training begins now: loading is over, and the first step's time starts."""
        self.heartbeat.phase("start")
        if self.watch is not None:
            self.watch.start()

    # --- each step -----------------------------------------------------------------
    def step_done(self, step: int, values: dict[str, Any] | None = None, *, hold: bool = False) -> None:
        if self.watch is not None:
            self.watch.record({k: v for k, v in (values or {}).items() if v is not None})
            self.watch.step_done(step, hold=hold)

    def logged(self, values: dict[str, Any]) -> None:
        """Values the framework logged for the step that just ended."""
        if self.watch is not None:
            self.watch.amend(values)

    def decide(self, step: int) -> tuple[bool, bool]:
        """(save now, stop now) after `step`, the same on every rank: one all-reduce MAX."""
        save, stop = agree_max([int(self.schedule.due(step)), int(self.stop.here())])
        return bool(save or stop), bool(stop)

    # --- saves ---------------------------------------------------------------------------
    def saving(self, step: int) -> None:
        self.heartbeat.phase("save", step)

    def commit(self, step: int, fill: Callable[[Path], None]) -> Generation:
        """Rank 0: commit the files `fill` puts in place as generation `step` (`saved` then records it)."""
        return commit_files(
            self.directory, step, fill, framework=self.framework, keep=self.settings.keep, world_size=self.world,
            spec_hash=self.settings.spec_hash, layout=self.settings.layout, owner=self.owner,
        )

    def saved(self, step: int) -> None:
        """The save is over: the next step's time starts now."""
        self.last_committed = step
        self.heartbeat.phase("idle", step)
        if self.watch is not None:
            self.watch.start()

    def exit_stopped(self, step: int) -> NoReturn:
        """After the stop's save: every rank exits 85, and the run continues in a new job."""
        self.close()
        exit_stopped(self.rank, step)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
        self.heartbeat.close()

