"""From what a node reports to a site config: choose NICs, number rails, split CPUs, write YAML.

Inputs are `NodeFacts` (one node type's GPUs with their CPU lists, NUMA
nodes and distance to each NIC) from `nvidia-smi topo -m`, a live probe or
gres.conf, plus `ImportOptions` from the command line. The output is a plain
dict in the site config's layout, checked with `clusterctl.config.site` before it
is returned, and its YAML.

How each GPU's NIC is chosen (documented in docs/admin/sites.md):

1. Distances rank PIX < PXB < PHB < NODE < SYS. NICs named with
   `--exclude-nic` (and, on a live node, NICs with no active port) are never
   chosen.
2. GPUs with a NIC at PHB or closer choose first, closest GPUs first: each
   takes, among the NICs at its best distance, the one fewest GPUs have taken
   so far (then the first in the matrix). Several NICs tied at the best
   distance are so dealt out one per GPU: GPU 0 and GPU 1 both PXB to mlx5_0
   and mlx5_1 get one each; four GPUs behind one NIC share it.
3. GPUs with nothing closer than NODE then choose among the NICs already
   chosen (the rails), closest first, fewest users first, so they share a
   rail NIC rather than pick a storage or management NIC; only when no GPU
   has a close NIC do they choose among all NICs.
4. The chosen NICs are the rails, numbered in the order of the first GPU
   using each. NICs no GPU chose (storage, management, bonded NICs far from
   every GPU) are listed without a rail.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from clusterctl.errors import OMIT, ConfigError, Problem
from clusterctl.siteimport.cpus import CpuSplitError, disjoint_sets
from clusterctl.siteimport.nvsmi import LEVEL_RANK, Topo
from clusterctl.siteimport.siteyaml import FlowMap
from clusterctl.siteimport.slurmconf import GresNodes, gres_nvlink_domain
from clusterctl.syntax import hostlist
from clusterctl.syntax.cpulist import format_cpulist
from clusterctl.syntax.slurmrelease import SEGMENT, release_name

NEAR = LEVEL_RANK["PHB"]

# Memory per GPU in GB (10^9 bytes) by model name, longest names first: only
# for imports that cannot ask the GPU (text of nvidia-smi topo, gres.conf).
KNOWN_MEMORY_GB = [
    ("gh200", 96), ("gb200", 186), ("h200", 141), ("h100", 80), ("h800", 80), ("h20", 96), ("b200", 180),
    ("a100", 80), ("a800", 80), ("l40s", 48), ("l40", 48), ("a40", 48), ("a30", 24), ("a10", 24),
    ("l4", 24), ("v100", 32), ("mi300x", 192), ("mi325x", 256), ("mi250x", 128),
]

_RDMA_PREFIXES = {
    "mlx": "ib", "ibp": "ib", "hfi": "ib", "qib": "ib",
    "bnxt_re": "roce", "irdma": "roce", "qedr": "roce", "rocep": "roce", "erdma": "roce",
    "efa": "efa", "rdmap": "efa", "cxi": "slingshot",
}


def guess_kind(name: str) -> str:
    """A NIC's kind from its device name alone (a live probe reads the link layer instead)."""
    lowered = name.lower()
    if "bond" in lowered:
        return "roce"  # RDMA over a bond of Ethernet ports (mlx5_bond_0)
    if lowered == "lo":
        return "loopback"
    for prefix, kind in sorted(_RDMA_PREFIXES.items(), key=lambda kv: -len(kv[0])):
        if lowered.startswith(prefix):
            return kind
    return "ethernet"


@dataclass
class NicFacts:
    name: str
    kind: str | None = None
    netdev: str | None = None
    port: int | None = None
    numa: int | None = None
    usable: bool = True  # False: no active port


@dataclass
class GpuFacts:
    index: int
    cpus: frozenset[int] | None = None
    numa: int | None = None
    levels: dict[str, str] = field(default_factory=dict)  # NIC name -> PIX .. SYS


