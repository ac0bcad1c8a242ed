"""Reading metrics.jsonl without reading all of it.

An attempt's metrics file holds one line per step with the step number
rising, so the first line, the last line and the line of any step can be
found by seeking: `status` over a thousand runs with long files stays fast.
Torn lines (a rank killed while writing) are skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

_CHUNK = 8192
_UNREAD = object()


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


class MetricsFile:
    """One attempt's metrics.jsonl, opened for a few lookups."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._first: object = _UNREAD
        self._last: object = _UNREAD
        try:
            self._fh = open(path, "rb")
            self.size = os.fstat(self._fh.fileno()).st_size
        except OSError:
            self._fh = None
            self.size = 0

    def __enter__(self) -> "MetricsFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _line_from(self, offset: int) -> tuple[dict[str, Any] | None, int]:
        """The first whole record at or after `offset` (0, or just after a newline), and where it ends."""
        assert self._fh is not None
        self._fh.seek(offset)
        if offset > 0:
            self._fh.seek(offset - 1)
            if self._fh.read(1) != b"\n":
                self._fh.readline()  # the middle of a line: skip to the next one
        while True:
            start = self._fh.tell()
            if start >= self.size:
                return None, self.size
            line = self._fh.readline()
            record = _parse(line)
            if record is not None:
                return record, start + len(line)

    def first(self) -> dict[str, Any] | None:
        if self._first is _UNREAD:
            self._first = self._line_from(0)[0] if self._fh is not None and self.size else None
        return self._first  # type: ignore[return-value]

    def last(self) -> dict[str, Any] | None:
        if self._last is _UNREAD:
            self._last = self._read_last() if self._fh is not None and self.size else None
        return self._last  # type: ignore[return-value]

    def _read_last(self) -> dict[str, Any] | None:
        """The newest whole record: read backwards a chunk at a time."""
        assert self._fh is not None
        end = self.size
        tail = b""
        while end > 0:
            start = max(0, end - _CHUNK)
            self._fh.seek(start)
            tail = self._fh.read(end - start) + tail
            lines = tail.split(b"\n")
            whole = lines if start == 0 else lines[1:]  # the first piece may be a partial line
            for line in reversed(whole):
                record = _parse(line) if line.strip() else None
                if record is not None:
                    return record
            if start == 0:
                return None
            end = start
            tail = lines[0]
        return None

    def at_or_before(self, step: int) -> dict[str, Any] | None:
        """The record of the newest step <= `step`.

        An interpolation search on byte offsets: with one line per step, a step's line sits about where its
        number falls between the bracket's ends, so a few probes find it; bisection takes over if not."""
        first = self.first()
        if first is None or first["step"] > step:
            return None
        last = self.last()
        if last is None or last["step"] <= step:
            return last
        # The first record starting at or after `lo` has a step <= `step`; the first at or after `hi` a greater one.
        lo, lo_step, hi, hi_step, best = 0, first["step"], self.size, last["step"] + 1, first
        probes = 0
        while lo < hi:
            probes += 1
            if probes <= 8 and hi_step > lo_step:
                mid = min(max(lo + int((step - lo_step) / (hi_step - lo_step) * (hi - lo)), lo), hi - 1)
            else:
                mid = (lo + hi) // 2
            record, end = self._line_from(mid)
            if record is None or record["step"] > step:
                hi, hi_step = mid, record["step"] if record is not None else hi_step
                continue
            best, lo, lo_step = record, end, record["step"]
        return best

    def time_through(self, step: int) -> float:
        """Seconds spent in this attempt's steps up to and including `step`: its `train_s` (files that lack
        it: the sum of `step_s`, read through)."""
        record = self.at_or_before(step)
        if record is None:
            return 0.0
        if isinstance(record.get("train_s"), (int, float)):
            return float(record["train_s"])
        total = 0.0
        assert self._fh is not None
        self._fh.seek(0)
        for line in self._fh:
            parsed = _parse(line)
            if parsed is None:
                continue
            if parsed["step"] > step:
                break
            total += float(parsed.get("step_s") or 0.0)
        return total
