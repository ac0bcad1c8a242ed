"""Follow a submitted job until it ends, showing progress: state, attempt, step and loss."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clusterctl import rundir
from clusterctl.backends import Backend, JobInfo
from clusterctl.rundir import RunDir


@dataclass(frozen=True)
class Outcome:
    info: JobInfo | None
    exit_code: int | None
    verdict: dict[str, Any] | None
    summary: str


def last_line(path: Any) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 4096))
            lines = fh.read().decode(errors="replace").strip().splitlines()
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def progress(run: RunDir) -> str:
    """One line: the latest attempt and the trainer's latest step."""
    attempts = run.attempts()
    if not attempts:
        return "waiting for the first attempt"
    n = attempts[-1]
    record = last_line(run.attempt(n) / rundir.METRICS)
    if record is None:
        verdict = run.attempt(n) / rundir.VERDICT
        return f"attempt {n}: " + ("ranks running" if verdict.exists() else "starting ranks (preflight, rendezvous)")
    text = f"attempt {n}: step {record['step']}, loss {record['loss']:.4f}"
    if "val_loss" in record:
        text += f", validation {record['val_loss']:.4f}"
    return text


def _decisions(run: RunDir) -> list[dict[str, Any]]:
    return [e for e in run.events() if e.get("event") == rundir.EVENT_NEXT and e.get("attempt")]


def continued_as(run: RunDir, job_id: str) -> str | None:
    """The job that continues the run after `job_id` ended (the batch script's `next` event), if any."""
    job = None
    for event in run.events():
        if event.get("event") == rundir.EVENT_NEXT and str(event.get("job_id")) == str(job_id):
            job = str(event["next_job"]) if event.get("how") == rundir.NEXT_CONTINUATION and event.get("next_job") else None
    return job


def run_exit(run: RunDir) -> int | None:
    """The run's exit code so far: the latest `end` or `next` event that states one."""
    code = None
    for event in run.events():
        if event.get("event") in (rundir.EVENT_END, rundir.EVENT_NEXT) and isinstance(event.get("exit"), int):
            code = event["exit"]
    return code


def follow(backend: Backend, job_id: str, run: RunDir, show: Callable[[str], None], every_s: float = 1.0) -> Outcome:
    """Poll until the run stops, following its continuation jobs; `show` gets each changed progress line."""
    shown = ""
    told = len(_decisions(run))  # decisions made before we started following are old news
    info: JobInfo | None = None
    while True:
        info = backend.info(job_id)
        for event in _decisions(run)[told:]:  # why the next attempt begins, or why the run stops
            told += 1
            show(f"attempt {event.get('attempt')} ended with exit {event.get('exit')}: {event.get('reason')}")
        line = f"{info.state if info else 'UNKNOWN'}: {progress(run)}"
        if line != shown:
            show(line)
            shown = line
        if info is None or info.finished:
            nxt = continued_as(run, job_id)
            if nxt is None:
                break
            show(f"job {backend.display_id(job_id)} ended; the run continues as job {backend.display_id(nxt)}")
            job_id = nxt
            continue
        time.sleep(every_s)
    attempts = run.attempts()
    verdict = None
    if attempts:
        path = run.attempt(attempts[-1]) / rundir.VERDICT
        if path.exists():
            verdict = json.loads(path.read_text())
    code = info.exit_code if info else None
    recorded = run_exit(run)
    if recorded is not None:
        code = recorded
    summary = f"job {backend.display_id(job_id)} {info.state if info else 'gone'} with exit code {code}"
    if verdict and not verdict.get("ok", True):
        summary += f": {verdict['message']}"
    return Outcome(info, code, verdict, summary)
