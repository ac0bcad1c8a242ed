"""Suspect nodes: nodes a verdict blamed, remembered across runs in the runs root.

One JSON line per event in `<runs root>/suspects.jsonl`, appended and never
rewritten, so many jobs (and `clusterctl suspects --clear`) can write it at
once: each line goes out in one O_APPEND write, which a local filesystem
keeps whole. A blame is `{node, reason, code, run, time, evidence}` (evidence:
the word of rundir/verdict.EVIDENCE that pointed at the node, such as
`stopped`, `slow` or `repeated`; older lines have none) (plus `drill: true`
when `clusterctl drill` caused it: such blames are listed, not avoided by
later submissions unless they ask, `topology.avoid_drill_suspects`); a clear is
`{node, cleared: true, time, by}` and forgives every blame of that node
appended before it (a blame appended later makes the node a suspect again).
Readers skip lines they cannot use (a torn tail, another tool's lines).

Standard library only: the recovery path on the compute nodes records here.
"""

from __future__ import annotations

import errno
import getpass
import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from clusterctl.rundir.jsonio import new_file_mode

FILE = "suspects.jsonl"  # in the runs root (the parent directory of every run directory)
DRAIN_TIMEOUT_S = 30.0
REASON_MAX = 500  # characters: keeps each line one small write
PLACEHOLDERS = ("node", "reason", "run")
_PLACEHOLDER = re.compile(r"\{(node|reason|run)\}")


@dataclass(frozen=True)
class Suspect:
    """One blame: which node, why (reason text and exit code), in which run, when (epoch seconds)."""

    node: str
    reason: str
    code: int
    run: str  # the run id (the run directory's name)
    time: float
    drill: bool = False  # caused by `clusterctl drill`: a fault injected on purpose, not the node's
    evidence: str = ""  # what pointed at the node (a word of rundir/verdict.EVIDENCE); "" in lines written before it


@dataclass(frozen=True)
class Cleared:
    """Someone's word that a node is fine again: the blames appended before this no longer count."""

    node: str
    time: float
    by: str


@dataclass(frozen=True)
class NodeRecord:
    """What the file says about one node: its latest blame, how many there were, a clear since then."""

    latest: Suspect
    blames: int
    cleared: Cleared | None  # a clear appended after the latest blame

    def until(self, exclude_for_s: float) -> float:
        """When the node stops being avoided (its latest blame plus the window)."""
        return self.latest.time + exclude_for_s

    def active(self, exclude_for_s: float, now: float) -> bool:
        """Still avoided: blamed within the window and not cleared since."""
        return exclude_for_s > 0 and self.cleared is None and now < self.until(exclude_for_s)


def path(runs_root: Path) -> Path:
    """The suspects file of a runs root."""
    return Path(runs_root) / FILE


def _open(runs_root: Path, flags: int) -> int:
    """The suspects file, never through a link and only when it is this user's: in a runs root others can write to
    (a sticky 1777 one) a planted link would take the appends elsewhere, and another's file its own node list."""
    fd = os.open(path(runs_root), flags | os.O_NOFOLLOW | os.O_CLOEXEC, new_file_mode(Path(runs_root)))
    owner = os.fstat(fd).st_uid
    if owner != os.geteuid():
        os.close(fd)
        raise PermissionError(errno.EPERM, f"it is owned by uid {owner}, not this user's (uid {os.geteuid()})")
    return fd


def _append(runs_root: Path, entries: list[dict[str, Any]]) -> None:
    """One write per line on an O_APPEND descriptor, so concurrent writers interleave whole lines only."""
    Path(runs_root).mkdir(parents=True, exist_ok=True)
    fd = _open(runs_root, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        for entry in entries:
            data = (json.dumps(entry, sort_keys=True) + "\n").encode()
            written = os.write(fd, data)
            while written < len(data):  # a short write on a regular file: disk full or a signal
                written += os.write(fd, data[written:])
    finally:
        os.close(fd)


def drain_argv(drain_command: list[str], suspect: Suspect) -> list[str]:
    """The hook's argv for one suspect: {node}, {reason}, {run} replaced in one pass inside each item."""
    values = {"node": suspect.node, "reason": suspect.reason, "run": suspect.run}
    return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], arg) for arg in drain_command]


def _run_hook(argv: list[str], node: str) -> str:
    shown = " ".join(argv)
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=DRAIN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"suspect {node}: drain hook `{shown}` did not finish in {DRAIN_TIMEOUT_S:.0f} s and was killed"
    except OSError as exc:
        return f"suspect {node}: drain hook `{shown}` could not run: {exc.strerror or exc}"
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        tail = f": {said[-1]}" if said else ""
        return f"suspect {node}: drain hook `{shown}` failed with exit code {done.returncode}{tail}"
    return f"suspect {node}: drain hook `{shown}` ran"


