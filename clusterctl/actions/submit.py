"""Submit a job: validate, create the run directory, hand the batch script to a backend.

A dry run follows the same path and stops before the backend, so what it
leaves on disk is exactly what a submission would submit. Before rendering,
the suspect nodes of the runs root (nodes a recent verdict blamed) join the
job's exclusion; the lookup happens here, at the edge, so planning and
rendering stay pure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from clusterctl.syntax import hostlist
from clusterctl.rundir import suspects
from clusterctl.backends import Backend, get_backend
from clusterctl.errors import ClusterctlError, ConfigError
from clusterctl.plan.job import Job
from clusterctl.plan import make_plan
from clusterctl.rundir import RunDir
from clusterctl.render.runfiles import create_run, runs_root
from clusterctl.config.site import known_nodes
from clusterctl.config.spec import SLURM_WORD
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
class SuspectChoice:
    """Which suspect nodes of the job's partition a submission leaves out, and why it keeps any."""

    excluded: tuple[Suspect, ...] = ()
    kept: tuple[Suspect, ...] = ()  # suspects of the partition the job may still land on
    why_kept: str | None = None
    window_s: float = 0.0  # the site's reliability.suspect_hours, in seconds

    def until(self, suspect: Suspect) -> float:
        return suspect.time + self.window_s

    def as_state(self) -> dict[str, object]:
        """What state.json records: the suspects excluded (and any kept, with the reason)."""
        state: dict[str, object] = {"suspects_excluded": [asdict(s) for s in self.excluded]}
        if self.kept:
            state["suspects_kept"] = [asdict(s) for s in self.kept]
            state["suspects_kept_because"] = self.why_kept
        return state


@dataclass(frozen=True)
class Submitted:
    run: RunDir
    job_id: str | None  # the scheduler's id: SLURM_JOB_ID inside the job, slurm-<id>.out
    backend: str
    warnings: tuple[str, ...] = ()
    display_id: str | None = None  # the job as the user sees it (`local-N` on the local backend), as in state.json
    suspects: SuspectChoice = SuspectChoice()


def default_backend(job: Job) -> str:
    """The embedded local site runs locally; every other site goes to Slurm."""
    return "local" if job.site.name == "local" else "slurm"


def submit_job(job: Job, backend_name: str | None = None, *, dry_run: bool = False) -> Submitted:
    name = backend_name or default_backend(job)
    backend = get_backend(name)
    if not dry_run:
        backend.check()  # before anything is written: no sbatch, no run directory
    job, choice = avoid_suspects(job)
    run = create_run(job)
    run.write_state(**choice.as_state())
    if dry_run:
        run.write_state(state="dry-run", backend=name)
        return Submitted(run, None, name, suspects=choice)
    return replace(submit_rendered(run, backend, Path.cwd()), suspects=choice)


def submit_rendered(run: RunDir, backend: Backend, workdir: Path, options: list[str] | None = None) -> Submitted:
    """Hand a complete run directory's batch script to the backend; state.json says how it went."""
    name = backend.name
    try:
        submission = backend.submit(run.sbatch, workdir, options)
    except ClusterctlError as exc:
        run.write_state(state="failed", backend=name, reason=exc.message, exit_code=int(exc.exit_code))
        raise
    except BaseException as exc:
        run.write_state(state="failed", backend=name, reason=f"{type(exc).__name__}: {exc}")
        raise
    shown = backend.display_id(submission.job_id)
    run.write_state(state="submitted", backend=name, job_id=shown)
    return Submitted(run, submission.job_id, name, tuple(_first_look(backend, submission.job_id)), shown)


def avoid_suspects(job: Job, now: float | None = None, found: dict[str, Suspect] | None = None) -> tuple[Job, SuspectChoice]:
    """The job with its partition's active suspects added to topology.exclude, and what was decided.

    Reads the runs root the run will be created in unless `found` (the active suspects, read elsewhere:
    a login node's) is given; the rest is pure (choose_suspects, exclude_nodes), so render and plan never
    touch the disk.
    """
    window_s = job.site.reliability.suspect_hours * 3600
    if window_s <= 0:
        return job, SuspectChoice()
    if found is None:
        found = suspects.active(runs_root(job), window_s, now)
    choice = choose_suspects(job, found, window_s)
    if not choice.excluded:
        return job, choice
    try:
        return exclude_nodes(job, [s.node for s in choice.excluded]), choice
    except ConfigError as exc:  # the planner refused the larger exclusion: submit as written
        why = f"the planner refused the exclusion ({exc.message})"
        return job, SuspectChoice((), choice.excluded, why, window_s)


def choose_suspects(job: Job, found: dict[str, Suspect], window_s: float) -> SuspectChoice:
    """Of the active suspects, those in the job's partition the spec does not already exclude; none when too few nodes would be left."""
    if not found:
        return SuspectChoice(window_s=window_s)
    spec, site, partition = job.spec, job.site, job.plan.partition
    part = site.partitions[partition]
    members = set(hostlist.expand(part.nodes)) if part.nodes else known_nodes(site)
    # A partition without a node list takes any plain node name (it reaches #SBATCH --exclude).
    relevant = sorted(n for n in found if (n in members if members is not None else bool(SLURM_WORD.match(n))))
    already = _named(spec.topology.exclude)
    candidates = tuple(found[n] for n in relevant if n not in already)
    if not candidates:
        return SuspectChoice(window_s=window_s)
    if not spec.topology.avoid_suspects:
        return SuspectChoice((), candidates, "topology.avoid_suspects is false", window_s)
    if part.nodes:
        usable = len(members - already)
        wanted = job.plan.nodes_allocated
        if usable - len(candidates) < wanted:
            needs = f"the job needs {job.plan.nodes}" + (f" + {spec.spares} spares" if spec.spares else "")
            left = f" ({len(members) - usable} already excluded by topology.exclude)" if usable < len(members) else ""
            why = (
                f"partition {partition} has {usable} usable nodes{left} and {needs};"
                f" leaving out {len(candidates)} suspect node{'s' if len(candidates) > 1 else ''} would leave {usable - len(candidates)}"
            )
            return SuspectChoice((), candidates, why, window_s)
    return SuspectChoice(candidates, (), None, window_s)


def _named(exprs: list[str]) -> set[str]:
    names: set[str] = set()
    for expr in exprs:
        try:
            names.update(hostlist.expand(expr))
        except hostlist.HostlistError:
            continue  # the planner has already refused it
    return names


def exclude_nodes(job: Job, nodes: list[str]) -> Job:
    """The job re-planned with nodes added to topology.exclude (the planner sees and checks them).

    The spec written to the run directory stays the user's; the plan (and so
    job.sbatch's --exclude and run.json) carries the addition.
    """
    spec = job.spec
    topology = spec.topology.model_copy(update={"exclude": [*spec.topology.exclude, hostlist.compress(nodes)]})
    plan = make_plan(spec.model_copy(update={"topology": topology}), job.site)
    return replace(job, plan=plan)


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
