"""RUN on the command line: a run directory, a run id under ./runs, or one of the run's job ids."""

from __future__ import annotations

from pathlib import Path

from clusterctl import rundir
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, is_run, jobid

RUNS = "runs"  # the default runs root, relative to where clusterctl runs


def _by_job(job: str, root: Path) -> Path | None:
    """The run under `root` that has had job `job` (submitted, continued or requeued into it)."""
    from clusterctl.actions.runjobs import run_jobs

    native = jobid.native(job)
    if not native.isdigit() or not root.is_dir():
        return None
    found = [p for p in sorted(root.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True) if is_run(p) and native in run_jobs(RunDir(p))]
    return found[0] if found else None


def runs_root(given: Path | None) -> Path:
    """`--runs-root`, else ./runs."""
    return given.expanduser().absolute() if given is not None else Path.cwd() / RUNS


def resolve_run(arg: str, root: Path | None = None) -> RunDir:
    """A run directory path, a run id under the runs root (./runs), or a job id of a run there."""
    root = runs_root(root)
    given = Path(arg).expanduser()
    path = given if given.exists() else root / arg
    if not path.is_dir():
        path = _by_job(arg, root) or path
    if not path.is_dir():
        raise ClusterctlError(
            f"no run {arg!r}: neither a directory, a run id under {root}, nor a job id of a run there", ExitCode.USAGE
        )
    if not is_run(path):
        raise ClusterctlError(f"{path} is not a run directory (no {rundir.STATE} or {rundir.RUN_JSON})", ExitCode.USAGE)
    return RunDir(path.resolve())
