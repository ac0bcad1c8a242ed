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
collective, and nothing in it spans the world: each node's first rank puts
its node's inventory in the rendezvous store once, rank 0 alone reads them
and publishes the newest step for which every rank's state is somewhere
(its own node, or a peer node that holds it) with the few transfers it
needs (restoreplan.py), each node's first rank alone waits for that plan
in the store and hands it to its node's other ranks in a file beside the
snapshots (`agreed-<node>-<key digest>`, sealed as rank 0 sealed it), and a
rank whose node lacks it (a spare that
replaced a lost node) receives it from a rank on a node that has it, over a
link of their own (pairlink.py). Never a mix of steps. A node whose
inventory has not come within AGREE_TIMEOUT_S leaves the restore to the
durable checkpoint, and rank 0 says which node. Replicas travel the same
way: each rank has a link to its holder and one from its sender, made at
its first replica.

Snapshots are per world size and layout (their tag), each tag described by
`<node>/width-<tag>.json` (its world, layout, and whether the state is the
same on every dp replica). A restart of another width (an elastic job that
shrank in its allocation) finds no whole step of its own: it then takes the
newest step of another width's snapshots when only dp changed and the
state is replicated, each rank the saved rank checkpoint/reshard.py maps it
to (restoreplan.plan_remapped); any other layout resumes from the durable
checkpoint, which DCP reshards.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

from clusterctl import envnames
from clusterctl.checkpoint.names import SNAPSHOTS_KEPT, STEP_DIGITS
from clusterctl.checkpoint.pairlink import PairLink, ring_colour
from clusterctl.checkpoint.restoreplan import (
    Inventory,
    RestorePlan,
    Width,
    decode_inventory,
    encode_held,
    plan_remapped,
    plan_restore,
    remapper,
)
from clusterctl.store import collect, sealed
from clusterctl.store.nodetmp import ROOT_ENV, default_root, node_dir, private_root  # noqa: F401 - the snapshots' root

KEEP = SNAPSHOTS_KEPT  # per rank: the newest may be half-written when a rank dies; the one before it is whole
PREFIX, SUFFIX = "step-", ".pt"
HOLDINGS = re.compile(r"^(rank|replica)-(\d+)-of-(.+)$")
WIDTH_FILE = "width-{tag}.json"  # one tag's world, layout and replication, beside its snapshots
LINK_TIMEOUT_S = 300  # a peer that neither sends nor takes its replica for this long fails the snapshot, not training
AGREE_TIMEOUT_S = 60.0  # rank 0 waits this long for every node's inventory, then the durable checkpoint decides
PLAN_MARGIN_S = 30.0  # a rank waits for rank 0's plan this much longer than rank 0 waits for the inventories
POLL_S = 0.05  # a key whose value is not this attempt's: look again this often
RELAY_PREFIX = "agreed-"  # <node>/agreed-<node index>-<key digest>: the plan a node leader hands its node's ranks
RELAY_POLL_S = (0.002, 0.05)  # a rank looks for its leader's plan this often at first, backing off to the second
_opened = itertools.count()  # snapshots opened in this process: each one's store keys are its own


def world_tag(world: int, layout: Any = None) -> str:
    """`4` or `4-1a2b3c4d`: snapshots are found only by a restart of the same world size and layout."""
    if not layout:
        return str(world)
    return f"{world}-" + hashlib.sha256(json.dumps(layout, sort_keys=True, default=str).encode()).hexdigest()[:8]


