"""attempt-N/timeline.jsonl: what the controller learned while the attempt ran, one record per line.

The watch server is the one writer (`TimelineWriter`); `t` is the
controller's receive time, `at` the rank's own clock where the rank said
when. Each kind has a fixed key order (LAYOUT), so the report can read
millions of lines with patterns built from it (`pattern`) instead of one
json.loads a line; a line in another order is still read, line by line.

    phase      t, kind, rank, node, step, phase, at               a rank entered a phase
    step       t, kind, rank, node, step, phase, at, step_s, compute_s   a rank finished a step
    gone       t, kind, rank, node, pid, at                        the rank's process ended
    gpu        t, kind, node, gpus                                 an NVML sample {index: facts}
    node_lost  t, kind, node                                       its aggregator vanished
    verdict    t, kind, code, message                              the watchdog's verdict

The file's first record also carries `format`, this layout's version (files
written before it have none).

Deaths, lost nodes and verdicts (MARKS) are written a second time to
timeline-marks.jsonl beside it, each line `{"offset": <its byte offset in
timeline.jsonl>, ...the record}`: a large job's timeline grows about 1 GB an
hour, and the report and trace read only part of it, so they find these few
records there instead of searching every byte (`marks`). Runs written before
the marks file have none; their readers search.

Phases are those of the heartbeat: start, forward, backward, optimizer,
collective, save, eval, idle.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from clusterctl.rundir.layout import TIMELINE_MARKS

PHASE = "phase"
STEP = "step"
GONE = "gone"
GPU = "gpu"
NODE_LOST = "node_lost"
VERDICT = "verdict"
FORMAT = 2  # 1: files written before the first line said so (same records)
MARKS = frozenset({GONE, NODE_LOST, VERDICT})  # the rare kinds timeline-marks.jsonl holds too

LAYOUT: dict[str, tuple[str, ...]] = {
    PHASE: ("t", "kind", "rank", "node", "step", "phase", "at", "format"),
    STEP: ("t", "kind", "rank", "node", "step", "phase", "at", "step_s", "compute_s", "format"),
    GONE: ("t", "kind", "rank", "node", "pid", "at", "format"),
    GPU: ("t", "kind", "node", "gpus", "format"),
    NODE_LOST: ("t", "kind", "node", "format"),
    VERDICT: ("t", "kind", "code", "message", "format"),
}
# The shape of each value as json.dumps writes it, for the patterns.
_VALUE = {
    "t": rb"[-+0-9.eE]+", "at": rb"[-+0-9.eE]+", "step_s": rb"[-+0-9.eE]+", "compute_s": rb"[-+0-9.eE]+",
    "rank": rb"\d+", "step": rb"-?\d+", "pid": rb"\d+", "code": rb"\d+",
    "node": rb'"[^"\\\n]*"', "phase": rb'"\w+"',
}


def record(kind: str, t: float, **fields: Any) -> dict[str, Any]:
    """One record in its kind's key order (keys it does not have are left out)."""
    values = {"t": t, "kind": kind, **fields}
    return {key: values[key] for key in LAYOUT[kind] if key in values}


class TimelineWriter:
    """Appends records to an attempt's timeline.jsonl (the watch server's thread is its only user).

    The first record of a new file says which layout its lines have (`format`).
    """

    def __init__(self, path: Path) -> None:
        self._fh: TextIO = open(path, "a", encoding="utf-8")
        self._offset = self._fh.tell()
        self._first = self._offset == 0
        self._marks: TextIO = open(path.with_name(TIMELINE_MARKS), "a", encoding="utf-8")

    def write(self, kind: str, t: float, **fields: Any) -> None:
        if self._first:
            fields["format"], self._first = FORMAT, False
        line = json.dumps(record(kind, t, **fields)) + "\n"
        if kind in MARKS:
            self._marks.write(mark_line(self._offset, line))
        self._fh.write(line)
        self._offset += len(line)  # json.dumps writes ASCII: one byte a character

    def flush(self) -> None:
        self._fh.flush()
        self._marks.flush()

    def close(self) -> None:
        self._fh.close()
        self._marks.close()


_decode = json.JSONDecoder().raw_decode


def parse(line: str) -> dict[str, Any] | None:
    """One line's record; None for a torn or foreign line."""
    try:
        rec = _decode(line)[0]
    except ValueError:
        try:
            rec = json.loads(line)
        except ValueError:
            return None
    return rec if rec.__class__ is dict else None


def read(path: Path) -> Iterator[dict[str, Any]]:
    """Every whole record, in file order; torn or foreign lines are skipped."""
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except OSError:
        return
    with fh:
        for line in fh:
            rec = parse(line)
            if rec is not None:
                yield rec


def mark_line(offset: int, line: str) -> str:
    """A marks file's line: the timeline's `line` (a record, newline-terminated) with `offset` put first."""
    return f'{{"offset": {offset}, {line[1:]}'


def marks(path: Path) -> list[tuple[int, dict[str, Any]]] | None:
    """The deaths, lost nodes and verdicts of timeline.jsonl at `path`, each with its byte offset there, from the marks
    file beside it; None where there is none (a run written before it: search the timeline instead)."""
    try:
        fh = open(path.with_name(TIMELINE_MARKS), encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = []
    with fh:
        for line in fh:
            rec = parse(line)
            if rec is None:
                continue
            offset = rec.pop("offset", None)
            if offset.__class__ is int and rec.get("kind") in MARKS:
                found.append((offset, rec))
    return found


def line_chunks(fh: BinaryIO, length: int, chunk: int) -> Iterator[bytes]:
    """The next `length` bytes of a file opened in binary, in pieces of about `chunk` bytes that each end at a line's
    end (the last one at `length`): for readers that scan gigabytes a piece at a time."""
    left, rest = length, b""
    while left > 0:
        buf = fh.read(min(chunk, left))
        if not buf:
            break
        left -= len(buf)
        buf = rest + buf
        cut = buf.rfind(b"\n") + 1 if left > 0 else len(buf)
        rest = buf[cut:]
        yield buf[:cut]
    if rest:
        yield rest


def tail(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The whole records written since byte `offset`, and the offset to go on from (for following a live file)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
    except OSError:
        return [], offset
    complete = chunk[: chunk.rfind(b"\n") + 1]
    found = [r for r in map(parse, complete.decode("utf-8", "replace").splitlines()) if r is not None]
    return found, offset + len(complete)


def pattern(
    kind: str, first: str, last: str, capture: tuple[str, ...], start: bytes = b"", end: bytes = rb"[,}]"
) -> re.Pattern[bytes]:
    """A pattern for the keys `first`..`last` of a `kind` line as the writer lays it out, capturing `capture`.

    The report reads with these; tests check that every line the writer makes matches them.
    """
    keys = LAYOUT[kind]
    parts = []
    for key in keys[keys.index(first): keys.index(last) + 1]:
        value = json.dumps(kind).encode() if key == "kind" else _VALUE[key]
        if key in capture:
            value = rb'"(\w+)"' if key == "phase" else b"(" + value + b")"
        parts.append(b'"' + key.encode() + b'": ' + value)
    return re.compile(start + b", ".join(parts) + end)
