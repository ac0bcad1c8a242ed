"""Read an attempt's timeline.jsonl into arrays, fast enough for millions of lines.

A 100,000-step run on 4 ranks has millions of phase and step records; one
`json.loads` per line takes longer than the whole report may. Lines written
by the watch server have one layout (runtime/controller/watchserver.py: `json.dumps` of
a dict built in a fixed key order), so a precompiled pattern over whole
chunks of the file reads them, and the records are counted (every phase and
step record has a `"phase":` key) to prove that none was missed. A chunk where
the count differs (another writer, keys in another order, records without
`at`) is read line by line with `json.loads`: slower, never wrong. Torn or
foreign lines are skipped. Large files are read by worker processes, one
part each, when the machine has more than one core.

A timeline is bounded in lines per hour, not in hours: a large job's sample
writes about 1 GB an hour (docs/admin/scale.md). Past READ_BYTES, an
attempt's file is read in STRETCHES evenly spaced stretches, the first at
its start (the warm-up), the last at its end (a fault), READ_BYTES in all;
the deaths and verdicts come from the marks file beside it (rundir/timeline.py),
or, for a run written before it, a byte search between the stretches. A phase's duration never bridges two stretches, and
`Timeline.read_share` says how much was parsed, so the report can say so.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clusterctl.rundir import timeline

# Phase categories, in the order the phases plot stacks them; a phase maps to one (PHASE_CATEGORY).
CATEGORIES = ("compute", "collective", "save", "eval", "idle", "load", "other")
PHASE_CATEGORY = {
    "forward": 0, "backward": 0, "optimizer": 0, "collective": 1, "save": 2, "eval": 3, "idle": 4, "load": 5, "start": 6,
}
OTHER = CATEGORIES.index("other")
SAVE = CATEGORIES.index("save")

CHUNK = 1 << 25  # bytes per read: big enough to amortise the pattern's start-up, small for memory
PARALLEL_BYTES = 1 << 26  # a file this big is split across worker processes
READ_BYTES = 1 << 28  # a run's timelines parsed in full up to this; past it, stretches of this much in all
STRETCHES = 32  # evenly spaced stretches an attempt's timeline is read in, past its share of READ_BYTES

# Patterns built from the writer's layout (rundir/timeline.py); tests check every line it writes matches.
_PHASE = timeline.pattern(timeline.PHASE, "kind", "at", ("rank", "phase", "at"))
_PHASE_NO_AT = timeline.pattern(timeline.PHASE, "t", "phase", ("t", "rank", "phase"), start=rb"\{", end=rb"\}")
_STEP = timeline.pattern(timeline.STEP, "kind", "compute_s", ("rank", "step", "step_s", "compute_s"))
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
    step_compute_s: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))  # NaN where not given
    gone: dict[int, float] = field(default_factory=dict)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    slow_chunks: int = 0  # chunks read line by line (not in the watch server's layout)
    phase_part: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # each phase's stretch (0: read whole)
    read_share: float = 1.0  # of the file's bytes parsed: below 1, its phases and steps are those of evenly spaced stretches
    size: int = 0  # the file's bytes

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
              dict[int, float], list[dict[str, Any]], int, list[np.ndarray], list[np.ndarray]]
# 9: the steps' compute_s; 10: each phase record's stretch


def _new_parts() -> Parts:
    return ([], [], [], [], [], [], {}, [], 0, [], [])


def _rare(line: bytes, gone: dict[int, float], verdicts: list[dict[str, Any]]) -> None:
    try:
        rec = json.loads(line)
    except ValueError:
        return
    if isinstance(rec, dict):
        _rare_record(rec, gone, verdicts)


def _rare_record(rec: dict[str, Any], gone: dict[int, float], verdicts: list[dict[str, Any]]) -> None:
    """A gone record into `gone` (rank -> when its process ended), a verdict record into `verdicts`."""
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
    sc: list[float] = []
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
            continue  # gone and verdict records are read by _rare_lines
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
                compute = rec.get("compute_s")
                sc.append(float(compute) if isinstance(compute, (int, float)) else float("nan"))
    parts[0].append(np.array(pr, np.int32))
    parts[1].append(np.array(pc, np.int8))
    parts[2].append(np.array(pa, np.float64))
    parts[3].append(np.array(sr, np.int32))
    parts[4].append(np.array(ss, np.int64))
    parts[5].append(np.array(sd, np.float64))
    parts[9].append(np.array(sc, np.float64))


# The vectorised reader: the watch server's layout, checked byte for byte with numpy over a whole chunk.
_LIT = {name: np.frombuffer(text, np.uint8) for name, text in {
    "start": b'{"t": ', "phase": b', "kind": "phase", "rank": ', "step": b', "kind": "step", "rank": ', "node": b', "node": "',
    "stepn": b', "step": ', "phasen": b', "phase": "', "at": b', "at": ', "step_s": b', "step_s": ', "compute": b', "compute_s": ',
}.items()}
_NAMES = {name.encode(): cat for name, cat in PHASE_CATEGORY.items()}


def _words(buf: np.ndarray) -> np.ndarray:
    """words[i]: the 8 bytes from buf[i] as one little-endian integer (zero past the end), so that a
    literal is compared 8 bytes per gather."""
    padded = np.concatenate((buf, np.zeros(8, np.uint8)))
    return np.lib.stride_tricks.as_strided(padded, shape=(buf.size, 8), strides=(1, 1)).view("<u8")[:, 0]


def _word(text: bytes) -> tuple[int, int]:
    """(value, mask) of up to 8 bytes, little-endian as _words reads them."""
    return int.from_bytes(text.ljust(8, b"\0"), "little"), (1 << (8 * len(text))) - 1


def _is(words: np.ndarray, pos: np.ndarray, lit: str) -> np.ndarray:
    """Whether the literal _LIT[lit] starts at each position."""
    text = _LIT[lit].tobytes()
    ok = np.ones(pos.size, bool)
    last = words.size - 1
    for k in range(0, len(text), 8):
        value, mask = _word(text[k : k + 8])
        ok &= (words[np.minimum(pos + k, last)] & np.uint64(mask)) == np.uint64(value)
    return ok


def _numbers(buf: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decimal numbers in buf[a:b] (optional '-', digits, at most one '.'); (values, which were well formed)."""
    n = a.size
    if n == 0:
        return np.zeros(0), np.ones(0, bool)
    length = b - a
    width = int(min(max(int(length.max()), 1), 20))
    ok = (length >= 1) & (length <= width)
    mant = np.zeros(n, np.int64)
    frac = np.zeros(n, np.int64)
    dots = np.zeros(n, np.int64)
    digits = np.zeros(n, np.int64)
    neg = buf[np.minimum(a, buf.size - 1)] == 45
    last = buf.size - 1
    for j in range(width):
        inside = j < length
        ch = buf[np.minimum(a + j, last)]
        digit = inside & (ch >= 48) & (ch <= 57)
        dot = inside & (ch == 46)
        ok &= digit | dot | ~inside | ((j == 0) & neg)
        mant = np.where(digit, mant * 10 + (ch.astype(np.int64) - 48), mant)
        frac += digit & (dots > 0)
        dots += dot
        digits += digit
    ok &= (dots <= 1) & (digits >= 1) & (digits <= 18)
    values = mant / np.power(10.0, frac)
    return np.where(neg, -values, values), ok


