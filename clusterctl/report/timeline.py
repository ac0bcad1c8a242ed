"""Read an attempt's timeline.jsonl into arrays, fast enough for millions of lines.

A 100,000-step run on 4 ranks has millions of phase and step records; one
`json.loads` per line takes longer than the whole report may. Lines written
by the watch server have one layout (runtime/watchserver.py: `json.dumps` of
a dict built in a fixed key order), so a precompiled pattern over whole
chunks of the file reads them, and the records are counted (every phase and
step record has a `"phase":` key) to prove that none was missed. A chunk where
the count differs (another writer, keys in another order, records without
`at`) is read line by line with `json.loads`: slower, never wrong. Torn or
foreign lines are skipped. Large files are read by worker processes, one
part each, when the machine has more than one core.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Phase categories, in the order the phases plot stacks them; a phase maps to one (PHASE_CATEGORY).
CATEGORIES = ("compute", "collective", "save", "eval", "idle", "other")
PHASE_CATEGORY = {
    "forward": 0, "backward": 0, "optimizer": 0, "collective": 1, "save": 2, "eval": 3, "idle": 4, "start": 5,
}
OTHER = CATEGORIES.index("other")
SAVE = CATEGORIES.index("save")

CHUNK = 1 << 25  # bytes per read: big enough to amortise the pattern's start-up, small for memory
PARALLEL_BYTES = 1 << 26  # a file this big is split across worker processes

_NUM = rb"([-+0-9.eE]+)"
_PHASE = re.compile(
    rb'"kind": "phase", "rank": (\d+), "node": "[^"\\\n]*", "step": -?\d+, "phase": "(\w+)", "at": ' + _NUM + rb"[,}]"
)
_PHASE_NO_AT = re.compile(
    rb'\{"t": ' + _NUM + rb', "kind": "phase", "rank": (\d+), "node": "[^"\\\n]*", "step": -?\d+, "phase": "(\w+)"\}'
)
_STEP = re.compile(
    rb'"kind": "step", "rank": (\d+), "node": "[^"\\\n]*", "step": (-?\d+), "phase": "\w+", "at": [-+0-9.eE]+, "step_s": '
    + _NUM + rb"[,}]"
)
_RARE = re.compile(rb'"kind": ?"(?:gone|verdict)"')
_PHASE_KEY = b'"phase":'


@dataclass
class Timeline:
    """One attempt's phase and step records as arrays, in file order; `gone`: rank -> when its process ended."""

    phase_rank: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    phase_cat: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    phase_at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    step_rank: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    step_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    step_s: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    gone: dict[int, float] = field(default_factory=dict)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    slow_chunks: int = 0  # chunks read line by line (not in the watch server's layout)

    @property
    def empty(self) -> bool:
        return self.phase_rank.size == 0 and self.step_rank.size == 0


def _floats(items: list[bytes] | tuple[bytes, ...]) -> np.ndarray:
    return np.fromiter(map(float, items), np.float64, len(items))


def _ints(items: list[bytes] | tuple[bytes, ...], dtype: Any) -> np.ndarray:
    return np.fromiter(map(int, items), dtype, len(items))


def _cats(names: list[bytes] | tuple[bytes, ...]) -> np.ndarray:
    lookup = {k.encode(): v for k, v in PHASE_CATEGORY.items()}
    return np.fromiter((lookup.get(n, OTHER) for n in names), np.int8, len(names))


Parts = tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray],
              dict[int, float], list[dict[str, Any]], int]


def _new_parts() -> Parts:
    return ([], [], [], [], [], [], {}, [], 0)


def _rare(line: bytes, gone: dict[int, float], verdicts: list[dict[str, Any]]) -> None:
    try:
        rec = json.loads(line)
    except ValueError:
        return
    if not isinstance(rec, dict):
        return
    if rec.get("kind") == "gone" and isinstance(rec.get("rank"), int):
        when = rec.get("at", rec.get("t"))
        if isinstance(when, (int, float)):
            gone[rec["rank"]] = float(when)
    elif rec.get("kind") == "verdict":
        verdicts.append(rec)


def _slow(chunk: bytes, parts: Parts) -> None:
    """Line by line with json.loads: any key order, `t` where `at` is missing."""
    pr: list[int] = []
    pc: list[int] = []
    pa: list[float] = []
    sr: list[int] = []
    ss: list[int] = []
    sd: list[float] = []
    for line in chunk.split(b"\n"):
        if _PHASE_KEY not in line and b'"kind"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        kind, rank = rec.get("kind"), rec.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool):
            if kind == "verdict":
                parts[7].append(rec)
            continue
        if kind == "phase":
            when = rec.get("at", rec.get("t"))
            if isinstance(when, (int, float)) and isinstance(rec.get("phase"), str):
                pr.append(rank)
                pc.append(PHASE_CATEGORY.get(rec["phase"], OTHER))
                pa.append(float(when))
        elif kind == "step":
            step, dur = rec.get("step"), rec.get("step_s")
            if isinstance(step, int) and isinstance(dur, (int, float)):
                sr.append(rank)
                ss.append(step)
                sd.append(float(dur))
        elif kind == "gone":
            _rare(line, parts[6], parts[7])
    parts[0].append(np.array(pr, np.int32))
    parts[1].append(np.array(pc, np.int8))
    parts[2].append(np.array(pa, np.float64))
    parts[3].append(np.array(sr, np.int32))
    parts[4].append(np.array(ss, np.int64))
    parts[5].append(np.array(sd, np.float64))


