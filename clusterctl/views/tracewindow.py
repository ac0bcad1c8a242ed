"""Which part of each attempt's timeline a trace shows, and the lines it reads there.

A large job's timeline grows about 1 GB an hour (docs/admin/scale.md), which
no trace viewer opens with ease. Past TRACE_BYTES over the attempts traced,
each attempt shows its last part, its share of TRACE_BYTES by size: the
minutes before its end, where its verdict is. Before that part only its
deaths, lost nodes and verdicts are read: from the marks file beside the
timeline (rundir/timeline.py), or, for a run written before it, by a byte
search that costs a fraction of parsing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from clusterctl import rundir
from clusterctl.rundir import RunDir, timeline

TRACE_BYTES = 1 << 26  # the timelines' bytes traced in full; past it, each attempt's last share of this much
RARE_MARKS = (b'"kind": "gone"', b'"kind": "verdict"', b'"kind": "node_lost"')  # read from before a window too
SEARCH_CHUNK = 1 << 24


def size(run: RunDir, attempt: int) -> int:
    """The attempt's timeline's bytes (0 when it has none)."""
    try:
        return timeline.size(run.attempt(attempt) / rundir.TIMELINE)
    except OSError:
        return 0


def starts(run: RunDir, attempts: list[int]) -> dict[int, tuple[int, int]]:
    """Attempt -> (the byte its window starts at, a line start; the file's size), for the attempts not traced whole."""
    sizes = {n: size(run, n) for n in attempts}
    total = sum(sizes.values())
    if total <= TRACE_BYTES:
        return {}
    found = {}
    for number, length in sizes.items():
        share = TRACE_BYTES * length // total
        if length - share <= 0:
            continue
        with timeline.open_binary(run.attempt(number) / rundir.TIMELINE) as fh:
            fh.seek(length - share - 1)
            fh.readline()
            found[number] = (fh.tell(), length)
    return found


def lines(fh: TextIO, start: int, path: Path) -> Iterator[str]:
    """The timeline's lines as traced: before byte `start` only deaths, lost nodes and verdicts (from the marks file
    beside `path`, else a byte search), then every line."""
    marked = timeline.marks(path) if start else None
    if marked is not None:
        for offset, rec in marked:
            if offset < start:
                yield json.dumps(rec)
        fh.buffer.seek(start)
    elif start:
        for buf in timeline.line_chunks(fh.buffer, start, SEARCH_CHUNK):
            if any(mark in buf for mark in RARE_MARKS):
                for line in buf.split(b"\n"):
                    if any(mark in line for mark in RARE_MARKS):
                        yield line.decode("utf-8", "replace")
        fh.buffer.seek(start)
    yield from fh
