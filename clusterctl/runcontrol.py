"""Stopping and continuing a whole run by hand: `clusterctl cancel` and `clusterctl requeue`.

A run outlives its jobs, so both act on every job the run has had (the
submitted one, continuations, requeues), read from state.json and
attempts.jsonl. The run's own marker (rundir.CANCEL) is what makes a cancel
final: the batch script's recovery step reads it before it starts an
attempt and before it submits a continuation, so a job that is already
deciding cannot bring the run back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clusterctl import hostlist, rundir
from clusterctl.backends import Backend, JobInfo, get_backend
from clusterctl.errors import ClusterctlError, ConfigError, Problem
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, read_json, write_json_atomic
from clusterctl.runtime.nextattempt import avoided

POLL_S = 0.5
PROGRESS_EVERY_S = 5.0
LAYOUT_FIXED = ("tp", "pp", "cp", "ep")  # a checkpoint's shards follow these; dp only replicates


@dataclass
class Report:
    """What a cancel or requeue did, for the terminal and for --json."""

    run: str
    cancelled: list[str] = field(default_factory=list)  # jobs cancelled outright
    stopped: list[str] = field(default_factory=list)  # running jobs asked to save and stop, that did
    submitted: str | None = None  # requeue: the new job
    exclude: list[str] = field(default_factory=list)
    resume_step: int | None = None  # requeue: the committed checkpoint the new job resumes from
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _load_obj(path: Path) -> dict[str, Any]:
    return read_json(path) or {}


def backend_of(run: RunDir) -> Backend:
    name = run.read_state().get("backend")
    if name not in ("local", "slurm"):
        raise ClusterctlError(
            f"run {run.path.name} was never submitted (state.json has no backend): nothing to act on", ExitCode.USAGE
        )
    return get_backend(name)


def run_jobs(run: RunDir) -> list[str]:
    """Every job id the run has had, oldest first (the scheduler's own ids)."""
    ids: list[str] = []
    submitted = run.read_state().get("job_id")
    if submitted:
        ids.append(str(submitted).removeprefix("local-"))
    for event in run.events():
        for key in ("job_id", "next_job"):
            value = event.get(key)
            if value not in (None, ""):
                ids.append(str(value).removeprefix("local-"))
    return list(dict.fromkeys(ids))


def active_jobs(run: RunDir, backend: Backend) -> list[JobInfo]:
    found = []
    for job_id in run_jobs(run):
        info = backend.info(job_id)
        if info is not None and not info.finished:
            found.append(info)
    return found


def wait_ended(backend: Backend, job_ids: list[str], timeout: float, show: Callable[[str], None]) -> list[str]:
    """Wait until the jobs have ended; the ones still running at the timeout."""
    start = time.monotonic()
    shown = 0.0
    while True:
        left = [j for j in job_ids if (info := backend.info(j)) is not None and not info.finished]
        elapsed = time.monotonic() - start
        if not left or elapsed >= timeout:
            return left
        if elapsed - shown >= PROGRESS_EVERY_S:
            show(f"{elapsed:.0f} s: waiting for job{'s' if len(left) > 1 else ''} {', '.join(backend.display_id(j) for j in left)} to save and stop")
            shown = elapsed
        time.sleep(POLL_S)


def _signal_name(run: RunDir) -> str:
    run_json = _load_obj(run.run_json)
    return str((run_json.get("signal") or {}).get("name") or "USR2")


def stop_jobs(
    run: RunDir, backend: Backend, save: bool, timeout: float, show: Callable[[str], None], report: Report
) -> None:
    """Pending jobs are cancelled; running ones save first when asked (the pre-timeout signal), else are cancelled."""
    for info in active_jobs(run, backend):
        if save and info.state == "RUNNING":
            backend.signal(info.job_id, _signal_name(run))
            show(f"asked job {backend.display_id(info.job_id)} to save a checkpoint and stop")
            left = wait_ended(backend, [info.job_id], timeout, show)
            if left:
                report.notes.append(f"job {backend.display_id(info.job_id)} did not stop within {timeout:g} s: cancelled")
                backend.cancel(info.job_id)
                report.cancelled.append(backend.display_id(info.job_id))
            else:
                report.stopped.append(backend.display_id(info.job_id))
        else:
            backend.cancel(info.job_id)
            report.cancelled.append(backend.display_id(info.job_id))
    # A running job cancelled outright may still be deciding: its marker-aware recovery step submits
    # nothing, and anything it submitted before the marker appeared is caught here.
    for _ in range(3):
        late = active_jobs(run, backend)
        if not late:
            break
        for info in late:
            backend.cancel(info.job_id)
            report.cancelled.append(backend.display_id(info.job_id))
        time.sleep(POLL_S)


def cancel_run(run: RunDir, save: bool, timeout: float, show: Callable[[str], None], by: str = "clusterctl cancel") -> Report:
    """Stop the whole run: its running job, any pending continuation, every future restart."""
    backend = backend_of(run)
    write_json_atomic(run.path / rundir.CANCEL, {"time": time.time(), "save": save, "by": by})
    run.append_event(rundir.EVENT_CANCEL, by=by, save=save)
    report = Report(run.path.name)
    stop_jobs(run, backend, save, timeout, show, report)
    report.cancelled = list(dict.fromkeys(report.cancelled))
    return report


# --- requeue -------------------------------------------------------------------------
def last_culprit_nodes(run: RunDir) -> list[str]:
    """The nodes the latest verdict blamed."""
    for n in reversed(run.attempts()):
        verdict = _load_obj(run.attempt(n) / rundir.VERDICT)
        if verdict:
            if verdict.get("ok", True):
                return []
            return list(dict.fromkeys(str(c["host"]) for c in verdict.get("culprits") or [] if isinstance(c, dict) and c.get("host")))
    return []


def replan(run: RunDir, overrides: list[str]) -> tuple[dict[str, str], list[str]]:
    """The run re-planned with `--set` overrides: its files re-rendered (not yet written), and what changed.

    The committed checkpoints must stay loadable: tp, pp, cp and ep decide how
    the model is cut into shards, so they cannot change; a dp change is a
    reshard on load (torch.distributed.checkpoint reads any dp layout).
    """
    from clusterctl.job import load_job
    from clusterctl.render import render_run
    from clusterctl.runfiles import node_python

    job = load_job(run.path / rundir.SPEC, overrides, site=str(run.path / rundir.SITE))
    old = _load_obj(run.run_json)
    layout = job.plan.dims.layout
    new_par = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep, "dp": layout.dp}
    old_par = old.get("parallel") or {}
    problems = [
        Problem(
            f"parallel.{axis}", new_par[axis],
            f"{old_par.get(axis)}, as in the run's checkpoints: a {axis} change re-cuts every tensor into other"
            " shards, which a resume cannot load (a dp change is allowed: it reshards)",
        )
        for axis in LAYOUT_FIXED
        if old_par.get(axis) is not None and int(old_par[axis]) != new_par[axis]
    ]
    for key, now in (("name", job.spec.name),):
        if old.get(key) not in (None, now):
            problems.append(Problem(key, now, f"{old.get(key)!r}: a requeue continues the same run"))
    if problems:
        raise ConfigError("--set", problems)
    rendered = render_run(job.plan, run.path, python=node_python(job), site_path=job.site_path, run_id=run.path.name)
    spec_doc = job.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    files = {**rendered.files, rundir.SPEC: yaml.safe_dump(spec_doc, sort_keys=False)}
    changed = [f"parallel.dp {old_par.get('dp')} -> {layout.dp} (resharded on load)"] if old_par.get("dp") not in (None, layout.dp) else []
    return files, changed + [f"--set {o}" for o in overrides]


