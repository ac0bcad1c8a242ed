"""PyTorch Lightning under clusterctl: rank and world from clusterctl, step reports, committed checkpoints, 85 on a stop.

    import lightning as L
    from clusterctl.integrations.lightning import Clusterctl

    cc = Clusterctl()                                    # checkpoint dir, interval, keep from the job spec
    trainer = L.Trainer(max_steps=1000, **cc.trainer_options())
    trainer.fit(model, data, ckpt_path=cc.resume_path()) # the newest committed checkpoint, or None

`trainer_options()` gives Lightning:
* `plugins`: `ClusterctlEnvironment` (rank, world, master address and port
  from the variables clusterctl's launcher sets, so Lightning neither
  launches processes nor reads Slurm's own variables, whose task order need
  not be clusterctl's rank order) and `CommittedCheckpointIO` (every
  checkpoint Lightning writes, yours from `ModelCheckpoint` included, is
  committed as `<checkpoint dir>/step-N/lightning.ckpt`: temporary name,
  fsync, manifest, rename; `checkpoint.keep` decides what is kept);
* `callbacks`: `ClusterctlCallback` (one step report per optimizer step with
  the loss `training_step` returned; a save every `checkpoint.interval`
  steps; on a stop request a save, then exit 85; with
  `checkpoint.memory_interval`, Lightning's whole checkpoint in host memory,
  which `resume_path()` prefers when it is newer than the newest committed
  file);
* `devices=1, num_nodes=WORLD_SIZE`: each rank is one process with its one
  GPU (clusterctl makes only that one visible), so Lightning sees one-device
  "nodes": `trainer.local_rank` is 0 on every rank and `prepare_data` runs
  on each (use `prepare_data_per_node=False` for a download);
* after an elastic shrink with `batch: keep`, `accumulate_grad_batches`
  scaled by the plan's dp over the shrunk one, so the global batch stays
  (the data order is then Lightning's own sampler's, not exact across the change).
Step N is Lightning's `global_step` N + 1 (clusterctl counts steps from 0).
A mid-epoch resume restores the loops' counters and the optimizer; the
batches of that epoch are those of a stateful dataloader, or start again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.environments import ClusterEnvironment

from clusterctl import envnames
from clusterctl.checkpoint.snapshots import Restored
from clusterctl.integrations.rank.framework import FrameworkLoop

CHECKPOINT_FILE = "lightning.ckpt"


class ClusterctlEnvironment(ClusterEnvironment):
    """Rank, world and rendezvous address as clusterctl's launcher set them (torch's env:// names)."""

    @property
    def creates_processes_externally(self) -> bool:
        return True  # clusterctl started every rank

    @property
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        return int(os.environ["MASTER_PORT"])

    @staticmethod
    def detect() -> bool:
        return envnames.RUN_DIR in os.environ and "RANK" in os.environ

    def world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"])

    def set_world_size(self, size: int) -> None:
        pass  # clusterctl decided it

    def global_rank(self) -> int:
        return int(os.environ["RANK"])

    def set_global_rank(self, rank: int) -> None:
        pass  # clusterctl decided it

    def local_rank(self) -> int:
        return 0  # the index of this rank's device among those it sees: its own, the only one

    def node_rank(self) -> int:
        return int(os.environ["RANK"])  # a one-device "node" per rank (module docstring)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if num_devices * num_nodes != self.world_size():
            raise ValueError(
                f"Trainer(devices={num_devices}, num_nodes={num_nodes}) runs {num_devices * num_nodes} processes, but"
                f" clusterctl started {self.world_size()} ranks, one per GPU: pass devices=1,"
                f" num_nodes={self.world_size()} (Clusterctl().trainer_options() does)"
            )


class CommittedCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint file, committed as a generation (Lightning calls it on global rank 0 only)."""

    def __init__(self, loop: FrameworkLoop) -> None:
        super().__init__()
        self.loop = loop
        self.memory: tuple[str, dict[str, Any]] | None = None  # (the name fit() was given, the snapshot's checkpoint)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """The in-memory snapshot `resume_path()` chose, handed over once; any other path from its file."""
        if self.memory is not None and str(path) == self.memory[0]:
            checkpoint, self.memory = self.memory[1], None
            return checkpoint
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        done = int(checkpoint.get("global_step", 0))
        step = done - 1
        if done == 0 or step == self.loop.last_committed:
            return  # nothing trained yet, or this step is committed already (two callbacks saving the same step)
        self.loop.commit(step, lambda tmp: TorchCheckpointIO.save_checkpoint(self, checkpoint, tmp / CHECKPOINT_FILE))

    def remove_checkpoint(self, path: Any) -> None:
        pass  # retention (checkpoint.keep) decides what goes


class ClusterctlCallback(Callback):
    """Step reports, the save schedule and the stop request, from Lightning's hooks."""

    def __init__(self, loop: FrameworkLoop) -> None:
        self.loop = loop
        self._seen = -1  # the global_step last reported: accumulation batches make no step

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._seen = trainer.global_step
        self.loop.steps_begin()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self._seen:
            return
        self._seen = trainer.global_step
        step = trainer.global_step - 1
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.loop.step_done(step, {"loss": loss.detach() if hasattr(loss, "detach") else loss})
        save, stop = self.loop.decide(step)
        if save:
            self.loop.saving(step)
            # The whole state (loops, callbacks, optimizers), as a resume needs; the path is CommittedCheckpointIO's.
            trainer.save_checkpoint(self.loop.directory / f"step-{step}.ckpt", weights_only=False)
            self.loop.saved(step)
        if stop:
            self.loop.exit_stopped(step)
        # Lightning's whole checkpoint, as a save would write it: a resume from it is a resume from a file.
        self.loop.snapshot(step, lambda: trainer._checkpoint_connector.dump_checkpoint(weights_only=False))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.loop.close()


def _as_list(value: Any) -> list[Any]:
    """A Trainer argument that takes one item or a list of them, as a list."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class Clusterctl:
    """The adapter: what to give `L.Trainer(...)` and `trainer.fit(..., ckpt_path=...)`."""

    def __init__(self, *, directory: str | Path | None = None, interval: int | None = None, keep: int | None = None) -> None:
        self.loop = FrameworkLoop("lightning", directory=directory, interval=interval, keep=keep)
        self.io = CommittedCheckpointIO(self.loop)

    def trainer_options(self, **given: Any) -> dict[str, Any]:
        """The `L.Trainer(**...)` arguments: yours (`given`, what the Trainer call had) merged with clusterctl's.

        Your plugins and callbacks are kept, clusterctl's added to them. Under clusterctl each rank is one process
        on one GPU: `devices` and `num_nodes` become 1 and the world size, which is the same world as a
        `devices=8, num_nodes=4` written for torchrun; a pair that makes another world is refused here, on every
        rank, before the Trainer starts (ValueError naming both)."""
        options: dict[str, Any] = dict(given)
        options["plugins"] = [*_as_list(given.get("plugins")), self.io]
        options["callbacks"] = [*_as_list(given.get("callbacks")), ClusterctlCallback(self.loop)]
        if ClusterctlEnvironment.detect():
            world = int(os.environ["WORLD_SIZE"])
            plan = self.loop.full_plan()  # an elastic job's Trainer call may be written for its full size
            planned = {world, plan.world_size} if plan is not None and plan.elastic.widths else {world}
            devices, nodes = given.get("devices"), given.get("num_nodes", 1)
            if isinstance(devices, int) and devices > 0 and isinstance(nodes, int) and devices * nodes not in planned:
                raise ValueError(
                    f"Trainer(devices={devices}, num_nodes={nodes}) makes {devices * nodes} processes, but this"
                    f" clusterctl job has {world} ranks (the spec's nodes x gpus_per_node): leave devices and"
                    " num_nodes out (clusterctl sets devices=1 and num_nodes to the world size), or change the spec"
                )
            options["plugins"].insert(0, ClusterctlEnvironment())
            options.update(devices=1, num_nodes=world)
            kept = self.loop.kept_accumulation(given.get("accumulate_grad_batches"))
            if kept is not None:
                options["accumulate_grad_batches"] = kept
        return options

    def resume_path(self) -> str | None:
        """For `fit(ckpt_path=...)`: the newest committed checkpoint's file, an in-memory snapshot's name, or None.

        Collective with `checkpoint.memory_interval` (integrations/rank/framework.py):
        a snapshot chosen is handed to Lightning by `CommittedCheckpointIO`
        when `fit` loads the name returned here.
        """
        found = self.loop.resume()
        if isinstance(found, Restored):
            assert self.loop.snapshots is not None  # a snapshot was found in them
            name = str(self.loop.snapshots.node / f"in-memory-step-{found.step}")
            self.io.memory = (name, found.state)
            return name
        return str(found.path / CHECKPOINT_FILE) if found is not None else None