def _vector_chunk(chunk: bytes, parts: Parts) -> bool:
    """Read a chunk whose every phase and step record is in the watch server's layout; False (nothing
    added) when one is not, so that the caller reads it another way."""
    buf = np.frombuffer(chunk, np.uint8)
    if buf.size == 0:
        return True
    words = _words(buf)
    ends = np.flatnonzero(buf == 10)
    if ends.size == 0 or ends[-1] != buf.size - 1:
        ends = np.append(ends, buf.size)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    commas = np.append(np.flatnonzero(buf == 44), buf.size)
    k0 = np.searchsorted(commas, starts)
    count = np.searchsorted(commas, ends) - k0
    last_ok = buf[np.maximum(ends - 1, 0)] == 125  # '}'

    def comma(rows: np.ndarray, j: int) -> np.ndarray:
        return commas[np.minimum(k0[rows] + j, commas.size - 1)]

    ph = np.flatnonzero((count == 6) & last_ok)
    c0, c2, c3, c4, c5 = (comma(ph, j) for j in (0, 2, 3, 4, 5))
    good = (_is(words, starts[ph], "start") & _is(words, c0, "phase") & _is(words, c2, "node") & _is(words, c3, "stepn")
            & _is(words, c4, "phasen") & _is(words, c5, "at") & (buf[np.maximum(c5 - 1, 0)] == 34))
    ph, c0, c2, c4, c5 = ph[good], c0[good], c2[good], c4[good], c5[good]
    rank, ok_r = _numbers(buf, c0 + len(_LIT["phase"]), c2)
    at, ok_a = _numbers(buf, c5 + len(_LIT["at"]), ends[ph] - 1)
    name_at = c4 + len(_LIT["phasen"])
    name_len = c5 - 1 - name_at
    cat = np.full(ph.size, OTHER, np.int8)
    head = words[np.minimum(name_at, words.size - 1)]
    for name, code in _NAMES.items():  # the first 8 bytes and the length tell the phase names apart
        value, mask = _word(name[:8])
        cat[(name_len == len(name)) & ((head & np.uint64(mask)) == np.uint64(value))] = code

    st = np.flatnonzero((count == 8) & last_ok)
    s0, s2, s3, s4, s5, s6, s7 = (comma(st, j) for j in (0, 2, 3, 4, 5, 6, 7))
    good = (_is(words, starts[st], "start") & _is(words, s0, "step") & _is(words, s2, "node") & _is(words, s3, "stepn")
            & _is(words, s4, "phasen") & _is(words, s5, "at") & _is(words, s6, "step_s") & _is(words, s7, "compute"))
    st, s0, s2, s3, s4, s6, s7 = st[good], s0[good], s2[good], s3[good], s4[good], s6[good], s7[good]
    srank, ok_sr = _numbers(buf, s0 + len(_LIT["step"]), s2)
    sstep, ok_ss = _numbers(buf, s3 + len(_LIT["stepn"]), s4)
    secs, ok_d = _numbers(buf, s6 + len(_LIT["step_s"]), s7)
    csecs, ok_c = _numbers(buf, s7 + len(_LIT["compute"]), ends[st] - 1)

    if ph.size + st.size != chunk.count(_PHASE_KEY):
        return False  # a phase or step record in another layout
    if not (ok_r.all() and ok_a.all() and ok_sr.all() and ok_ss.all() and ok_d.all() and ok_c.all()):
        return False  # a number this reader does not parse (an exponent, NaN): json.loads will
    parts[0].append(rank.astype(np.int32))
    parts[1].append(cat)
    parts[2].append(at)
    parts[3].append(srank.astype(np.int32))
    parts[4].append(sstep.astype(np.int64))
    parts[5].append(secs)
    parts[9].append(csecs)
    return True


