"""The registrations in the store, read as they arrive: a node's at once (its leader's), or a rank's own.

The one reader of registration values, for the rendezvous and for
manifest.json. A node of several ranks is stored under its node key
(runtime/rank/nodegather.py: one value, each rank's sealed registration in
it); a rank that registered on its own (every rank of a one-rank node, a
rank its leader did not take, a duplicate) under its rank key, and a rank
of a node of several that did so also in DIRECT, so that its key is read
beside its node's. Each value is read once, its summaries decoded at once
(the judging's input, and most of the controller's work at 100,000 ranks,
so done while the last nodes still arrive). The full records stay in the
store, or in the node's file (layout.node_registrations: a node's store
value holds its ranks' summaries only), until the manifest is written;
`source` says where each one is.

A rank found twice with the same summary is one claim (its leader died
after registering it, and it registered the same bytes itself); with two
different ones, the later is a duplicate, as a later claimant of the rank
key is (registration.DUPLICATES, read by the caller).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clusterctl import rundir
from clusterctl.runtime.wire import registration
from clusterctl.store import collect, sealed

FILE_WAIT_S = 10.0  # a node registered in the store writes its full records' file a moment later
NODE_CHUNK = 128  # node values a request: ~2 KB of summaries each at 8 ranks a node, ~0.25 MB answered
OWN = -1  # source[rank]: the rank's own key


class Intake:
    def __init__(self, store: Any, world: int, gpus_per_node: int, token: str, attempt_dir: Path) -> None:
        self.store, self.world, self.token, self.attempt_dir = store, world, token, attempt_dir
        self._files_by: float | None = None
        self.gpn = max(1, gpus_per_node)
        self.records: dict[int, dict[str, Any]] = {}
        self.duplicates: dict[int, list[dict[str, Any]]] = {}
        self.source = array("i", [OWN]) * world  # where each rank's record is: its node's slot, or OWN
        self._slots_unread = list(range(-(-world // self.gpn))) if self.gpn > 1 else []  # a one-rank node: its own key
        self._own_read: set[int] = set()
        self._seen: dict[Any, Any] = {}  # values many records repeat, one object each (registration.share_values)

    def complete(self, thorough: bool) -> bool:
        """Read what arrived since the last look; whether every rank's registration is in. Without `thorough`, only
        the requests whose values are all there are read (a node's request costs one look while some are missing,
        a rank's own ends the look); with it, every key is looked at one by one where its request's are not all
        there."""
        self._read_nodes(thorough)
        self._read_own(thorough)
        return len(self.records) >= self.world

    def _read_nodes(self, thorough: bool) -> None:
        keys = [registration.node_key(s) for s in self._slots_unread]
        left: list[int] = []
        for start in range(0, len(keys), NODE_CHUNK):
            part, slots = keys[start : start + NODE_CHUNK], self._slots_unread[start : start + NODE_CHUNK]
            if self.store.check(part):
                present = list(range(len(part)))
            elif thorough and not self._own_keys_all_there(slots):
                present = [i for i, key in enumerate(part) if self.store.check([key])]
            else:  # looked at again later; with `thorough`, every rank of these nodes registered on its own
                present = []
            taken = set(present)
            left += [s for i, s in enumerate(slots) if i not in taken]
            if present:
                for i, raw in zip(present, self.store.multi_get([part[i] for i in present])):
                    self._take_node(slots[i], raw)
        self._slots_unread = left

    def _own_keys_all_there(self, slots: list[int]) -> bool:
        ranks = range(slots[0] * self.gpn, min(self.world, (slots[-1] + 1) * self.gpn))
        return all(self.store.check(list(part)) for part in collect.chunks([registration.reg_key(r) for r in ranks]))

    def _take_node(self, slot: int, raw: bytes) -> None:
        first, last = slot * self.gpn, min(self.world, (slot + 1) * self.gpn)
        for rank, payload in registration.decode_node(bytes(raw)).items():
            if first <= rank < last:  # a node's value speaks for the node's own ranks only
                self._take(rank, payload, slot)

    def _take(self, rank: int, payload: bytes, source: int) -> None:
        head = registration.share_values(registration.open_registration(self.token, rank, 1, payload)[0], self._seen)
        first = self.records.get(rank)
        if first is None:
            self.records[rank] = head
            self.source[rank] = source
        elif head != first:
            self.duplicates.setdefault(rank, []).append(head)

    def _read_own(self, thorough: bool) -> None:
        listed = registration.parse_ranks(self._raw(registration.DIRECT), self.token, self.world,
                                            registration.DIRECT) if self.gpn > 1 else []
        ranks = [r for r in range(self.world) if r not in self.records and r not in self._own_read]
        ranks += [r for r in listed if r in self.records and r not in self._own_read]
        keys = [registration.reg_key(r) for r in ranks]
        if thorough:
            found = collect.iter_present(self.store, keys)
        else:
            found = self._whole_chunks(keys)
        for i, raw in found:
            self._own_read.add(ranks[i])
            self._take(ranks[i], raw, OWN)

    def _whole_chunks(self, keys: list[str]) -> Iterator[tuple[int, bytes]]:
        """iter_present's values while each request's keys are all there; none past the first that is not."""
        for start in range(0, len(keys), collect.CHUNK):
            part = keys[start : start + collect.CHUNK]
            if not self.store.check(part):
                return
            for i, raw in enumerate(self.store.multi_get(part)):
                yield start + i, raw

    def _raw(self, key: str) -> bytes | None:
        return self.store.get(key) if self.store.check([key]) else None

    def full_records(self, ranks: list[int]) -> dict[int, bytes | memoryview]:
        """The full records of `ranks` (all judged): a rank's own from the store, a node's from the node's file
        (layout.node_registrations); a node whose file is not there within FILE_WAIT_S of the first look keeps
        the summaries its store value holds. The manifest's rows."""
        own = [r for r in ranks if self.source[r] == OWN]
        found = dict(zip(own, map(registration.full_record, self.store.multi_get([registration.reg_key(r) for r in own])
                                  if own else [])))
        for slot in sorted({self.source[r] for r in ranks} - {OWN}):
            payloads = self._node_file(slot)
            judged = [r for r in range(slot * self.gpn, min(self.world, (slot + 1) * self.gpn)) if self.source[r] == slot]
            if any(r not in payloads for r in judged):  # the store's value: the summaries the verdict judged
                payloads = {**registration.decode_node(bytes(self.store.get(registration.node_key(slot)))), **payloads}
            for rank in judged:
                if rank in payloads:
                    found[rank] = registration.full_record(payloads[rank])
        return found

    def _node_file(self, slot: int) -> dict[int, bytes]:
        path = rundir.node_registrations(self.attempt_dir, slot)
        if self._files_by is None:
            self._files_by = time.monotonic() + FILE_WAIT_S
        while True:
            try:
                found = registration.decode_node(path.read_bytes())
                # a record not sealed under its rank's key (the directory is shared; the file anyone's) is not taken
                return {r: v for r, v in found.items() if sealed.unseal(self.token, registration.reg_key(r), v)}
            except FileNotFoundError:
                if time.monotonic() >= self._files_by:
                    return {}
                time.sleep(0.05)
            except OSError:
                return {}
