"""A run's logs as a user reads them: one rank, one node, or everything merged.

Where lines come from (rundir/layout.py has the names):

* `attempt-N/logs/node-<slot>.log`: srun writes each task's stdout and stderr
  there (`--output/--error ... --label`), every line prefixed by the task's
  global rank right-aligned to a width (`0: `, ` 3: `). The lines pass through
  no code of ours (the rank's process writes to srun's pipe), so they carry no
  timestamp unless the program printed one.
* `slurm-<job>.out`: the batch log of one job (several for a run continued in
  new jobs; a requeued job appends to its own). The batch script's and the
  controller's lines begin with an ISO-8601 UTC time (`2026-12-01T03:50:27Z
  clusterctl: ...`); srun's own lines (`srun: error: ...`) do not. The line
  `clusterctl: attempt N of job J: ...` opens attempt N's part of the file;
  lines before it belong to the job's first attempt, lines after an attempt's
  end (`attempt N ended`, what comes next) to that attempt.

Merging orders an attempt's lines by time: a line's time is its own leading
ISO-8601 stamp; a line without one keeps its place after the line before it
in its own file (it takes that line's time). A file's first lines without a
stamp take the time its writer began: for a node's file, when the controller
let the ranks' programs start (the rendezvous verdict, verdict.json `time`),
since a rank runs the user's command only after it; else the attempt's start
(attempt.json `started`). Equal times keep the batch log first, then the
nodes in slot order, each file in its own order.

Everything here reads files only; whether a job still runs is the caller's
question (`run_over` takes it as a function).
"""

from __future__ import annotations

import calendar
import os
import re
import shlex
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from clusterctl import rundir
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, attemptjson, history, jobid, runjson
from clusterctl.rundir import verdict as verdictfile

BATCH = "batch"  # the source name of batch log lines
ALL = "all"  # --attempt all
POLL_S = 0.5
LINGER_S = 1.0  # after the run's end is seen, lines still written (the last log lines) are read this long

LABEL = re.compile(r"^ *(\d+): ?(.*)$", re.S)  # srun --label
STAMP = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?(?=\s|$)")
MARKER = re.compile(r"clusterctl: attempt (\d+) of job (\S+?):")  # the batch script's log() at each attempt's start


def batch_log_name(job_id: str) -> str:
    """The batch log of a job (`slurm-%j.out`), by the scheduler's own id."""
    return rundir.BATCH_LOG.format(job=jobid.native(job_id))


def parse_label(line: str) -> tuple[int | None, str]:
    """(rank, text) of a line srun labelled; (None, line) for one it did not."""
    match = LABEL.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), match.group(2)


def parse_time(text: str) -> float | None:
    """Seconds since the epoch of a leading ISO-8601 time (`2026-12-01T03:50:27Z`, `...27.5+01:00`); UTC when no zone."""
    match = STAMP.match(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    try:
        seconds = float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))
    except (ValueError, OverflowError):
        return None
    if match.group(7):
        seconds += float(match.group(7))
    zone = match.group(8)
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return seconds


# -- what exists -------------------------------------------------------------


@dataclass(frozen=True)
class AttemptInfo:
    """One attempt as the run directory tells it: its job, its nodes in slot order, its start."""

    number: int
    job_id: str | None
    hosts: tuple[str, ...]
    started: float | None
    ranks_from: float | None = None  # when the ranks' own programs began: the rendezvous verdict, when it passed

    def host(self, slot: int) -> str:
        return self.hosts[slot] if slot < len(self.hosts) else f"node-{slot}"


def list_attempts(run: RunDir) -> list[AttemptInfo]:
    """Every attempt the run's history knows (a start event or a directory), ascending."""
    found = []
    for a in history.read(run).attempts:
        info = attemptjson.read(run.attempt(a.number))
        hosts = info.hosts if info is not None and info.hosts else tuple(rundir.read_hosts(run.attempt(a.number)))
        started = info.started if info is not None and info.started is not None else a.start
        given = verdictfile.read(run.attempt(a.number))
        ranks_from = given.time if given is not None and given.ok and given.time else None
        found.append(AttemptInfo(a.number, (info.job_id if info is not None else "") or a.job_id or None, tuple(hosts), started,
                                 ranks_from))
    return found


