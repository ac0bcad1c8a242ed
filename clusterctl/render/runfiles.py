"""Write a run directory: rendered files, the resolved inputs, a code snapshot.

The directory is assembled under a temporary name and renamed into place,
so a crash or a rejected submission never leaves a half-made run behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from clusterctl import rundir
from clusterctl.errors import ClusterctlError, ConfigError, Problem
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.job import JobConfig, PlannedJob
from clusterctl.plan.memory import oom_problem
from clusterctl.render.scripts import render_run
from clusterctl.rundir import RunDir, access, roots
from clusterctl.rundir.runjson import RunJson


def node_python(job: PlannedJob | JobConfig) -> str:
    """The interpreter ranks run: the site's, else the one running clusterctl (shared filesystems)."""
    return job.site.python or sys.executable


def _render(job: PlannedJob, final: Path, standalone: bool, run_id: str | None, python: str | None = None,
            groups_here: bool = True) -> tuple[dict[str, str], RunJson]:
    """Every file of the run as text, and its run.json typed, rendered and validated before anything touches the
    disk; a problem found in rendering names its spec line, as the planner's do."""
    if not job.spec.allow_oom and (problem := oom_problem(job.plan.memory)) is not None:
        raise job.refused([problem])  # a job that cannot fit is refused, not submitted to crash
    try:
        rendered = render_run(
            job.plan, final, python=python or node_python(job), standalone=standalone, site_path=job.site_path,
            run_id=run_id, groups_here=groups_here,
        )
    except ConfigError as exc:
        if exc.source != "job spec":
            raise  # the site's templates: their own source
        raise job.refused(exc.problems) from None
    spec_doc = job.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {**rendered.files, rundir.SPEC: yaml.safe_dump(spec_doc, sort_keys=False)}, rendered.run_json


def _write_files(job: PlannedJob, files: dict[str, str], target: Path, final: Path) -> list[Path]:
    written = []
    for name, content in files.items():
        path = target / name
        path.write_text(content, encoding="utf-8")
        if name.endswith((".sh", ".sbatch")):
            path.chmod(0o755)
        if name != rundir.SPEC:
            written.append(final / name)
    shutil.copyfile(job.site_path, target / rundir.SITE)
    return written


def write_rendered(job: PlannedJob, out: Path, *, standalone: bool = False) -> list[Path]:
    """`render -o DIR`: write the files into DIR (created only once the job rendered)."""
    files, _ = _render(job, out, standalone, None)
    try:
        out.mkdir(parents=True, exist_ok=True)
        return _write_files(job, files, out, out)
    except OSError as exc:
        raise ClusterctlError(f"cannot write to {out}: {exc.strerror or exc}", ExitCode.BAD_CONFIG) from None


def create_run(job: PlannedJob, *, standalone: bool = False, run_id: str | None = None) -> RunDir:
    """Make `<runs root>/<run id>/` complete, or not at all (and no runs root for a refused job)."""
    run_id = run_id or rundir.new_run_id(job.spec.name)
    try:
        root = roots.of_spec(job.spec.runs_root, job.site.runs_root)
    except ConfigError as exc:
        raise job.refused(exc.problems) from None
    final = root / run_id
    files, run_json = _render(job, final, standalone, run_id)
    if not root.parent.is_dir():  # a mistyped or absent file system: refused, not created with all its parents
        field = "runs_root" if job.spec.runs_root else "site runs_root"
        raise job.refused([Problem(field, str(job.spec.runs_root or job.site.runs_root), (
            f"a directory whose parent exists: {root.parent} does not (create it, or set runs_root to another place)"))])
    run_access = access.Access(run_json.runs_mode, run_json.runs_group)
    # A new runs root, and a new checkpoint directory outside the run, are as private as the run (and a shared
    # one has the group, setgid, for what the job writes in it); existing ones are never changed.
    ckpt = Path(run_json.checkpoint.dir) if run_json.checkpoint.dir else None
    for directory in (root, ckpt):
        if directory is not None and not directory.is_dir() and directory.parent.is_dir():
            directory.mkdir(exist_ok=True)
            run_access.apply(directory)
    tmp = root / f".{run_id}.tmp"
    try:
        _populate(job, files, tmp, final, None, run_access)
        os.rename(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ClusterctlError(f"cannot create run directory {final}: {exc}", ExitCode.BAD_CONFIG) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return RunDir(final)


def _populate(job: PlannedJob, files: dict[str, str], target: Path, final: Path, ship_from: Path | None,
              given: access.Access) -> None:
    """A new run directory's contents, written at `target` for its place `final`, with the access `given`."""
    target.mkdir(parents=True)
    _write_files(job, files, target, final)
    (target / rundir.ATTEMPTS).touch()
    (target / rundir.CHECKPOINTS).mkdir()
    snapshot_code(target / rundir.CODE, job.spec_path.parent)
    if ship_from is not None:
        ship_tree(target / rundir.CODE_TREE, ship_from)
    RunDir(target).write_state(state="rendered", run_id=final.name)
    given.apply(target)


def stage_run(job: PlannedJob, final: Path, stage: Path, python: str, ship_from: Path | None) -> RunDir:
    """A run rendered for `final` on another machine, written under `stage` here to be shipped there whole.

    With `ship_from`, the git work tree holding it is copied into code/tree/ as it is now (uncommitted
    changes included): the ranks run in that copy, not in whatever the cluster happens to have. The staged
    files are private here; `submit-run` gives them the run's access there, with the login node's groups (a
    sharing group need not exist on this machine).
    """
    files, _ = _render(job, final, False, final.name, python, groups_here=False)
    target = stage / final.name
    try:
        _populate(job, files, target, final, ship_from, access.Access())
    except OSError as exc:
        raise ClusterctlError(f"cannot stage the run in {stage}: {exc}", ExitCode.BAD_CONFIG) from None
    return RunDir(target)


def _git(where: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def shipped_root(source: Path) -> Path | None:
    """The top of the git work tree holding `source`: what ship_tree copies, where remote ranks run (None: no tree)."""
    top = _git(source, "rev-parse", "--show-toplevel")
    return Path(top.strip()) if top is not None else None


def ship_tree(dest: Path, source: Path) -> int:
    """Copy the git work tree holding `source` as it is now: tracked and untracked files (not ignored ones),
    uncommitted changes included. Returns the bytes copied."""
    root = shipped_root(source)
    if root is None:
        raise ClusterctlError(
            f"{source} is not inside a git work tree, so there is no defined set of files to ship: give --code DIR"
            " (a git work tree), or --code-on-cluster PATH (code already on the cluster)", ExitCode.USAGE
        )
    names = (_git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard") or "").split("\0")
    dest.mkdir(parents=True)
    total = 0
    for name in filter(None, names):
        src, dst = root / name, dest / name
        if not os.path.lexists(src):
            continue  # deleted in the working tree: the job runs without it
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_dir():  # a submodule
            shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        else:
            shutil.copy2(src, dst)
            total += dst.stat().st_size
    return total


def snapshot_code(dest: Path, where: Path) -> None:
    """Record the git revision and uncommitted diff of the tree the job was submitted from."""
    dest.mkdir()

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None:
        (dest / "revision.txt").write_text(f"not a git repository: {where.resolve()}\n")
        return
    revision = git("rev-parse", "HEAD") or "(no commits)\n"
    (dest / "revision.txt").write_text(f"repository: {top.strip()}\nrevision: {revision.strip()}\n")
    (dest / "status.txt").write_text(git("status", "--porcelain") or "")
    (dest / "diff.patch").write_text(git("diff", "HEAD") or "")
