"""The rank's side of the rendezvous: register with the controller, wait for its verdict.

One TCPStore client per rank, to the store the controller hosts. The
script's `init_process_group()` (env://) is then given that same client
(`share_with_process_group`), so there is one rendezvous and one connection
per rank, not two.

Every round trip is paid on the store's single thread, so a registration
makes five: the client's ping on connect (no `init/` counter: nobody waits
for workers), one compare-and-set that claims the rank (or, for a node
leader, the node: nodegather.py) and stores its record at once, the
arrival count, and the verdict's wait and get. A node's other ranks make
none before the process group's init (LazyStore).

torch's client looks up the name of the controller's address on connect
(the IPv4-mapped form, `::ffff:a.b.c.d`), one query per rank: see the
docs/design/rendezvous.md for the /etc/hosts line that answers it locally.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from clusterctl import rundir
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import jsonio
from clusterctl.rundir.verdict import Verdict
from clusterctl.runtime.rank.rankinfo import RankInfo
from clusterctl.runtime.wire import registration
from clusterctl.store import sealed

FORGED_VERDICT_POLL_S = 0.1  # a verdict without the controller's seal in the store: look again this often
RETURNED_TIMEOUT_S = 5.0  # a rank whose command returned waits no longer than this to say so
REPORT_SETTLE_S = 1.0  # a rank whose command failed waits at most this long for its peers' reports
REPORT_POLL_S = 0.05
CURRENT_STORE: Any = None
"""The rank's client of the controller's store, once registered (None outside a managed attempt)."""


def connect(info: RankInfo, timeout_s: float):  # noqa: ANN201 - torch type
    from torch.distributed import TCPStore

    return TCPStore(
        info.master_addr,
        info.master_port,
        world_size=info.world_size,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        use_libuv=True,
        wait_for_workers=False,  # else every client bumps an `init/` counter that nobody reads: one round trip less
    )


def register(store: Any, rank: int, record: dict[str, Any], token: str, listed: bool = False) -> int:
    """Claim the rank and publish the record, sealed; returns the claim number (1 unless a duplicate).

    The first claimant's compare-and-set stores its record and answers with
    it; a later claimant gets the first one's record back (records differ:
    each carries its pid, host and start time) and registers as a duplicate.
    A rank of a node of several that registers on its own (`listed`) says so
    in DIRECT: the controller reads such a rank's key besides its node's.
    """
    payload = registration.sealed_registration(token, rank, 1, record)
    if listed:
        store.append(registration.DIRECT, sealed.item(token, registration.DIRECT, str(rank)))
    if bytes(store.compare_set(registration.reg_key(rank), "", payload)) == payload:
        store.add(registration.ARRIVED, 1)
        return 1
    claim = int(store.add(registration.claim_key(rank), 1)) + 1
    store.set(registration.reg_key(rank, claim), registration.sealed_registration(token, rank, claim, record))
    store.append(registration.DUPLICATES, sealed.item(token, registration.DUPLICATES, f"{rank}:{claim}"))
    store.add(registration.ARRIVED, 1)  # wakes the controller: a duplicate may fill a rank a forgery took
    return claim


def register_node(store: Any, slot: int, payloads: dict[int, bytes], token: str, attempt_dir: Path) -> list[int]:
    """A node leader's registration of its node's ranks (runtime/rank/nodegather.py), each one's sealed record as it
    would have stored it; the ranks registered: none when the node's key holds another value (a stranger's, or a
    stale leader's), and every rank then registers on its own.

    The store gets the summaries (what the controller judges); the full
    records go to the node's file in the attempt directory, for
    manifest.json, once the node is registered: off the store's one thread,
    and off the way to the verdict.
    """
    value = registration.encode_node({r: registration.summary_only(token, r, p) for r, p in payloads.items()})
    if bytes(store.compare_set(registration.node_key(slot), "", value)) != value:
        return []
    store.add(registration.ARRIVED, len(payloads))
    path = rundir.node_registrations(attempt_dir, slot)
    try:
        mode = jsonio.new_file_mode(attempt_dir)
        path.parent.mkdir(exist_ok=True, mode=mode | (mode & 0o444) >> 2)  # entered by whom may read its files
        jsonio.write_bytes_atomic(path, registration.encode_node(payloads))
    except OSError as exc:  # manifest.json then holds this node's summaries only
        print(f"clusterctl: warning: cannot write {path}: {exc}", file=sys.stderr, flush=True)
    return sorted(payloads)


def await_verdict(store: Any, timeout_s: float, world_size: int, token: str) -> Verdict:
    """The controller's verdict (`await_sealed_verdict`)."""
    return await_sealed_verdict(store, timeout_s, world_size, token)[0]


