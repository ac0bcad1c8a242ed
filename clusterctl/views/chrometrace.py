"""A run's timeline as a Chrome trace (the JSON object form), for ui.perfetto.dev and chrome://tracing.

Why a trace: a hang or a straggler is easiest to see as lanes side by side --
one lane per rank, its phases as slices, deaths, verdicts and restarts as
markers on one time axis.

Layout:
  process (pid)   one per node of an attempt: pid = attempt base + the node's slot in
                  attempt.json's host order. The first attempt in the trace has base 0, so
                  `--attempt N` gives pid = slot; every further attempt adds `stride`
                  (1000, or the next power of ten above the largest node count), so the
                  attempts of a run stack top to bottom in Perfetto. Named "<host> (attempt N)".
  thread (tid)    one per rank: tid = rank, named "rank R (GPU g)".
  slices (X)      phases (cat "phase"), each from its record's `at` (the rank's clock; the
                  controller's receive time `t` for older runs) to the same rank's next phase
                  record; a rank's last phase ends at its `gone` record or the attempt's end.
                  With steps, `step N` slices (cat "step") enclose the phases of step N. A
                  `startup` slice (cat "startup") runs from the rank's process start (its
                  manifest timings) to its first phase.
  instants (i)    attempt start/end/next (global), verdicts with culprits (global), a rank's
                  death (thread), a lost node (process).
  counters (C)    GPU samples: `gpu I` per node, one track per numeric fact.

Timestamps are integer microseconds from the trace's earliest event (otherData.origin_epoch_s).
The timeline is read in one pass with state per rank only, so a timeline of millions
of lines costs memory in proportion to the ranks, not the lines.

Window: past views/tracewindow.py's TRACE_BYTES, each attempt shows its last
part, with its deaths, lost nodes and verdicts from all of it;
otherData.window says where each window starts. `whole=True` (`trace --all`)
writes everything.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any, Iterator, TextIO

import orjson

from clusterctl import rundir
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, attemptjson, history, rankmanifest, timeline
from clusterctl.rundir import verdict as verdictfile
from clusterctl.rundir.attemptjson import AttemptJson
from clusterctl.rundir.verdict import Verdict
from clusterctl.views import tracewindow

ORIGIN_SCAN_LINES = 2000  # lines of each timeline read ahead to find the earliest timestamp
BATCH = 4096  # events handed on (and encoded) together
STEP_BUFFER_MAX = 4096  # phases held back per rank until their step slice is written (then flushed anyway)
MIN_STRIDE = 1000
STARTUP = "startup"  # the slice from a rank's process start (manifest timings) to its first phase


def _num(value: Any) -> float | int | None:
    """A finite number (bool excluded), else None: timeline fields come from the network."""
    if (value.__class__ is float or value.__class__ is int) and -1e300 < value < 1e300:
        return value
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


@dataclass
class _Lane:
    """One rank's open state in one attempt: what is needed to close its slices later."""

    pid: int
    rank: int
    cursor: int = 0  # end of the last slice written: the next one never starts earlier
    phase: str | None = None
    phase_step: Any = None
    phase_start: int = 0
    phase_cat: str = "phase"
    phase_args: dict[str, Any] = field(default_factory=dict)
    step: int | None = None
    step_start: int = 0
    step_args: dict[str, Any] = field(default_factory=dict)
    held: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Attempt:
    number: int
    base: int
    hosts: list[str]
    ranks: dict[int, dict[str, Any]]  # rank -> manifest record (host, gpu)
    verdict: Verdict | None
    events: list[dict[str, Any]]  # attempts.jsonl events belonging to this attempt
    cancelled_by: str | None = None  # a cancel stopped it (rundir/history.py): its end reads 89, whatever the event says
    slots: dict[str, int] = field(default_factory=dict)  # host -> slot (first listing wins)

    def __post_init__(self) -> None:
        for host in self.hosts:
            self.slots.setdefault(host, len(self.slots))
        self.hosts = list(self.slots)