def _chunk(chunk: bytes, parts: Parts) -> int:
    """Read one chunk of whole lines into parts; returns 1 when it had to be read line by line."""
    _rare_lines(chunk, parts)
    if _vector_chunk(chunk, parts):
        return 0
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
        rank, step, dur, compute = zip(*steps)
        parts[3].append(_ints(rank, np.int32))
        parts[4].append(_ints(step, np.int64))
        parts[5].append(_floats(dur))
        parts[9].append(_floats(compute))
    return 0


def _rare_lines(chunk: bytes, parts: Parts) -> None:
    """gone and verdict records: few, read with json.loads."""
    if b'"gone"' in chunk or b'"verdict"' in chunk:
        for hit in _RARE.finditer(chunk):
            start = chunk.rfind(b"\n", 0, hit.start()) + 1
            end = chunk.find(b"\n", hit.end())
            _rare(chunk[start : end if end >= 0 else len(chunk)], parts[6], parts[7])


def _read_range(path: str, start: int, stop: int, part: int = 0, rare_only: bool = False) -> Parts:
    """Parse bytes [start, stop) of the file, both ends on line starts, as stretch `part`; with `rare_only`,
    only its deaths and verdicts."""
    parts = _new_parts()
    slow = 0
    read = _rare_lines if rare_only else _chunk
    with timeline.open_binary(Path(path)) as fh:
        fh.seek(start)
        for piece in timeline.line_chunks(fh, stop - start, CHUNK):
            slow += read(piece, parts) or 0
    phases = sum(a.size for a in parts[0])
    return (*parts[:8], slow, parts[9], [np.full(phases, part, np.int32)])  # type: ignore[return-value]


