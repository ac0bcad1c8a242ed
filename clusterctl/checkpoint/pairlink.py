"""A link between two ranks for snapshot bytes: a two-rank gloo group of its own, and a seal on what it carries.

A whole-world gloo group connects every rank to every other (10,000
sockets per process at 10,000 ranks) and is made on every attempt. The
snapshots need far less: a replica goes to one peer and comes from one, a
restore's transfer pairs one sender with one receiver. Each such pair gets
its own two-rank group, made through the rendezvous store under its own
prefix (only the two ranks take part: nobody else waits for it).

Making a link waits for the peer, and a rank's store client serves one
request at a time, so a rank makes its links one after another in an order
every rank agrees on: `ring_order` colours a ring's links so that the
waits never close a cycle and a ring of any size is made in at most three
rounds (never a chain around the ring), and a restore's few transfers go in
the order of the plan.

What a link carries is sealed with the attempt's token (store/sealed.py)
under the link's name and the step: a snapshot is a pickle, so bytes from
anyone else are refused before they are loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from clusterctl.store import sealed

TAG = 7  # the one message kind on a link: each transfer is a header, then its payload


class SealError(RuntimeError):
    """Bytes on a link that the attempt's token did not seal: someone else's, or torn."""


class PairLink:
    """One direction's two-rank group between `sender` and `receiver` (the same group carries either way)."""

    def __init__(self, store: Any, prefix: str, *, sender: int, receiver: int, me: int, token: str,
                 timeout_s: float) -> None:
        self.name = f"{prefix}pair/{sender}-{receiver}"
        self.peer = receiver if me == sender else sender
        self.token = token
        self.other = 1 if me == sender else 0  # the peer's rank in the two-rank group: the sender is 0
        self.group = dist.ProcessGroupGloo(dist.PrefixStore(self.name + "/", store), 1 - self.other, 2,
                                           timedelta(seconds=timeout_s))

    def post(self, data: bytes, step: int) -> Callable[[], None]:
        """Start sending `data` (the snapshot of `step`); the returned call waits for it to be taken."""
        payload = sealed.seal(self.token, f"{self.name}/{step}", data) if self.token else data
        head = torch.tensor([len(payload), step], dtype=torch.int64)
        body = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        works = [self.group.send([head], self.other, TAG), self.group.send([body], self.other, TAG)]

        def taken() -> None:
            sending = (head, body)  # the tensors stay alive until the peer has taken them
            for work in works:
                work.wait()
            del sending

        return taken

    def take(self) -> tuple[int, bytes]:
        """(step, data) of the next transfer from the peer; SealError when the token did not seal it."""
        head = torch.zeros(2, dtype=torch.int64)
        self.group.recv([head], self.other, TAG).wait()
        body = torch.empty(int(head[0]), dtype=torch.uint8)
        self.group.recv([body], self.other, TAG).wait()
        step, raw = int(head[1]), body.numpy().tobytes()
        if not self.token:
            return step, raw
        data = sealed.unseal(self.token, f"{self.name}/{step}", raw)
        if data is None:
            raise SealError(f"the snapshot of step {step} from rank {self.peer} is not sealed with this attempt's token")
        return step, data


def ring_colour(node: int, nodes: int) -> int:
    """The round in which the link from `node` to the next node is made: 0 and 1 alternate, an odd ring's last is 2.

    Adjacent links differ, so each node makes its two links in two distinct
    rounds and its neighbours make the same link in the same round.
    """
    return 2 if nodes % 2 and node == nodes - 1 else node % 2
