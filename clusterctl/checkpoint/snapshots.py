"""In-memory snapshots: each rank's state in host memory every `checkpoint.memory_interval` steps, and a peer's copy.

A restart then loses at most the step in flight instead of everything since
the last durable checkpoint, and reads the state from memory instead of the
file system. The snapshot is taken at the step boundary (the state is copied
to CPU memory before the next step can change it) and written in the
background to the node's tmpfs (/dev/shm): one file per rank and step,
written under a temporary name and renamed, so a file that exists is whole.
The same bytes go to the rank's holder, the rank of the same local rank on
the next node, which writes them to its own node's tmpfs: a replica that
outlives the node. Each rank keeps its newest KEEP snapshots and replicas;
a kill during a copy leaves the previous ones.

    <root>/<run id>/<node>/rank-<R>-of-<W>[-<layout>]/step-<S>.pt      R's own, on R's node
    <root>/<run id>/<node>/replica-<R>-of-<W>[-<layout>]/step-<S>.pt   R's replica, on its holder's node
    root: $CLUSTERCTL_SNAPSHOTS, else /dev/shm/clusterctl-<uid>

The files outlive the ranks' processes, not the job: the node's warm process
server removes its node's directory when the job ends. `restore` is
collective: the ranks share what their nodes hold, agree on the newest step
for which every rank's state is somewhere (its own node, or a peer node that
holds it), and a rank whose node lacks it (a spare that replaced a lost
node) receives it from a rank on a node that has it. Never a mix of steps.
Snapshots are per world size and layout: a restart on another layout
resumes from the durable checkpoint instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

from clusterctl.checkpoint.names import SNAPSHOTS_KEPT, STEP_DIGITS

ROOT_ENV = "CLUSTERCTL_SNAPSHOTS"
KEEP = SNAPSHOTS_KEPT  # per rank: the newest may be half-written when a rank dies; the one before it is whole
PREFIX, SUFFIX = "step-", ".pt"
HOLDINGS = re.compile(r"^(rank|replica)-(\d+)-of-(.+)$")
GROUP_TIMEOUT_S = 300  # a peer that neither sends nor takes its replica for this long fails the snapshot, not training


def default_root() -> Path:
    configured = os.environ.get(ROOT_ENV)
    if configured:
        return Path(configured)
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
    return base / f"clusterctl-{os.getuid()}"


def private_root(root: Path) -> str:
    """'' when `root` is this user's alone (made so when missing), else why not: /dev/shm is every user's.

    A directory another user made, or one others may enter, could hold files
    planted for a restart to load (a snapshot is a pickle): then no snapshot
    is written or read there.
    """
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        found = os.lstat(root)
    except OSError as exc:
        return f"cannot make {root}: {exc.strerror or exc}"
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        return f"{root} is not a directory of this user's alone (mode {stat.S_IMODE(found.st_mode):o}, uid {found.st_uid})"
    return ""


def node_dir(root: Path, run_id: str, node: str) -> Path:
    """One node's snapshots of one run (what the node's server removes at the end of the job)."""
    return root / run_id / node


def world_tag(world: int, layout: Any = None) -> str:
    """`4` or `4-1a2b3c4d`: snapshots are found only by a restart of the same world size and layout."""
    if not layout:
        return str(world)
    return f"{world}-" + hashlib.sha256(json.dumps(layout, sort_keys=True, default=str).encode()).hexdigest()[:8]


def open_snapshots(interval: int, *, run_id: str, layout: Any, rank: int, world: int) -> Snapshots | None:
    """This rank's snapshots when `interval` (checkpoint.memory_interval) asks for them, else None.

    Collective when the process group is up: replicas and restores travel on
    a gloo group of their own, off the training's (and off its GPU streams).
    Every optimizer's step waits, on the GPU, for a copy still in flight
    (torch's global optimizer pre-hook: the Contract's, a framework's).
    """
    if not interval:
        return None
    group = None
    if dist.is_initialized() and world > 1:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    found = Snapshots(node_dir(default_root(), run_id or "standalone", node), rank=rank, world=world, interval=interval,
                      tag=world_tag(world, layout), gpus_per_node=int(os.environ.get("LOCAL_WORLD_SIZE") or 1), group=group)
    register_optimizer_step_pre_hook(lambda *_: found.staging.before_update())
    return found


class Staging:
    """Copies of a state's tensors in CPU memory, taken at the step boundary: the next step may change the originals.

    A CPU tensor is cloned. A GPU tensor is copied on a side stream, without
    blocking, into a pinned host buffer kept for its place in the state
    (reused by the next snapshot: one is in flight at a time), so the copy
    overlaps the next step's forward and backward; the next optimizer step
    waits for it on the GPU (`before_update`, an optimizer pre-hook), and
    the background writer waits for it before it reads the buffers. The GPU
    path has run on one GPU (bench/gpu_check.sh's warm restart, bench/README.md).
    """

    def __init__(self) -> None:
        self.pinned: dict[str, torch.Tensor] = {}
        self.event: Any = None
        self.stream: Any = None

    def copy(self, value: Any, where: str = "") -> Any:
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if value.device.type != "cuda":
                return value.to("cpu", copy=True)
            buffer = self.pinned.get(where)
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                buffer = self.pinned[where] = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
            buffer.copy_(value, non_blocking=True)
            self.event = self.event or torch.cuda.Event()
            return buffer
        if isinstance(value, dict):
            copied = {k: self.copy(v, f"{where}/{k}") for k, v in value.items()}
            if type(value) is not dict:  # an OrderedDict, a framework's AttributeDict: the same kind back where it can be
                with contextlib.suppress(TypeError, ValueError):
                    copied = type(value)(copied)
            return copied
        if isinstance(value, (list, tuple)):
            return type(value)(self.copy(v, f"{where}/{i}") for i, v in enumerate(value))
        return value

    def take(self, state: Any) -> Any:
        """The copy, its GPU parts under way: `ready()` before reading them, `before_update()` before changing the state."""
        self.event = None
        if not torch.cuda.is_available():
            return self.copy(state)
        self.stream = self.stream or torch.cuda.Stream()
        self.stream.wait_stream(torch.cuda.current_stream())  # the step's results are what is copied
        with torch.cuda.stream(self.stream):
            copied = self.copy(state)
            if self.event is not None:
                self.event.record(self.stream)
        return copied

    def ready(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def before_update(self) -> None:
        """The optimizer is about to change the state: its stream waits for the copies (the host does not)."""
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)


def steps_in(directory: Path) -> dict[int, Path]:
    """The whole snapshot files of one directory, by step."""
    found = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir(directory):
            if entry.startswith(PREFIX) and entry.endswith(SUFFIX):
                with contextlib.suppress(ValueError):
                    found[int(entry[len(PREFIX):-len(SUFFIX)])] = directory / entry
    return found


def write_whole(directory: Path, step: int, data: bytes) -> None:
    """A snapshot file that exists is whole: written under a temporary name, renamed; older ones beyond KEEP go."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = directory / f".tmp-{step}-{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, directory / f"{PREFIX}{step:0{STEP_DIGITS}d}{SUFFIX}")
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    held = steps_in(directory)
    for old in sorted(held, reverse=True)[KEEP:]:
        with contextlib.suppress(OSError):
            held[old].unlink()


class Snapshots:
    """One rank's snapshots and the replica it holds for a peer: take them on schedule, restore the newest whole step."""

    def __init__(self, node: Path, *, rank: int, world: int, interval: int, tag: str, gpus_per_node: int,
                 group: Any = None) -> None:
        self.node, self.rank, self.world, self.interval, self.tag = node, rank, world, interval, tag
        self.group = group  # a gloo group of every rank: replicas and restores travel on it, off the training's
        self.holder = (rank + gpus_per_node) % world  # the same local rank on the next node
        self.sender = (rank - gpus_per_node) % world
        self.directory = node / f"rank-{rank}-of-{tag}"
        self.thread: threading.Thread | None = None
        self.error: str | None = None
        self.staging = Staging()
        self.untrusted = private_root(node.parent.parent)
        if self.untrusted:
            print(f"clusterctl: warning: rank {rank}: no in-memory snapshots: {self.untrusted}", file=sys.stderr, flush=True)

    def due(self, step: int) -> bool:
        return self.interval > 0 and (step + 1) % self.interval == 0

    def take(self, step: int, state: dict[str, Any], extra: dict[str, Any]) -> None:
        """Copy the state to CPU memory now; write it and its replica in the background (one in flight)."""
        self.wait()
        copy = {"state": self.staging.take(state), "extra": extra, "step": step, "rank": self.rank}
        self.thread = threading.Thread(target=self._write, args=(step, copy), name="clusterctl-snapshot", daemon=True)
        self.thread.start()

    def _write(self, step: int, copy: dict[str, Any]) -> None:
        try:
            self.staging.ready()
            buffer = io.BytesIO()
            torch.save(copy, buffer)
            data = buffer.getvalue()
            if not self.untrusted:  # the peers' exchange goes on either way: each one waits for its sender
                write_whole(self.directory, step, data)
            if self.group is not None and self.holder != self.rank:
                self._replicate(step, data)
        except Exception as exc:  # noqa: BLE001 - a snapshot that fails leaves the previous ones; training goes on
            if self.error is None:
                print(f"clusterctl: warning: rank {self.rank}: the in-memory snapshot of step {step} failed ({exc});"
                      " restarts resume from the previous one or the durable checkpoint", file=sys.stderr, flush=True)
            self.error = f"{type(exc).__name__}: {exc}"

    def _replicate(self, step: int, data: bytes) -> None:
        """Ours to the holder, the sender's to this node: every rank does both for the same step, a ring."""
        head_out = torch.tensor([len(data), step], dtype=torch.int64)
        head_in = torch.zeros(2, dtype=torch.int64)
        for op in (dist.isend(head_out, self.holder, group=self.group), dist.irecv(head_in, self.sender, group=self.group)):
            op.wait()
        payload_in = torch.empty(int(head_in[0]), dtype=torch.uint8)
        payload_out = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        for op in (dist.isend(payload_out, self.holder, group=self.group),
                   dist.irecv(payload_in, self.sender, group=self.group)):
            op.wait()
        if not self.untrusted:
            write_whole(self.node / f"replica-{self.sender}-of-{self.tag}", int(head_in[1]), payload_in.numpy().tobytes())

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def holdings(self) -> dict[int, dict[int, str]]:
        """What this node holds, own snapshots and replicas alike: rank -> step -> file (nothing from an untrusted root)."""
        held: dict[int, dict[int, str]] = {}
        if self.untrusted:
            return held
        with contextlib.suppress(OSError):
            for entry in os.listdir(self.node):
                match = HOLDINGS.match(entry)
                if match and match.group(3) == self.tag:
                    for step, path in steps_in(self.node / entry).items():
                        held.setdefault(int(match.group(2)), {}).setdefault(step, str(path))
        return held

    def restore(self, durable_step: int | None) -> Restored | None:
        """The newest step whose state every rank can have, when not older than `durable_step`.

        Collective. None when no step is whole across the ranks' nodes or
        the durable checkpoint is newer: every rank then resumes from that.
        """
        held = self.holdings()
        if self.group is None:
            everyone = [held]
        else:
            everyone = [None] * self.world
            dist.all_gather_object(everyone, {r: sorted(s) for r, s in held.items()}, group=self.group)
        step = newest_whole(everyone, self.world)
        if step is None or (durable_step is not None and step < durable_step):
            return None
        data = None
        served: dict[int, int] = {}  # rank -> the rank whose node sent it its state
        for r in range(self.world):  # the same order on every rank: each transfer pairs exactly two ranks
            sources = [q for q, node in enumerate(everyone) if step in node.get(r, ())]
            if r in sources:
                continue  # rank r's own node holds it
            served[r] = sources[0]
            if sources[0] == self.rank:
                box = [Path(held[r][step]).read_bytes()]
                dist.send_object_list(box, dst=r, group=self.group)
            elif r == self.rank:
                box = [None]
                dist.recv_object_list(box, src=sources[0], group=self.group)
                data = box[0]
        if data is None:
            data = Path(held[self.rank][step]).read_bytes()
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        if loaded.get("rank") != self.rank or loaded.get("step") != step:
            raise RuntimeError(f"rank {self.rank}: the snapshot of step {step} holds rank {loaded.get('rank')}'s"
                               f" step {loaded.get('step')}")
        return Restored(step, loaded["state"], loaded["extra"], served)


@dataclass(frozen=True)
class Restored:
    step: int
    state: dict[str, Any]
    extra: dict[str, Any]
    served: dict[int, int]  # ranks whose own node lacked the snapshot -> the rank whose node sent it


def newest_whole(everyone: list[dict[int, Any]], world: int) -> int | None:
    """The newest step for which every rank's state is held by some rank's node (pure)."""
    steps = {s for node in everyone for held in node.values() for s in held}
    for step in sorted(steps, reverse=True):
        if all(any(step in node.get(r, ()) for node in everyone) for r in range(world)):
            return step
    return None


def remove_node(root: Path, run_id: str, node: str) -> None:
    """The end of the job on this node: its snapshots go (host memory is the node's next job's)."""
    shutil.rmtree(node_dir(root, run_id, node), ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / run_id).rmdir()
