"""In-memory snapshots: each rank's state in its node's host memory every `checkpoint.memory_interval` steps.

A restart then loses at most the step in flight instead of everything since
the last durable checkpoint, and reads the state from memory instead of the
file system. The snapshot is taken at the step boundary (the state is copied
to CPU memory before the next step can change it) and written in the
background to tmpfs (/dev/shm): one file per rank and step, written under a
temporary name and renamed, so a file that exists is whole. Each rank keeps
its newest KEEP snapshots; a kill during a copy leaves the previous ones.

    <root>/<run id>/<node>/rank-<R>-of-<W>[-<layout>]/step-<S>.pt
    root: $CLUSTERCTL_SNAPSHOTS, else /dev/shm/clusterctl-<uid>

The files outlive the rank's process (so a restarted rank on the same node
finds them), not the job: the node's warm process server removes its node's
directory when the job ends. A snapshot counts as committed for resuming
only when every rank holds it: `newest_common` agrees on that step through
two tiny all-reduces, never mixing steps. Snapshots are per rank and per
layout: a restart with another world size or layout resumes from the durable
checkpoint instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT_ENV = "CLUSTERCTL_SNAPSHOTS"
KEEP = 2  # per rank: the newest may be half-written when a rank dies; the one before it is whole
PREFIX, SUFFIX = "step-", ".pt"


def default_root() -> Path:
    configured = os.environ.get(ROOT_ENV)
    if configured:
        return Path(configured)
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
    return base / f"clusterctl-{os.getuid()}"


def node_dir(root: Path, run_id: str, node: str) -> Path:
    """One node's snapshots of one run (what the node's server removes at the end of the job)."""
    return root / run_id / node


def rank_dir(root: Path, run_id: str, node: str, rank: int, world: int, layout: Any = None) -> Path:
    """Where one rank keeps its snapshots: named by world size and layout, so only a like restart finds them."""
    tag = ""
    if layout:
        import hashlib
        import json

        tag = "-" + hashlib.sha256(json.dumps(layout, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return node_dir(root, run_id, node) / f"rank-{rank}-of-{world}{tag}"


def to_cpu(value: Any) -> Any:
    """A copy of every tensor in a (nested) state, in CPU memory: the next step may change the originals."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


class Snapshots:
    """One rank's snapshots: take them on schedule, agree on the newest that every rank holds, load it."""

    def __init__(self, directory: Path, *, rank: int, world: int, interval: int, device: Any = "cpu") -> None:
        self.directory, self.rank, self.world, self.interval, self.device = directory, rank, world, interval, device
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.thread: threading.Thread | None = None
        self.error: str | None = None

    def due(self, step: int) -> bool:
        return self.interval > 0 and (step + 1) % self.interval == 0

    def path(self, step: int) -> Path:
        return self.directory / f"{PREFIX}{step:08d}{SUFFIX}"

    def steps(self) -> list[int]:
        """The steps this rank holds whole, newest first."""
        found = []
        with contextlib.suppress(OSError):
            for entry in os.listdir(self.directory):
                if entry.startswith(PREFIX) and entry.endswith(SUFFIX):
                    with contextlib.suppress(ValueError):
                        found.append(int(entry[len(PREFIX):-len(SUFFIX)]))
        return sorted(found, reverse=True)

    def take(self, step: int, state: dict[str, Any], extra: dict[str, Any]) -> None:
        """Copy the state to CPU memory now; write it to tmpfs in the background (one write in flight)."""
        self.wait()
        copy = {"state": to_cpu(state), "extra": extra, "step": step}
        self.thread = threading.Thread(target=self._write, args=(step, copy), name="clusterctl-snapshot", daemon=True)
        self.thread.start()

    def _write(self, step: int, copy: dict[str, Any]) -> None:
        tmp = self.directory / f"tmp-{step}-{os.getpid()}{SUFFIX}"  # torch.save names its archive after the file: no dot first
        try:
            torch.save(copy, tmp)
            os.replace(tmp, self.path(step))
            for old in self.steps()[KEEP:]:
                with contextlib.suppress(OSError):
                    self.path(old).unlink()
        except Exception as exc:  # noqa: BLE001 - a snapshot that fails leaves the previous ones; training goes on
            if self.error is None:
                print(f"clusterctl: warning: rank {self.rank}: the in-memory snapshot of step {step} failed ({exc});"
                      " restarts resume from the previous one or the durable checkpoint", file=sys.stderr, flush=True)
            self.error = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(OSError):
                tmp.unlink()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def newest_common(self) -> int | None:
        """The newest step every rank holds (collective: two all-reduces per step tried), None when there is none."""
        mine = self.steps()
        candidate = mine[0] if mine else -1
        if not dist.is_initialized():
            return candidate if candidate >= 0 else None
        for _ in range(KEEP + 1):
            low = torch.tensor([candidate], dtype=torch.int64, device=self.device)
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            step = int(low.item())
            if step < 0:
                return None
            held = torch.tensor([1 if step in mine else 0], dtype=torch.int64, device=self.device)
            dist.all_reduce(held, op=dist.ReduceOp.MIN)
            if held.item():
                return step
            candidate = max([s for s in mine if s < step], default=-1)
        return None

    def load(self, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """This rank's state and extra of `step` (in CPU memory: set_state_dict copies them into place)."""
        data = torch.load(self.path(step), map_location="cpu", weights_only=False)
        return data["state"], data["extra"]


def remove_node(root: Path, run_id: str, node: str) -> None:
    """The end of the job on this node: its snapshots go (host memory is the node's next job's)."""
    shutil.rmtree(node_dir(root, run_id, node), ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / run_id).rmdir()