def write_files(run: RunDir, files: dict[str, str]) -> None:
    """Each file whole or not at all (written aside, then renamed over the old one)."""
    for name, content in files.items():
        tmp = run.path / f".{name}.requeue.tmp"
        tmp.write_text(content, encoding="utf-8")
        if name.endswith((".sh", ".sbatch")):
            tmp.chmod(0o755)
        tmp.replace(run.path / name)


def requeue_run(
    run: RunDir,
    exclude: list[str],
    keep_culprits: bool,
    overrides: list[str],
    timeout: float,
    show: Callable[[str], None],
) -> Report:
    """Continue the run from its latest committed checkpoint in a new job, whatever its jobs are doing now."""
    backend = backend_of(run)
    for expr in exclude:
        try:
            hostlist.expand(expr)
        except hostlist.HostlistError as exc:
            raise ConfigError("--exclude", [Problem("--exclude", expr, f"a node name or hostlist ({exc})")]) from None
    report = Report(run.path.name)
    files: dict[str, str] = {}
    if overrides:
        files, changed = replan(run, overrides)  # refuses before anything is stopped
        report.notes += changed
    if active_jobs(run, backend):
        # Its recovery step must not continue the run on its own: the marker holds it while it saves.
        write_json_atomic(run.path / rundir.CANCEL, {"time": time.time(), "save": True, "by": "clusterctl requeue"})
        stop_jobs(run, backend, True, timeout, show, report)
    write_files(run, files)  # only now: a running job's restart must not pick up the new layout
    avoid = avoided(_load_obj(run.run_json), run.events())
    if not keep_culprits:
        avoid += last_culprit_nodes(run)
    avoid += [n for expr in exclude for n in hostlist.expand(expr)]
    report.exclude = list(dict.fromkeys(avoid))
    (run.path / rundir.CANCEL).unlink(missing_ok=True)
    options = [f"--exclude={hostlist.compress(report.exclude)}"] if report.exclude else []
    submission = backend.submit(run.sbatch, run.path, options)
    report.submitted = backend.display_id(submission.job_id)
    run.append_event(rundir.EVENT_REQUEUE, by="clusterctl requeue", next_job=submission.job_id, exclude=report.exclude,
                     overrides=overrides)
    run.write_state(state="submitted", job_id=report.submitted)
    report.resume_step = _resume_step(run)
    return report


def _resume_step(run: RunDir) -> int | None:
    from clusterctl.checkpoint.generations import latest_committed

    try:
        found = latest_committed(run.checkpoint_dir(_load_obj(run.run_json)))
    except Exception:  # noqa: BLE001 - only for the message
        return None
    return found.step + 1 if found else None