def earlier_failures(run: RunDir, shown: list[AttemptInfo], arg: str) -> str | None:
    """When only the latest attempt is shown and earlier ones failed: which, and how to see them."""
    if len(shown) != 1:
        return None
    failed = [a for a in history.read(run).attempts
              if a.number < shown[0].number
              and a.exit_code not in (None, 0, ExitCode.PRE_TIMEOUT, ExitCode.CANCELLED)]  # 85: a planned stop; 89: a cancel
    if not failed:
        return None
    said = "; ".join(f"attempt {a.number} (job {a.job_id}) ended with exit {a.exit_code}: {a.meaning}" for a in failed)
    first = failed[0].number
    return (f"note: showing attempt {shown[0].number}; {said}. See it with `clusterctl logs {shlex.quote(arg)} --attempt {first}`"
            " (or --attempt all)")


def _numbers(infos: Iterable[AttemptInfo]) -> str:
    return ", ".join(str(i.number) for i in infos) or "none yet"


def choose_attempts(infos: list[AttemptInfo], spec: str | None) -> list[AttemptInfo]:
    """--attempt: None is the latest, `all` every one, N that one."""
    if spec is not None and spec.strip().lower() == ALL:
        if not infos:
            raise ClusterctlError("the run has no attempts yet", ExitCode.USAGE)
        return list(infos)
    if spec is None:
        if not infos:
            raise ClusterctlError("the run has no attempts yet (use --follow to wait for the first)", ExitCode.USAGE)
        return [infos[-1]]
    text = spec.strip()
    if not text.isdigit():
        raise ClusterctlError(f"--attempt takes an attempt number or {ALL!r}, not {spec!r}; attempts: {_numbers(infos)}", ExitCode.USAGE)
    for info in infos:
        if info.number == int(text):
            return [info]
    raise ClusterctlError(f"attempt {int(text)} does not exist; attempts: {_numbers(infos)}", ExitCode.USAGE)


@dataclass(frozen=True)
class Layout:
    """Ranks per node as the batch script launches them (block distribution): from run.json."""

    world: int | None
    per_node: int | None
    nodes: int | None

    @classmethod
    def of(cls, run: RunDir) -> Layout:
        plan = runjson.read(run.path) or runjson.RunJson()

        def number(value: int) -> int | None:
            return value if isinstance(value, int) and value > 0 else None

        return cls(world=number(plan.world_size), per_node=number(plan.gpus_per_node), nodes=number(plan.nodes))

    def slot_of(self, rank: int) -> int | None:
        return rank // self.per_node if self.per_node else None


@dataclass(frozen=True)
class Selection:
    """Which lines: one rank, one node (a slot, or a host whose slot each attempt says), or all merged."""

    rank: int | None = None
    slot: int | None = None
    host: str | None = None
    rank_slot: int | None = None  # the node file that holds `rank`; None: read every node file

    @property
    def merged(self) -> bool:
        return self.rank is None and self.slot is None and self.host is None

    def slots(self, info: AttemptInfo) -> list[int] | None:
        """The node files to read for an attempt; None: all of them."""
        if self.host is not None:
            return [info.hosts.index(self.host)] if self.host in info.hosts else []
        if self.slot is not None:
            return [self.slot]
        if self.rank is not None and self.rank_slot is not None:
            return [self.rank_slot]
        return None


def _ranges(values: list[int]) -> str:
    return f"{values[0]}-{values[-1]}" if len(values) > 2 else ", ".join(map(str, values))