def record(runs_root: Path, found: list[Suspect], drain_command: list[str] | None = None) -> list[str]:
    """Remember each blamed node, then run the site's drain hook once per suspect when one is given.

    Never raises for the file or the hook: the recovery path calling this must
    go on, so a failure comes back as one of the returned lines to log.
    """
    messages: list[str] = []
    if found:
        try:
            _append(runs_root, [_blame_line(s) for s in found])
        except OSError as exc:
            names = ", ".join(s.node for s in found)
            messages.append(f"cannot record suspect nodes {names} in {path(runs_root)}: {exc.strerror or exc}")
    if drain_command:
        for suspect in found:
            messages.append(_run_hook(drain_argv(drain_command, suspect), suspect.node))
    return messages


def _blame_line(s: Suspect) -> dict[str, Any]:
    line = {**asdict(s), "reason": s.reason[:REASON_MAX]}
    if not s.drill:
        line.pop("drill")  # the lines every other blame has always had
    if not s.evidence:
        line.pop("evidence")
    return line


def clear(runs_root: Path, nodes: list[str], now: float | None = None, by: str | None = None) -> None:
    """Forgive the nodes' blames so far (OSError when the runs root cannot be written)."""
    when = time.time() if now is None else now
    who = by if by is not None else _user()
    _append(runs_root, [{**asdict(Cleared(node, when, who)), "cleared": True} for node in nodes])


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN


def _parse(line: str) -> Suspect | Cleared | None:
    """One line as an event, or None for anything else (torn, foreign, wrong types)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("node"), str) or not data["node"]:
        return None
    if not _number(data.get("time")):
        return None
    if data.get("cleared") is True:
        by = data.get("by")
        return Cleared(data["node"], float(data["time"]), by if isinstance(by, str) else "")
    code, reason, run = data.get("code"), data.get("reason"), data.get("run")
    if not (isinstance(code, int) and not isinstance(code, bool) and isinstance(reason, str) and isinstance(run, str)):
        return None
    evidence = data.get("evidence")
    return Suspect(data["node"], reason, code, run, float(data["time"]), data.get("drill") is True,
                   evidence if isinstance(evidence, str) else "")


def read(runs_root: Path) -> list[Suspect | Cleared]:
    """Every usable event in file order; none when there is no file (or it cannot be read, is a link or is not this
    user's: `_open`)."""
    try:
        with os.fdopen(_open(runs_root, os.O_RDONLY), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return []
    return [event for event in map(_parse, text.splitlines()) if event is not None]


def nodes(runs_root: Path, drills: bool = True) -> dict[str, NodeRecord]:
    """Per node ever blamed, by name: its latest blame, the count, and a clear appended after that blame.
    `drills=False` leaves out the blames drills caused.

    Order in the file decides, not the clocks of the machines that wrote the
    lines: the latest blame is the last one appended, and a clear forgives
    everything appended before it.
    """
    latest: dict[str, Suspect] = {}
    counts: dict[str, int] = {}
    cleared: dict[str, Cleared] = {}
    for event in read(runs_root):
        if isinstance(event, Cleared):
            cleared[event.node] = event
            continue
        if event.drill and not drills:
            continue
        counts[event.node] = counts.get(event.node, 0) + 1
        cleared.pop(event.node, None)
        latest[event.node] = event
    return {node: NodeRecord(s, counts[node], cleared.get(node)) for node, s in sorted(latest.items())}


def active(runs_root: Path, exclude_for_s: float, now: float | None = None, drills: bool = False) -> dict[str, Suspect]:
    """Nodes blamed within the last exclude_for_s seconds and not cleared since: node -> its latest blame.
    A drill's blames count only with `drills` (a fault injected on purpose says nothing about the node)."""
    if exclude_for_s <= 0:
        return {}
    when = time.time() if now is None else now
    return {node: rec.latest for node, rec in nodes(runs_root, drills).items() if rec.active(exclude_for_s, when)}


def forgiven(runs_root: Path, since: dict[str, float]) -> set[str]:
    """Of the nodes a run avoids (node -> when it began to: history's excluded_since), those cleared since
    (`clusterctl suspects --clear`, or an attempt that ended well on them): the run may use them again. A node
    never blamed here (a spec's exclude, `requeue --exclude`) stays avoided."""
    records = nodes(runs_root)
    return {node for node, began in since.items()
            if (rec := records.get(node)) is not None and rec.cleared is not None and rec.cleared.time >= began}