@dataclass
class Summary:
    """What the trace holds, for the one-line report and otherData."""

    events: int = 0
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    first_us: int | None = None
    last_us: int | None = None
    skipped_lines: int = 0
    clamped: int = 0
    windows: dict[int, tuple[int, int]] = field(default_factory=dict)  # attempt -> (bytes before its window, file size)

    @property
    def span_s(self) -> float:
        if self.first_us is None or self.last_us is None:
            return 0.0
        return (self.last_us - self.first_us) / 1e6


def _manifest_ranks(manifest: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    ranks: dict[int, dict[str, Any]] = {}
    for record in (manifest or {}).get("ranks") or []:
        if isinstance(record, dict) and _int(record.get("rank")) is not None:
            ranks[int(record["rank"])] = record
    return dict(sorted(ranks.items()))


def _given_at(verdict: Verdict | None) -> float | None:
    """When the verdict was given, where verdict.json says (its `time`; 0 when it did not)."""
    return verdict.time if verdict is not None and verdict.time > 0 else None


def _culprits(verdict: Verdict) -> list[str]:
    out = []
    for c in verdict.culprits:
        gpu = f", GPU {c['gpu']}" if c.get("gpu") is not None else ""
        out.append(f"rank {c.get('rank')} on {c.get('host')}{gpu}: {c.get('reason', '')}".rstrip(": "))
    return out


def _event_name(event: dict[str, Any], att: _Attempt | None = None) -> str:
    """The instant's name; an attempt a cancel stopped ends as the run's history tells it (89, who cancelled)."""
    kind = str(event.get("event", "?"))
    attempt = event.get("attempt")
    by = att.cancelled_by if att is not None and attempt == att.number else None
    if kind == history.EVENT_START:
        return f"attempt {attempt} start"
    if kind == history.EVENT_END:
        return f"attempt {attempt} end (exit {event.get('exit') if not by else f'{int(ExitCode.CANCELLED)}: cancelled by {by}'})"
    if kind == history.EVENT_NEXT and by and event.get("how") == history.NEXT_STOP:
        return f"run stops: cancelled by {by}"
    if kind == history.EVENT_NEXT:
        how = event.get("how")
        return {
            history.NEXT_ALLOCATION: "restart in the allocation",
            history.NEXT_CONTINUATION: f"continuation job {event.get('next_job')}",
            history.NEXT_REQUEUE: "requeue",
            history.NEXT_SLURM: "requeued by Slurm",
            history.NEXT_STOP: "run stops",
        }.get(str(how), f"next: {how}")
    return kind


def _clean(value: Any) -> Any:
    """JSON that strict parsers accept: non-finite numbers (which Python's json reads) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _label(value: Any) -> Any:
    """A step number or node name as the trace shows it: int or text, never a nested object."""
    if value is None or value.__class__ is int or value.__class__ is str:
        return value
    return str(_clean(value))


class Trace:
    """The events of one run (or one attempt of it), produced lazily in one pass over each timeline.

    Iterate it (or `batches()`) once; `summary` and `other_data()` are complete after that.
    """

    def __init__(self, run: RunDir, attempt: int | None = None, steps: bool = True, gpu: bool = True,
                 whole: bool = False) -> None:
        self.run = run
        self.steps = steps
        self.gpu = gpu
        self.summary = Summary()
        self._out: list[dict[str, Any]] = []
        self._first, self._last = 1 << 62, -1  # the earliest start and latest end written (summary.first_us/last_us)
        told = history.read(run)
        known = [a.number for a in told.attempts]
        if attempt is not None and attempt not in known:
            have = ", ".join(map(str, known)) if known else "none yet"
            raise ClusterctlError(f"run {run.path.name} has no attempt {attempt}; its attempts: {have}", ExitCode.USAGE)
        chosen = [a for a in told.attempts if attempt is None or a.number == attempt]
        loaded: list[tuple[history.AttemptHistory, AttemptJson, dict[str, Any]]] = []
        for found in chosen:
            directory = run.attempt(found.number)
            info = attemptjson.read(directory) or AttemptJson()
            loaded.append((found, info, rankmanifest.read(directory / rundir.MANIFEST) or {}))
        widest = max([len(info.hosts) for _, info, _ in loaded] + [1])
        self.stride = max(MIN_STRIDE, 10 ** len(str(widest)))
        self.attempts: list[_Attempt] = []
        for index, (found, info, manifest) in enumerate(loaded):
            listed = list(info.hosts) or manifest.get("hosts")
            hosts = [str(h) for h in listed] if isinstance(listed, list) else []
            # events before the first attempt (a stop before any start) go with the first attempt shown
            mine = [*(told.preamble if attempt is None and index == 0 else []), *found.events]
            verdict = verdictfile.read(run.attempt(found.number))
            self.attempts.append(_Attempt(found.number, index * self.stride, hosts, _manifest_ranks(manifest), verdict, mine,
                                          found.cancelled_by))
        self.origin = self._origin([info for _, info, _ in loaded])
        self.summary.windows = {} if whole else tracewindow.starts(self.run, [a.number for a in self.attempts])

    def _origin(self, infos: list[AttemptJson]) -> float:
        """The earliest timestamp known before streaming: events, attempt starts, rank starts, verdicts, each timeline's head."""
        seen: list[float | None] = []
        for att, info in zip(self.attempts, infos):
            seen += [_num(e.get("time")) for e in att.events]
            seen += [info.started, _given_at(att.verdict)]
            seen += [_num(_timings(record).get("started")) for record in att.ranks.values()]
            for record in islice(timeline.read(self.run.attempt(att.number) / rundir.TIMELINE), ORIGIN_SCAN_LINES):
                seen += [_num(record.get("t")), _num(record.get("at"))]
        found = [x for x in seen if x is not None]
        return min(found) if found else 0.0

    def us(self, epoch_s: float) -> int:
        """Microseconds from the origin; a timestamp earlier than the origin (a rank's clock behind) is clamped to 0."""
        value = round((epoch_s - self.origin) * 1e6)
        if value < 0:
            self.summary.clamped += 1
            return 0
        return value

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[dict[str, Any]]]:
        """The events in lists of up to a few thousand: cheaper to pass on and to encode than one by one."""
        previous: float | None = None
        for att in self.attempts:
            lanes: dict[int, _Lane] = {}
            self._metadata(att, lanes)
            latest, verdict_used = None, False
            for latest, verdict_used in self._stream(att, lanes):
                yield self._flush()
            verdict_at = _given_at(att.verdict)
            if verdict_at is not None:  # the verdict is written before the attempt's end is recorded
                latest = verdict_at if latest is None else max(latest, verdict_at)
            refined = []
            for event in att.events:
                raw = _num(event.get("time"))
                if raw is None:
                    continue
                when = raw if previous is None else max(raw, previous)
                if event.get("event") in (history.EVENT_END, history.EVENT_NEXT) and latest is not None:
                    when = max(when, latest)
                if raw == int(raw):  # whole seconds: the event happened within that second
                    when = min(when, raw + 1)
                previous = when
                refined.append((when, event))
            ends = [w for w, e in refined if e.get("event") == history.EVENT_END]
            close = ends[0] if ends else latest
            if close is not None:
                self._close_all(lanes, self.us(close))
            if att.verdict is not None and not verdict_used:
                when = _given_at(att.verdict)
                if when is not None:
                    self._verdict(att, att.verdict, self.us(when))
            for when, event in refined:
                self._instant(att, _event_name(event, att), self.us(when), "g", _clean(event))
            yield self._flush()

    def _flush(self) -> list[dict[str, Any]]:
        batch, self._out = self._out, []
        self.summary.events += len(batch)
        if self._last >= 0:
            self.summary.first_us, self.summary.last_us = self._first, self._last
        return batch

    # -- the timeline, in one pass ------------------------------------------------------------------

    def _stream(self, att: _Attempt, lanes: dict[int, _Lane]) -> Iterator[tuple[float | None, bool]]:
        """Read the timeline, leaving events in self._out; yields (latest timestamp, verdict.json used) every batch and at the end."""
        latest: float | None = None
        verdict_used = False
        summary = self.summary
        origin = self.origin
        parse = timeline.parse
        try:
            fh = timeline.open_text(self.run.attempt(att.number) / rundir.TIMELINE)
        except OSError:
            return
        with fh:
            path = self.run.attempt(att.number) / rundir.TIMELINE
            for line in tracewindow.lines(fh, self.summary.windows.get(att.number, (0, 0))[0], path):
                record = parse(line)
                if record is None:
                    summary.skipped_lines += 1
                    continue
                t = record.get("t")  # _num inlined: this loop runs once per line
                if not ((t.__class__ is float or t.__class__ is int) and -1e300 < t < 1e300):
                    t = None
                when = record.get("at")
                if not ((when.__class__ is float or when.__class__ is int) and -1e300 < when < 1e300):
                    when = t
                if when is None:
                    summary.skipped_lines += 1
                    continue
                if latest is None or when > latest:
                    latest = when
                if t is not None and t > latest:
                    latest = t
                kind = record.get("kind")
                if kind == "phase" or kind == "step" or kind == "gone":
                    rank = record.get("rank")
                    if rank.__class__ is not int:
                        summary.skipped_lines += 1
                        continue
                    lane = lanes.get(rank) or self._new_lane(att, lanes, rank, record.get("node"))
                    ts = round((when - origin) * 1e6)
                    if ts < 0:
                        ts = self.us(when)
                    floor = lane.phase_start if lane.phase is not None else lane.cursor
                    if ts < floor:
                        ts = floor
                    if kind == "phase":
                        self._phase(lane, record, ts)
                    elif kind == "step":
                        if self.steps and lane.step is not None and record.get("step") == lane.step:
                            lane.step_args = {k: record[k] for k in ("step_s", "compute_s") if _num(record.get(k)) is not None}
                    else:
                        self._close_phase(lane, ts)
                        self._close_step(lane, ts)
                        args = {"node": _label(record.get("node")), "pid": _label(record.get("pid"))}
                        self._instant(att, f"rank {rank} gone", ts, "t", args, pid=lane.pid, tid=rank)
                elif kind == "verdict":
                    verdict = att.verdict
                    if verdict is not None and not verdict_used and verdict.code == record.get("code"):
                        verdict_used = True
                        merged = replace(verdict, message=str(record.get("message") or verdict.message))
                    else:  # a verdict the timeline recorded that verdict.json no longer holds
                        merged = Verdict(False, _int(record.get("code")) or 0, str(record.get("message") or ""))
                    self._verdict(att, merged, self.us(when))
                elif kind == "node_lost":
                    host = str(_label(record.get("node")))
                    pid = self._pid(att, host)
                    tid = next((r for r, m in att.ranks.items() if m.get("host") == host), 0)
                    self._instant(att, f"node {host} lost", self.us(when), "p", {"node": host}, pid=pid, tid=tid)
                elif kind == "gpu" and self.gpu:
                    self._gpu(att, record, self.us(when))
                if len(self._out) >= BATCH:
                    yield latest, verdict_used
        yield latest, verdict_used

    def _phase(self, lane: _Lane, record: dict[str, Any], ts: int) -> None:
        phase = record.get("phase")
        if phase.__class__ is not str:
            phase = str(_label(phase))
        step = record.get("step")
        if step.__class__ is not int:
            step = _label(step)
        if lane.phase == phase and lane.phase_step == step:
            return  # the same phase again: one slice
        self._close_phase(lane, ts)
        if self.steps:
            number = step if step.__class__ is int else None
            if number != lane.step:
                self._close_step(lane, ts)
                if number is not None:
                    lane.step, lane.step_start = number, ts
        lane.phase, lane.phase_step, lane.phase_start = phase, step, ts

    def _gpu(self, att: _Attempt, record: dict[str, Any], ts: int) -> None:
        gpus = record.get("gpus")
        if not isinstance(gpus, dict) or not gpus:
            return
        pid = self._pid(att, str(_label(record.get("node"))))
        for index, facts in sorted(gpus.items(), key=lambda kv: str(kv[0])):
            if isinstance(facts, dict):
                values = {str(k): v for k, v in facts.items() if _num(v) is not None}
                if values:
                    self._mark(ts)
                    self._out.append({"name": f"gpu {index}", "cat": "gpu", "ph": "C", "ts": ts, "pid": pid, "tid": 0, "args": values})

    # -- events -------------------------------------------------------------------------------------

    def _mark(self, ts: int) -> None:
        if ts < self._first:
            self._first = ts
        if ts > self._last:
            self._last = ts

    def _metadata(self, att: _Attempt, lanes: dict[int, _Lane]) -> None:
        """Name every node and every rank the attempt knows; a rank's start-up (from its manifest timings) opens its lane."""
        for host in att.hosts:
            self._process(att, host)
        for rank, record in att.ranks.items():
            pid = self._pid(att, str(_label(record.get("host", "?"))))
            self._thread(pid, rank, record.get("gpu"))
            timings = _timings(record)
            started = _num(timings.get("started"))
            if started is not None and att.number not in self.summary.windows:  # a window starts long after the ranks did
                lane = lanes[rank] = _Lane(pid, rank)
                lane.phase, lane.phase_start, lane.phase_cat = STARTUP, self.us(started), "startup"
                lane.phase_args = {str(k): round(v - started, 6) for k, v in timings.items() if k != "started" and _num(v) is not None}

    def _pid(self, att: _Attempt, host: str) -> int:
        """The host's pid in this attempt, naming a process for a host attempt.json did not list."""
        slot = att.slots.get(host)
        if slot is None:
            slot = att.slots[host] = len(att.hosts)
            att.hosts.append(host)
            self._process(att, host)
        return att.base + slot

    def _process(self, att: _Attempt, host: str) -> None:
        pid = att.base + att.slots[host]
        self.summary.hosts.add(host)
        self._out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"{host} (attempt {att.number})"}})
        self._out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})

    def _thread(self, pid: int, rank: int, gpu: Any) -> None:
        self.summary.ranks.add(rank)
        name = f"rank {rank} (GPU {_label(gpu)})" if gpu is not None else f"rank {rank}"
        self._out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": rank, "args": {"name": name}})
        self._out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": rank, "args": {"sort_index": rank}})

    def _new_lane(self, att: _Attempt, lanes: dict[int, _Lane], rank: int, node: Any) -> _Lane:
        """A lane for a rank first seen in the timeline, naming its thread when the manifest did not."""
        record = att.ranks.get(rank)
        host = str(_label(record.get("host") if record else node if node is not None else "?"))
        pid = self._pid(att, host)
        if record is None:
            self._thread(pid, rank, None)
        lane = lanes[rank] = _Lane(pid, rank)
        return lane

    def _instant(self, att: _Attempt, name: str, ts: int, scope: str, args: dict[str, Any], pid: int | None = None, tid: int = 0) -> None:
        self._mark(ts)
        self._out.append({"name": name, "cat": "run", "ph": "i", "s": scope, "ts": ts, "pid": att.base if pid is None else pid, "tid": tid, "args": args})

    def _verdict(self, att: _Attempt, verdict: Verdict, ts: int) -> None:
        name = f"verdict {verdict.name} (code {verdict.code})"
        args = _clean({"attempt": att.number, "code": verdict.code, "message": verdict.message, "culprits": _culprits(verdict)})
        if verdict.victims:
            args["victims"] = len(verdict.victims)
        self._instant(att, name, ts, "g", args)

    def _slice(self, lane: _Lane, name: str, cat: str, start: int, end: int, args: dict[str, Any]) -> dict[str, Any]:
        if start < self._first:
            self._first = start
        if end > self._last:
            self._last = end
        return {"name": name, "cat": cat, "ph": "X", "ts": start, "dur": end - start, "pid": lane.pid, "tid": lane.rank, "args": args}

    def _close_phase(self, lane: _Lane, end: int) -> None:
        if lane.phase is None:
            return
        if end < lane.phase_start:
            end = lane.phase_start
        args = {"step": lane.phase_step} if lane.phase_cat == "phase" else {"after_s": lane.phase_args}
        event = self._slice(lane, lane.phase, lane.phase_cat, lane.phase_start, end, args)
        lane.phase, lane.phase_cat, lane.phase_args = None, "phase", {}
        lane.cursor = end
        if self.steps and lane.step is not None:
            lane.held.append(event)
            if len(lane.held) >= STEP_BUFFER_MAX:
                self._out.extend(lane.held)
                lane.held = []
        else:
            self._out.append(event)

    def _close_step(self, lane: _Lane, end: int) -> None:
        """The step slice first, then the phases it encloses: viewers nest equal starts by order."""
        if lane.step is not None:
            end = max(end, lane.cursor, lane.step_start)
            self._out.append(self._slice(lane, f"step {lane.step}", "step", lane.step_start, end, {"step": lane.step, **lane.step_args}))
            lane.cursor = end
        self._out.extend(lane.held)
        lane.held = []
        lane.step = None
        lane.step_args = {}

    def _close_all(self, lanes: dict[int, _Lane], end: int) -> None:
        for lane in lanes.values():
            self._close_phase(lane, end)
            self._close_step(lane, end)


