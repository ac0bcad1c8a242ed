"""attempt-N/metrics.jsonl: rank 0's record of each training step — its definition, writer and readers.

One JSON object per line, the step number rising, keys in FIELDS order (keys
a writer adds of its own come after them; keys are only ever added). The
first line of a file also carries `format`, the layout's version (files
written before it have none).

    step          the step's number (0-based, the run's count: a resumed attempt goes on from its checkpoint)
    loss          the step's mean loss over the ranks
    loss_hex      the same as float.hex, for bit-exact comparisons
    step_s        the step's wall time on rank 0
    compute_s     its compute (forward, backward, optimizer) time: the step's time less the waits for peers
    compute_on    "cuda" when compute_s was timed on the GPU's stream (a step late: runtime/rank/devicespans.py); absent: the host's clock
    tokens_per_s  the job's throughput in the step
    t             the wall clock (seconds since the epoch) at the step's end
    train_s       the attempt's time in steps so far
    total_steps   the steps the run is to train in all
    data_s        time waiting for input in the step (file-backed data)
    epoch         the data epoch
    val_loss      the validation loss, on steps that ran one
    target_reached  {step, seconds, val_loss} when validation first reached the target
    watch_s       rank 0's time in the step watcher's own code so far this attempt (its overhead: watch_s / train_s)
    format        the layout's version: on the file's first line only

`status` reads only the first and last lines and finds a step's line by
seeking (MetricsFile): long files cost nothing. Torn lines (a rank killed
while writing) are skipped.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

FIELDS = (
    "step", "loss", "loss_hex", "step_s", "compute_s", "compute_on", "tokens_per_s", "t", "train_s", "total_steps",
    "data_s", "epoch", "val_loss", "target_reached", "watch_s", "format",
)
FORMAT = 2  # 1: files written before the first line said so (same records)
_VALUE = {"step": rb"-?\d+", "total_steps": rb"-?\d+", "epoch": rb"-?\d+", "format": rb"\d+", "loss_hex": rb'"[^"\n]*"',
          "target_reached": rb"\{[^\n]*\}"}
_NUMBER = rb"[-+0-9.eE]+"
_CHUNK = 8192
_UNREAD = object()


def line(record: dict[str, Any]) -> str:
    """One metrics line: the record's keys in FIELDS order, then any others, as json.dumps writes them."""
    ordered = {key: record[key] for key in FIELDS if key in record}
    ordered.update((k, v) for k, v in record.items() if k not in ordered)
    return json.dumps(ordered) + "\n"


class MetricsWriter:
    """Appends one line per step and flushes it (a reader sees whole lines only); a new file's first line says its format."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "a", encoding="utf-8")
        self._first = self._fh.tell() == 0

    def write(self, record: dict[str, Any]) -> None:
        if self._first:
            record, self._first = {**record, "format": FORMAT}, False
        self._fh.write(line(record))
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def pattern(required: tuple[str, ...], capture: tuple[str, ...]) -> re.Pattern[bytes]:
    """A whole-line pattern for lines this module writes: `required` keys always there, the other FIELDS
    optional, each in FIELDS order; groups are the `capture` keys in FIELDS order (an optional one absent
    captures None). A line with a key outside FIELDS does not match (its reader falls back to json.loads)."""
    parts = []
    for i, key in enumerate(FIELDS):
        value = _VALUE.get(key, _NUMBER)
        if key in capture:
            value = b"(" + value + b")"
        piece = (b"" if i == 0 else b", ") + b'"' + key.encode() + b'": ' + value
        parts.append(piece if key in required else b"(?:" + piece + b")?")
    return re.compile(rb"^\{" + b"".join(parts) + rb"\}$", re.M)


def records(data: bytes) -> list[dict[str, Any]]:
    """Every whole record in a metrics file's bytes, in order; torn or foreign lines are skipped."""
    return [r for r in map(_parse, data.split(b"\n")) if r is not None]


def read_all(path: Path) -> list[dict[str, Any]]:
    """Every whole record of a metrics file, in order (small files: tests, the ladder's checks)."""
    try:
        return records(Path(path).read_bytes())
    except OSError:
        return []


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
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
