"""The Hugging Face Trainer under clusterctl: step reports, committed checkpoints, resume, 85 on a stop.

    from transformers import Trainer
    from clusterctl.integrations.hf import ClusterctlCallback

    cc = ClusterctlCallback()                            # checkpoint dir, interval, keep from the job spec
    trainer = Trainer(model, cc.training_args(args), train_dataset=data, callbacks=[cc])
    trainer.train(resume_from_checkpoint=cc.resume_from())   # the newest committed checkpoint, or None

What the callback does:
* one step report per optimizer step (`on_step_end`), with what the
  Trainer logs for it (`loss`, `learning_rate`, `grad_norm`: set
  `logging_steps` to how often you want them) in rank 0's metrics.jsonl;
* a save every `checkpoint.interval` steps (`control.should_save`), on top of
  the Trainer's own `save_strategy`; on a stop request (pre-timeout,
  preemption, `clusterctl requeue`) `should_save` and
  `should_training_stop`, then, once the save is committed, exit 85;
* every checkpoint the Trainer writes (its folder `checkpoint-N` under
  `output_dir`) is moved into `<checkpoint dir>/step-(N-1)` and committed
  there (fsync, manifest, rename); `checkpoint.keep` decides what is kept.
  Step N-1 because clusterctl counts steps from 0 and the Trainer's
  `global_step` counts steps done.
* with `checkpoint.memory_interval`, the model, optimizer, scheduler,
  trainer state and RNG state kept in host memory after every such step
  (integrations/rank/framework.py); `resume_from()` prefers the newest step every
  rank holds when it is newer than the newest committed checkpoint, laid out
  as the Trainer's own checkpoint folder on the rank's node.
`output_dir` must be on storage every rank writes to (each writes its RNG
state there), as the checkpoint directory is.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import WEIGHTS_NAME

from clusterctl.checkpoint.filesets import move_into
from clusterctl.checkpoint.snapshots import Restored
from clusterctl.integrations.rank.framework import FrameworkLoop

LOGGED = ("loss", "learning_rate", "grad_norm")  # what the Trainer logs that metrics.jsonl keeps


class ClusterctlCallback(TrainerCallback):
    """The Trainer's hooks, doing the Contract's duties (integrations/framework.py)."""

    def __init__(self, *, directory: str | Path | None = None, interval: int | None = None, keep: int | None = None) -> None:
        self.loop = FrameworkLoop("hf", directory=directory, interval=interval, keep=keep)
        self._stopping = False
        self._unpacked: Path | None = None  # an in-memory snapshot laid out for the Trainer to resume from

    def training_args(self, args: Any) -> Any:
        """Your TrainingArguments at this attempt's width: after an elastic shrink with `batch: keep`,
        `gradient_accumulation_steps` scaled by the plan's dp over the shrunk one, so the global batch stays (the
        Trainer's own sampler decides the batches: the data position is not exact across the change)."""
        kept = self.loop.kept_accumulation(args.gradient_accumulation_steps)
        if kept is None or kept == args.gradient_accumulation_steps:
            return args
        shrunk = copy.copy(args)  # not dataclasses.replace: its __post_init__ would set up the devices again
        shrunk.gradient_accumulation_steps = kept
        return shrunk

    def resume_from(self) -> str | None:
        """For `trainer.train(resume_from_checkpoint=...)`: the newest committed checkpoint's folder, or None.

        With `checkpoint.memory_interval` (collective: call it on every rank,
        after the Trainer is made), a newer in-memory snapshot wins: it is
        laid out as the Trainer's own checkpoint folder in this node's host
        memory, one per rank, and removed once training has resumed from it.
        """
        found = self.loop.resume()
        if isinstance(found, Restored):
            assert self.loop.snapshots is not None  # a snapshot was found in them
            self._unpacked = unpack(found, self.loop.snapshots.node / f"hf-resume-rank-{self.loop.rank}",
                                   self.loop.rank, self.loop.world)
            return str(self._unpacked)
        return str(found.path) if found is not None else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loop.steps_begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step - 1
        self.loop.step_done(step, hold=True)  # the Trainer logs this step's loss after this hook
        save, stop = self.loop.decide(step)
        if save:
            control.should_save = True
            self.loop.saving(step)
        if stop:
            control.should_training_stop = True
            self._stopping = True
        if self._unpacked is not None:  # the Trainer has read all of it (the RNG state last, before the first step)
            shutil.rmtree(self._unpacked.parent, ignore_errors=True)
            self._unpacked = None
        self.loop.snapshot(step, lambda: trainer_state(state, kwargs["model"], kwargs["optimizer"], kwargs["lr_scheduler"]))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        values = {k: v for k, v in (logs or {}).items() if k in LOGGED}
        if values:
            self.loop.logged(values)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Every rank has written its part of `checkpoint-N`: rank 0 commits it, the others wait for the outcome."""
        import torch.distributed as dist

        step = state.global_step - 1
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if dist.is_initialized():
            dist.barrier()
        error = None
        if self.loop.rank == 0:
            try:
                self.loop.commit(step, move_into(folder))
            except Exception as exc:  # noqa: BLE001 - every rank waits for the outcome below: it must hear of it
                error = f"committing {folder} as step {step} failed: {type(exc).__name__}: {exc}"
        if dist.is_initialized():
            box = [error]
            dist.broadcast_object_list(box, src=0)
            error = box[0]
        if error is not None:
            raise RuntimeError(f"clusterctl: {error}")
        self.loop.saved(step)
        if self._stopping:
            self.loop.exit_stopped(step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loop.close()


def trainer_state(state: Any, model: Any, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """What the Trainer's checkpoint folder holds, as one state for an in-memory snapshot (copied before the next step)."""
    rng: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.random.get_rng_state_all()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "trainer_state": dataclasses.asdict(state), "rng": rng}


def unpack(found: Restored, where: Path, rank: int, world: int) -> Path:
    """A snapshot laid out as the Trainer's own checkpoint folder (`checkpoint-N` under `where`): what it resumes from.

    The Trainer's file names and formats: the model's weights, optimizer and
    scheduler (torch.save), trainer_state.json, this rank's RNG state.
    """
    shutil.rmtree(where, ignore_errors=True)
    folder = where / f"{PREFIX_CHECKPOINT_DIR}-{found.step + 1}"
    folder.mkdir(parents=True, mode=0o700)
    state = found.state
    torch.save(state["model"], folder / WEIGHTS_NAME)
    torch.save(state["optimizer"], folder / OPTIMIZER_NAME)
    if state["scheduler"] is not None:
        torch.save(state["scheduler"], folder / SCHEDULER_NAME)
    (folder / TRAINER_STATE_NAME).write_text(json.dumps(state["trainer_state"], indent=2, sort_keys=True) + "\n")
    torch.save(state["rng"], folder / ("rng_state.pth" if world <= 1 else f"rng_state_{rank}.pth"))
    return folder