def select(run: RunDir, infos: list[AttemptInfo], rank: int | None, node: str | None) -> Selection:
    """--rank / --node checked against the run's plan and the attempts shown."""
    if rank is not None and node is not None:
        raise ClusterctlError("--rank and --node cannot be given together: a rank lives on one node", ExitCode.USAGE)
    layout = Layout.of(run)
    if rank is not None:
        if rank < 0 or (layout.world is not None and rank >= layout.world):
            known = f"ranks: 0-{layout.world - 1}" if layout.world else "the plan does not say how many"
            raise ClusterctlError(f"rank {rank} does not exist; {known}", ExitCode.USAGE)
        return Selection(rank=rank, rank_slot=layout.slot_of(rank))
    if node is None:
        return Selection()
    hosts = sorted({h for info in infos for h in info.hosts})
    slots = layout.nodes or max((len(i.hosts) for i in infos), default=0)
    where = "; ".join(
        f"attempt {i.number}: " + ", ".join(f"{s}={h}" for s, h in enumerate(i.hosts)) for i in infos if i.hosts
    )
    where = f" (slot=host in {where})" if where else ""
    if node.strip().isdigit():
        slot = int(node)
        if slot >= slots:
            known = f"slots: {_ranges(list(range(slots)))}" if slots else "no node is known yet"
            raise ClusterctlError(f"node slot {slot} does not exist; {known}{where}", ExitCode.USAGE)
        return Selection(slot=slot)
    if node not in hosts:
        shown = f"attempt {infos[0].number}" if len(infos) == 1 else "any attempt shown"
        known = f"nodes: {', '.join(hosts)}" if hosts else "no node is known yet"
        raise ClusterctlError(f"node {node!r} did not run {shown}; {known}{where}", ExitCode.USAGE)
    return Selection(host=node)


def compile_grep(pattern: str | None) -> re.Pattern[str] | None:
    """--grep as a Python regular expression; a bad one is a usage error naming it."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ClusterctlError(f"--grep {pattern!r} is not a valid Python regular expression: {exc}", ExitCode.USAGE) from None


# -- reading -----------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One log line with where it came from and when it happened (`at`, for merging)."""

    attempt: int
    source: str  # BATCH or the node's host
    slot: int | None  # None for the batch log
    rank: int | None  # srun's label; None for the batch log and unlabelled lines
    text: str  # without srun's label
    raw: str  # as written
    at: float  # its own time, else that of the line before it in its file, else when its file's writer began
    seq: int  # arrival order: ties keep each file's order

    def sort_key(self) -> tuple[int, float, int, int]:
        return (self.attempt, self.at, -1 if self.slot is None else self.slot, self.seq)


class Tail:
    """A file read as it grows: whole lines only; read again from the start when replaced or truncated.

    Truncation shows as a shorter file or, when it has grown past the old end
    again by the next read, as different first bytes.
    """

    HEAD = 64  # bytes of the file's start kept to notice it was rewritten

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.inode: int | None = None
        self.head = b""
        self.partial = b""

    def read(self, final: bool = False) -> list[str]:
        """The complete lines written since the last read (at the end, `final`, a last unfinished one too)."""
        try:
            stat = os.stat(self.path)
            if stat.st_size != self.offset or stat.st_ino != self.inode:
                with open(self.path, "rb") as fh:
                    if self.inode is not None and (
                        stat.st_ino != self.inode or stat.st_size < self.offset or fh.read(len(self.head)) != self.head
                    ):
                        self.offset, self.head, self.partial = 0, b"", b""  # rotated or truncated: start over
                    self.inode = stat.st_ino
                    fh.seek(self.offset)
                    data = fh.read(max(0, stat.st_size - self.offset))
                    self.offset += len(data)
                    if len(self.head) < self.HEAD:
                        fh.seek(0)
                        self.head = fh.read(min(self.HEAD, self.offset))
                    self.partial += data
        except OSError:
            return self._rest(final)
        *complete, self.partial = self.partial.split(b"\n")
        lines = [raw.decode("utf-8", "replace").removesuffix("\r") for raw in complete]
        return lines + self._rest(final)

    def _rest(self, final: bool) -> list[str]:
        if final and self.partial:
            rest, self.partial = self.partial, b""
            return [rest.decode("utf-8", "replace").removesuffix("\r")]
        return []


