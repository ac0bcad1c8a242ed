"""`clusterctl report RUN -o DIR`: the run's plots as an offline HTML page, its headline figures as text or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from clusterctl import rundir
from clusterctl.cli.app import err_console, out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.cli.remote_opts import RemoteOpt, remote_target, run_there
from clusterctl.cli.runarg import RootOpt, RunArg, resolve_run
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.syntax.units import format_figure

OutOpt = Annotated[
    Optional[Path], typer.Option("--output", "-o", help="directory for index.html and the PNGs (default: RUN/report)")
]


ATTEMPT_COLUMNS = {"attempt": "attempt", "job_id": "job", "nodes": "nodes", "exit_code": "exit", "meaning": "what it meant",
                   "steps": "steps"}


_f = format_figure


def _said(culprit: dict[str, Any], message: str) -> bool:
    """The verdict's message already names this culprit (its rank and host, or its host and reason)."""
    host, reason = str(culprit.get("host")), str(culprit.get("reason") or "")
    return f"rank {culprit.get('rank')} on {host}" in message or (host in message and reason in message)


def print_text(head: dict[str, Any]) -> None:
    """The headline figures on the terminal."""
    console = out_console()
    console.print(f"run {head['run']} ({head.get('name')})")
    if head.get("state"):
        console.print(f"state: {head['state']}" + (f" ({head['reason']})" if head.get("reason") else ""))
    goodput = head.get("goodput")
    if goodput is not None or head.get("lost_gpu_hours") is not None:
        console.print(f"goodput: {_f(goodput * 100 if isinstance(goodput, float) else None, '.1f')}%   "
                      f"lost GPU hours: {_f(head.get('lost_gpu_hours'))} of {_f(head.get('allocated_gpu_hours'))}   "
                      f"checkpoint: step {_f(head.get('checkpoint'))}")
    console.print(f"attempts: {head.get('attempts')}   last step: {_f(head.get('last_step'))}   "
                  f"final loss: {_f(head.get('final_loss'))}   validation loss: {_f(head.get('final_val_loss'))} "
                  f"(best {_f(head.get('best_val_loss'))})   median tokens/s: {_f(head.get('tokens_per_s_median'), '.4g')}")
    rows = head.get("attempts_table") or []
    if rows:
        table = Table(title="attempts", title_justify="left")
        for label in ATTEMPT_COLUMNS.values():
            table.add_column(label)
        for r in rows:
            table.add_row(*(_f(r.get(key)) for key in ATTEMPT_COLUMNS))
        console.print(table)
    per = head.get("step_time_s") or {}
    if per:
        table = Table(title=f"step time per rank, steady (first {head.get('warmup_steps_per_attempt')} steps of each attempt "
                      "are warm-up)", title_justify="left")
        for col in ("rank", "p50 s", "p90 s", "max s", "steps"):
            table.add_column(col, justify="right")
        for rank, f in per.items():
            table.add_row(rank, _f(f["p50"]), _f(f["p90"]), _f(f["max"]), str(f["steady_steps"]))
        console.print(table)
    slow = head.get("slowest_rank")
    if slow:
        console.print(f"slowest rank by {slow['by']}: {slow['rank']} ({_f(slow['seconds'])} s,"
                      f" {_f(slow['vs_median'])}x the median rank's)")
    for v in head.get("verdicts") or []:
        message = str(v.get("message") or "")
        culprits = "; ".join(f"rank {c.get('rank')} on {c.get('host')}" + (f": {c['reason']}" if c.get("reason") else "")
                             for c in v.get("culprits") or []
                             if not _said(c, message))  # each sentence once
        status = v.get("status") or ("ok" if v.get("ok") else "failed")  # ok, failed or cancelled
        console.print(f"attempt {v['attempt']} verdict: {status} (code {_f(v.get('code'))}) {message}"
                      + (f"; culprits: {culprits}" if culprits else ""))
    for note in head.get("notes") or []:
        console.print(f"note: {note}")
    if head.get("index"):
        console.print(f"report: {head['index']}")


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(ctx: typer.Context, run: RunArg, output: OutOpt = None, as_json: JsonOpt = False, root: RootOpt = None,
               remote: RemoteOpt = None) -> None:
        """Write the run's report: index.html with loss, step-time, heatmap, throughput, attempts and phase plots.

        The page works offline from disk. The same headline figures are printed
        (per-rank step time p50/p90/max over the steady interval, goodput, lost
        GPU hours, verdicts with culprits); --json prints them as JSON.
        """
        if where := remote_target(remote):
            run_there(where, ctx)  # the page is written on the login node
        from clusterctl.views import report as reportlib  # noqa: PLC0415 - numpy only when reporting

        target = resolve_run(run, root)
        collected = reportlib.collect(target)
        out = output if output is not None else target.path / rundir.REPORT_DIR
        try:
            head = reportlib.write(collected, out)
        except ClusterctlError as exc:
            if exc.exit_code == ExitCode.BACKEND_UNAVAILABLE:  # no matplotlib: the figures still help
                _show(dict(collected.headline), as_json)
                err_console.print("the figures are above; the HTML page and its plots were not written")
            raise
        _show(head, as_json)


def _show(head: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(head, indent=1, sort_keys=True, default=str))
    else:
        print_text(head)