@dataclass
class NodeFacts:
    """One node's GPUs, NICs and CPUs, from whichever source."""

    source: str
    gpus: list[GpuFacts]
    nics: list[NicFacts] = field(default_factory=list)
    nvlink_domain: int | None = None
    gpu_model: str | None = None
    gpu_memory_gb: float | None = None
    host_memory_gb: float | None = None  # the node's memory (a live probe's /proc/meminfo)
    gpu_vendor: str = "nvidia"
    siblings: dict[int, frozenset[int]] | None = None
    numa_cpus: dict[int, frozenset[int]] | None = None
    sockets: int | None = None
    interface: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class ImportOptions:
    name: str | None = None
    nodes: str | None = None
    partition: str = "gpu"
    node_type: str | None = None
    interface: str | None = None
    gpu_model: str | None = None
    gpu_memory_gb: float | None = None
    host_memory_gb: float | None = None  # --host-memory-gb, else slurm.conf's RealMemory (--slurm-conf)
    nvlink_domain: int | None = None
    sockets: int | None = None
    exclude_nics: list[str] = field(default_factory=list)
    extra_nics: list[str] = field(default_factory=list)
    smt_offset: int | None = None
    slurm_version: str | None = None  # the cluster's release ("24.05"): --slurm-version, else this machine's scontrol


# --- facts from each source ------------------------------------------------------------


def facts_from_topo(topo: Topo) -> NodeFacts:
    facts = NodeFacts(source=topo.source, gpus=[], nics=[NicFacts(n) for n in topo.nics], warnings=list(topo.warnings))
    several = []
    for gpu in topo.gpus:
        numa = gpu.numa[0] if gpu.numa else None
        if len(gpu.numa) > 1:
            several.append(gpu.index)
        facts.gpus.append(GpuFacts(gpu.index, gpu.cpus, numa, dict(zip(topo.nics, gpu.nic_levels))))
    if several:
        facts.warnings.append(
            f"{topo.source}: GPU {format_cpulist(several)} report several NUMA nodes (e.g."
            f" {format_cpulist(set(topo.gpus[several[0]].numa))}); each is bound to the first it reports"
        )
    facts.nvlink_domain = topo.nvlink_domain()
    if len(topo.gpus) > 1 and not any(link.startswith("NV") for g in topo.gpus for link in g.links):
        facts.warnings.append(
            f"{topo.source}: no NVLink between any GPUs (PCIe-only GPUs, or `nvidia-smi topo -mp`, which hides"
            " NVLink): nvlink_domain 1; pass --nvlink-domain if the GPUs are NVLinked"
        )
    return facts


def facts_from_gres(group: GresNodes, source: str, smt_offset: int | None = None) -> NodeFacts:
    """A node group of gres.conf: GPU count, model (Type=), cores and NVLinks; no NICs."""
    gpus = []
    for pos, gpu in enumerate(group.gpus):
        cpus = gpu.cores
        if cpus is not None and smt_offset and not group.legacy_cpus:
            cpus = frozenset(cpus | {c + smt_offset for c in cpus})
        gpus.append(GpuFacts(pos, cpus))
    types = [g.type for g in group.gpus if g.type]
    model = None
    warnings = []
    if types:
        model = types[0]
        if len(set(types)) > 1:
            warnings.append(f"{source}: {group.nodes or 'these nodes'} mix GPU types {sorted(set(types))}; using {model}")
    vendor = "amd" if (group.autodetect == "rsmi" or (model or "").lower().startswith("mi")) else "nvidia"
    return NodeFacts(
        source=source,
        gpus=gpus,
        nvlink_domain=gres_nvlink_domain(group.gpus),
        gpu_model=model,
        gpu_vendor=vendor,
        warnings=warnings,
    )