@dataclass
class _BatchFile:
    """A job's batch log, whose lines go to the attempt whose part of the file they are in."""

    tail: Tail
    attempt: int | None  # the attempt the next unmarked line belongs to
    last_at: float | None = None


@dataclass
class _NodeFile:
    tail: Tail
    info: AttemptInfo
    slot: int
    last_at: float | None = None


class LogReader:
    """The logs of a run that a selection covers, read incrementally (once for a listing, repeatedly to follow)."""

    def __init__(self, run: RunDir, selection: Selection, wanted: Callable[[int], bool]) -> None:
        self.run = run
        self.selection = selection
        self.wanted = wanted
        self.infos: dict[int, AttemptInfo] = {}
        self.nodes: dict[tuple[int, int], _NodeFile] = {}
        self.batches: dict[str, _BatchFile] = {}
        self.seq = 0

    def refresh(self) -> list[AttemptInfo]:
        """Every attempt, as far as the run directory tells now (hosts and job id may arrive late)."""
        for info in list_attempts(self.run):
            known = self.infos.get(info.number)
            if known is None or not known.hosts or known.job_id is None or known.ranks_from is None:
                self.infos[info.number] = info
        return [self.infos[n] for n in sorted(self.infos)]

    def poll(self, final: bool = False) -> list[Line]:
        """New lines since the last poll, ordered by attempt, time and source."""
        infos = self.refresh()
        lines: list[Line] = []
        for info in infos:
            if self.wanted(info.number):
                self._open_nodes(info)
        if self.selection.merged:
            lines += self._read_batches(infos, final)
        for node in self.nodes.values():
            lines += self._read_node(node, final)
        return sorted(lines, key=Line.sort_key)

    def _open_nodes(self, info: AttemptInfo) -> None:
        slots = self.selection.slots(info)
        if slots is None:
            slots = list(range(len(info.hosts)))
            slots += rundir.node_log_slots(self.run.attempt(info.number))  # files of nodes attempt.json does not name (yet)
        for slot in slots:
            if (info.number, slot) not in self.nodes:
                self.nodes[(info.number, slot)] = _NodeFile(Tail(rundir.node_log(self.run.attempt(info.number), slot)), info, slot)
            else:
                self.nodes[(info.number, slot)].info = info  # hosts may have arrived since

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _read_node(self, node: _NodeFile, final: bool) -> list[Line]:
        found = []
        source = node.info.host(node.slot)
        for raw in node.tail.read(final):
            rank, text = parse_label(raw)
            if self.selection.rank is not None and rank != self.selection.rank:
                continue
            own = parse_time(text)
            if own is not None:
                node.last_at = own
            at = node.last_at if node.last_at is not None else node.info.ranks_from or node.info.started or 0.0
            found.append(Line(node.info.number, source, node.slot, rank, text, raw, at, self._next_seq()))
        return found

    def _read_batches(self, infos: list[AttemptInfo], final: bool) -> list[Line]:
        firsts: dict[str, int] = {}  # a job's first attempt owns the lines before any attempt's marker
        for info in infos:
            if info.job_id is not None:
                firsts.setdefault(info.job_id, info.number)
        jobs = {info.job_id for info in infos if info.job_id is not None and self.wanted(info.number)}
        for job, first in firsts.items():
            if job not in jobs:
                continue
            if job not in self.batches:
                self.batches[job] = _BatchFile(Tail(self.run.path / batch_log_name(job)), None)
            batch = self.batches[job]
            if batch.attempt is None:
                batch.attempt = first
        found = []
        for batch in self.batches.values():
            for raw in batch.tail.read(final):
                found += self._route(batch, raw)
        return found

    def _route(self, batch: _BatchFile, raw: str) -> list[Line]:
        marker = MARKER.search(raw)
        if marker is not None:
            batch.attempt = int(marker.group(1))
        own = parse_time(raw)
        if own is not None:
            batch.last_at = own
        number = batch.attempt
        if number is None or not self.wanted(number):
            return []
        info = self.infos.get(number)
        at = batch.last_at if batch.last_at is not None else (info.started if info and info.started else 0.0)
        return [Line(number, BATCH, None, None, raw, raw, at, self._next_seq())]


