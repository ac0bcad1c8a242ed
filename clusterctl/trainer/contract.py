"""The recovery contract, for the reference trainer and for your own script.

A training script adopts it with a few lines:

    from clusterctl.trainer import Contract

    contract = Contract(model, optimizer, sampler=sampler)   # settings from the job spec
    start = contract.resume()                                 # the latest committed generation, if any
    for step in range(start, total_steps):
        ...                                                   # forward, backward, optimizer step
        contract.after_step(step, loss=loss)                  # reports the step; saves on schedule; on pre-timeout:
    contract.close()                                          #   save, commit, exit 85

What it reports to the watchdog: the phase `load` while resume() loads
(watchdog.load_timeout applies, not the hang timeout), one step report per
rank per `after_step` with its step and compute time (runtime/rank/stepwatch.py
times the step; the collectives' waits are left out of compute), `save`
while a checkpoint is written, and the values given to `after_step` (loss,
tokens, any scalar or one-element tensor) in rank 0's metrics.jsonl. The
time a save takes is its own phase, not part of the next step.

`resume()` also writes this attempt's run record (attempt-N/record.json, rank
0): the generation and data position it resumed from, or none, and the
optimizer's settings. `contract.describe(training={...}, data={...})` adds
what only the script knows (dataset identity, schedule, seeds, precision);
`clusterctl record RUN` shows the whole record.

`after_step` is collective (every rank calls it each step): it agrees on
whether to stop through one tiny all-reduce, so every rank saves the same
step. A stop is requested by the controller (the batch shell trapped the
pre-timeout signal or a preemption) or by SIGUSR2/SIGTERM reaching the rank
directly (standalone scripts).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from clusterctl import envnames
from clusterctl.runtime.rank import heartbeat as heartbeats
from clusterctl.runtime.rank.stoprequest import StopRequest, agree_max, exit_stopped
from clusterctl.trainer import runrecord
from clusterctl.trainer.settings import SaveSchedule, attach_watch, attempt, loop_settings


def rng_state() -> dict[str, str]:
    state = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available():
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return state


def set_rng_state(state: dict[str, str]) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8))


def _optimizer_summary(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's type and hyperparameters: each distinct parameter-group setting once, with its count."""

    def plain(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.item() if value.numel() == 1 else str(value)
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)

    groups: list[dict[str, Any]] = []
    for group in optimizer.param_groups:
        settings = {k: plain(v) for k, v in sorted(group.items()) if k != "params"}
        for seen in groups:
            if seen["settings"] == settings:
                seen["groups"] += 1
                break
        else:
            groups.append({"settings": settings, "groups": 1})
    return {"type": type(optimizer).__name__, "param_groups": groups}


