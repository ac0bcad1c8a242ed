"""The plan: everything decidable before the job starts, from (spec, site).

Pure and deterministic: no I/O, no clock. `make_plan` either returns a Plan
or raises one ConfigError listing every problem with the field that causes
it, so a bad job is rejected before anything is written or submitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from clusterctl.config.site import NodeType, Site, known_nodes
from clusterctl.config.spec import JobSpec
from clusterctl.errors import OMIT, ConfigError, Problem
from clusterctl.plan.avoidance import SuspectChoice, choose_suspects, excluding
from clusterctl.plan.batch import BatchPlan, bubble_fraction, plan_batch
from clusterctl.plan.elastic import ElasticPlan, plan_elastic
from clusterctl.plan.hostmemory import SnapshotCost, snapshot_check
from clusterctl.plan.interval import IntervalAdvice, advise
from clusterctl.plan.memory import MemoryEstimate, MemoryInputs, count_params, estimate_memory
from clusterctl.plan.ranks import GROUP_KINDS, RankLayout
from clusterctl.plan.segments import BOUND, Segments, bound_kinds, plan_segments
from clusterctl.plan.traffic import GroupTraffic, gpu_rails, group_rails, group_traffic
from clusterctl.rundir import secretenv
from clusterctl.rundir.suspects import Suspect
from clusterctl.syntax import hostlist
from clusterctl.syntax.units import format_duration, parse_duration


@dataclass(frozen=True)
class Dims:
    nodes: int
    gpus_per_node: int
    layout: RankLayout
    vpp: int

    @property
    def world(self) -> int:
        return self.layout.world


@dataclass
class Plan:
    """A resolved job: sizes, groups, batch, memory, traffic, warnings."""

    spec: JobSpec
    site: Site
    partition: str
    node_type_name: str
    node_type: NodeType
    dims: Dims
    batch: BatchPlan
    bubble: float
    memory: MemoryEstimate | None
    groups: dict[str, list[list[int]]]
    traffic: dict[str, GroupTraffic]
    dp_rails: list[list[int]]
    checkpoint: IntervalAdvice | None = None
    warnings: list[str] = field(default_factory=list)
    suspects: SuspectChoice = field(default_factory=SuspectChoice)  # suspect nodes left out (in spec.topology.exclude)
    segments: Segments | None = None  # on a block site: the segments that keep NVLink-bound groups in one block
    snapshots: SnapshotCost | None = None  # checkpoint.memory_interval's host memory
    memory_interval: int = 0  # checkpoint.memory_interval resolved (auto: 1 where it is known to fit)
    elastic: ElasticPlan | None = None  # the smaller widths an elastic job may shrink to (plan/elastic.py)

    @property
    def world_size(self) -> int:
        return self.dims.world

    @property
    def nodes(self) -> int:
        return self.dims.nodes

    @property
    def gpus_per_node(self) -> int:
        return self.dims.gpus_per_node

    @property
    def nodes_allocated(self) -> int:
        """Nodes asked of Slurm: the ranks' nodes plus spares."""
        return self.dims.nodes + self.spec.spares

    def rank_map(self) -> list[tuple[int, int]]:
        """(node slot, local GPU) of every rank: block distribution, tp fastest."""
        gpn = self.dims.gpus_per_node
        return [(node, gpu) for node in range(self.dims.nodes) for gpu in range(gpn)]

    def as_json(self) -> dict[str, object]:
        """The stable `plan --json` interface for scripts."""
        layout = self.dims.layout
        return {
            "name": self.spec.name,
            "site": self.site.name,
            "partition": self.partition,
            "node_type": self.node_type_name,
            "world_size": self.world_size,
            "nodes": self.nodes,
            "spares": self.spec.spares,
            "gpus_per_node": self.gpus_per_node,
            "parallel": {
                "tp": layout.tp,
                "pp": layout.pp,
                "dp": layout.dp,
                "cp": layout.cp,
                "ep": layout.ep,
                "vpp": self.dims.vpp,
                "edp": layout.edp,
            },
            "micro_batch": self.batch.micro,
            "grad_accum": self.batch.grad_accum,
            "global_batch": self.batch.global_batch,
            "tokens_per_step": self.batch.tokens_per_step,
            "bubble_fraction": self.bubble,
            "groups": self.groups,
            "rank_map": [{"rank": r, "node": n, "gpu": g} for r, (n, g) in enumerate(self.rank_map())],
            "traffic": {k: t.as_dict() for k, t in self.traffic.items()},
            "dp_rails": self.dp_rails,
            "memory": self.memory.as_dict() if self.memory else None,
            "snapshots": {**self.snapshots.as_dict(), "interval": self.memory_interval} if self.snapshots else None,
            "checkpoint": self.checkpoint.as_dict() if self.checkpoint else None,
            "segments": self.segments.as_dict() if self.segments else None,
            "elastic": self.elastic.as_dict() if self.elastic else None,
            "warnings": self.warnings,
        }


