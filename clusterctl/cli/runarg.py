"""RUN on the command line, one resolver for every command: a run directory, a run id, or any job id of the run.

A name that is not a directory is looked up in `--runs-root` when given;
else in every root this machine knows, in order: $CLUSTERCTL_RUNS_ROOTS
(colon-separated), the `runs_root` of every site it knows (shipped,
./site-configs, $CLUSTERCTL_SITES), the roots its user submitted into
(rundir/roots.py: a spec's runs_root, a submitit folder), and ./runs. A run
id is matched first, then a job id: `local-7` is asked of this machine's
local backend (its job 7's batch script is the run's), else looked for
among local runs; `7` among the scheduler's runs, then the local ones; then
a spec's name (`quickstart`: that name's newest run). No match, or a run id
or job id matched in two places, is a usage error (exit 2) that names the
newest runs it knows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from clusterctl import rundir
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, is_run, jobid, roots

RootOpt = Annotated[
    Optional[Path],
    typer.Option("--runs-root", metavar="DIR", show_default=False,
                 help=f"the runs root to look in (default: ${roots.ENV}, every known site's runs_root, the roots submitted"
                      " into and ./runs, where RUN is looked up and runs are listed from)"),
]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="run directory, run id, a job id of the run, or a spec name"
                                                            " (its newest run)", show_default=False)]
RECENT = 5  # runs a failed lookup names


def _site_roots() -> list[str]:
    """The runs_root of every site this machine knows (a site that does not load is skipped)."""
    from clusterctl.config.site import known_sites, load_site
    from clusterctl.errors import ConfigError

    found = []
    for name in known_sites():
        try:
            site, _ = load_site(name)
        except ConfigError:
            continue
        if site.runs_root:
            found.append(str(site.runs_root))
    return found


def search_roots(given: Path | None) -> list[Path]:
    """The roots RUN is looked up in, in order, each once (rundir/roots.py)."""
    return roots.search(given, _site_roots())


def known_runs(given: Path | None) -> list[RunDir]:
    """Every run RUN could name, newest first: under the root given, else under every root searched (`runs` lists
    them, and `status` shows the newest)."""
    return rundir.list_runs(*([roots.listing(given)] if given is not None else search_roots(None)))


def _by_job(job: str, root: Path, local: bool) -> Path | None:
    """The newest run under `root` that has had job `job` (submitted, continued or requeued into it), among the
    local backend's runs (`local`) or the scheduler's."""
    from clusterctl.actions.runjobs import run_jobs

    native = jobid.native(job)
    if not native.isdigit() or not root.is_dir():
        return None
    for path in sorted(root.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
        if not is_run(path):
            continue
        run = RunDir(path)
        if (run.read_state().get("backend") == "local") == local and native in run_jobs(run):
            return path
    return None


def _local_job(job: str, root: Path | None) -> Path | None:
    """`local-N` as this machine's local backend knows it: the run whose batch script it ran as job N."""
    from clusterctl.backends.local.records import JobRecord, state_root

    number = jobid.local_number(job)
    if not job.strip().startswith(jobid.LOCAL_PREFIX) or number is None:
        return None
    record = JobRecord(state_root(), number)
    try:
        run = Path(str(record.spec.get("script", ""))).parent if record.exists() else None
    except (OSError, ValueError):
        return None
    if run is None or not is_run(run) or (root is not None and roots.listing(root) not in run.parents):
        return None
    return run


def resolve_run(arg: str, root: Path | None = None) -> RunDir:
    """The run RUN names (see the module's docstring); a usage error that says where it looked."""
    given = Path(arg).expanduser()
    if given.is_dir():
        return _checked(given)
    if (local := _local_job(arg, root)) is not None:
        return _checked(local)  # the job this machine ran: no guessing across runs roots
    where = search_roots(root)
    found: list[Path] = []
    if os.sep not in arg:
        found = [r / arg for r in where if (r / arg).is_dir()]
        if not found:
            # `local-7` names the local backend's job; a bare `7` the scheduler's first (Slurm shows no prefix).
            for local in ((True,) if arg.strip().startswith(jobid.LOCAL_PREFIX) else (False, True)):
                found = found or [p for r in where if (p := _by_job(arg, r, local)) is not None]
    unique = list(dict.fromkeys(p.resolve() for p in found))
    if len(unique) == 1:
        return _checked(unique[0])
    known = rundir.list_runs(*where) if not unique else []
    if not unique and (named := rundir.runs_named(arg.strip(), known)):
        return _checked(named[0].path)  # a spec's name: its newest run, wherever it went
    if not unique:
        existing = [r for r in where if r.is_dir()]
        recent = ", ".join(r.path.name for r in known[:RECENT])
        raise ClusterctlError(
            f"no run {arg!r}: not a directory, nor a run id, job id or spec name of the runs in"
            f" {len(existing)} runs root{'s' if len(existing) != 1 else ''} ({', '.join(map(str, existing[:3]))}"
            f"{', ...' if len(existing) > 3 else ''})."
            + (f" Newest runs: {recent}{', ...' if len(known) > RECENT else ''} (`clusterctl runs` lists them)." if recent else "")
            + " Give the run's directory, or --runs-root DIR", ExitCode.USAGE)
    raise ClusterctlError(f"{arg!r} names more than one run: {', '.join(map(str, unique))}. Give the run's directory"
                          " or --runs-root DIR", ExitCode.USAGE)


def _checked(path: Path) -> RunDir:
    if not is_run(path):
        raise ClusterctlError(f"{path} is not a run directory (no {rundir.STATE} or {rundir.RUN_JSON})", ExitCode.USAGE)
    return RunDir(path.resolve())