def _timings(record: dict[str, Any]) -> dict[str, Any]:
    timings = record.get("timings")
    return timings if isinstance(timings, dict) else {}


def build_trace(run: RunDir, attempt: int | None = None, steps: bool = True, gpu: bool = True, whole: bool = False) -> Trace:
    """The trace of a run (every attempt on one axis) or of one attempt; raises a usage error for an attempt that does not exist.
    `whole`: every line of a timeline past TRACE_BYTES, not its window."""
    return Trace(run, attempt, steps, gpu, whole)


_json_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _encode(batch: list[dict[str, Any]]) -> str:
    """A batch of events as compact JSON: orjson (a fifth of the trace's time went to the standard encoder), the
    standard encoder for what orjson will not write (a type of its own)."""
    try:
        return orjson.dumps(batch, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return _json_encode(batch)


def write_trace(trace: Trace, out: TextIO) -> Summary:
    """Write the JSON object form incrementally, a batch of events per line, otherData (with the counts) last."""
    out.write('{"traceEvents":[')
    first = True
    for batch in trace.batches():
        if not batch:
            continue
        out.write("\n" if first else ",\n")
        out.write(_encode(batch)[1:-1])
        first = False
    out.write('\n],"displayTimeUnit":"ms","otherData":')
    out.write(json.dumps(other_data(trace), separators=(",", ":"), ensure_ascii=False))
    out.write("}\n")
    return trace.summary


def other_data(trace: Trace) -> dict[str, Any]:
    """What a reader of the file needs to map it back to the run: origin, layout, counts."""
    s = trace.summary
    return {
        "run": trace.run.path.name,
        "attempts": [a.number for a in trace.attempts],
        "origin_epoch_s": trace.origin,
        "origin": "ts 0 is the earliest event of the trace, origin_epoch_s seconds since the Unix epoch (UTC)",
        "clock": "phase slices and deaths use each rank's own clock (at), else the controller's receive time (t); "
        "attempts.jsonl times are whole seconds, placed within their second after the previous event and the attempt's last record",
        "pid": f"attempt base + node slot; the bases are 0, {trace.stride}, {2 * trace.stride}, ... for the attempts in order",
        "tid": "rank",
        "events": s.events,
        "ranks": len(s.ranks),
        "nodes": len(s.hosts),
        "span_s": s.span_s,
        "skipped_lines": s.skipped_lines,
        "clamped_to_origin": s.clamped,
        "window": {str(n): {"from_byte": a, "of_bytes": b} for n, a, b in ((n, *w) for n, w in s.windows.items())},
    }


def write_trace_file(trace: Trace, path: Path) -> Summary:
    """Write to a temporary file beside `path` and rename: a reader never sees half a trace."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            summary = write_trace(trace, fh)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return summary