def make_plan(spec: JobSpec, site: Site, source: str = "job spec", suspects: dict[str, Suspect] | None = None) -> Plan:
    """Resolve and check a job against a site; raise ConfigError listing every problem.

    `suspects` are the active suspect nodes read at the edge (the runs root's, or a login node's): those of the
    job's partition that it can do without join topology.exclude (plan/avoidance.py), and the plan says which.
    """
    problems: list[Problem] = []
    warnings: list[str] = []
    partition = spec.partition or site.default_partition
    if partition not in site.partitions:
        raise ConfigError(
            source, [Problem("partition", partition, f"expected a partition of site {site.name}: {', '.join(site.partitions)}")]
        )
    node_type_name = site.partitions[partition].node_type
    node_type = site.node_types[node_type_name]
    dims = _resolve_dims(spec, node_type, problems)
    if dims is None:
        raise ConfigError(source, problems)
    choice = choose_suspects(spec, site, partition, dims.nodes + spec.spares, suspects or {})
    spec = excluding(spec, choice)
    layout = dims.layout
    problems += _model_problems(spec, layout, dims.vpp)
    size_problems = _size_problems(spec, site, partition, dims)
    problems += size_problems
    problems += _partition_problems(spec, site, partition, dims, warnings)
    problems += _network_problems(spec, site)
    batch = plan_batch(spec.batch.micro, spec.batch.global_, spec.batch.grad_accum, layout.dp, spec.seq_len)
    if isinstance(batch, Problem):
        problems.append(batch)
    if size_problems:
        # Nothing that grows with the world size is built for a job that cannot run:
        # `nodes: 100000000` is refused in milliseconds, not after gigabytes of groups.
        raise ConfigError(source, problems)
    groups = {kind: layout.groups(kind) for kind in GROUP_KINDS}
    problems += _nvlink_problems(spec, site, node_type, dims, groups)
    segments, segment_problems = plan_segments(spec, site, dims.gpus_per_node, dims.nodes, groups, warnings)
    problems += segment_problems
    if problems:
        raise ConfigError(source, problems)
    assert isinstance(batch, BatchPlan)
    gpn = dims.gpus_per_node
    traffic = {kind: group_traffic(kind, g, gpn) for kind, g in groups.items()}
    dp_rails = group_rails(groups["dp"], gpu_rails(node_type), gpn)
    memory = _memory(spec, node_type, layout, batch)
    if memory is not None and not memory.fits:
        warnings.append("the memory estimate does not fit the GPU: see the memory table")
    memory_interval, snapshots, snapshot_problems = snapshot_check(spec.checkpoint.memory_interval, memory, gpn,
                                                                   node_type.host_memory_gb, warnings)
    if snapshot_problems:
        raise ConfigError(source, snapshot_problems)
    elastic = None
    if spec.elastic is not None:
        found = plan_elastic(spec.elastic, dims.nodes, gpn, layout.tp * layout.cp * layout.pp, layout.ep, layout.cp, batch,
                             lambda dp, shrunk: _memory(spec, node_type, replace(layout, dp=dp), shrunk))
        if isinstance(found, list):
            raise ConfigError(source, found)
        elastic = found
    for name in secretenv.suspicious(spec.env):
        warnings.append(f"env.{name} looks like a secret, and env values are written to spec.yaml and job.sbatch:"
                        f" list {name} in secret_env instead (its value is then taken from the submitting environment)")
    if (idle := len(node_type.gpus) - gpn) > 0 and not site.oversubscribe:  # exclusive nodes: nobody else gets them
        warnings.append(f"gpus_per_node {gpn} leaves {idle} of each node's {len(node_type.gpus)} GPUs idle for the whole"
                        f" job (its nodes are allocated whole): use gpus_per_node {len(node_type.gpus)}, or fewer nodes")
    if node_type.nvlink_domain > len(node_type.gpus) and site.topology.kind != "block":
        warnings.append(
            f"NVLink domains span {node_type.nvlink_domain // len(node_type.gpus)} nodes but the site has no block"
            " topology: Slurm may split a domain's nodes"
        )
    return Plan(
        checkpoint=_interval(spec, site, memory, dims),
        spec=spec,
        site=site,
        partition=partition,
        node_type_name=node_type_name,
        node_type=node_type,
        dims=dims,
        batch=batch,
        bubble=bubble_fraction(layout.pp, dims.vpp, batch.grad_accum),
        memory=memory,
        groups=groups,
        traffic=traffic,
        dp_rails=dp_rails,
        warnings=warnings,
        suspects=choice,
        segments=segments,
        snapshots=snapshots,
        memory_interval=memory_interval,
        elastic=elastic,
    )


