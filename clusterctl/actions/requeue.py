"""`clusterctl requeue`: continue a run from its latest committed checkpoint in a new job, by hand.

A pending job of the run is cancelled, a running one saves and stops first
(the cancel marker holds its recovery step meanwhile); the nodes of the
latest verdict's culprits are excluded unless told otherwise. `--set` may
change the data-parallel size (the checkpoint is resharded on load); tp, pp,
cp and ep cut the checkpoint's shards and cannot change.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from clusterctl.actions.runjobs import Report, active_jobs, backend_of, stop_jobs
from clusterctl.actions.submit import refuse_untrusted_run
from clusterctl.checkpoint.generations import latest_committed
from clusterctl.errors import ConfigError, Problem
from clusterctl.plan.job import load_job
from clusterctl.render.runfiles import node_python
from clusterctl.render.scripts import render_run
from clusterctl.rundir import CANCEL, SITE, SPEC, RunDir, history, runjson, secretenv, suspects, write_json_atomic
from clusterctl.rundir import verdict as verdictfile
from clusterctl.syntax import hostlist

LAYOUT_FIXED = ("tp", "pp", "cp", "ep")  # a checkpoint's shards follow these; dp only replicates


def last_culprit_nodes(run: RunDir) -> list[str]:
    """The nodes the latest verdict blamed."""
    for n in reversed(run.attempts()):
        given = verdictfile.read(run.attempt(n))
        if given is not None:
            return [] if given.ok else given.culprit_hosts()
    return []


def replan(run: RunDir, overrides: list[str]) -> tuple[dict[str, str], list[str]]:
    """The run re-planned with `--set` overrides: its files re-rendered (not yet written), and what changed.

    The committed checkpoints must stay loadable: tp, pp, cp and ep decide how
    the model is cut into shards, so they cannot change; a dp change is a
    reshard on load (torch.distributed.checkpoint reads any dp layout).
    """
    job = load_job(run.path / SPEC, overrides, site=str(run.path / SITE))
    old = runjson.read(run.path)
    layout = job.plan.dims.layout
    new_par = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep, "dp": layout.dp}
    old_par = old.parallel.sizes() if old is not None else {}
    problems = [
        Problem(
            f"parallel.{axis}", new_par[axis],
            f"{old_par.get(axis)}, as in the run's checkpoints: a {axis} change re-cuts every tensor into other"
            " shards, which a resume cannot load (a dp change is allowed: it reshards)",
        )
        for axis in LAYOUT_FIXED
        if old_par.get(axis) is not None and int(old_par[axis]) != new_par[axis]
    ]
    if old is not None and old.name and old.name != job.spec.name:
        problems.append(Problem("name", job.spec.name, f"{old.name!r}: a requeue continues the same run"))
    if problems:
        raise ConfigError("--set", problems)
    rendered = render_run(job.plan, run.path, python=node_python(job), site_path=job.site_path, run_id=run.path.name)
    spec_doc = job.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    files = {**rendered.files, SPEC: yaml.safe_dump(spec_doc, sort_keys=False)}
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


def submit_dir(run: RunDir) -> Path:
    """Where the run was submitted from (state.json `workdir`): its ranks' relative paths mean that directory.
    Runs submitted before it was recorded, or whose directory is gone, submit from the run directory."""
    recorded = run.read_state().get("workdir")
    return Path(recorded) if isinstance(recorded, str) and Path(recorded).is_dir() else run.path


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
    refuse_untrusted_run(run)  # before anything is stopped: a directory others can write is theirs to run
    for expr in exclude:
        try:
            hostlist.expand(expr)
        except hostlist.HostlistError as exc:
            raise ConfigError("--exclude", [Problem("--exclude", expr, f"a node name or hostlist ({exc})")]) from None
    report = Report(run.path.name)
    names = (runjson.read(run.path) or runjson.RunJson()).secret_env
    held = secretenv.read(run.path)  # a running job's stop below removes them: kept here for the new job
    lacking = secretenv.missing([n for n in names if n not in held], os.environ)
    if lacking:
        raise ConfigError(str(run.path / "spec.yaml"), [Problem("secret_env", ", ".join(lacking), (
            "expected each name to be set in the environment clusterctl requeue runs in: the stopped run no longer"
            " holds its secrets"))])
    files: dict[str, str] = {}
    if overrides:
        files, changed = replan(run, overrides)  # refuses before anything is stopped
        report.notes += changed
    if active_jobs(run, backend):
        # Its recovery step must not continue the run on its own: the marker holds it while it saves.
        write_json_atomic(run.path / CANCEL, {"time": time.time(), "save": True, "by": "clusterctl requeue"})
        stop_jobs(run, backend, True, timeout, show, report)
    write_files(run, files)  # only now: a running job's restart must not pick up the new layout
    plan = runjson.read(run.path) or runjson.RunJson()
    told = history.read(run)
    avoid = told.avoided(plan.exclude, suspects.forgiven(run.path.parent, told.excluded_since))
    if not keep_culprits:
        avoid += last_culprit_nodes(run)
    avoid += [n for expr in exclude for n in hostlist.expand(expr)]
    report.exclude = list(dict.fromkeys(avoid))
    (run.path / CANCEL).unlink(missing_ok=True)
    options = [f"--exclude={hostlist.compress(report.exclude)}"] if report.exclude else []
    secretenv.write(run.path, names, {**os.environ, **held})
    submission = backend.submit(run.sbatch, submit_dir(run), options)
    report.submitted = backend.display_id(submission.job_id)
    history.append(run, history.EVENT_REQUEUE, by="clusterctl requeue", next_job=submission.job_id, exclude=report.exclude,
                     overrides=overrides)
    run.write_state(state="submitted", job_id=report.submitted)
    report.resume_step = _resume_step(run)
    return report


def _resume_step(run: RunDir) -> int | None:
    try:
        found = latest_committed((runjson.read(run.path) or runjson.RunJson()).checkpoint_dir(run.path))
    except Exception:  # noqa: BLE001 - only for the message
        return None
    return found.step + 1 if found else None
