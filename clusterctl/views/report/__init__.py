"""`clusterctl report`: a run's plots and headline figures, as an offline HTML page and as text.

Split by job: load.py and timeline.py read the run directory (fast: a
100,000-step run's timeline has millions of lines), stats.py computes the
figures, plots.py draws the PNGs (matplotlib, the optional `report` extra),
page.py writes index.html, runinfo.py brings in the run's state and record,
synth.py writes synthetic runs for tests and benchmarks.

Warm-up is the first WARMUP_STEPS (5) steps of each attempt: shown in the
plots, left out of the steady per-rank p50/p90/max.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir
from clusterctl.views.report import runinfo
from clusterctl.views.report.load import RunData, load_run
from clusterctl.views.report.stats import WARMUP_STEPS, Figures, figures, headline

__all__ = ["WARMUP_STEPS", "Report", "build_report", "collect", "write"]


@dataclass
class Report:
    data: RunData
    figures: Figures
    headline: dict[str, Any]
    state: dict[str, Any] | None
    attempts: list[dict[str, Any]]
    record: dict[str, Any] | None
    record_source: str


def _own_attempts(data: RunData) -> list[dict[str, Any]]:
    """The attempts table from the run directory alone, where clusterctl.views.state cannot give it."""
    rows = []
    for a in data.attempts:
        steps = int(a.metrics.step.size)
        rows.append({"attempt": a.number, "job_id": a.job_id, "nodes": ",".join(a.hosts), "start": a.start, "end": a.end,
                     "exit_code": a.exit_code, "meaning": a.meaning,
                     "steps": steps})
    return rows


def collect(run: RunDir) -> Report:
    """Read the run and compute every figure; needs no matplotlib."""
    data = load_run(run)
    fig = figures(data)
    head = headline(data, fig)
    state, why = runinfo.run_state(run)
    if state is not None:
        head.update(runinfo.summary(state))
        attempts = runinfo.attempts_table(state)
    else:
        head["state_note"] = why
        attempts = _own_attempts(data)
    head["attempts_table"] = attempts
    record, source = runinfo.run_record(run)
    return Report(data, fig, head, state, attempts, record, source)


def write(report: Report, out: Path) -> dict[str, Any]:
    """Draw the plots and write index.html into `out`; returns the headline with the files written."""
    from clusterctl.views.report import page, plots  # noqa: PLC0415 - plots imports matplotlib lazily

    plots.require()  # before anything is written: no half-made report directory without matplotlib
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ClusterctlError(f"cannot create the report directory {out}: {exc.strerror}", ExitCode.USAGE) from None
    if not out.is_dir():
        raise ClusterctlError(f"{out} is not a directory", ExitCode.USAGE)
    submitted = report.state.get("submitted") if report.state else None
    files = plots.draw_all(report.data, report.figures, out, submitted if isinstance(submitted, (int, float)) else None)
    text = page.render(report.headline, report.state, report.attempts, report.record, report.record_source)
    index = out / "index.html"
    try:
        index.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ClusterctlError(f"cannot write {index}: {exc.strerror}", ExitCode.USAGE) from None
    head = dict(report.headline)
    head["index"] = str(index)
    head["files"] = files
    return head


def build_report(run: RunDir, out: Path) -> dict[str, Any]:
    """The whole report of `run` into directory `out` (index.html and PNGs); returns the headline figures."""
    return write(collect(run), Path(out))
