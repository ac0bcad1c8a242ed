"""A node's ranks register through its first rank: one record, one count and one verdict wait in the store a node.

Every request a rank makes is served by the store's one thread, 100,000
times over at 100k ranks (bench/scale_recovery.py: five a rank, 13 s of
that thread). So a rank of a node of several hands its sealed registration
to the node's first rank (the leader) through the node's private folder in
host memory; the leader stores the node's registrations in one
compare-and-set (registration.node_key), counts them in one add, waits for
the verdict and hands it back the same way. Such a rank opens its own store
connection only when it first needs one (the process group's init).

Whatever goes wrong ends with the rank registering on its own, as the rank
of a one-rank node does, so that the verdict still names the rank at fault:
- its record cannot be handed over (no private folder; another process of
  the same rank claimed the rank on the node first);
- no leader showed itself within LEADER_WAIT_S (it is slow, or dead), or
  its leader died before registering the node: the rank takes its record
  back (or, taken already, registers the same bytes, which the controller
  reads as one claim);
- the leader registered the node without it (it came after GATHER_S).
A rank the leader registered whose leader died before handing the verdict
on reads the verdict from the store itself.

The files, in <node dir>/rendezvous-<attempt>-<token digest>-<slot>/ (an
exclusive create or a rename decides every race, with one winner):
    claim-<r>   a rank's claim: the first process of the rank on the node hands its record over
    rank-<r>    a rank's sealed registration, handed over
    taken-<r>   the same, once the leader took it (renamed)
    leader      the leader's pid; a second line, once it registered: the ranks it registered
    verdict     the controller's sealed verdict, as the store held it
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from clusterctl.rundir.jsonio import write_bytes_atomic
from clusterctl.store import nodetmp

GATHER_S = 5.0  # the leader waits this long past its own readiness for its node's other ranks, then registers
LEADER_WAIT_S = 10.0  # a rank whose node shows no leader by then registers on its own
POLL_S = (0.002, 0.05)  # how often a file is looked for: at first, and backed off to
DIRECT, STORE, TOLD = "direct", "store", "told"  # what a follower does next (follow)


def folder(info: Any) -> Path | None:
    """This attempt's folder for the rank's node, made private; None where the node has one rank, the layout is not
    the plain one (local rank = rank mod ranks a node) or no private folder can be had: then every rank registers
    on its own."""
    gpn = info.gpus_per_node
    if gpn <= 1 or not info.token or info.local_rank != info.rank % gpn:
        return None
    root = nodetmp.default_root()
    if nodetmp.private_root(root):
        return None
    digest = hashlib.sha256(info.token.encode()).hexdigest()[:12]
    path = nodetmp.node_dir(root, info.run_dir.name, info.host) / f"rendezvous-{info.attempt}-{digest}-{info.node_slot}"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return path


def _write(path: Path, data: bytes) -> bool:
    """`data` at `path`, whole or not at all."""
    try:
        write_bytes_atomic(path, data)
        return True
    except OSError:
        return False


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def _leader(path: Path) -> tuple[int, list[int] | None] | None:
    """(the leader's pid, the ranks it registered or None while it gathers), None while no leader showed itself."""
    lines = (_read(path / "leader") or b"").decode(errors="replace").splitlines()
    if not lines or not lines[0].isdigit():
        return None
    registered = None
    if len(lines) > 1:
        with contextlib.suppress(ValueError):
            found = json.loads(lines[1])
            registered = [r for r in found if type(r) is int] if isinstance(found, list) else []
    return int(lines[0]), registered


def follow(path: Path, rank: int, payload: bytes, verdict_of: Any, deadline: float) -> tuple[str, Any]:
    """A follower's part: hand the record over, then (TOLD, the verdict the leader relayed), (DIRECT, None):
    register on your own, or (STORE, None): the leader registered you, read the verdict from the store.

    `verdict_of(raw)` is the verdict in a relayed value, None for one without the controller's seal.
    """
    handed, taken_back = path / f"rank-{rank}", path / f"back-{rank}"
    try:  # the rank's claim on this node, for the whole attempt: a second process of the rank registers on its own
        os.close(os.open(path / f"claim-{rank}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError:
        return DIRECT, None
    if not _write(handed, payload):
        return DIRECT, None
    since, pause = time.monotonic(), POLL_S[0]

    def take_back() -> tuple[str, Any]:
        with contextlib.suppress(OSError):
            os.rename(handed, taken_back)  # untaken: the leader cannot take it now; taken: the same bytes go direct
        return DIRECT, None

    while time.monotonic() < deadline:
        raw = _read(path / "verdict")
        if raw is not None and (verdict := verdict_of(raw)) is not None:
            return TOLD, verdict
        leader = _leader(path)
        if leader is None:
            if time.monotonic() - since >= LEADER_WAIT_S:
                return take_back()
        else:
            pid, registered = leader
            if registered is not None and rank not in registered:
                return take_back()
            if not _alive(pid):
                return (STORE, None) if registered is not None else take_back()
        time.sleep(pause)
        pause = min(POLL_S[1], pause * 1.5)
    return STORE, None


def gather(path: Path, rank: int, gpn: int, world: int, payload: bytes) -> dict[int, bytes]:
    """The leader's part before it registers: its node's records, rank -> sealed registration (its own among them),
    each taken once every other rank of the node handed one, or after GATHER_S with the ones that did."""
    _write(path / "leader", f"{os.getpid()}\n".encode())
    slot = path.name.rpartition("-")[2]
    for old in path.parent.glob(f"rendezvous-*-{slot}"):  # the node's earlier attempts'
        if old != path:
            shutil.rmtree(old, ignore_errors=True)
    wanted = set(range(rank + 1, min(world, rank + gpn)))
    found = {rank: payload}
    deadline, pause = time.monotonic() + GATHER_S, POLL_S[0]
    while True:
        for r in sorted(wanted):
            handed, taken = path / f"rank-{r}", path / f"taken-{r}"
            if (path / f"back-{r}").exists():  # it waited too long for a leader and registered on its own
                wanted.discard(r)
                continue
            try:
                os.rename(handed, taken)
            except OSError:
                continue
            data = _read(taken)
            if data is not None:
                found[r] = data
                wanted.discard(r)
        if not wanted or time.monotonic() >= deadline:
            return found
        time.sleep(pause)
        pause = min(POLL_S[1], pause * 1.5)


def announce(path: Path, registered: list[int]) -> None:
    """The ranks the leader's node record carries: the others register on their own."""
    _write(path / "leader", f"{os.getpid()}\n{json.dumps(sorted(registered))}\n".encode())


def relay(path: Path, raw: bytes) -> None:
    """The controller's sealed verdict for the node's other ranks (they check the seal)."""
    _write(path / "verdict", raw)