def merge_facts(primary: NodeFacts, gres: NodeFacts) -> NodeFacts:
    """The node's own report (topo or probe) first; gres.conf fills what it lacks."""
    if len(primary.gpus) != len(gres.gpus):
        raise ConfigError(
            gres.source,
            [
                Problem(
                    "File",
                    len(gres.gpus),
                    f"expected {len(primary.gpus)} GPUs per node, as {primary.source} shows",
                )
            ],
        )
    for mine, theirs in zip(primary.gpus, gres.gpus):
        if mine.cpus is None:
            mine.cpus = theirs.cpus
    primary.gpu_model = primary.gpu_model or gres.gpu_model
    if gres.nvlink_domain and (primary.nvlink_domain or 1) < gres.nvlink_domain:
        primary.nvlink_domain = gres.nvlink_domain
    primary.warnings += gres.warnings
    return primary


# --- choosing NICs and CPUs --------------------------------------------------------------


def assign_nics(facts: NodeFacts, exclude: set[str]) -> dict[int, str | None]:
    """GPU index -> its NIC (None: no NIC reachable), by the rule in this module's docstring."""
    order = {nic.name: pos for pos, nic in enumerate(facts.nics)}
    usable = [n.name for n in facts.nics if n.usable and n.name not in exclude]
    load: Counter[str] = Counter()
    chosen: dict[int, str | None] = {}

    def pick(gpu: GpuFacts, pool: list[str]) -> str | None:
        ranked = [(LEVEL_RANK[gpu.levels[n]], n) for n in pool if n in gpu.levels]
        if not ranked:
            return None
        best = min(rank for rank, _ in ranked)
        return min((n for rank, n in ranked if rank == best), key=lambda n: (load[n], order[n]))

    def best_rank(gpu: GpuFacts) -> int:
        return min((LEVEL_RANK[gpu.levels[n]] for n in usable if n in gpu.levels), default=len(LEVEL_RANK))

    by_distance = sorted(facts.gpus, key=lambda g: (best_rank(g), g.index))
    for gpu in by_distance:
        if best_rank(gpu) <= NEAR:
            nic = pick(gpu, usable)
            chosen[gpu.index] = nic
            load[nic] += 1  # type: ignore[index]
    rails = [n for n in usable if load[n]]
    for gpu in by_distance:
        if gpu.index in chosen:
            continue
        nic = pick(gpu, rails) or pick(gpu, usable)
        chosen[gpu.index] = nic
        if nic:
            load[nic] += 1
    return chosen


def _numa_of(cpus: frozenset[int], numa_cpus: dict[int, frozenset[int]]) -> int | None:
    best = max(numa_cpus, key=lambda n: (len(cpus & numa_cpus[n]), -n), default=None)
    return best if best is not None and cpus & numa_cpus[best] else None