def open_snapshots(interval: int, *, run_id: str, layout: Any, rank: int, world: int) -> Snapshots | None:
    """This rank's snapshots when `interval` (checkpoint.memory_interval) asks for them, else None.

    With the process group up, replicas and restores travel on two-rank
    links of their own (pairlink.py), off the training's group and its GPU
    streams, agreed through the group's store. Every optimizer's step waits,
    on the GPU, for a copy still in flight (torch's global optimizer
    pre-hook: the Contract's, a framework's).
    """
    if not interval:
        return None
    store = dist.distributed_c10d._get_default_store() if dist.is_initialized() and world > 1 else None
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    tag = world_tag(world, layout)
    found = Snapshots(node_dir(default_root(), run_id or "standalone", node), rank=rank, world=world, interval=interval,
                      tag=tag, gpus_per_node=int(os.environ.get("LOCAL_WORLD_SIZE") or 1), store=store,
                      prefix=exchange_prefix(tag), token=sealed.rank_token(), layout=layout)
    if store is not None:
        found.connect()
    register_optimizer_step_pre_hook(lambda *_: found.staging.before_update())
    return found


def exchange_prefix(tag: str) -> str:
    """The store keys of one opening's exchange: its attempt's, its restart's (torchrun's) and its own."""
    attempt = os.environ.get(envnames.ATTEMPT, "0")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"clusterctl/snapshots/{tag}/{attempt}.{restart}.{next(_opened)}/"


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
                 store: Any = None, prefix: str = "", token: str = "", agree_timeout_s: float = AGREE_TIMEOUT_S,
                 layout: Any = None) -> None:
        self.node, self.rank, self.world, self.interval, self.tag = node, rank, world, interval, tag
        self.layout = layout if isinstance(layout, dict) else None
        self.store, self.prefix, self.token = store, prefix, token  # the process group's store: None alone
        self.gpus_per_node = max(1, min(gpus_per_node, world))
        self.agree_timeout_s = agree_timeout_s
        self.holder = (rank + self.gpus_per_node) % world  # the same local rank on the next node
        self.sender = (rank - self.gpus_per_node) % world
        self.ring: list[PairLink] | None = None  # to the holder, from the sender: made when the snapshots open
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
        if not self.untrusted:
            self._describe(state)
        copy = {"state": self.staging.take(state), "extra": extra, "step": step, "rank": self.rank}
        self.thread = threading.Thread(target=self._write, args=(step, copy), name="clusterctl-snapshot", daemon=True)
        self.thread.start()

    def _describe(self, state: dict[str, Any]) -> None:
        """This width's description beside its snapshots, once a node (what a restart of another width reads)."""
        path = self.node / WIDTH_FILE.format(tag=self.tag)
        if path.exists():
            return
        width = Width(self.tag, self.world, self.layout, replicated=not _sharded(state))
        with contextlib.suppress(OSError):
            self.node.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(width.as_dict()))
            os.replace(tmp, path)

    def _write(self, step: int, copy: dict[str, Any]) -> None:
        try:
            self.staging.ready()
            buffer = io.BytesIO()
            torch.save(copy, buffer)
            data = buffer.getvalue()
            if not self.untrusted:  # the peers' exchange goes on either way: each one waits for its sender
                write_whole(self.directory, step, data)
            if self.store is not None and self.holder != self.rank:
                self._replicate(step, data)
        except Exception as exc:  # noqa: BLE001 - a snapshot that fails leaves the previous ones; training goes on
            if self.error is None:
                print(f"clusterctl: warning: rank {self.rank}: the in-memory snapshot of step {step} failed ({exc});"
                      " restarts resume from the previous one or the durable checkpoint", file=sys.stderr, flush=True)
            self.error = f"{type(exc).__name__}: {exc}"

    def connect(self) -> None:
        """The links to the holder and from the sender, made in the rounds every rank agrees on (pairlink.ring_colour)."""
        if self.store is None or self.holder == self.rank:
            return
        nodes = -(-self.world // self.gpus_per_node)
        if ring_colour(self.rank // self.gpus_per_node, nodes) < ring_colour(self.sender // self.gpus_per_node, nodes):
            to_holder = self._link("ring/", self.rank, self.holder)
            from_sender = self._link("ring/", self.sender, self.rank)
        else:
            from_sender = self._link("ring/", self.sender, self.rank)
            to_holder = self._link("ring/", self.rank, self.holder)
        self.ring = [to_holder, from_sender]

    def _replicate(self, step: int, data: bytes) -> None:
        """Ours to the holder, the sender's to this node: every rank does both for the same step, a ring."""
        if self.ring is None:
            self.connect()
        to_holder, from_sender = self.ring
        taken = to_holder.post(data, step)
        their_step, theirs = from_sender.take()
        taken()
        if not self.untrusted:
            write_whole(self.node / f"replica-{self.sender}-of-{self.tag}", their_step, theirs)

    def _link(self, kind: str, sender: int, receiver: int) -> PairLink:
        return PairLink(self.store, self.prefix + kind, sender=sender, receiver=receiver, me=self.rank,
                        token=self.token, timeout_s=LINK_TIMEOUT_S)

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def holdings(self) -> dict[int, dict[int, str]]:
        """What this node holds, own snapshots and replicas alike: rank -> step -> file (nothing from an untrusted root)."""
        return self.all_holdings().get(self.tag, {})

    def all_holdings(self) -> dict[str, dict[int, dict[int, str]]]:
        """Every width's holdings on this node: tag -> rank -> step -> file."""
        held: dict[str, dict[int, dict[int, str]]] = {}
        if self.untrusted:
            return held
        with contextlib.suppress(OSError):
            for entry in os.listdir(self.node):
                match = HOLDINGS.match(entry)
                if match:
                    for step, path in steps_in(self.node / entry).items():
                        held.setdefault(match.group(3), {}).setdefault(int(match.group(2)), {}).setdefault(step, str(path))
        return held

    def other_widths(self, every: dict[str, dict[int, dict[int, str]]]) -> list[tuple[Width, dict[int, dict[int, str]]]]:
        """The run's other widths this node holds snapshots of, each with its description (undescribed ones left)."""
        found = []
        for tag, held in every.items():
            if tag == self.tag:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                found.append((Width.from_dict(json.loads((self.node / WIDTH_FILE.format(tag=tag)).read_text())), held))
        return found

    def restore(self, durable_step: int | None) -> Restored | None:
        """The newest step whose state every rank can have, when not older than `durable_step`.

        Collective. None when no step is whole across the ranks' nodes, the
        durable checkpoint is newer, or a node's inventory did not come:
        every rank then resumes from the durable checkpoint.
        """
        every = self.all_holdings()
        held, others = every.get(self.tag, {}), self.other_widths(every)
        if self.store is None:
            plan = self._planned({0: Inventory(held, tuple(others))}, self.world, durable_step)
        else:
            plan = self._agree(held, others, durable_step)
        if plan.step is None:
            return None
        step = plan.step
        take = (lambda r: r) if plan.source is None else remapper(self.world, self.layout, plan.source)
        if plan.source is not None:  # another width's: its files, each rank the saved rank mapped to it
            held = dict(every.get(plan.source.tag, {}))
            if self.rank == 0:
                dp = [(layout or {}).get("dp", "?") for layout in (plan.source.layout, self.layout)]
                print(f"clusterctl: restoring step {step} from host memory, the snapshots of {plan.source.world} ranks"
                      f" (dp {dp[0]} -> {dp[1]})", file=sys.stderr, flush=True)
        mine = [(s, d) for s, d in plan.transfers if self.rank in (s, d)]
        links = {t: self._link("restore/", *t) for t in mine}  # in the plan's order, which every rank has
        taken = [links[(s, d)].post(Path(held[take(d)][step]).read_bytes(), step) for s, d in mine if s == self.rank]
        data = None
        for s, d in mine:
            if d == self.rank:
                got, data = links[(s, d)].take()
                if got != step:
                    raise RuntimeError(f"rank {self.rank}: rank {s} sent step {got}'s snapshot, not step {step}'s")
        for wait in taken:
            wait()
        if data is None:
            data = Path(held[take(self.rank)][step]).read_bytes()
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        if loaded.get("rank") != take(self.rank) or loaded.get("step") != step:
            raise RuntimeError(f"rank {self.rank}: the snapshot of step {step} holds rank {loaded.get('rank')}'s"
                               f" step {loaded.get('step')}, not rank {take(self.rank)}'s")
        return Restored(step, loaded["state"], loaded["extra"], {d: s for s, d in plan.transfers},
                        plan.source.world if plan.source is not None else None)

    def _planned(self, nodes: dict[int, Inventory], g: int, durable_step: int | None) -> RestorePlan:
        """This width's newest whole step, else another width's that every rank can take (restoreplan.py)."""
        plan = plan_restore({n: inv.held for n, inv in nodes.items()}, world=self.world, gpus_per_node=g,
                            durable_step=durable_step)
        if plan.step is not None or not any(inv.others for inv in nodes.values()):
            return plan
        remapped = plan_remapped(nodes, world=self.world, gpus_per_node=g, layout=self.layout, durable_step=durable_step)
        if remapped.step is None:
            print(f"clusterctl: no restore from host memory across the change of width: {remapped.why}", file=sys.stderr,
                  flush=True)
        return remapped if remapped.step is not None else plan

    def _agree(self, held: dict[int, dict[int, str]], others: list[tuple[Width, dict[int, dict[int, str]]]],
               durable_step: int | None) -> RestorePlan:
        """The restore plan: this node's inventory in, rank 0's plan out (rank 0 alone reads every node's).

        Only the node leaders (each node's first rank) wait on the store for
        the plan: the store then wakes a rank a node, 12,500 at 100,000 ranks
        instead of every rank, and each leader hands the plan to its node's
        other ranks through the node's tmpfs (`_relay`). Where the root is
        not this user's alone, or a node runs one rank, every rank waits on
        the store as before.
        """
        g = self.gpus_per_node
        key = self.prefix + "plan"
        deadline = time.monotonic() + self.agree_timeout_s + PLAN_MARGIN_S
        relayed = g > 1 and not self.untrusted
        if self.rank % g:
            return self._await_relay(key, deadline) if relayed else self._await_plan(key, deadline)
        self._put(self.prefix + f"inventory/{self.rank // g}", encode_held(held, others))
        if self.rank == 0:
            plan = self._plan(durable_step)
            self._put(key, plan.to_json())
        else:
            plan = self._await_plan(key, deadline)
        if relayed:
            self._relay(key, plan)
        return plan

    def _relay_stem(self) -> str:
        """The start of every attempt's relay file for this rank's node (its index: emulated nodes may share a host)."""
        return f"{RELAY_PREFIX}{self.rank // self.gpus_per_node}-"

    def _relay_file(self, key: str) -> Path:
        """This attempt's plan for this node's ranks, beside the node's snapshots (named by the node and the key)."""
        return self.node / (self._relay_stem() + hashlib.sha256(key.encode()).hexdigest()[:16])

    def _relay(self, key: str, plan: RestorePlan) -> None:
        """The node leader's plan, sealed as rank 0 sealed it, for its node's other ranks: written whole, then renamed."""
        path = self._relay_file(key)
        data = sealed.seal(self.token, key, plan.to_json()) if self.token else plan.to_json().encode()
        try:
            self.node.mkdir(parents=True, exist_ok=True, mode=0o700)
            for old in self.node.glob(self._relay_stem() + "*"):  # earlier attempts'
                if old != path:
                    old.unlink(missing_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:  # the node's other ranks wait to their deadline, then resume from the durable checkpoint
            print(f"clusterctl: warning: rank {self.rank}: cannot hand the restore plan to this node's ranks ({exc})",
                  file=sys.stderr, flush=True)

    def _await_relay(self, key: str, deadline: float) -> RestorePlan:
        """The plan this node's leader relayed, looked for every few milliseconds until `deadline`."""
        path, pause = self._relay_file(key), RELAY_POLL_S[0]
        while True:
            with contextlib.suppress(OSError, ValueError):
                body = self._open(key, path.read_bytes())
                if body is not None:
                    return RestorePlan.from_json(body)
            if time.monotonic() >= deadline:
                leader = self.rank - self.rank % self.gpus_per_node
                why = (f"no restore plan came from this node's first rank (rank {leader}) within"
                       f" {self.agree_timeout_s + PLAN_MARGIN_S:g} s")
                print(f"clusterctl: warning: rank {self.rank}: no restore from host memory: {why}", file=sys.stderr,
                      flush=True)
                return RestorePlan(None, why=why)
            time.sleep(pause)
            pause = min(RELAY_POLL_S[1], pause * 1.5)

    def _await_plan(self, key: str, deadline: float) -> RestorePlan:
        """Rank 0's sealed plan, waited for until `deadline` (a value under the key that is not rank 0's is not one)."""
        while True:
            with contextlib.suppress(Exception):  # a timeout: said below
                self.store.wait([key], timedelta(seconds=max(0.001, deadline - time.monotonic())))
                body = self._open(key, self.store.get(key))
                if body is not None:
                    return RestorePlan.from_json(body)
            if time.monotonic() >= deadline:
                why = f"no restore plan sealed by rank 0 came within {self.agree_timeout_s + PLAN_MARGIN_S:g} s"
                print(f"clusterctl: warning: rank {self.rank}: no restore from host memory: {why}", file=sys.stderr,
                      flush=True)
                return RestorePlan(None, why=why)
            time.sleep(POLL_S)

    def _plan(self, durable_step: int | None) -> RestorePlan:
        """Rank 0's part: every node's inventory, awaited up to agree_timeout_s, then the plan (restoreplan.py)."""
        g = self.gpus_per_node
        count = -(-self.world // g)
        keys = [self.prefix + f"inventory/{i}" for i in range(count)]
        deadline = time.monotonic() + self.agree_timeout_s
        nodes: dict[int, Inventory] = {}
        pending = list(range(count))
        while pending:  # a value that is not sealed by this attempt (a stranger's) is waited past, as if absent
            waiting = [keys[i] for i in pending]
            with contextlib.suppress(Exception):  # a timeout: which nodes are missing is found below
                for part in collect.chunks(waiting):
                    self.store.wait(list(part), timedelta(seconds=max(0.001, deadline - time.monotonic())))
            for j, raw in collect.iter_present(self.store, waiting):
                body = self._open(waiting[j], raw)
                with contextlib.suppress(ValueError):
                    if body is not None:
                        nodes[pending[j]] = decode_inventory(body)
            pending = [i for i in pending if i not in nodes]
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        missing = [i for i in range(count) if i not in nodes]
        if missing:
            first = missing[0]
            why = (f"node {first}'s snapshot inventory (ranks {first * g}-{min(self.world, first * g + g) - 1};"
                   f" {len(missing)} node(s) in all) did not come within {self.agree_timeout_s:g} s, or not sealed by"
                   " this attempt: resuming from the durable checkpoint")
            print(f"clusterctl: warning: no restore from host memory: {why}", file=sys.stderr, flush=True)
            return RestorePlan(None, why=why)
        return self._planned(nodes, g, durable_step)

    def _put(self, key: str, text: str) -> None:
        self.store.set(key, sealed.seal(self.token, key, text) if self.token else text.encode())

    def _open(self, key: str, raw: bytes) -> bytes | None:
        return sealed.unseal(self.token, key, raw) if self.token else bytes(raw)


@dataclass(frozen=True)
class Restored:
    step: int
    state: dict[str, Any]
    extra: dict[str, Any]
    served: dict[int, int]  # ranks whose own node lacked the snapshot -> the rank whose node sent it
    remapped_from: int | None = None  # the world size whose snapshots were restored, where it was not this one's


def _sharded(state: Any) -> bool:
    """Whether any tensor of the state is a DTensor (sharded over the mesh): then no dp replica's will do for another's."""
    if isinstance(state, dict):
        return any(_sharded(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return any(_sharded(v) for v in state)
    return type(state).__name__ in ("DTensor", "ShardedTensor")


def remove_node(root: Path, run_id: str, node: str) -> None:
    """The end of the job on this node: its snapshots go (host memory is the node's next job's)."""
    shutil.rmtree(node_dir(root, run_id, node), ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / run_id).rmdir()
