"""Compute time on a GPU, measured on the device: under NCCL it is the stream that waits for the peers, not the host.

With NCCL, `Work.wait()` does not block the host: it makes the current CUDA
stream wait for the communication stream, and DDP's gradient all-reduce is
waited for the same way at the end of the backward. The host runs ahead to
the script's next synchronisation (`loss.item()`, a copy to the CPU), where
every rank then waits alike — host clocks would show every rank as slow as
the straggler, and the straggler verdict would never fire.

The stream's own timeline tells them apart. CUDA events recorded on the
step's stream at its start and end, and on each side of every wait the
stream makes for a collective, give

    compute = (end - start) - sum(after wait - before wait)

where a wait is a `Work.wait()` of the training thread, and for DDP the
stretch from the backward's last gradient being ready (DDP hands its last
bucket over then) to the backward's return (the all-reduce of that bucket, plus the wait for the
slowest peer). A host that blocks (a gloo collective, a barrier) leaves the
stream idle between the two events too, so that wait is left out as well;
host time with the stream idle outside any wait (data loading, Python)
counts as compute, as on the CPU.

Events are read a step late, once `query()` says the device passed them:
never a synchronisation. So the compute time a step report carries on a GPU
is the latest step the device has finished (usually the one before); the
straggler verdict compares medians over a window, which a step's lag does
not move. Without CUDA in use, the host clock serves (runtime/rank/stepwatch.py).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

BACKLOG = 8  # steps the device may lag before the oldest is dropped unread


class DeviceSpans:
    """One rank's step spans on the device: events recorded on the current stream, read when the device passed them."""

    def __init__(self, event: Callable[[], Any]) -> None:
        self._event = event  # a new timing event (torch.cuda.Event(enable_timing=True); a stand-in in tests)
        self._pool: list[Any] = []
        self._lock = threading.Lock()
        self._start: Any = None
        self._waits: list[tuple[Any, Any]] = []
        self._open: Any = None  # a wait's first event, until its second is recorded
        self._finished: deque[tuple[Any, Any, list[tuple[Any, Any]]]] = deque()

    def _mark(self) -> Any:
        event = self._pool.pop() if self._pool else self._event()
        event.record()
        return event

    def begin(self) -> None:
        """The step starts now on the stream."""
        with self._lock:
            if self._start is not None:  # a step begun again before it ended: its events are not read
                self._release(*self._flatten((self._start, self._open, self._waits)))
            self._start, self._waits, self._open = self._mark(), [], None

    def wait_begin(self) -> None:
        """The stream is about to wait for a collective (or, for DDP, the backward's last gradient is ready)."""
        with self._lock:
            if self._start is not None:
                self._release(self._open)
                self._open = self._mark()

    def wait_end(self) -> None:
        """The wait begun last is over, as far as the stream is concerned."""
        with self._lock:
            if self._open is not None:
                self._waits.append((self._open, self._mark()))
                self._open = None

    @property
    def waiting(self) -> bool:
        return self._open is not None

    def end(self) -> float | None:
        """The step ends: its events queued; the compute seconds of the latest step the device has finished, or None."""
        with self._lock:
            if self._start is None:
                return None
            self._release(self._open)
            self._finished.append((self._start, self._mark(), self._waits))
            self._start, self._waits, self._open = None, [], None
            while len(self._finished) > BACKLOG:
                self._release(*self._flatten(self._finished.popleft()))
            latest = None
            while self._finished and all(e.query() for e in self._flatten(self._finished[0])):
                start, end, waits = step = self._finished.popleft()
                waited_ms = sum(a.elapsed_time(b) for a, b in waits)
                latest = max(0.0, start.elapsed_time(end) - waited_ms) / 1000.0
                self._release(*self._flatten(step))
            return latest

    @staticmethod
    def _flatten(step: tuple[Any, Any, list[tuple[Any, Any]]]) -> list[Any]:
        start, end, waits = step
        return [start, end, *(e for pair in waits for e in pair)]

    def _release(self, *events: Any) -> None:
        self._pool.extend(e for e in events if e is not None)


def for_cuda() -> DeviceSpans | None:
    """Spans on the current CUDA device, when this process uses CUDA (torch imported and CUDA initialised); else None."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not (torch.cuda.is_initialized() and torch.cuda.is_available()):
            return None
    except (AttributeError, RuntimeError):
        return None
    return DeviceSpans(lambda: torch.cuda.Event(enable_timing=True))