def node_type_from_facts(
    facts: NodeFacts, opts: ImportOptions, allow_no_nic: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """The node type's section of the site config, and the warnings worth showing.

    `allow_no_nic` (the `--json` rail map) lists a GPU without a NIC with no NICs
    instead of refusing it; such a section is not a valid site config.
    """
    warnings = list(facts.warnings)
    src = facts.source
    gpus = sorted(facts.gpus, key=lambda g: g.index)
    if not gpus:
        raise ConfigError(src, [Problem("", OMIT, "describes no GPU")])

    own = _cpus(facts, gpus, warnings)
    chosen, nic_section = _nics(facts, opts, gpus, warnings, allow_no_nic)
    model, memory = _gpu(facts, opts, warnings)
    domain = opts.nvlink_domain or facts.nvlink_domain or 1
    numa_nodes = {g.numa for g in gpus}
    sockets = opts.sockets or facts.sockets or max(1, len(numa_nodes))
    host = opts.host_memory_gb or facts.host_memory_gb
    if host is None:
        warnings.append("host_memory_gb unknown: pass --host-memory-gb or --slurm-conf (RealMemory), or edit the YAML;"
                        " without it in-memory snapshots are not checked against the nodes' memory")
    data = {
        "gpu_model": model,
        "gpu_vendor": facts.gpu_vendor,
        "gpu_memory_gb": None if memory is None else round(float(memory), 1) if float(memory) % 1 else int(memory),
        **({"host_memory_gb": round(float(host), 1) if float(host) % 1 else int(host)} if host else {}),
        "nvlink_domain": domain,
        "sockets": sockets,
        "gpus": [
            FlowMap(
                {
                    "index": g.index,
                    "numa": g.numa,
                    "cpus": format_cpulist(own[pos] or frozenset()),
                    "nics": [chosen[g.index]] if chosen[g.index] else [],
                }
            )
            for pos, g in enumerate(gpus)
        ],
        "nics": nic_section,
    }
    return data, warnings


def _cpus(facts: NodeFacts, gpus: list[Any], warnings: list[str]) -> list[frozenset[int] | None]:
    """Each GPU's own CPUs (shared lists split into whole cores), its NUMA node filled in where the input left it."""
    src = facts.source
    for gpu in gpus:
        if gpu.cpus is None and gpu.numa is not None and facts.numa_cpus and gpu.numa in facts.numa_cpus:
            gpu.cpus = facts.numa_cpus[gpu.numa]
    missing = [g.index for g in gpus if not g.cpus]
    if missing:
        raise ConfigError(
            src,
            [
                Problem(
                    "CPU Affinity",
                    OMIT,
                    f"GPU {', '.join(map(str, missing))}: no CPU list (an empty CPU Affinity column, or no Cores=);"
                    " give --gres-conf with Cores= for these GPUs, or run `clusterctl site import --probe` on the node",
                )
            ],
        )
    if any(g.numa is None for g in gpus):
        if facts.numa_cpus:
            for gpu in gpus:
                if gpu.numa is None:
                    gpu.numa = _numa_of(gpu.cpus or frozenset(), facts.numa_cpus)
        if any(g.numa is None for g in gpus):
            distinct = sorted({g.cpus for g in gpus if g.numa is None}, key=lambda s: min(s))  # type: ignore[arg-type]
            for gpu in gpus:
                if gpu.numa is None:
                    gpu.numa = distinct.index(gpu.cpus)  # type: ignore[arg-type]
            warnings.append(
                f"{src}: no NUMA node given; numbered NUMA nodes by CPU list (lowest CPUs first: node 0);"
                " check with `numactl -H` on a node"
            )
    try:
        own = disjoint_sets([g.cpus for g in gpus], facts.siblings)
    except CpuSplitError as exc:
        raise ConfigError(src, [Problem("CPU Affinity", OMIT, str(exc))]) from None
    shared = sorted({g.index for g, mine in zip(gpus, own) if mine != g.cpus})
    if shared:
        warnings.append(
            f"{src}: GPU {format_cpulist(shared)} share their CPU lists;"
            " each got a contiguous share of whole cores (see docs/admin/sites.md, the CPU split rule)"
        )
    return own


def _nics(facts: NodeFacts, opts: ImportOptions, gpus: list[Any], warnings: list[str],
          allow_no_nic: bool) -> tuple[dict[int, str | None], dict[str, Any]]:
    """The NIC each GPU uses (GPU index -> NIC name), and the site's `nics:` section with the rails numbered."""
    src = facts.source
    names = {n.name for n in facts.nics}
    for name in opts.extra_nics:
        if name not in names:
            facts.nics.append(NicFacts(name, kind=guess_kind(name), netdev=name if guess_kind(name) == "ethernet" else None))
            names.add(name)
    if opts.extra_nics:
        # --nic: NICs the report does not show (gres.conf, or a node without RDMA NICs), dealt out in blocks.
        extra = list(opts.extra_nics)
        for pos, gpu in enumerate(gpus):
            if not any(n in gpu.levels for n in names if n not in opts.extra_nics):
                gpu.levels[extra[pos * len(extra) // len(gpus)]] = "PHB"
    unknown = sorted(set(opts.exclude_nics) - names)
    if unknown:
        warnings.append(f"--exclude-nic names NICs {src} does not show: {', '.join(unknown)}")
    for nic in facts.nics:
        if not nic.usable:
            warnings.append(f"{src}: {nic.name} has no active port; not used as a rail")
    chosen = assign_nics(facts, set(opts.exclude_nics))
    lost = [i for i, nic in sorted(chosen.items()) if nic is None]
    if lost and allow_no_nic:
        warnings.append(f"{src}: GPU {format_cpulist(lost)} have no NIC")
    elif lost:
        raise ConfigError(
            src,
            [
                Problem(
                    "NICs",
                    OMIT,
                    f"GPU {', '.join(map(str, lost))}: no NIC to use ("
                    + ("the node shows no NIC" if not facts.nics else "every NIC is excluded or down")
                    + "); name the NIC ranks should use with --nic NAME (an RDMA device such as mlx5_0,"
                    " or the Ethernet interface for socket transports)",
                )
            ],
        )
    rails: dict[str, int] = {}
    for index in sorted(chosen):
        nic = chosen[index]
        if nic is not None and nic not in rails:
            rails[nic] = len(rails)  # type: ignore[index]
    for gpu in gpus:
        nic = chosen[gpu.index]
        level = gpu.levels.get(nic or "")
        if level in ("NODE", "SYS"):
            warnings.append(f"{src}: GPU{gpu.index} has no NIC closer than {level}; it uses {nic}")

    nic_section: dict[str, Any] = {}
    for nic in facts.nics:
        entry: dict[str, Any] = {}
        if nic.name in rails:
            entry["rail"] = rails[nic.name]
        if nic.port and nic.port != 1:
            entry["port"] = nic.port
        if nic.netdev:
            entry["netdev"] = nic.netdev
        entry["kind"] = nic.kind or guess_kind(nic.name)
        nic_section[nic.name] = FlowMap(entry)
    return chosen, nic_section


def _gpu(facts: NodeFacts, opts: ImportOptions, warnings: list[str]) -> tuple[str, float | None]:
    """The GPU model and its memory: given, reported, or known for the model; never a guess (None: left empty)."""
    model = opts.gpu_model or facts.gpu_model
    memory = opts.gpu_memory_gb or facts.gpu_memory_gb
    if memory is None and model:
        lowered = model.lower().replace(" ", "")
        memory = next((float(gb) for key, gb in KNOWN_MEMORY_GB if key in lowered), None)
        if memory is not None:
            warnings.append(f"gpu_memory_gb {memory:g} assumed for {model}; pass --gpu-memory-gb if yours differs")
    if memory is None:  # never a guess: left empty, which `site validate` refuses until a person writes it
        warnings.append(
            "gpu_memory_gb is left empty: the input does not say and the GPU is not one clusterctl knows; pass"
            " --gpu-memory-gb (and --gpu-model), or write it in the YAML (site validate refuses the file until then)"
        )
    if not model:
        model = "unknown"
        warnings.append("gpu_model unknown: pass --gpu-model (e.g. H100-SXM5-80GB), or edit the YAML")
    return model, memory


# --- the whole site --------------------------------------------------------------------


@dataclass
class Built:
    data: dict[str, Any]
    warnings: list[str]
    sources: list[str]


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug or "gpu"


def default_site_name(nodes: str | None) -> str:
    if nodes:
        first = hostlist.expand(nodes)[0]
        stem = re.sub(r"[\d\-_.]+$", "", first)
        if stem:
            return stem
    return "site"


def build_site(
    node_types: list[tuple[NodeFacts, str | None]],
    opts: ImportOptions,
    topology: dict[str, Any] | None,
    sources: list[str],
    interface_guess: str | None = None,
) -> Built:
    """Assemble and check the site: one partition per node type (the first is the default)."""
    from clusterctl.config.site import rail_optimized, site_problems

    warnings: list[str] = []
    types: dict[str, dict[str, Any]] = {}
    partitions: dict[str, dict[str, Any]] = {}
    for pos, (facts, nodes) in enumerate(node_types):
        section, notes = node_type_from_facts(facts, opts)
        warnings += [n for n in notes if n not in warnings]
        same = next((t for t, existing in types.items() if _plain(existing) == _plain(section)), None)
        if same is not None:  # node groups that differ only in how gres.conf describes them
            part = next(p for p in partitions.values() if p["node_type"] == same)
            if nodes and part.get("nodes"):
                part["nodes"] = hostlist.compress(hostlist.expand(part["nodes"]) + hostlist.expand(nodes))
            continue
        name = opts.node_type if (opts.node_type and pos == 0) else None
        name = name or _slug(section["gpu_model"] if section["gpu_model"] != "unknown" else "gpu")
        base, n = name, 2
        while name in types:
            name, n = f"{base}-{n}", n + 1
        types[name] = section
        part_name = opts.partition if pos == 0 else name
        base, n = part_name, 2
        while part_name in partitions:
            part_name, n = f"{base}-{n}", n + 1
        part: dict[str, Any] = {"node_type": name}
        if nodes:
            part["nodes"] = nodes
        if pos == 0:
            part["default"] = True
        partitions[part_name] = part
    if all("nodes" not in p for p in partitions.values()):
        warnings.append("the partition lists no nodes: pass --nodes 'gpu-[001-016]' (or --topology-conf / --gres-conf)")

    blocks = bool(topology and topology.get("kind") == "block")
    slurm_version = opts.slurm_version
    if slurm_version is None and blocks:
        slurm_version = release_name(SEGMENT)
        warnings.append(f"slurm_version is set to {slurm_version}, the first release with --segment (the topology has"
                        " blocks and scontrol did not answer here): pass --slurm-version with the cluster's release")
    data: dict[str, Any] = {
        "name": opts.name or default_site_name(next((p.get("nodes") for p in partitions.values() if p.get("nodes")), None)),
        "description": "imported from " + ", ".join(sources),
        "partitions": partitions,
        "node_types": types,
    }
    if slurm_version is not None:
        data["slurm_version"] = slurm_version
    if topology:
        data["topology"] = topology
    interface = opts.interface or interface_guess
    explicit = interface is not None
    if interface is None:
        ib = any(n.get("kind") == "ib" and "rail" in n for t in types.values() for n in t["nics"].values())
        interface = "ib0" if ib else "eth0"
        warnings.append(
            f"network.interface defaults to {interface} (the interface whose address ranks rendezvous on);"
            " pass --interface if the nodes use another"
        )
    data["network"] = {"interface": interface, "port_range": [20000, 29999]}
    env: dict[str, Any] = {}
    if explicit:
        env["NCCL_SOCKET_IFNAME"] = interface
    data["env"] = env

    site = _validated(data)
    if any(rail_optimized(nt) for nt in site.node_types.values()):
        env["NCCL_CROSS_NIC"] = 0
    if not env:
        del data["env"]
    site = _validated(data)
    if blocks and site.topology.usable_segment is not None:
        topology["segment_size"] = site.topology.usable_segment  # written out, for the admin to lower (16 of 18)
    site = _validated(data)
    problems = site_problems(site)
    if problems:
        raise ConfigError("imported site", problems)
    return Built(data, warnings, sources)


def _validated(data: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    from clusterctl.config.site import Site

    plain = _plain(data)
    for node_type in (plain.get("node_types") or {}).values():
        if isinstance(node_type, dict) and node_type.get("gpu_memory_gb") is None:
            node_type["gpu_memory_gb"] = 1  # left empty for a person to write: the rest of the file is checked here
    try:
        return Site.model_validate(plain)
    except ValidationError as exc:
        problems = [
            Problem(".".join(str(p) for p in err["loc"]), err.get("input", OMIT), err["msg"]) for err in exc.errors()
        ]
        raise ConfigError("imported site", problems) from None


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def rail_map(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The `--json` rail map of a node type section: per GPU its index, NUMA node, CPU list and NICs."""
    return [
        {"gpu": g["index"], "numa": g.get("numa"), "cpus": g.get("cpus"), "nics": list(g.get("nics", []))}
        for g in section["gpus"]
    ]
