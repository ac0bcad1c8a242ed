"""NVLink domains that span nodes (NVL72 racks): the segment a job asks of Slurm, and which groups stay in a domain.

On a block site (Slurm's topology/block) each block is one NVLink domain of
several nodes. `sbatch --segment=N` has Slurm put every N consecutive nodes of
the job inside one block, and clusterctl lays ranks out node by node, tp
fastest. So a group is inside one NVLink domain when all of its ranks' nodes
fall in one segment, and nothing else guarantees it: the job's node list need
not follow the racks. The segment is the spec's, else the smallest that keeps
every NVLink-bound group (tp; tp*cp and ep where the spec asks) whole, divides
the job's nodes and fits the site's segment_size with the segment's share of
the spares: a spare must replace a node inside the same domain. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterctl.config.site import Site
from clusterctl.config.spec import JobSpec
from clusterctl.errors import Problem
from clusterctl.syntax.slurmrelease import SEGMENT, release_name

BOUND: dict[str, tuple[str, str, str]] = {
    "tp": ("tp_in_nvlink", "parallel.tp", "tp"),
    "tp_cp": ("tp_cp_in_nvlink", "parallel.cp", "tp*cp"),
    "ep": ("ep_in_nvlink", "parallel.ep", "ep"),
}
"""Group kinds a spec can keep inside NVLink: (the spec's topology flag, the field to change, the label)."""


def _a(label: str) -> str:
    return f"{'an' if label.startswith('e') else 'a'} {label}"


def bound_kinds(spec: JobSpec) -> list[str]:
    """The group kinds this spec requires inside one NVLink domain."""
    return [kind for kind, (flag, _, _) in BOUND.items() if getattr(spec.topology, flag)]


@dataclass(frozen=True)
class Segments:
    """The job's segments: `size` rank nodes each (plus `spares_each`), `count` of them."""

    size: int
    count: int
    spares_each: int
    rendered: bool  # --segment is in the batch script (the site's Slurm has it, or does not say)
    spans: dict[str, int] = field(default_factory=dict)  # bound kind -> nodes its widest group spans
    crossing: list[str] = field(default_factory=list)  # group kinds with groups across segments (NVLink domains)
    inside: list[str] = field(default_factory=list)  # other group kinds whose groups happen to stay in one segment

    @property
    def sbatch_size(self) -> int:
        """What `--segment` says: a segment's rank nodes and its spares."""
        return self.size + self.spares_each

    def as_dict(self) -> dict[str, object]:
        return {"size": self.size, "count": self.count, "spares_each": self.spares_each, "sbatch": self.sbatch_size,
                "rendered": self.rendered, "spans": self.spans, "crossing": self.crossing, "inside": self.inside}


def node_spans(groups: list[list[int]], gpus_per_node: int) -> set[tuple[int, int]]:
    """Each group's first and last node (ranks are laid out node by node)."""
    return {(min(g) // gpus_per_node, max(g) // gpus_per_node) for g in groups}


def _crosses(spans: set[tuple[int, int]], size: int) -> bool:
    return any(a // size != b // size for a, b in spans)


@dataclass
class _Need:
    nodes: int
    spares: int
    usable: int
    spans: dict[str, set[tuple[int, int]]]

    def unfit(self, size: int) -> str | None:
        """Why segments of `size` nodes do not work for this job, or None."""
        if self.nodes > size and self.nodes % size:
            return f"{self.nodes} nodes are not a whole number of segments of {size}"
        size = min(size, self.nodes)
        for kind, spans in self.spans.items():
            if _crosses(spans, size):
                a, b = next((a, b) for a, b in sorted(spans) if a // size != b // size)
                return f"{_a(BOUND[kind][2])} group on nodes {a}-{b} would span two segments of {size}"
        count = self.nodes // size
        if self.spares % count:
            return f"{self.spares} spares cannot be shared evenly by {count} segments (a spare replaces a node of its own block)"
        if size + self.spares // count > self.usable:
            return (f"a segment of {size} nodes with its {self.spares // count} spare(s) is more than the site's"
                    f" segment_size of {self.usable}")
        return None

    def spares_hint(self, candidates: list[int]) -> str | None:
        """The fewest spares (at least as many as asked) that some segment size can share out, said as a fix."""
        options = []
        for size in candidates:
            count = self.nodes // size
            each = -(-self.spares // count)
            if size + each <= self.usable and _Need(self.nodes, count * each, self.usable, self.spans).unfit(size) is None:
                options.append((count * each, size, each))
        if not options:
            return None
        total, size, each = min(options)
        return f"spares: {total} (segments of {size} nodes with {each} spare each)"


def plan_segments(spec: JobSpec, site: Site, gpus_per_node: int, nodes: int,
                  groups: dict[str, list[list[int]]], warnings: list[str]) -> tuple[Segments | None, list[Problem]]:
    """The job's segments on a block site (None elsewhere, or when no NVLink-bound group spans nodes), or the
    problems that refuse it."""
    topo, asked = site.topology, spec.topology.segment
    if topo.kind != "block":
        problems = []
        if asked is not None:
            problems.append(Problem("topology.segment", asked, f"segments need a block topology; site {site.name}'s is"
                                    f" {topo.kind}: expected no topology.segment"))
        if spec.topology.exclusive_topo:
            problems.append(Problem("topology.exclusive_topo", True, f"needs a block topology; site {site.name}'s is"
                                    f" {topo.kind}: expected false"))
        return None, problems
    problems = []
    if spec.topology.exclusive_topo and not site.slurm_has(SEGMENT, unknown=True):
        problems.append(Problem("topology.exclusive_topo", True, f"--exclusive=topo needs Slurm {release_name(SEGMENT)} or later;"
                                f" site {site.name} runs {site.slurm_version}: expected false"))
    spans = {kind: node_spans(groups[kind], gpus_per_node) for kind in bound_kinds(spec) if len(groups[kind][0]) > 1}
    need = _Need(nodes, spec.spares, topo.usable_segment or nodes, spans)
    if asked is None and not any(a != b for s in spans.values() for a, b in s):
        return None, problems  # every NVLink-bound group is inside a node: nothing for Slurm to keep together
    if asked is not None:
        why = need.unfit(asked)
        if why:
            problems.append(Problem("topology.segment", asked, f"{why}; expected a segment that divides the job's"
                                    f" nodes, keeps each NVLink-bound group whole and fits segment_size {need.usable}"))
            return None, problems
        size = min(asked, nodes)
    else:
        candidates = [s for s in range(1, min(nodes, need.usable) + 1) if nodes % s == 0]
        fits = [s for s in candidates if need.unfit(s) is None]
        if not fits:
            widest, kind = max((b - a + 1, kind) for kind, s in spans.items() for a, b in s)
            tried = "; ".join(f"{s}: {need.unfit(s)}" for s in candidates if s >= widest) or (
                f"no divisor of {nodes} from {widest} to {need.usable}")
            hint = need.spares_hint(candidates)
            problems.append(Problem(
                "spares" if hint else "nodes", spec.spares if hint else nodes,
                f"no segment works on block site {site.name}: {_a(BOUND[kind][2])} group spans {widest} nodes, so a"
                f" segment must hold whole groups (at least {widest} nodes), divide the job's {nodes} nodes, hold its"
                f" share of the {spec.spares} spares and have at most {need.usable} nodes (segment_size); tried {tried}"
                + (f"; expected e.g. {hint}" if hint else "")))
            return None, problems
        size = fits[0]
    rendered = site.slurm_has(SEGMENT, unknown=True)
    if not rendered:
        warnings.append(f"site {site.name} runs Slurm {site.slurm_version}, which has no --segment ({release_name(SEGMENT)} or"
                        " later): Slurm may place an NVLink-bound group across blocks, and the job is then refused at start")
    free, seen = [], [groups[kind] for kind in spans]
    for kind, g in groups.items():
        if kind not in spans and len(g[0]) > 1 and g not in seen:  # not trivial, nor another kind's groups again
            seen.append(g)
            free.append(kind)
    crossing = [kind for kind in free if _crosses(node_spans(groups[kind], gpus_per_node), size)]
    widths = {kind: max(b - a + 1 for a, b in s) for kind, s in spans.items()}
    count = nodes // size
    inside = [kind for kind in free if kind not in crossing]
    return Segments(size, count, spec.spares // count, rendered, widths, crossing, inside), problems