def await_sealed_verdict(store: Any, timeout_s: float, world_size: int, token: str) -> tuple[Verdict, bytes | None]:
    """The controller's verdict, and its sealed value as the store held it (for a node leader to hand on), waiting
    past the rendezvous timeout by a margin that grows with the world.

    A get waits for its key on its own: one wait and one get, where an
    explicit wait first would cost a third round trip. A verdict without the
    controller's seal (a stranger's, set first) is no verdict: the rank waits
    on for the controller's, which overwrites it, and is refused, saying why,
    only when none came by the deadline.
    """
    wait_s = timeout_s + registration.verdict_margin_s(world_size)
    deadline = time.monotonic() + wait_s
    previous = store.timeout
    store.set_timeout(timedelta(seconds=wait_s))
    try:
        while True:
            raw = bytes(store.get(registration.VERDICT))
            found = opened_verdict(raw, token)
            if found is not None:
                return found, raw
            if time.monotonic() >= deadline:
                return Verdict(False, int(ExitCode.RENDEZVOUS_FAILED),
                               "no rendezvous verdict of the controller's came: the one in the store has no valid seal"
                               " (someone else wrote it), and this rank stops without acting on it"), None
            time.sleep(FORGED_VERDICT_POLL_S)
    finally:
        store.set_timeout(previous)


def opened_verdict(raw: bytes, token: str) -> Verdict | None:
    """The verdict in VERDICT's sealed value; None for one without the controller's seal."""
    body = sealed.unseal(token, registration.VERDICT, raw)
    return registration.read_verdict(body) if body is not None else None


class LazyStore:
    """A rank's store client, connected when first used: a rank its node's leader registered needs none until the
    process group's init, and 100,000 connections at once are the store's busiest moment."""

    def __init__(self, info: RankInfo, timeout_s: float) -> None:
        self._info, self._timeout_s, self._client = info, timeout_s, None
        self._lock = threading.Lock()

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = connect(self._info, self._timeout_s)
            return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client(), name)


def client(store: Any) -> Any:
    """torch's own client behind `store` (a LazyStore connects now): what torch's C++ side must be given."""
    return store.client() if isinstance(store, LazyStore) else store


def report_error(store: Any, rank: int, text: str, token: str) -> None:
    """Tell the controller what went wrong on this rank (best effort: the store may be gone)."""
    try:
        key = registration.error_key(rank)
        store.set(key, sealed.seal(token, key, text[-20000:]))
        store.append(registration.ERRORED, sealed.item(token, registration.ERRORED, str(rank)))
    except Exception:  # noqa: BLE001 - reporting must never mask the original error
        traceback.print_exc()


def await_peer_reports(store: Any, world_size: int, token: str, wait_s: float = REPORT_SETTLE_S) -> None:
    """After reporting its own error, give the peers a moment to report theirs before this rank exits.

    srun stops every rank once one fails (--kill-on-bad-exit): a bug that
    fails on every rank would otherwise be reported by the fastest rank
    alone, and one rank's error is ambiguous where every rank's is the
    script's (runtime/controller/blame.py). Returns as soon as every rank reported an
    error or a return, else after `wait_s` (peers blocked in a collective
    with the failed rank report nothing). Best effort: the store may be gone.
    """
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            said = registration.parse_ranks(_value(store, registration.ERRORED), token, world_size)
            done = registration.parse_returned(_value(store, registration.RETURNED), token, world_size)
            if len(set(said) | set(done)) >= world_size:
                return
            time.sleep(REPORT_POLL_S)
    except Exception:  # noqa: BLE001 - the controller judges from what reached it
        return


def _value(store: Any, key: str) -> bytes | None:
    return store.get(key) if store.check([key]) else None


def report_returned(store: Any, rank: int, code: int, token: str) -> None:
    """Tell the controller this rank's command returned (0, or 85 after a requested save): its work is done,
    whatever ending the process does afterwards. Best effort, briefly: the store may be gone."""
    try:
        previous = store.timeout
        store.set_timeout(timedelta(seconds=RETURNED_TIMEOUT_S))
        try:
            store.append(registration.RETURNED, sealed.item(token, registration.RETURNED, f"{rank}:{code}"))
        finally:
            store.set_timeout(previous)
    except Exception:  # noqa: BLE001 - the controller then judges from srun's lines alone
        pass


def share_with_process_group(store: Any, rank: int, world_size: int) -> None:
    """Make the script's first env:// `init_process_group()` use this rank's store client.

    torch's own convention for a store someone else hosts
    (TORCHELASTIC_USE_AGENT_STORE) opens a second connection per rank, all at
    the same moment right after the verdict, and torch's client looks up
    the name of the address it connects to: a burst of DNS queries, where
    one dropped query costs that rank the resolver's 5 s. So the env://
    handler is wrapped to hand out the registered client once; later groups,
    or a script that changed the address, rank or world size, connect as
    torchrun's workers do.
    """
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # any other env:// group joins the controller's store
    torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module; the package exports a function of that name

    handlers = getattr(torch_rendezvous, "_rendezvous_handlers", None)
    original = handlers.get("env") if isinstance(handlers, dict) else None
    if original is None:  # a torch without the handler table: the second connection it is
        return
    lent = [store]
    address = (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))

    def env_handler(url: str, **kwargs: Any):  # noqa: ANN202 - a generator, as torch expects
        query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
        ours = (
            int(query.get("rank", rank)) == rank
            and int(query.get("world_size", world_size)) == world_size
            and (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")) == address
        )
        if not (lent and ours):
            yield from original(url, **kwargs)
            return
        yield client(lent.pop()), rank, world_size
        raise RuntimeError("Unable to perform re-rendezvous using env:// method")

    handlers["env"] = env_handler