class Contract:
    """Checkpoint schedule, resume, pre-timeout stop and heartbeats for one training loop."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        sampler: Any = None,
        directory: str | Path | None = None,
        interval: int | None = None,
        keep: int | None = None,
        asynchronous: bool | None = None,
        metrics_dir: str | Path | None = None,
    ) -> None:
        from clusterctl.checkpoint import Checkpointer
        from clusterctl.runtime.rank import stepwatch

        self.settings = loop_settings(directory=directory, interval=interval, keep=keep, asynchronous=asynchronous)
        self.directory = self.settings.directory
        self.asynchronous = self.settings.asynchronous
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.schedule = SaveSchedule(self.settings, self._agree_on, self.rank)
        self.heartbeat = heartbeats.shared(self.rank, attempt())
        self.watch = attach_watch(self.rank, self.world, self.settings, metrics_dir)
        if self.watch is not None:
            stepwatch.adopt(model)
        self.checkpointer = Checkpointer(
            self.directory,
            keep=self.settings.keep,
            rank=self.rank,
            world_size=self.world,
            spec_hash=self.settings.spec_hash,
            layout=self.settings.layout,
        )
        self.stop = StopRequest(self.rank)
        self.last_saved: int | None = None
        self.snapshots = self._snapshots()

    def _snapshots(self) -> Any:
        """In-memory snapshots when checkpoint.memory_interval asks for them (checkpoint/snapshots.py); collective."""
        from clusterctl.checkpoint.snapshots import open_snapshots

        return open_snapshots(self.settings.memory_interval, run_id=self.settings.run_id, layout=self.settings.layout,
                              rank=self.rank, world=self.world)

    # --- state --------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def _extra(self, step: int) -> dict[str, Any]:
        extra: dict[str, Any] = {"step": step, "rng": rng_state()}
        if self.sampler is not None:
            extra["sampler"] = self.sampler.state_dict()
        return extra

    def resume(self) -> int:
        """Load the newest committed generation; the step to continue from (0 without one)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        generation = self.checkpointer.latest()
        if self.snapshots is not None:
            found = self.snapshots.restore(generation.step if generation is not None else None)
            if found is not None:
                return self._resume_from_memory(found)
        if generation is None:
            self._record_resume(None)
            self._steps_begin()
            return 0
        self.heartbeat.phase("load")
        state = self._state()
        extra = self.checkpointer.load(generation, state)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if self.sampler is not None and "sampler" in extra:
            self.sampler.load_state_dict(extra["sampler"])
        if "rng" in extra:
            set_rng_state(extra["rng"])
        self.last_saved = generation.step
        self._record_resume(generation)
        self._steps_begin()
        return generation.step + 1

    def _resume_from_memory(self, found: Any) -> int:
        """Every rank has its state of one step from host memory (its node's, or a peer node's): no file system."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        self.heartbeat.phase("load")
        step, state, extra = found.step, found.state, found.extra
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if self.sampler is not None and "sampler" in extra:
            self.sampler.load_state_dict(extra["sampler"])
        if "rng" in extra:
            set_rng_state(extra["rng"])
        self._record_resume(None, memory=found)
        self._steps_begin()
        return step + 1

    def _steps_begin(self) -> None:
        """The first step's time starts now: loading is not part of it."""
        self.heartbeat.phase("start")
        if self.watch is not None:
            self.watch.start()

    # --- the run record -------------------------------------------------------------
    def describe(self, *, training: dict[str, Any] | None = None, data: dict[str, Any] | None = None) -> None:
        """Add what only the script knows to this attempt's run record: dataset identity, schedule, seeds, precision.

        Rank 0 writes it (attempt-N/record.json); other ranks, and runs outside
        clusterctl, write nothing. Keys given here win over the contract's own.
        """
        self._record({"training": training or {}, "data": data or {}}, replace=True)

    def _record_resume(self, generation: Any, memory: Any = None) -> None:
        """The facts resume() knows: the generation (or memory snapshot) and data position resumed from, optimizer, model, seeds."""
        if self.rank != 0 or not os.environ.get(envnames.ATTEMPT_DIR):
            return
        recovery, data = runrecord.resumed(self.directory, self.world, generation=generation, memory=memory,
                                           memory_path=self.snapshots.node if memory is not None else None)
        if self.sampler is not None:
            state = self.sampler.state_dict() if hasattr(self.sampler, "state_dict") else None
            data["sampler"] = {"type": type(self.sampler).__name__, "seed": getattr(self.sampler, "seed", None), "state": state}
        model = getattr(self.model, "module", self.model)  # DDP wraps the model
        training = {
            "optimizer": _optimizer_summary(self.optimizer),
            "model_type": type(model).__name__,
            "parameters": int(sum(p.numel() for p in self.model.parameters())),
            "torch_initial_seed": int(torch.initial_seed()),
            "process_group": {"backend": dist.get_backend() if dist.is_initialized() else None, "world_size": self.world},
        }
        self._record({"recovery": recovery, "data": data, "training": training}, replace=False)

    def _record(self, groups: dict[str, dict[str, Any]], *, replace: bool) -> None:
        runrecord.write(groups, rank=self.rank, replace=replace, writer="clusterctl.trainer.Contract")

    def save(self, step: int, *, asynchronous: bool | None = None) -> None:
        """A collective save of everything needed to continue after `step`."""
        self.heartbeat.phase("save", step)
        use_async = self.asynchronous if asynchronous is None else asynchronous
        self.checkpointer.save(step, self._state(), self._extra(step), asynchronous=use_async)
        self.last_saved = step

    # --- the per-step hook -----------------------------------------------------------
    def stop_agreed(self) -> bool:
        """Whether any rank was asked to stop: one all-reduce, so every rank answers alike."""
        return bool(agree_max([int(self.stop.here())])[0])

    def after_step(self, step: int, *, loss: Any = None, tokens: Any = None, **scalars: Any) -> dict[str, float]:
        """Report the step; save when the interval comes round; on a stop request save synchronously and exit 85.

        `loss`, `tokens` (this rank's tokens in the step: tokens/s is derived)
        and any other scalars go to rank 0's metrics.jsonl; a tensor is read
        a step later, so passing one costs no synchronisation. Returns the
        step's timing ({step, step_s, compute_s}; zeros with `watchdog.steps: off`).
        """
        timing = {"step": step, "step_s": 0.0, "compute_s": 0.0}
        if self.watch is not None:
            values = {"loss": loss, "tokens": tokens, **scalars}
            self.watch.record({k: v for k, v in values.items() if v is not None})
            timing = self.watch.step_done(step)
        saved = self.last_saved
        self._after_step(step)
        if self.watch is not None and self.last_saved != saved:
            self.watch.start()  # the save was its own phase: the next step starts after it
        return timing

    def _after_step(self, step: int) -> None:
        if self.stop_agreed():
            self.checkpointer.wait()
            if self.last_saved != step:
                self.save(step, asynchronous=False)
            self.checkpointer.wait()
            self.close()
            exit_stopped(self.rank, step)
        if self.schedule.due(step):
            self.save(step)
        if self.snapshots is not None and self.snapshots.due(step):
            self.snapshots.take(step, self._state(), self._extra(step))

    def _agree_on(self, value: int) -> int:
        """Rank 0's value, on every rank (so that every rank picks the same interval)."""
        if not dist.is_initialized():
            return value
        chosen = torch.tensor([value], dtype=torch.int64, device=next(self.model.parameters()).device)
        dist.broadcast(chosen, src=0)
        return int(chosen.item())

    def close(self) -> None:
        if self.snapshots is not None:
            self.snapshots.wait()
        self.checkpointer.wait()
        self.checkpointer.close()
        if self.watch is not None:
            self.watch.close()
        self.heartbeat.close()
