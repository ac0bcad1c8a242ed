"""`submit --remote`: render here, ship the run directory (and the code) to the login node, submit there.

The run is rendered for its place on the cluster (the runs root expanded
by the login node: `~` and `$VARIABLES` are the cluster's), staged in a
temporary directory here, uploaded whole (transport.upload_tree), and
handed to the login node's clusterctl (`submit-run`), which runs sbatch in
a login shell with the ranks' working directory set to the shipped code.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from clusterctl import rundir
from clusterctl.actions.submit import default_backend, refuse_missing_secrets
from clusterctl.errors import ClusterctlError, ConfigError, Problem
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.job import JobConfig, PlannedJob, plan_job
from clusterctl.plan.avoidance import SuspectChoice
from clusterctl.remote.client import Remote, connect
from clusterctl.render.runfiles import stage_run
from clusterctl.rundir import roots, secretenv
from clusterctl.rundir.suspects import Suspect


@dataclass
class RemoteSubmission:
    remote: Remote
    run_path: str  # on the login node
    job_id: str | None
    display_id: str | None
    backend: str
    warnings: list[str]
    job: PlannedJob  # as planned there: the login node's suspect nodes left out
    workdir: str

    @property
    def suspects(self) -> SuspectChoice:
        return self.job.plan.suspects


def login_of(job: JobConfig, remote: str | None, backend: str | None) -> tuple[str, str | None, str] | None:
    """Where `submit` goes: --remote (or $CLUSTERCTL_REMOTE); else the site's login node when this machine
    has no sbatch (a laptop); else nowhere (None: submit here). With the clusterctl command and transport."""
    login = job.site.login
    if remote is None and (login is None or backend == "local" or shutil.which("sbatch") is not None):
        return None
    host = remote or login.host  # type: ignore[union-attr]
    return host, (str(login.clusterctl) if login else None), (login.transport if login else "auto")


def remote_suspects(rows: object, job: JobConfig, now: float) -> dict[str, Suspect]:
    """The login node's suspect nodes (`clusterctl suspects --json --all` rows), active by this job's site's window."""
    window_s = job.site.reliability.suspect_hours * 3600
    if window_s <= 0:
        return {}
    found = {}
    for row in rows if isinstance(rows, list) else []:
        drill_ignored = row.get("drill") is True and not job.spec.topology.avoid_drill_suspects
        if row.get("state") != "cleared" and not drill_ignored and float(row.get("time", 0)) + window_s > now:
            found[str(row["node"])] = Suspect(str(row["node"]), str(row.get("reason", "")), int(row.get("code", 0)),
                                              str(row.get("run", "")), float(row["time"]))
    return found


def submit_remote(config: JobConfig, remote: str, command: str | None, transport: str, backend_name: str | None,
                  code: Path | None, code_on_cluster: str | None, dry_run: bool = False) -> RemoteSubmission:
    """Plan the job once with the login node's suspect nodes, render here, ship the run (and the code), submit there."""
    raw_root, field = roots.chosen(config.spec.runs_root, config.site.runs_root)
    link = connect(remote, command, transport, expand=[raw_root])
    try:
        assert link.facts is not None
        root = link.facts["expanded"].get(raw_root)
        if not root:
            raise ConfigError("job spec", [Problem(field, raw_root, f"a variable in it is not set on {link.host}; write the path out")])
        if code_on_cluster and link.transport.run(shlex.join(["test", "-d", code_on_cluster])).returncode != 0:
            raise ClusterctlError(f"--code-on-cluster {code_on_cluster}: no such directory on {link.host}", ExitCode.USAGE)
        rows = (link.facts.get("suspects") or {}).get(raw_root, [])
        job = plan_job(config, remote_suspects(rows, config, time.time()))
        refuse_missing_secrets(job)  # taken here, where the user typed the command; they travel in the SSH stream
        run_id = rundir.new_run_id(job.spec.name)
        final = PurePosixPath(root) / run_id
        workdir = code_on_cluster or str(final / rundir.CODE_TREE)
        python = job.site.python or str(link.facts.get("python") or "python3")
        with tempfile.TemporaryDirectory(prefix="clusterctl-stage-") as stage:
            staged = stage_run(job, Path(final), Path(stage), python, None if code_on_cluster else (code or job.spec_path.parent))
            if dry_run:
                staged.write_state(state="dry-run", backend=backend_name or default_backend(job))
            else:
                secretenv.write(staged.path, job.spec.secret_env, os.environ)
            link.transport.upload_tree(staged.path, root, run_id)
        if dry_run:
            return RemoteSubmission(link, str(final), None, None, backend_name or default_backend(job), [], job, workdir)
        answer = link.json(["submit-run", str(final), "--backend", backend_name or default_backend(job), "--chdir", workdir])
        return RemoteSubmission(link, str(final), answer.get("job_id"), answer.get("display_id"), answer.get("backend", ""),
                                list(answer.get("warnings") or []), job, workdir)
    except BaseException:
        link.close()
        raise

