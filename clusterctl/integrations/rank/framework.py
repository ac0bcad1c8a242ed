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
  `resume_path()` is the newest committed one;
* with `checkpoint.memory_interval`, the framework's whole checkpoint in
  host memory after every such step (checkpoint/snapshots.py: this node's
  and a peer node's), so that a restart in the allocation resumes from the
  newest step every rank holds, at most the step in flight lost; the
  resume's choice and where it came from go into the run record
  (attempt-N/record.json), as the Contract's do.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Callable, NoReturn

from clusterctl import envnames
from clusterctl.checkpoint.errors import CheckpointError
from clusterctl.checkpoint.filesets import commit_files
from clusterctl.checkpoint.generations import Generation, resumable
from clusterctl.checkpoint.snapshots import Restored, Snapshots, open_snapshots
from clusterctl.rundir import runjson
from clusterctl.runtime.rank import heartbeat as heartbeats
from clusterctl.runtime.rank.stoprequest import StopRequest, agree_max, exit_stopped
from clusterctl.trainer import runrecord
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
        self.snapshots: Snapshots | None = None

    # --- resume ------------------------------------------------------------------
    def full_plan(self) -> runjson.RunJson | None:
        """The run's plan at its full size, whatever this attempt's width (None outside clusterctl)."""
        run_dir = os.environ.get(envnames.RUN_DIR)
        return runjson.read(Path(run_dir)) if run_dir else None

    def kept_accumulation(self, given: Any) -> int | None:
        """After an elastic shrink with `batch: keep`: the accumulation that keeps the global batch at this width
        (the given one, else the plan's, scaled by the plan's dp over this width's); None at the full width or
        outside clusterctl. ValueError where no whole number does."""
        plan = self.full_plan()
        if plan is None or not plan.elastic.widths or self.world == plan.world_size or plan.elastic.batch != "keep":
            return None
        accum = given if isinstance(given, int) and given > 0 else plan.batch.grad_accum
        dp = plan.at_width(self.world // max(1, plan.gpus_per_node)).parallel.dp
        if (accum * plan.parallel.dp) % dp:
            raise ValueError(f"a gradient accumulation of {accum} at dp {plan.parallel.dp} has no whole counterpart at"
                             f" this shrunk width's dp {dp}: the global batch cannot be kept (elastic.batch: keep)")
        return accum * plan.parallel.dp // dp

    def resume(self) -> Generation | Restored | None:
        """What to resume from, the same on every rank: an in-memory snapshot, the newest committed generation, or nothing.

        With `checkpoint.memory_interval`, collective: the ranks agree on the
        newest step whose snapshot every rank can have (checkpoint/snapshots.py);
        it wins when not older than the newest committed generation. Its load
        (or the generation's) is the phase `load`.
        """
        generation, refused = resumable(self.directory) if self.directory.is_dir() else (None, None)
        if refused:  # every rank reads the same directory: the same error everywhere, the script's (trust.py)
            raise CheckpointError(refused)
        snapshots = self._open_snapshots()
        found = snapshots.restore(generation.step if generation is not None else None) if snapshots is not None else None
        if self.rank == 0:
            where = (f"resuming from the in-memory snapshot of step {found.step}" if found is not None
                     else f"resuming from step {generation.step} ({generation.path})" if generation
                     else "no committed checkpoint: from scratch")
            print(f"clusterctl: {where}", flush=True)
        recovery, data = runrecord.resumed(self.directory, self.world, generation=None if found else generation,
                                           memory=found, memory_path=snapshots.node if found else None)
        runrecord.write({"recovery": recovery, "data": data}, rank=self.rank, replace=False,
                        writer=f"clusterctl.integrations ({self.framework})")
        if generation is not None:
            self.last_committed = generation.step
        if found is not None or generation is not None:
            self.heartbeat.phase("load")
        return found if found is not None else generation

    def _open_snapshots(self) -> Snapshots | None:
        """This rank's in-memory snapshots (checkpoint.memory_interval), opened once; collective.

        They need the ranks' process group before a framework makes its own
        (Lightning makes it inside `fit`, after the resume is chosen): then it
        is made here as the framework would, from the launcher's variables
        (gloo for CPU tensors, NCCL for CUDA ones where there are GPUs), and
        the framework finds it made and uses it.
        """
        if self.snapshots is None and self.settings.memory_interval:
            import torch.distributed as dist

            if self.world > 1 and not dist.is_initialized():
                dist.init_process_group(rank=self.rank, world_size=self.world)
            self.snapshots = open_snapshots(self.settings.memory_interval, run_id=self.settings.run_id,
                                            layout=self.settings.layout, rank=self.rank, world=self.world)
        return self.snapshots

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

    def snapshot(self, step: int, state: Callable[[], dict[str, Any]]) -> None:
        """An in-memory snapshot of `state()` (the framework's whole checkpoint) after `step`, when one is due.

        Collective (every rank calls it each step). The state is copied now and
        written in the background, to this node's and a peer node's host memory.
        """
        snapshots = self._open_snapshots()
        if snapshots is not None and snapshots.due(step):
            snapshots.take(step, state(), {})

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
        if self.snapshots is not None:
            self.snapshots.wait()
        if self.watch is not None:
            self.watch.close()
        self.heartbeat.close()

