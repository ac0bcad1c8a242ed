"""Submit a job: validate, create the run directory, hand the batch script to a backend.

A dry run follows the same path and stops before the backend, so what it
leaves on disk is exactly what a submission would submit. The suspect nodes
of the runs root (nodes a recent verdict blamed) are read here, at the edge,
before the job is planned (once): the planner decides which to leave out
(plan/avoidance.py), so planning and rendering stay pure.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from clusterctl.backends import Backend, get_backend
from clusterctl.errors import ClusterctlError, ConfigError, Problem
from clusterctl.plan.commandcheck import PYTHON_ENV, CommandCheck, Where, check_command
from clusterctl.plan.job import JobConfig, PlannedJob, plan_job, read_job
from clusterctl.plan.avoidance import SuspectChoice
from clusterctl.render.runfiles import create_run, node_python, shipped_root
from clusterctl.rundir import RunDir, access, ownership, roots, runjson, secretenv, suspects
from clusterctl.rundir.suspects import Suspect

# Pending reasons that no amount of waiting resolves: the job as asked cannot run here.
HOPELESS_REASONS = frozenset(
    {
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "PartitionConfig",
        "BadConstraints",
        "AccountNotAllowed",
        "InvalidAccount",
        "InvalidQOS",
        "QOSMaxNodePerJobLimit",
        "QOSMaxWallDurationPerJobLimit",
        "QOSMaxGRESPerJob",
    }
)


@dataclass(frozen=True)
class Submitted:
    run: RunDir
    job_id: str | None  # the scheduler's id: SLURM_JOB_ID inside the job, slurm-<id>.out
    backend: str
    warnings: tuple[str, ...] = ()
    display_id: str | None = None  # the job as the user sees it (`local-N` on the local backend), as in state.json
    suspects: SuspectChoice = SuspectChoice()


def default_backend(job: PlannedJob | JobConfig) -> str:
    """The embedded local site runs locally; every other site goes to Slurm."""
    return "local" if job.site.name == "local" else "slurm"


def local_suspects(config: JobConfig, now: float | None = None) -> dict[str, Suspect]:
    """The active suspect nodes of the runs root the job's run will be created in ({} when the site keeps none)."""
    window_s = config.site.reliability.suspect_hours * 3600
    drills = config.spec.topology.avoid_drill_suspects
    if window_s <= 0:
        return {}
    try:
        root = roots.of_spec(config.spec.runs_root, config.site.runs_root)
    except ConfigError as exc:
        raise config.refused(exc.problems) from None
    return suspects.active(root, window_s, now, drills)


def load_for_submit(spec_path: Path | str, overrides: list[str] | None = None, site: str | None = None) -> PlannedJob:
    """The job planned once for a submission here: its runs root's suspect nodes left out where it can do without."""
    config = read_job(spec_path, overrides, site)
    return plan_job(config, local_suspects(config))


def submit_job(job: PlannedJob, backend_name: str | None = None, *, dry_run: bool = False) -> Submitted:
    """Create the run directory of a planned job and hand its batch script to the backend (not for a dry run)."""
    name = backend_name or default_backend(job)
    backend = get_backend(name)
    if not dry_run:
        backend.check()  # before anything is written: no sbatch, no run directory
    choice = job.plan.suspects
    refuse_missing_secrets(job)
    refuse_missing_image(job)
    said = refuse_bad_command(job, Path.cwd())  # sbatch runs in this directory, and so do the ranks
    refuse_untrusted_places(job)
    run = create_run(job)
    roots.remember(run.path.parent)  # so that `status RUN` finds it from any directory
    run.write_state(**choice.as_state())
    if dry_run:  # no secret is taken: `clusterctl requeue` takes them when it submits the run
        run.write_state(state="dry-run", backend=name)
        return Submitted(run, None, name, said, suspects=choice)
    secretenv.write(run.path, job.spec.secret_env, os.environ)
    loose = access.loose_root(run.path.parent)
    try:
        done = submit_rendered(run, backend, Path.cwd())
        return replace(done, suspects=choice, warnings=(*said, *([loose] if loose else []), *done.warnings))
    except ClusterctlError:
        shutil.rmtree(run.path, ignore_errors=True)  # refused or unreachable: no job, so no run to look at
        raise


