"""Which suspect nodes a job leaves out: a planning decision, made once, from the suspects read at the edge.

Suspects are nodes a recent verdict blamed, kept in the runs root
(rundir/suspects.py); `submit` reads them and the planner decides, with the
job's partition and size, which to add to topology.exclude. The spec written
to the run directory stays the user's; the plan (job.sbatch's --exclude,
run.json) carries the addition.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from clusterctl.config.fieldtypes import SLURM_WORD
from clusterctl.config.site import Site, known_nodes
from clusterctl.config.spec import JobSpec
from clusterctl.rundir.suspects import Suspect
from clusterctl.syntax import hostlist


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


def choose_suspects(spec: JobSpec, site: Site, partition: str, nodes_allocated: int, found: dict[str, Suspect]) -> SuspectChoice:
    """Of the active suspects, those in the job's partition the spec does not already exclude; none when too few nodes would be left."""
    window_s = site.reliability.suspect_hours * 3600
    if not found or window_s <= 0:
        return SuspectChoice(window_s=max(0.0, window_s))
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
        if usable - len(candidates) < nodes_allocated:
            needs = f"the job needs {nodes_allocated - spec.spares}" + (f" + {spec.spares} spares" if spec.spares else "")
            left = f" ({len(members) - usable} already excluded by topology.exclude)" if usable < len(members) else ""
            why = (
                f"partition {partition} has {usable} usable nodes{left} and {needs};"
                f" leaving out {len(candidates)} suspect node{'s' if len(candidates) > 1 else ''} would leave {usable - len(candidates)}"
            )
            return SuspectChoice((), candidates, why, window_s)
    return SuspectChoice(candidates, (), None, window_s)


def excluding(spec: JobSpec, choice: SuspectChoice) -> JobSpec:
    """The spec with the chosen suspects added to topology.exclude (the planner checks them like any other)."""
    if not choice.excluded:
        return spec
    added = hostlist.compress([s.node for s in choice.excluded])
    return spec.model_copy(update={"topology": spec.topology.model_copy(update={"exclude": [*spec.topology.exclude, added]})})


def _named(exprs: list[str]) -> set[str]:
    names: set[str] = set()
    for expr in exprs:
        try:
            names.update(hostlist.expand(expr))
        except hostlist.HostlistError:
            continue  # the planner has already refused it
    return names


