"""How a run's state reads on a terminal: one line for `submit --wait`, one screen for `status`, a table for `runs`."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import jobid
from clusterctl.syntax import hostlist
from clusterctl.views.state import CANCELLED, COMPLETED, DRY_RUN, FAILED, PENDING, RESTARTING, STOPPING, TRAINING, Attempt, RunState
from clusterctl.views.statetext import culprits, duration, progress

STYLES = {COMPLETED: "green", FAILED: "bold red", CANCELLED: "yellow", TRAINING: "cyan", RESTARTING: "magenta", STOPPING: "red", PENDING: "blue",
          DRY_RUN: "dim"}


def clock(epoch: float | None, now: float | None = None) -> str:
    """Local time of day; the date too when it is not today."""
    if epoch is None:
        return "-"
    today = time.strftime("%Y-%m-%d", time.localtime(now if now is not None else time.time()))
    day = time.strftime("%Y-%m-%d", time.localtime(epoch))
    return time.strftime("%H:%M:%S" if day == today else "%Y-%m-%d %H:%M", time.localtime(epoch))


def ago(epoch: float | None, now: float | None = None) -> str:
    if epoch is None:
        return "-"
    return f"{duration(max(0.0, (now if now is not None else time.time()) - epoch))} ago"


def _nodes(a: Attempt) -> str:
    try:
        return hostlist.compress(a.nodes) if a.nodes else "-"
    except ValueError:
        return ",".join(a.nodes)


def _steps(a: Attempt) -> str:
    if not a.steps:
        return "-"  # none reported (a command that is no training loop, or one that never got to its first step)
    return f"{a.first_step}-{a.last_step}" + ("" if a.kept_steps == a.steps else f" ({a.kept_steps} kept)")


def short_meaning(a: Attempt) -> str:
    """A word or two for the table (`script failed`, `hang`, `cancelled`); the full meaning is in --json."""
    if a.cancelled_by:
        return "cancelled"
    if a.exit_code is None:
        return a.meaning if a.end is None else "no end recorded"
    try:
        return ExitCode(a.exit_code).name.lower().replace("_", " ")
    except ValueError:
        return f"exit {a.exit_code}"


def goodput_line(st: RunState) -> str:
    """Where the allocated GPU time went: useful steps (goodput), start-up, lost work, the rest."""
    total = st.allocated_gpu_hours or 0.0
    if st.goodput is None:  # without steps nothing tells start-up from work: no shares to give
        return f"{total:.3f} GPU-hours, goodput unknown (no training step reported)"
    head = f"goodput {st.goodput:.1%} of {total:.3f} GPU-hours"

    def share(hours: float | None) -> str:
        return f"{(hours or 0.0) / total:.1%}" if total else "-"

    return f"{head}: start-up {share(st.startup_gpu_hours)}, lost {share(st.lost_gpu_hours)}, other {share(st.other_gpu_hours)}"


def width_words(width: dict[str, object]) -> str:
    """An elastic change of width in a few words: `dp 4 → 3`."""
    dp = width.get("dp")
    if isinstance(dp, list) and len(dp) == 2:
        return f"dp {dp[0]} → {dp[1]}"
    nodes = width.get("nodes")
    return f"nodes {nodes[0]} → {nodes[1]}" if isinstance(nodes, list) and len(nodes) == 2 else ""


NEXT_WORDS = {"allocation": "restart", "continuation": "job", "requeue": "requeue", "slurm": "requeue", "stop": "stop"}


WRAPPED = ("start", "meaning", "steps", "then")  # what wraps on a narrow terminal: between words, never inside one


def attempts_table(st: RunState, now: float | None = None) -> Table:
    rows = []
    for a in st.attempts:
        then = NEXT_WORDS.get(a.next or "", a.next or "") + (f" {jobid.display(a.next_job, st.backend)}" if a.next_job else "")
        then += f" {width_words(a.width)}" if a.width else ""
        rows.append((str(a.attempt), jobid.display(a.job_id, st.backend) or "-", _nodes(a), clock(a.start, now),
                     duration((a.end or (now if now is not None else time.time())) - a.start) if a.start else "-",
                     "-" if a.exit_code is None else str(a.exit_code), short_meaning(a), _steps(a), then))
    table = Table(box=None, pad_edge=False, header_style="bold")
    for i, column in enumerate(("#", "job", "nodes", "start", "took", "exit", "meaning", "steps", "then")):
        words = [w for row in rows for w in row[i].split()] + [column]
        table.add_column(column, overflow="fold", no_wrap=column not in WRAPPED,
                         min_width=max(map(len, words)) if column in WRAPPED else None)
    for row in rows:
        table.add_row(*row)
    return table


def verdict_lines(st: RunState) -> list[Text]:
    """Each attempt's verdict in full, under the table where it has room."""
    return [Text(f"  attempt {a.attempt}: {a.verdict}") for a in st.attempts
            if a.verdict and a.verdict not in (st.reason or "")]  # the headline said it already


def run_screen(st: RunState, now: float | None = None) -> RenderableType:
    """Everything `status RUN` shows about one run."""
    head = Text.assemble((st.run, "bold"), "  ", (st.state, "bold " + STYLES.get(st.state, "")))
    if st.reason:
        head.append(f"  {st.reason}")
    if st.state in (FAILED, RESTARTING, STOPPING):
        head.append(culprits(st))
    facts = [f"job {st.job_id or '-'}"]
    if progress(st):
        facts.append(progress(st))
    facts.append(f"checkpoint step {st.checkpoint}" if st.checkpoint is not None else "no committed checkpoint")
    if st.grow_job:
        facts.append(f"full-size job {jobid.display(st.grow_job, st.backend)} queued to grow back")
    if st.allocated_gpu_hours:
        facts.append(goodput_line(st))
    facts.append(f"last change {ago(st.last_change, now)}")
    parts: list[RenderableType] = [head, Text("  " + " · ".join(facts))]
    if st.attempts:
        parts.append(attempts_table(st, now))
        parts.extend(verdict_lines(st))
    parts.append(Text(f"  {st.path}", style="dim"))
    return Group(*parts)


def runs_table(states: list[RunState], now: float | None = None) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("run", "state", "step", "tries", "changed", "reason"):
        table.add_column(column, overflow="fold", no_wrap=column != "reason", ratio=1 if column == "reason" else None)
    for st in states:
        step = "-" if st.step is None else str(st.step) + (f"/{st.total_steps}" if st.total_steps else "")
        table.add_row(st.run, Text(st.state, style=STYLES.get(st.state, "")), step, str(len(st.attempts)),
                      ago(st.last_change or st.submitted, now).removesuffix(" ago"), st.reason)
    return table


# `runs --json`: these keys of a run's state, `attempts` being their count (the reference lists them from here)
RUNS_JSON_KEYS = ("run", "name", "path", "state", "reason", "step", "attempts", "job_id", "last_change", "submitted")


def runs_json(st: RunState) -> dict[str, object]:
    out = {key: getattr(st, key) for key in RUNS_JSON_KEYS}
    out.update(path=str(st.path), attempts=len(st.attempts))
    return out
