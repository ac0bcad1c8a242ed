"""`clusterctl qualify SPEC -o DIR`: the validation ladder, as real jobs, ending in a report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from clusterctl.backends import BACKENDS
from clusterctl.cli.app import err_console, out_console
from clusterctl.cli.options import JsonOpt, SetOpt, SiteOpt, SpecArg
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.qualify import RUNGS


def _counts(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ClusterctlError(f"--node-counts {text!r}: expected node counts such as 1,2,4", ExitCode.USAGE)
    return counts


def register(app: typer.Typer) -> None:
    @app.command("qualify")
    def qualify_cmd(
        spec: SpecArg,
        out: Annotated[Path, typer.Option("--output", "-o", metavar="DIR", help="directory for report.json, index.html and the rungs' runs")],
        site: SiteOpt = None,
        set_: SetOpt = None,
        start: Annotated[Optional[str], typer.Option("--from", metavar="RUNG", help="start at this rung (none before it runs),"
                                                     " e.g. where an earlier run stopped")] = None,
        up_to: Annotated[Optional[str], typer.Option("--up-to", metavar="RUNG", help=f"stop after this rung: {', '.join(RUNGS)}")] = None,
        nodes: Annotated[Optional[str], typer.Option("--node-counts", metavar="N,N,...", help="node counts of the scaling rung, e.g. 1,2,4")] = None,
        backend: Annotated[Optional[str], typer.Option("--backend", "-b", help=f"one of {', '.join(BACKENDS)}")] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Run the validation ladder (worker, node, comm, nvlink, boundary, scaling, data, restart, failure, long, report)
        as real jobs; stops at the first rung that fails (exit 4) and always writes DIR/report.json and index.html."""
        for flag, rung in (("--from", start), ("--up-to", up_to)):
            if rung is not None and rung not in RUNGS:
                raise ClusterctlError(f"{flag} {rung!r}: expected one of {', '.join(RUNGS)}", ExitCode.USAGE)
        from clusterctl.qualify.ladder import qualify

        show = (lambda line: err_console.print(line)) if as_json else (lambda line: out_console().print(line))
        report = qualify(spec, site, backend, out, up_to, _counts(nodes), show, set_ or [], start)
        if as_json:
            print(json.dumps(report, indent=1, default=str))
        else:
            q = report["quality"]
            out_console().print(
                f"{('PASSED' + (f' from {start}' if start else '') + (f' up to {up_to}' if up_to and up_to != 'report' else '')) if report['passed'] else 'STOPPED at ' + str(report['stopped_at'])}: quality target"
                f" {q.get('target')} {'reached in ' + str(q.get('time_to_target_s')) + ' s' if q.get('reached') else 'not reached'};"
                f" report {out / 'index.html'}"
            )
        if report["stopped_at"]:
            raise typer.Exit(int(ExitCode.QUALIFY_FAILED))