# -- showing -----------------------------------------------------------------


def header(info: AttemptInfo) -> str:
    """The line that opens an attempt's lines when several attempts are shown."""
    job = f"job {info.job_id}" if info.job_id else "job ?"
    nodes = f" on {', '.join(info.hosts)}" if info.hosts else ""
    return f"==> attempt {info.number} ({job}){nodes} <=="


class Printer:
    """Lines as the user sees them: a rank's text bare, a node's as srun wrote it, merged ones with their source."""

    def __init__(self, selection: Selection, grep: re.Pattern[str] | None, headers: bool, world: int | None) -> None:
        self.selection = selection
        self.grep = grep
        self.headers = headers
        self.world = world
        self.current: int | None = None

    def source(self, line: Line) -> str:
        if line.rank is None:
            return line.source
        return f"{line.source}/{line.rank}"

    def width(self, info: AttemptInfo | None) -> int:
        hosts = info.hosts if info else ()
        rank_digits = len(str(self.world - 1)) if self.world else 1
        return max([len(BATCH)] + [len(h) + 1 + rank_digits for h in hosts])

    def format(self, line: Line, info: AttemptInfo | None) -> str:
        if self.selection.rank is not None:
            return line.text
        if not self.selection.merged:
            return line.raw
        return f"{self.source(line):<{self.width(info)}} | {line.text}"

    def lines(self, lines: Iterable[Line], infos: dict[int, AttemptInfo]) -> Iterator[str]:
        for line in lines:
            if self.grep is not None and self.grep.search(line.text) is None:
                continue
            if self.headers and line.attempt != self.current:
                yield from self.open(infos.get(line.attempt) or AttemptInfo(line.attempt, None, (), None))
            self.current = line.attempt
            yield self.format(line, infos.get(line.attempt))

    def open(self, info: AttemptInfo) -> Iterator[str]:
        """The attempt's header, after a blank line when another attempt's lines came before."""
        if self.current is not None:
            yield ""
        self.current = info.number
        yield header(info)


def show(run: RunDir, chosen: list[AttemptInfo], selection: Selection, grep: re.Pattern[str] | None) -> Iterator[str]:
    """The lines of the chosen attempts as they are now; a header per attempt when there are several."""
    numbers = {info.number for info in chosen}
    reader = LogReader(run, selection, numbers.__contains__)
    lines = reader.poll(final=True)
    infos = {info.number: info for info in chosen}
    printer = Printer(selection, grep, headers=len(chosen) > 1, world=Layout.of(run).world)
    for info in chosen:
        if printer.headers:
            yield from printer.open(info)
        yield from printer.lines((line for line in lines if line.attempt == info.number), infos)


def run_over(run: RunDir, job_active: Callable[[], bool]) -> bool:
    """Has the run reached an end? Its history says it stopped, or no job of the run is left pending or running."""
    return history.read(run).stopped or not job_active()


def follow(
    run: RunDir,
    selection: Selection,
    first: int | None,
    grep: re.Pattern[str] | None,
    over: Callable[[], bool],
    poll_s: float = POLL_S,
    linger_s: float = LINGER_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[str]:
    """Lines as they are written, from attempt `first` on (None: the latest now, or the first to come).

    New attempts' node files and continuation jobs' batch logs are picked up
    as they appear; every attempt's lines open with its header. Ends once
    `over()` says the run has ended and the files have been read for
    `linger_s` more (the last log lines follow the end event).
    """
    if first is None:
        existing = list_attempts(run)
        first = existing[-1].number if existing else 1
    start = first
    reader = LogReader(run, selection, lambda n: n >= start)
    printer = Printer(selection, grep, headers=True, world=Layout.of(run).world)
    ended_at: float | None = None
    while True:
        if ended_at is None and over():
            ended_at = clock()
        final = ended_at is not None and clock() - ended_at >= linger_s
        lines = reader.poll(final=final)
        yield from printer.lines(lines, reader.infos)
        if final:
            return
        sleep(poll_s)
