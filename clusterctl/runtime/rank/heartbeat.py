"""The rank's heartbeat client: phase changes and a liveness beat, to the node's aggregator.

Standard library only, and free when no aggregator listens: without
CLUSTERCTL_HEARTBEAT_SOCKET nothing is sent and no thread runs. With it,
every phase change and a beat each second go as one JSON datagram to the
node's Unix socket; a send that fails (aggregator gone, buffer full) is
dropped, never raised, and never blocks training.

What a message holds and when each kind is sent: wire/heartbeat.py.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

from clusterctl import envnames
from clusterctl.runtime.wire import heartbeat as wire
from clusterctl.runtime.wire.heartbeat import PHASES, socket_path

LIVENESS_S = 1.0


def socket_from_env() -> str | None:
    """CLUSTERCTL_HEARTBEAT_SOCKET, else the aggregator's socket when the batch script runs aggregators."""
    explicit = os.environ.get(envnames.HEARTBEAT_SOCKET)
    if explicit:
        return explicit
    directory, token = os.environ.get(envnames.HEARTBEAT_DIR), os.environ.get(envnames.TOKEN)
    node = os.environ.get("SLURMD_NODENAME")
    if directory and token and node:
        return socket_path(directory, token, node)
    return None


class Heartbeat:
    """Send phase changes and liveness beats; a no-op without an aggregator socket."""

    def __init__(self, rank: int, attempt: int = 0, socket_path: str | None = None, *, liveness_s: float = LIVENESS_S) -> None:
        self.rank = rank
        self.attempt = attempt
        self.path = socket_path if socket_path is not None else socket_from_env()
        self.pid = os.getpid()
        gpu = os.environ.get(envnames.GPU, "")
        self.gpu = int(gpu) if gpu.isdigit() else None
        self.step = 0
        self.phase_name = "start"
        self.step_s: float | None = None
        self.compute_s: float | None = None
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.path:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
            self._thread = threading.Thread(target=self._beat, args=(liveness_s,), name="clusterctl-heartbeat", daemon=True)
            self._thread.start()
            self._send(wire.HELLO)  # the aggregator learns this process at once (not progress: no phase yet)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def phase(self, name: str, step: int | None = None) -> None:
        """Enter a phase (`forward`, `backward`, `optimizer`, `collective`, `save`, `idle`)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; expected one of {', '.join(PHASES)}")
        self.phase_name = name
        if step is not None:
            self.step = step
        self._send(wire.PHASE)

    def step_done(self, step: int, step_s: float, compute_s: float | None = None) -> None:
        """Report a finished step with its wall time and the part spent computing."""
        self.step, self.step_s, self.compute_s = step, step_s, compute_s
        self._send(wire.STEP)

    def message(self, kind: str) -> dict[str, Any]:
        return wire.rank_message(kind, self.rank, self.attempt, self.step, self.phase_name, self.step_s,
                                 self.compute_s, time.time(), self.pid, self.gpu)

    def _send(self, kind: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto(json.dumps(self.message(kind)).encode(), self.path)
        except OSError:
            pass  # no aggregator (yet), or its buffer is full: a beat lost is not an error

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            self._send(wire.ALIVE)

    def close(self) -> None:
        """Stop beating and say so: a rank past its training loop is no longer judged for progress."""
        self._send(wire.CLOSED)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close()
            self._sock = None


_SHARED: Heartbeat | None = None


def shared(rank: int, attempt: int = 0) -> Heartbeat:
    """This process's one heartbeat: the launcher starts it for every rank, the Contract reuses it."""
    global _SHARED
    if _SHARED is None or _SHARED._sock is None or _SHARED.rank != rank:
        _SHARED = Heartbeat(rank, attempt)
    return _SHARED
