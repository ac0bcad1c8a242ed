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

Segments: past SEGMENT_BYTES the writer closes the live file as
`timeline.<start>-<end>.jsonl` (its bytes' place in the whole timeline) and
a thread of its own compresses it into `timeline.<start>-<end>.jsonl.gz`:
gzip members of MEMBER_BYTES each (one gzip file to any tool), their
offsets in `<that>.index` beside it, so that a reader seeks to within one
member. The compressed copy and its index are written beside the original
and renamed into place before the original goes: a crash at any point
leaves one whole copy. Offsets (the marks file's, a reader's) count in the
whole timeline, the segments and the live file one after another;
`open_binary` reads them as one file, `size` is their length.

Phases are those of the heartbeat: start, forward, backward, optimizer,
collective, save, eval, idle.
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import io
import json
import os
import re
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from clusterctl import jsonfast
from clusterctl.rundir.layout import TIMELINE_MARKS

PHASE = "phase"
STEP = "step"
GONE = "gone"
GPU = "gpu"
NODE_LOST = "node_lost"
VERDICT = "verdict"
FORMAT = 2  # 1: files written before the first line said so (same records)
MARKS = frozenset({GONE, NODE_LOST, VERDICT})  # the rare kinds timeline-marks.jsonl holds too
SEGMENT_BYTES = 1 << 27  # the live file is closed and compressed past this: every ~6 minutes at 16,384 ranks
MEMBER_BYTES = 1 << 20  # a compressed segment's gzip members: a reader's seek decompresses one (~3 ms)
INDEX_SUFFIX = ".index"

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

    The first record of a new timeline says which layout its lines have (`format`). Past `segment_bytes` the
    live file becomes a segment, compressed by a thread while the writes go on (module doc).
    """

    def __init__(self, path: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self._path, self._segment_bytes = path, segment_bytes
        closed = [part for part in segments(path) if part.end >= 0]
        self._base = closed[-1].end if closed else 0  # the live file's first byte in the whole timeline
        self._fh: TextIO = open(path, "a", encoding="utf-8")
        self._offset = self._base + self._fh.tell()
        self._first = self._offset == 0
        self._marks: TextIO = open(path.with_name(TIMELINE_MARKS), "a", encoding="utf-8")
        self._compressing: list[threading.Thread] = []

    def write(self, kind: str, t: float, **fields: Any) -> None:
        if self._first:
            fields["format"], self._first = FORMAT, False
        line = json.dumps(record(kind, t, **fields)) + "\n"
        if kind in MARKS:
            self._marks.write(mark_line(self._offset, line))
        self._fh.write(line)
        self._offset += len(line)  # json.dumps writes ASCII: one byte a character
        if self._offset - self._base >= self._segment_bytes:
            self._rotate()

    def _rotate(self) -> None:
        """The live file closed as a segment, a new one opened, the segment compressed in the background."""
        self._fh.close()
        closed = close_segment(self._path, self._base, self._offset)
        self._base = self._offset
        self._fh = open(self._path, "a", encoding="utf-8")
        self._compressing = [t for t in self._compressing if t.is_alive()]
        thread = threading.Thread(target=compress_quietly, args=(closed,), name="timeline-compress", daemon=True)
        thread.start()
        self._compressing.append(thread)

    def flush(self) -> None:
        self._fh.flush()
        self._marks.flush()

    def close(self, wait_s: float = 0.0) -> None:
        """Close the files; a compression in flight is waited for up to `wait_s` (the attempt's end does not wait:
        a segment left uncompressed is whole, and read as it is)."""
        self._fh.close()
        self._marks.close()
        for thread in self._compressing:
            thread.join(wait_s)


@dataclass(frozen=True)
class Segment:
    """One part of a timeline: its bytes [start, end) in the whole, end -1 for the live file (it grows)."""

    start: int
    end: int
    path: Path
    compressed: bool = False


def segment_path(path: Path, start: int, end: int, compressed: bool = False) -> Path:
    """Where the timeline at `path` keeps its bytes [start, end) once closed."""
    return path.with_name(f"{path.stem}.{start}-{end}.jsonl" + (".gz" if compressed else ""))


def segments(path: Path) -> list[Segment]:
    """The parts of the timeline at `path` in order: the closed segments (a compressed one rather than the original a
    compression in flight leaves beside it), then the live file where it exists. [] when there is nothing."""
    try:
        names = os.listdir(path.parent)
    except OSError:
        names = []
    name = re.compile(re.escape(path.stem) + r"\.(\d+)-(\d+)\.jsonl(\.gz)?")
    found: dict[int, Segment] = {}
    for entry in names:
        if (m := name.fullmatch(entry)) is not None and (int(m[1]) not in found or m[3]):
            found[int(m[1])] = Segment(int(m[1]), int(m[2]), path.with_name(entry), bool(m[3]))
    parts = [found[start] for start in sorted(found)]
    if path.exists():
        parts.append(Segment(parts[-1].end if parts else 0, -1, path))
    return parts


def size(path: Path) -> int:
    """The whole timeline's bytes, segments and live file; FileNotFoundError when it has neither."""
    parts = segments(path)
    if not parts:
        raise FileNotFoundError(f"no timeline at {path}")
    last = parts[-1]
    return last.start + last.path.stat().st_size if last.end < 0 else last.end


def close_segment(path: Path, start: int, end: int) -> Path:
    """The live file, whose bytes are [start, end) of the timeline, renamed to its segment's name."""
    closed = segment_path(path, start, end)
    os.replace(path, closed)
    return closed


def compress(plain: Path) -> Path:
    """A closed segment replaced by its gzip members and their index, each written beside it, synced and renamed
    into place before the original is removed."""
    gz = plain.with_name(plain.name + ".gz")
    tmp, index_tmp = gz.with_name(gz.name + ".tmp"), gz.with_name(gz.name + INDEX_SUFFIX + ".tmp")
    offsets = [0]
    with open(plain, "rb") as src, open(tmp, "wb") as out:
        while chunk := src.read(MEMBER_BYTES):
            out.write(gzip.compress(chunk, compresslevel=1, mtime=0))  # zlib lets go of the GIL meanwhile
            offsets.append(out.tell())
        out.flush()
        os.fsync(out.fileno())
    with open(index_tmp, "w", encoding="utf-8") as fh:
        json.dump({"member_bytes": MEMBER_BYTES, "offsets": offsets}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(index_tmp, gz.with_name(gz.name + INDEX_SUFFIX))
    os.replace(tmp, gz)
    os.unlink(plain)
    return gz


def split(path: Path, segment_bytes: int = SEGMENT_BYTES) -> list[Path]:
    """A timeline written whole cut as the writer cuts it (at the first line end past every `segment_bytes`) and
    each segment compressed, the rest left live: synthetic runs (testing/runsynth.py), and a run's timeline
    written before segments. Offsets do not change. The compressed segments, in order."""
    done = []
    with open(path, "rb") as src:
        total = os.fstat(src.fileno()).st_size
        start = 0
        while start + segment_bytes < total:
            src.seek(start + segment_bytes - 1)
            src.readline()
            end = src.tell()
            if end >= total:
                break
            closed = segment_path(path, start, end)
            with open(closed, "wb") as out:
                src.seek(start)
                for piece in line_chunks(src, end - start, 1 << 24):
                    out.write(piece)
            done.append(compress(closed))
            start = end
        if not done:
            return done
        src.seek(start)
        rest = path.with_name(path.name + ".tmp")
        with open(rest, "wb") as out:
            for piece in line_chunks(src, total - start, 1 << 24):
                out.write(piece)
    os.replace(rest, path)
    return done


def compress_quietly(plain: Path) -> None:
    """compress() for the writer's thread: a failure (a full disk) leaves the segment whole and uncompressed."""
    with contextlib.suppress(OSError):
        compress(plain)


class _Whole(io.RawIOBase):
    """The segments and the live file read as one file (open_binary): seekable, a compressed segment a member at a
    time through its index (without one, decompressed whole)."""

    def __init__(self, parts: list[Segment]) -> None:
        super().__init__()
        self._parts, self._starts = parts, [p.start for p in parts]
        self._pos = 0
        self._files: dict[int, BinaryIO] = {}
        self._member: tuple[int, int, bytes] = (-1, -1, b"")  # (segment start, member, its bytes)
        self._indexes: dict[int, dict[str, Any] | None] = {}
        if parts[-1].end < 0:  # opened now: a rotation after this renames the very file held, its offsets unchanged
            self._file(parts[-1])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size()}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _size(self) -> int:
        last = self._parts[-1]
        return last.start + os.fstat(self._file(last).fileno()).st_size if last.end < 0 else last.end

    def readinto(self, buffer: Any) -> int:
        i = bisect.bisect_right(self._starts, self._pos) - 1
        if i < 0:
            return 0
        part = self._parts[i]
        if 0 <= part.end <= self._pos:
            return 0  # past the last closed segment, and no live file
        view = memoryview(buffer).cast("B")
        want = len(view) if part.end < 0 else min(len(view), part.end - self._pos)
        fh = self._file(part)
        part = self._parts[i]  # compressed since it was listed, perhaps
        if part.compressed:
            data = self._from_members(part, self._pos - part.start, want)
            view[: len(data)] = data
            got = len(data)
        else:
            fh.seek(self._pos - part.start)
            got = fh.readinto(view[:want]) or 0
        self._pos += got
        return got

    def _file(self, part: Segment) -> BinaryIO:
        if part.start not in self._files:
            try:
                self._files[part.start] = open(part.path, "rb")
            except FileNotFoundError:
                if part.end < 0:
                    raise
                # compressed since it was listed: read the copy that replaced it
                i = self._starts.index(part.start)
                self._parts[i] = part = Segment(part.start, part.end, part.path.with_name(part.path.name + ".gz"), True)
                self._files[part.start] = open(part.path, "rb")
        return self._files[part.start]

    def _from_members(self, part: Segment, offset: int, want: int) -> bytes:
        index = self._index(part)
        step = int(index["member_bytes"]) if index else max(1, part.end - part.start)
        member = offset // step
        if self._member[:2] != (part.start, member):
            fh = self._file(part)
            if index:
                fh.seek(index["offsets"][member])
                raw = fh.read(index["offsets"][member + 1] - index["offsets"][member])
                self._member = (part.start, member, zlib.decompress(raw, 31))
            else:
                fh.seek(0)
                self._member = (part.start, member, gzip.decompress(fh.read()))
        inside = offset - member * step
        return self._member[2][inside: inside + want]

    def _index(self, part: Segment) -> dict[str, Any] | None:
        if part.start not in self._indexes:
            try:
                index = json.loads(part.path.with_name(part.path.name + INDEX_SUFFIX).read_text())
                ok = isinstance(index.get("member_bytes"), int) and isinstance(index.get("offsets"), list)
                self._indexes[part.start] = index if ok else None
            except (OSError, ValueError, AttributeError):
                self._indexes[part.start] = None
        return self._indexes[part.start]

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()
        super().close()


def open_binary(path: Path) -> BinaryIO:
    """The whole timeline at `path` as one binary file: the live file itself while it is the only part."""
    parts = segments(path)
    if not parts:
        raise FileNotFoundError(f"no timeline at {path}")
    if len(parts) == 1 and parts[0].end < 0:
        return open(path, "rb")
    return io.BufferedReader(_Whole(parts), buffer_size=1 << 20)  # type: ignore[return-value]


def open_text(path: Path) -> TextIO:
    """open_binary's text: UTF-8, undecodable bytes replaced."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8", errors="replace")  # type: ignore[arg-type]


_decode = json.JSONDecoder().raw_decode


def parse(line: str) -> dict[str, Any] | None:
    """One line's record; None for a torn or foreign line (jsonfast: the trace reads hundreds of thousands; a line
    with bytes after its record, the standard decoder's raw_decode)."""
    try:
        rec = jsonfast.loads(line)
    except ValueError:
        try:
            rec = _decode(line)[0]
        except ValueError:
            return None
    return rec if rec.__class__ is dict else None


def read(path: Path) -> Iterator[dict[str, Any]]:
    """Every whole record, in file order; torn or foreign lines are skipped."""
    try:
        fh = open_text(path)
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
    """The deaths, lost nodes and verdicts of timeline.jsonl at `path`, each with its byte offset in the whole, from the marks
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
        with open_binary(path) as fh:
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