def refuse_untrusted_places(job: PlannedJob | JobConfig) -> None:
    """A runs root or checkpoint directory that another user could write (or rename away), or a checkpoint
    directory whose newest generation this user's runs did not seal, refuses the job before anything is written:
    what the run reads from them runs as its owner (rundir/ownership.py, checkpoint/trust.py)."""
    checkpoints = Path(job.spec.checkpoint.dir).expanduser() if job.spec.checkpoint.dir else None
    field = "runs_root" if job.spec.runs_root else "site runs_root"
    try:
        root = roots.of_spec(job.spec.runs_root, job.site.runs_root)
    except ConfigError as exc:
        raise job.refused(exc.problems) from None
    problems = untrusted_places(root, field, checkpoints)
    if problems:
        raise job.refused(problems)


def refuse_untrusted_run(run: RunDir) -> None:
    """A run directory, its runs root or its checkpoint directory that is not this user's alone is not submitted;
    one that will be gets this user's checkpoint key (trust.install: a laptop's never travels to a login node)."""
    from clusterctl.checkpoint import trust

    plan = runjson.read(run.path)
    checkpoints = Path(plan.checkpoint.dir) if plan is not None and plan.checkpoint.dir else None
    problems = untrusted_places(run.path.parent, "runs_root", checkpoints)
    if why := ownership.untrusted(run.path):
        problems.append(Problem("run directory", str(run.path), f"expected a directory only you can write; {why}"))
    if problems:
        raise ConfigError(f"run {run.path}", problems)
    trust.install(run.path)


def untrusted_places(root: Path, root_field: str, checkpoints: Path | None) -> list[Problem]:
    """What is wrong with a runs root and a checkpoint directory (None: the run's own) for a run to trust them."""
    from clusterctl.checkpoint import trust
    from clusterctl.checkpoint.generations import refusal

    problems = []
    if why := ownership.untrusted(root):
        problems.append(Problem(root_field, str(root), f"expected a directory only you can write; {why}"))
    if checkpoints is not None:
        if why := ownership.untrusted(checkpoints):
            problems.append(Problem("checkpoint.dir", str(checkpoints), f"expected a directory only you can write; {why}"))
        elif checkpoints.is_dir() and (why := refusal(checkpoints, trust.user_key())):
            problems.append(Problem("checkpoint.dir", str(checkpoints), f"expected checkpoints your runs wrote; {why}"))
    return problems


def command_where(job: PlannedJob | JobConfig, workdir: Path, *, how: str = "the directory clusterctl submit ran in",
                  remote: str | None = None) -> Where:
    """What the command check may know of the place the ranks run, read here (the environment, this interpreter)."""
    spec, site = job.spec, job.site
    set_for_ranks = {**site.env, **spec.env, **spec.container.env}
    return Where(
        workdir=workdir, how=how, spec_dir=job.spec_path.parent.absolute(), path=os.environ.get("PATH", os.defpath),
        image=spec.container.image, modules=(*site.modules, *spec.modules), remote=remote,
        python_env=tuple(name for name in PYTHON_ENV if name in set_for_ranks),
        python_here=_interpreter(node_python(job)) == _interpreter(sys.executable),
        this_python=sys.executable,
    )


def _interpreter(python: str) -> str:
    """An interpreter's absolute path as written (a venv's python is not the base one it links to), a bare name
    looked up on PATH."""
    return os.path.abspath(python if "/" in python else (shutil.which(python) or python))


def refuse_bad_command(job: PlannedJob | JobConfig, workdir: Path) -> tuple[str, ...]:
    """A command that names a script, module or program that is not there refuses the job before anything is
    written (plan/commandcheck.py says when it is only a warning); returns the warnings to print."""
    found: CommandCheck = check_command(job.spec.command or [], command_where(job, workdir))
    if found.problems:
        raise ConfigError(f"job spec {job.spec_path}", list(found.problems))
    return found.warnings