def _read_ranges(path: str, ranges: list[tuple[int, int, int, bool]]) -> list[tuple[int, Parts]]:
    return [(r[0], _read_range(path, *r)) for r in ranges]


def _splits(path: Path, size: int, n: int) -> list[tuple[int, int]]:
    """n byte ranges of about equal size, each starting at a line start."""
    cuts = [0]
    with timeline.open_binary(path) as fh:
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


def _line_start(fh: Any, pos: int, size: int) -> int:
    """The first line start at or after `pos`."""
    if pos <= 0:
        return 0
    if pos >= size:
        return size
    fh.seek(pos - 1)
    fh.readline()
    return min(fh.tell(), size)


def _stretches(path: Path, size: int, share: int) -> list[tuple[int, int, int, bool]]:
    """(start, stop, stretch, deaths and verdicts only) over the whole file: STRETCHES parsed stretches of
    share / STRETCHES bytes, evenly spaced from the file's start (the warm-up) to its end (a fault), and the
    gaps between them."""
    out: list[tuple[int, int, int, bool]] = []
    length = max(1, share // STRETCHES)
    cursor = 0
    with timeline.open_binary(path) as fh:
        for i in range(STRETCHES):
            begin = max(cursor, _line_start(fh, (size - length) * i // (STRETCHES - 1), size))
            end = max(begin, _line_start(fh, begin + length, size) if i < STRETCHES - 1 else size)
            if begin > cursor:
                out.append((cursor, begin, 0, True))
            if end > begin:
                out.append((begin, end, i + 1, False))
            cursor = end
    if cursor < size:
        out.append((cursor, size, 0, True))
    return out


def read_timeline(path: Path, share: int | None = None) -> Timeline:
    """The attempt's timeline; an empty Timeline when the file is missing or unreadable. `share`: the bytes
    to parse at most (its part of READ_BYTES, load.py); a larger file is read in stretches."""
    try:
        size = timeline.size(path)
    except OSError:
        return Timeline()
    budget = READ_BYTES if share is None else share
    workers = min(_workers(), 8)
    marked = timeline.marks(path) if size > budget else None
    if size > budget:
        pieces = _stretches(path, size, budget)
        parsed = [p for p in pieces if not p[3]]
        searched = [p for p in pieces if p[3]] if marked is None else []  # the marks file has what they hold
        n = workers if size >= PARALLEL_BYTES and workers > 1 else 1
        tasks = [parsed[i::n] + searched[i::n] for i in range(n)]  # each worker as much parsing as the next
    elif size >= PARALLEL_BYTES and workers > 1:
        tasks = [[(a, b, 0, False)] for a, b in _splits(path, size, workers)]
    else:
        tasks = [[(0, size, 0, False)]]
    try:
        results = _run(str(path), [t for t in tasks if t])
    except OSError:
        return Timeline()
    tl = _merge(results)
    tl.size = size
    if marked is not None:  # the marks file's deaths and verdicts, not the stretches' share of them
        tl.gone, tl.verdicts = {}, []
        for _, rec in marked:
            _rare_record(rec, tl.gone, tl.verdicts)
    if size > budget:
        tl.read_share = sum(b - a for a, b, _, _ in parsed) / size
    return tl


def _run(path: str, tasks: list[list[tuple[int, int, int, bool]]]) -> list[Parts]:
    """Each task's ranges read by a worker of its own (one task: here); the parts in file order."""
    if len(tasks) == 1:
        done = _read_ranges(path, tasks[0])
    else:
        import multiprocessing  # noqa: PLC0415 - only for large files

        try:
            ctx = multiprocessing.get_context("fork")
        except ValueError:  # no fork on this platform: one process reads it all
            done = _read_ranges(path, [r for t in tasks for r in t])
        else:
            with ctx.Pool(len(tasks)) as pool:
                done = [p for ps in pool.starmap(_read_ranges, [(path, t) for t in tasks]) for p in ps]
    return [parts for _, parts in sorted(done, key=lambda item: item[0])]


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
        step_compute_s=joined(9, np.float64),
        gone=gone, verdicts=verdicts, slow_chunks=sum(r[8] for r in results), phase_part=joined(10, np.int32),
    )