def _chunk(chunk: bytes, parts: Parts) -> int:
    """Read one chunk of whole lines into parts; returns 1 when it had to be read line by line."""
    expected = chunk.count(_PHASE_KEY)
    phases = _PHASE.findall(chunk)
    steps = _STEP.findall(chunk)
    found = len(phases) + len(steps)
    no_at: list[tuple[bytes, bytes, bytes]] = []
    if found != expected:
        no_at = _PHASE_NO_AT.findall(chunk)
        if found + len(no_at) != expected:
            _slow(chunk, parts)
            return 1
    if phases:
        rank, name, at = zip(*phases)
        parts[0].append(_ints(rank, np.int32))
        parts[1].append(_cats(name))
        parts[2].append(_floats(at))
    if no_at:  # older files: the controller's receive time stands in for the rank's clock
        when, rank, name = zip(*no_at)
        parts[0].append(_ints(rank, np.int32))
        parts[1].append(_cats(name))
        parts[2].append(_floats(when))
    if steps:
        rank, step, dur = zip(*steps)
        parts[3].append(_ints(rank, np.int32))
        parts[4].append(_ints(step, np.int64))
        parts[5].append(_floats(dur))
    if b'"gone"' in chunk or b'"verdict"' in chunk:
        for hit in _RARE.finditer(chunk):
            start = chunk.rfind(b"\n", 0, hit.start()) + 1
            end = chunk.find(b"\n", hit.end())
            _rare(chunk[start : end if end >= 0 else len(chunk)], parts[6], parts[7])
    return 0


def _read_range(path: str, start: int, stop: int) -> Parts:
    """Parse bytes [start, stop) of the file; both ends lie on line starts."""
    parts = _new_parts()
    slow = 0
    with open(path, "rb") as fh:
        fh.seek(start)
        left = stop - start
        rest = b""
        while left > 0:
            buf = fh.read(min(CHUNK, left))
            if not buf:
                break
            left -= len(buf)
            buf = rest + buf
            cut = buf.rfind(b"\n") + 1 if left > 0 else len(buf)
            rest = buf[cut:]
            slow += _chunk(buf[:cut], parts)
        if rest:
            slow += _chunk(rest, parts)
    return (*parts[:8], slow)  # type: ignore[return-value]


def _splits(path: Path, size: int, n: int) -> list[tuple[int, int]]:
    """n byte ranges of about equal size, each starting at a line start."""
    cuts = [0]
    with open(path, "rb") as fh:
        for i in range(1, n):
            fh.seek(size * i // n)
            fh.readline()
            pos = fh.tell()
            if cuts[-1] < pos < size:
                cuts.append(pos)
    cuts.append(size)
    return list(zip(cuts[:-1], cuts[1:]))


def _workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def read_timeline(path: Path) -> Timeline:
    """The attempt's timeline; an empty Timeline when the file is missing or unreadable."""
    try:
        size = path.stat().st_size
    except OSError:
        return Timeline()
    workers = min(_workers(), 8)
    ranges = _splits(path, size, workers) if size >= PARALLEL_BYTES and workers > 1 else [(0, size)]
    try:
        results = _run(str(path), ranges)
    except OSError:
        return Timeline()
    return _merge(results)


def _run(path: str, ranges: list[tuple[int, int]]) -> list[Parts]:
    if len(ranges) == 1:
        return [_read_range(path, *ranges[0])]
    import multiprocessing  # noqa: PLC0415 - only for large files

    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:  # no fork on this platform: one process reads it all
        return [_read_range(path, ranges[0][0], ranges[-1][1])]
    with ctx.Pool(len(ranges)) as pool:
        return pool.starmap(_read_range, [(path, a, b) for a, b in ranges])


def _cat(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


def _merge(results: list[Parts]) -> Timeline:
    def joined(i: int, dtype: Any) -> np.ndarray:
        return _cat([a for r in results for a in r[i]], dtype)  # type: ignore[union-attr]

    gone: dict[int, float] = {}
    verdicts: list[dict[str, Any]] = []
    for r in results:
        gone.update(r[6])
        verdicts.extend(r[7])
    return Timeline(
        phase_rank=joined(0, np.int32), phase_cat=joined(1, np.int8), phase_at=joined(2, np.float64),
        step_rank=joined(3, np.int32), step_step=joined(4, np.int64), step_s=joined(5, np.float64),
        gone=gone, verdicts=verdicts, slow_chunks=sum(r[8] for r in results),
    )