def remote_command_warnings(job: JobConfig, host: str, ship_from: Path | None) -> tuple[str, ...]:
    """`submit --remote`: the ranks run in the copy of `ship_from`'s git work tree on `host`. What the command
    names is looked for in that tree here, and only warned about: the login node holds the files. Nothing to
    look at with --code-on-cluster (`ship_from` None) or outside a work tree (the shipping refuses that)."""
    root = shipped_root(ship_from) if ship_from is not None else None
    if root is None:
        return ()
    where = command_where(job, root, how=f"a copy of it shipped to {host}", remote=host)
    found = check_command(job.spec.command or [], where)
    return (*found.warnings, *(problem.render() for problem in found.problems))


def refuse_missing_image(job: PlannedJob | JobConfig, workdir: Path | None = None) -> None:
    """A container image given as a file here (a path, a .sif or .sqsh) that is not there, or cannot be read,
    refuses the job before anything is written. A registry reference is the runtime's to fetch: a rank that
    cannot start it fails before registering, and the rendezvous verdict names it."""
    image = job.spec.container.image
    if image is None or not local_image(image):
        return
    path = (workdir or Path.cwd()) / os.path.expanduser(image)
    if not os.access(path, os.R_OK):
        why = "does not exist" if not path.exists() else "cannot be read by this user"
        raise ConfigError(str(job.spec_path), [Problem("container.image", image, (
            f"{path} {why}; expected an image file the compute nodes can read (paths are taken from the submit"
            " directory), or a registry reference such as nvcr.io#nvidia/pytorch:25.01-py3"))])


def local_image(image: str) -> bool:
    """Whether an image reference names a file or directory here rather than a registry."""
    if "://" in image or "#" in image:
        return False
    return image.startswith(("/", "./", "../", "~")) or image.endswith((".sif", ".sqsh", ".squashfs", ".simg"))


def refuse_missing_secrets(job: PlannedJob | JobConfig) -> None:
    """A secret_env name with no value here refuses the job before anything is written."""
    lacking = secretenv.missing(job.spec.secret_env, os.environ)
    if lacking:
        raise ConfigError(str(job.spec_path), [Problem("secret_env", ", ".join(lacking), (
            "expected each name to be set in the environment clusterctl runs in (its value goes to the ranks)"))])


def submit_rendered(run: RunDir, backend: Backend, workdir: Path, options: list[str] | None = None) -> Submitted:
    """Hand a complete run directory's batch script to the backend; state.json says how it went. Submit, the
    submitit executor and a laptop's run on its login node come here, so the run's places are checked here;
    `requeue` holds the run to the same check (refuse_untrusted_run) before it stops the jobs it replaces."""
    name = backend.name
    try:
        refuse_untrusted_run(run)
        submission = backend.submit(run.sbatch, workdir, options)
    except ClusterctlError as exc:
        run.write_state(state="failed", backend=name, reason=exc.message, exit_code=int(exc.exit_code))
        raise
    except BaseException as exc:
        run.write_state(state="failed", backend=name, reason=f"{type(exc).__name__}: {exc}")
        raise
    shown = backend.display_id(submission.job_id)
    run.write_state(state="submitted", backend=name, job_id=shown, workdir=str(workdir))  # a requeue submits from here too
    return Submitted(run, submission.job_id, name, tuple(_first_look(backend, submission.job_id)), shown)


def _first_look(backend: Backend, job_id: str) -> list[str]:
    """Warn when the scheduler has already said the job will never start as asked."""
    try:
        info = backend.info(job_id)
    except ClusterctlError:
        return []
    if info is not None and info.state == "PENDING" and info.reason in HOPELESS_REASONS:
        return [
            f"job {backend.display_id(job_id)} is pending with reason {info.reason}: Slurm will not start it as asked"
            f" (cancel it with scancel {job_id} and change the spec)"
        ]
    return []
