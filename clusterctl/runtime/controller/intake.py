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
store until the manifest is written; `source` says where each one is.

A rank found twice with the same summary is one claim (its leader died
after registering it, and it registered the same bytes itself); with two
different ones, the later is a duplicate, as a later claimant of the rank
key is (registration.DUPLICATES, read by the caller).
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Iterator
from typing import Any

from clusterctl.runtime.wire import registration
from clusterctl.store import collect

NODE_CHUNK = 32  # node values a request: ~14 KB each at 8 ranks a node, ~0.5 MB answered, as collect.CHUNK's ranks
OWN = -1  # source[rank]: the rank's own key


class Intake:
    def __init__(self, store: Any, world: int, gpus_per_node: int, token: str) -> None:
        self.store, self.world, self.token = store, world, token
        self.gpn = max(1, gpus_per_node)
        self.records: dict[int, dict[str, Any]] = {}
        self.duplicates: dict[int, list[dict[str, Any]]] = {}
        self.source = array("i", [OWN]) * world  # where each rank's record is: its node's slot, or OWN
        self._slots_unread = list(range(-(-world // self.gpn)))
        self._own_read: set[int] = set()
        self._seen: dict[Any, Any] = {}  # values many records repeat, one object each (registration.share_values)

    def complete(self, thorough: bool) -> bool:
        """Read what arrived since the last look; whether every rank's registration is in. Without `thorough`, a
        look that meets a missing value ends there (cheap while most are missing); with it, every key is looked at
        one by one where its request's are not all there."""
        gc.disable()  # ~100,000 small dicts: the collector's passes were half the decoding time
        try:
            self._read_nodes(thorough)
            self._read_own(thorough)
        finally:
            gc.enable()
        return len(self.records) >= self.world

    def _read_nodes(self, thorough: bool) -> None:
        keys = [registration.node_key(s) for s in self._slots_unread]
        left: list[int] = []
        for start in range(0, len(keys), NODE_CHUNK):
            part, slots = keys[start : start + NODE_CHUNK], self._slots_unread[start : start + NODE_CHUNK]
            if self.store.check(part):
                present = list(range(len(part)))
            elif thorough:
                present = [i for i, key in enumerate(part) if self.store.check([key])]
            else:
                left += self._slots_unread[start:]
                break
            taken = set(present)
            left += [s for i, s in enumerate(slots) if i not in taken]
            if present:
                for i, raw in zip(present, self.store.multi_get([part[i] for i in present])):
                    self._take_node(slots[i], raw)
        self._slots_unread = left

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
        """The full records of `ranks` (all judged), read again from the store: the manifest's rows."""
        own = [r for r in ranks if self.source[r] == OWN]
        found = dict(zip(own, map(registration.full_record, self.store.multi_get([registration.reg_key(r) for r in own])
                                  if own else [])))
        slots = sorted({self.source[r] for r in ranks} - {OWN})
        for start in range(0, len(slots), NODE_CHUNK):
            part = slots[start : start + NODE_CHUNK]
            for slot, raw in zip(part, self.store.multi_get([registration.node_key(s) for s in part])):
                for rank, payload in registration.decode_node(bytes(raw)).items():
                    if 0 <= rank < self.world and self.source[rank] == slot:
                        found[rank] = registration.full_record(payload)
        return found