def _resolve_dims(spec: JobSpec, node_type: NodeType, problems: list[Problem]) -> Dims | None:
    par = spec.parallel
    gpus_here = len(node_type.gpus)
    gpn = spec.gpus_per_node or gpus_here
    if gpn > gpus_here:
        problems.append(
            Problem("gpus_per_node", gpn, f"expected at most {gpus_here} (the {node_type.gpu_model} nodes have {gpus_here})")
        )
        return None
    model_parallel = par.tp * par.cp * par.pp
    if par.dp is not None:
        world = model_parallel * par.dp
        if spec.nodes is not None and spec.nodes * gpn != world:
            formula = f"tp*cp*dp*pp = {par.tp}*{par.cp}*{par.dp}*{par.pp} = {world} ranks"
            if world % gpn:
                allowed = f"{formula}, which is not a multiple of {gpn} GPUs per node; change parallel.dp or gpus_per_node"
            else:
                allowed = f"expected {world // gpn} nodes: {formula} at {gpn} per node (or omit nodes, or omit parallel.dp)"
            problems.append(Problem("nodes", spec.nodes, allowed))
            return None
        if world % gpn:
            problems.append(
                Problem(
                    "gpus_per_node",
                    gpn,
                    f"world size {world} (tp*cp*dp*pp) does not fill whole nodes of {gpn}; "
                    f"expected gpus_per_node dividing {world}, or a dp that makes the world a multiple of {gpn}",
                )
            )
            return None
        dp = par.dp
    else:
        nodes = spec.nodes if spec.nodes is not None else None
        if nodes is None:
            if model_parallel % gpn:
                problems.append(
                    Problem(
                        "parallel",
                        OMIT,
                        f"tp*cp*pp = {model_parallel} does not fill whole nodes of {gpn} GPUs; "
                        "set nodes, parallel.dp or gpus_per_node",
                    )
                )
                return None
            dp = 1
        else:
            ranks = nodes * gpn
            if ranks % model_parallel:
                problems.append(
                    Problem(
                        "nodes",
                        nodes,
                        f"{nodes} node{'s' if nodes != 1 else ''} x {gpn} GPUs = {ranks} ranks, not a multiple of"
                        f" tp*cp*pp = {model_parallel};"
                        " expected a node count that makes dp whole",
                    )
                )
                return None
            dp = ranks // model_parallel
    layout = RankLayout(tp=par.tp, cp=par.cp, dp=dp, pp=par.pp, ep=par.ep)
    if (layout.dp * layout.cp) % layout.ep:
        problems.append(
            Problem("parallel.ep", par.ep, f"expected a divisor of dp*cp = {layout.dp}*{layout.cp} = {layout.dp * layout.cp}")
        )
        return None
    return Dims(nodes=layout.world // gpn, gpus_per_node=gpn, layout=layout, vpp=par.vpp)


def _model_problems(spec: JobSpec, layout: RankLayout, vpp: int) -> list[Problem]:
    problems = []
    if vpp > 1 and layout.pp == 1:
        problems.append(Problem("parallel.vpp", vpp, "expected 1 without pipeline parallelism (parallel.pp > 1)"))
    if layout.cp > 1 and spec.seq_len % (2 * layout.cp):
        problems.append(
            Problem("seq_len", spec.seq_len, f"expected a multiple of 2*cp = {2 * layout.cp} (load-balanced context parallel)")
        )
    model = spec.model
    if model is None:
        if layout.ep > 1:
            problems.append(Problem("parallel.ep", layout.ep, "expected 1 unless model.experts is given"))
        return problems
    if model.layers is not None and model.layers % (layout.pp * vpp):
        problems.append(
            Problem(
                "model.layers",
                model.layers,
                f"expected a multiple of pp*vpp = {layout.pp}*{vpp} = {layout.pp * vpp} (whole layers per stage)",
            )
        )
    if model.heads is not None and model.heads % layout.tp:
        problems.append(Problem("model.heads", model.heads, f"expected a multiple of tp = {layout.tp}"))
    if model.kv_heads is not None and model.kv_heads % layout.tp:
        problems.append(Problem("model.kv_heads", model.kv_heads, f"expected a multiple of tp = {layout.tp}"))
    if layout.ep > 1 and model.experts == 0:
        problems.append(Problem("parallel.ep", layout.ep, "expected 1 for a dense model (model.experts is 0)"))
    if model.experts and model.experts % layout.ep:
        problems.append(Problem("model.experts", model.experts, f"expected a multiple of ep = {layout.ep}"))
    return problems


MAX_WORLD = 1 << 20
"""The most ranks a plan may have (ten times the largest jobs run so far), for sites whose partitions list no nodes."""


def _size_problems(spec: JobSpec, site: Site, partition: str, dims: Dims) -> list[Problem]:
    """Sizes the site cannot hold, found from counts alone before anything is built."""
    part = site.partitions[partition]
    if part.nodes:
        available = hostlist.count(part.nodes)
        wanted = dims.nodes + spec.spares
        excluded = _excluded_in(spec, part.nodes) if spec.topology.exclude else set()
        if wanted > available - len(excluded):
            needs = f"the job needs {dims.nodes}" + (f" + {spec.spares} spares" if spec.spares else "")
            left = f", {len(excluded)} of them excluded by topology.exclude" if excluded else ""
            return [Problem("nodes", dims.nodes, f"partition {partition} has {available} nodes{left}; {needs}")]
    if dims.world > MAX_WORLD:
        return [
            Problem(
                "nodes",
                dims.nodes,
                f"{dims.nodes} nodes x {dims.gpus_per_node} GPUs = {dims.world} ranks; expected at most {MAX_WORLD} ranks",
            )
        ]
    return []


def _excluded_in(spec: JobSpec, partition_nodes: str) -> set[str]:
    """The partition's nodes that topology.exclude names (bounded: both lists are hostlist-checked)."""
    members = set(hostlist.expand(partition_nodes))
    names: set[str] = set()
    for expr in spec.topology.exclude:
        try:
            names.update(n for n in hostlist.expand(expr) if n in members)
        except hostlist.HostlistError:
            continue  # reported by _partition_problems
    return names


def _partition_problems(spec: JobSpec, site: Site, partition: str, dims: Dims, warnings: list[str]) -> list[Problem]:
    problems = []
    part = site.partitions[partition]
    if part.max_time:
        limit = parse_duration(part.max_time, bare_unit=60)
        if spec.time_limit > limit:
            problems.append(
                Problem(
                    "time_limit",
                    format_duration(spec.time_limit),
                    f"expected at most partition {partition}'s limit {part.max_time} ({format_duration(limit)})",
                )
            )
    members = (set(hostlist.expand(part.nodes)) if part.nodes else known_nodes(site)) if spec.topology.exclude else None
    for expr in spec.topology.exclude:
        try:
            names = hostlist.expand(expr)
        except hostlist.HostlistError as exc:
            problems.append(Problem("topology.exclude", expr, f"expected a node name or hostlist ({exc})"))
            continue
        if members is None:
            continue
        stray = [n for n in names if n not in members]
        if stray:
            where = f"partition {partition}'s nodes {part.nodes}" if part.nodes else f"nodes of site {site.name}"
            problems.append(
                Problem("topology.exclude", expr, f"{hostlist.compress(stray)} is not among {where}; expected names from it")
            )
    if spec.topology.switches is not None and site.topology.kind == "flat":
        warnings.append("topology.switches is set but the site describes no switch tree; Slurm may ignore it")
    return problems


def _network_problems(spec: JobSpec, site: Site) -> list[Problem]:
    if spec.rendezvous.port_range is None:
        return []
    lo, hi = spec.rendezvous.port_range
    elo, ehi = site.network.ephemeral_range
    if lo <= ehi and elo <= hi:
        return [
            Problem(
                "rendezvous.port_range",
                [lo, hi],
                f"expected a range outside the site's ephemeral ports {elo}-{ehi}",
            )
        ]
    return []


def _domain_of(rank: int, gpn: int, gpus_per_node_type: int, domain: int) -> int:
    node, local = divmod(rank, gpn)
    return (node * gpus_per_node_type + local) // domain


def _nvlink_problems(
    spec: JobSpec, site: Site, node_type: NodeType, dims: Dims, groups: dict[str, list[list[int]]]
) -> list[Problem]:
    """NVLink-bound groups that would leave their domain, where domains are numbered rank by rank. On a block site
    whose domains span nodes, the segments keep groups whole instead (plan/segments.py)."""
    gpn, per_type, domain = dims.gpus_per_node, len(node_type.gpus), node_type.nvlink_domain
    if site.topology.kind == "block" and domain > per_type:
        return []
    problems = []
    for kind in bound_kinds(spec):
        flag, path, label = BOUND[kind]
        for group in groups[kind]:
            first = _domain_of(group[0], gpn, per_type, domain)
            if any(_domain_of(r, gpn, per_type, domain) != first for r in group):
                problems.append(
                    Problem(
                        path,
                        getattr(dims.layout, path.split(".")[1]),
                        f"{label} = {len(group)} must fit inside one NVLink domain of {domain} GPUs "
                        f"({node_type.gpu_model}); e.g. ranks {group[0]}..{group[-1]} would span domains."
                        f" Use {label} <= {min(domain, gpn)} dividing it, or set topology.{flag}: false",
                    )
                )
                break
    return problems


def _interval(spec: JobSpec, site: Site, memory: MemoryEstimate | None, dims: Dims) -> IntervalAdvice | None:
    """Young/Daly advice: needs a save cost, measured (checkpoint.save_seconds) or estimated from the state size."""
    if memory is None and spec.checkpoint.save_seconds is None:
        return None
    state = (memory.params + memory.optimizer) if memory is not None else 0
    return advise(
        state,
        dims.gpus_per_node,
        site.reliability.checkpoint_write_gbs_per_node,
        site.reliability.node_mtbf_hours,
        dims.nodes + spec.spares,
        save_seconds=spec.checkpoint.save_seconds,
        job_mtbf_s=spec.checkpoint.mtbf,
    )


def _memory(spec: JobSpec, node_type: NodeType, layout: RankLayout, batch: BatchPlan) -> MemoryEstimate | None:
    model = spec.model
    if model is None:
        return None
    counts = count_params(
        layers=model.layers,
        hidden=model.hidden,
        heads=model.heads,
        kv_heads=model.kv_heads,
        ffn=model.ffn,
        vocab=model.vocab,
        gated_mlp=model.gated_mlp,
        tied_embeddings=model.tied_embeddings,
        experts=model.experts,
        params=model.params,
    )
    dp_per_node = max(1, len(node_type.gpus) // (layout.tp * layout.cp))
    shard_group = spec.hybrid_shard_group or min(layout.dp * layout.cp, dp_per_node)
    precision = spec.precision
    return estimate_memory(
        MemoryInputs(
            counts=counts,
            tp=layout.tp,
            pp=layout.pp,
            cp=layout.cp,
            ep=layout.ep,
            dp=layout.dp,
            edp=layout.edp,
            params_dtype=precision.params_dtype,
            grads_dtype=precision.grads_dtype,
            master_dtype=precision.master_dtype,
            optimizer_dtype=precision.optimizer,
            optimizer=spec.optimizer,
            sharding=spec.sharding,
            shard_group=shard_group,
            compute_dtype=precision.compute,
            recompute=spec.recompute,
            seq_len=spec.seq_len,
            micro=batch.micro,
            grad_accum=batch.grad_accum,
            layers=model.layers,
            hidden=model.hidden,
            heads=model.heads,
            capacity_bytes=int(node_type.gpu_memory_gb * 1e9),
        )
    )
