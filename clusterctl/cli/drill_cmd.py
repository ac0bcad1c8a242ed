"""`clusterctl drill RUN`: inject a real fault into a running job and check that it is detected.

The drill itself is clusterctl.qualify.faultdrill (the qualification ladder
runs it in-process too); this is its command line: the options, the report
in words (or --json), and the exit code (3 when the drill missed).
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from typing import Annotated, Any, Callable, Optional

import typer

from clusterctl.cli.app import err_console, out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.cli.remote_opts import RemoteOpt, remote_target, run_there
from clusterctl.cli.runarg import RootOpt, RunArg, resolve_run
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.qualify.faultdrill import choose_fault, passed, run_drill


def describe_culprit(c: dict[str, Any]) -> str:
    text = f"rank {c.get('rank')} on {c.get('host')}" if c.get("rank") is not None else f"{c.get('host')}"
    return text + (f" ({c['reason']})" if c.get("reason") else "")


def print_report(report: dict[str, Any], what: str) -> None:
    console = out_console()
    when = time.strftime("%H:%M:%S", time.localtime(report["injected_at"]))
    console.print(f"fault: {what}, injected at {when} (attempt {report['attempt']})")
    expected = report["expected_code"]
    if report["detected"]:
        name = report["verdict"] or ExitCode(expected).name.lower()
        after = f" after {report['seconds']:.1f} s" if report["seconds"] is not None else ""
        console.print(f"detected: yes, {name} ({report['code']}){after}")
    elif report["code"] is not None:
        after = f" after {report['seconds']:.1f} s" if report["seconds"] is not None else ""
        console.print(f"detected: no, code {report['code']}{after}; expected {expected}")
    else:
        console.print(f"detected: no, {report['note'] or 'no verdict'}; expected {expected}")
    if report["culprit_right"] is not None:
        blamed = "; ".join(describe_culprit(c) for c in report["culprits"][:4]) or "nobody"
        if len(report["culprits"]) > 4:
            blamed += f"; and {len(report['culprits']) - 4} more"
        console.print(f"culprit: {'right' if report['culprit_right'] else 'wrong'}, blamed {blamed}")
    console.print(f"victims: {len(report['victims'])}")
    if report["message"]:
        console.print(f"message: {report['message']}")
    console.print("drill passed" if passed(report) else "drill missed")


@contextlib.contextmanager
def _sigterm_interrupts() -> Any:
    """A SIGTERM to the drill ends it like Ctrl-C does: through the clean-up (no frozen rank left behind)."""
    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(app: typer.Typer) -> None:
    @app.command("drill")
    def drill(
        ctx: typer.Context,
        run: RunArg,
        hang: Annotated[Optional[int], typer.Option("--hang", metavar="RANK", help="SIGSTOP a rank")] = None,
        slow: Annotated[
            Optional[str], typer.Option("--slow", metavar="RANK:FACTOR[:PERIOD]",
                                        help="run a rank FACTOR times slower, stopped in cycles of PERIOD s (0.1)")
        ] = None,
        kill: Annotated[Optional[int], typer.Option("--kill", metavar="RANK", help="SIGKILL a rank")] = None,
        node: Annotated[
            Optional[str], typer.Option("--node", metavar="NODE", help="kill every process of the job on a node")
        ] = None,
        pre_timeout: Annotated[
            bool, typer.Option("--pre-timeout", help="send the job's pre-timeout signal to its batch script")
        ] = False,
        timeout: Annotated[
            float, typer.Option("--timeout", metavar="S", help="seconds to wait for the ranks, then for the verdict")
        ] = 300.0,
        as_json: JsonOpt = False,
        root: RootOpt = None,
        remote: RemoteOpt = None,
    ) -> None:
        """Inject a fault into a running job and check that it is detected, blamed right, and how fast.

        Exits 0 when the expected verdict names the right rank or node, 3 when it does not.
        """
        if where := remote_target(remote):
            run_there(where, ctx)
        fault, target, factor, period = choose_fault(hang, slow, kill, node, pre_timeout)
        if not timeout > 0:
            raise ClusterctlError(f"--timeout must be positive, got {timeout:g}", ExitCode.USAGE)
        path = resolve_run(run, root)
        console = out_console()
        show: Callable[[str], None] = (lambda _line: None) if as_json else (lambda line: console.print(line))
        with _sigterm_interrupts():
            report = run_drill(path, fault, target, factor, timeout, show, warn=lambda line: err_console.print(line),
                               period=period)
        if as_json:
            typer.echo(json.dumps({k: v for k, v in report.items() if k != "what"}))
        else:
            print_report(report, report["what"])
        if not passed(report):
            raise typer.Exit(int(ExitCode.DRILL_MISSED))
