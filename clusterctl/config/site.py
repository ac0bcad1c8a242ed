"""Site config: what the admin knows about the cluster, written down once.

Partitions, node types with their rail map (per GPU index: NUMA node, CPU
list, NICs; per NIC: its rail), the switch tree or blocks, addresses, ports,
default environment. `validate_site` holds the checks that need more than one
field (overlapping CPU sets, NICs on no rail, topology naming unknown nodes).
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from clusterctl.config.fieldtypes import (
    ENV_NAME,
    MODULE_NAME,
    RUNS_MODE_DESCRIPTION,
    EnvValue,
    GroupName,
    NonNegativeInt,
    PlainPath,
    PositiveInt,
    RunsMode,
)
from clusterctl.config.problems import validate_located
from clusterctl.config.shipped import shipped_dir
from clusterctl.config.spec import MOUNT
from clusterctl.config.yamlload import Located, load_yaml
from clusterctl.errors import OMIT, ConfigError, Problem
from clusterctl.syntax import hostlist
from clusterctl.syntax.cpulist import parse_cpulist
from clusterctl.syntax.slurmrelease import Release, major_minor, parse_site_release
from clusterctl.syntax.units import parse_duration

DEFAULT_SITE = "local"
SITES_ENV = "CLUSTERCTL_SITES"
LINUX_EPHEMERAL = (32768, 60999)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


def _cpus(value: Any) -> str:
    text = str(value) if isinstance(value, int) else value
    if not isinstance(text, str):
        raise ValueError("expected a CPU list such as 0-13,112-125")
    parse_cpulist(text)
    return text.strip()


CpuList = Annotated[str, Field(description="CPU list such as 0-13,112-125")]


class Gpu(Section):
    """One GPU slot of a node type, and what is closest to it."""

    index: NonNegativeInt = Field(description="the GPU's index on the node (nvidia-smi's), 0, 1, ... in order")
    numa: NonNegativeInt | None = Field(None, description="NUMA node closest to the GPU")
    cpus: CpuList | None = Field(None, description="CPUs to bind the GPU's rank to")
    nics: list[str] = Field(default_factory=list, description="NICs this GPU's rank uses, best first")

    _check_cpus = field_validator("cpus", mode="before")(lambda cls, v: None if v is None else _cpus(v))

    @cached_property
    def cpu_set(self) -> frozenset[int]:
        return parse_cpulist(self.cpus) if self.cpus else frozenset()


class Nic(Section):
    rail: NonNegativeInt | None = Field(None, description="rail (leaf switch plane); none for storage/management NICs")
    port: PositiveInt = Field(1, description="HCA port, as in NCCL_IB_HCA=mlx5_0:1")
    netdev: str | None = Field(None, description="network interface of this NIC (for UCX/socket transports)")
    kind: Literal["ib", "roce", "ethernet", "efa", "slingshot", "loopback"] = Field("ib", description="the link")


class NodeType(Section):
    gpu_model: str = Field(description="the GPU's model name, e.g. H100-SXM5-80GB (shown in plans and reports)")
    gpu_vendor: Literal["nvidia", "amd", "emulated"] = Field("nvidia", description="emulated: the local and test sites")
    gpu_memory_gb: float = Field(gt=0, description="memory per GPU in GB (10^9 bytes)")
    host_memory_gb: float | None = Field(None, gt=0, description="host memory per node in GB (10^9 bytes): in-memory"
                                         " snapshots are sized against it (site import: slurm.conf's RealMemory)")
    nvlink_domain: PositiveInt = Field(description="GPUs per NVLink (or Infinity Fabric) domain")
    sockets: PositiveInt = Field(1, description="CPU sockets per node")
    gpus: list[Gpu] = Field(min_length=1, description="every GPU of the node: its NUMA node, CPUs and NICs (the rail map)")
    nics: dict[str, Nic] = Field(default_factory=dict, description="the node's NICs by name: rail, port, interface, kind")
    features: list[str] = Field(default_factory=list, description="Slurm node features these nodes have (for --constraint)")

    @field_validator("gpu_memory_gb", mode="before")
    @classmethod
    def _memory_set(cls, value: Any) -> Any:
        if value is None:  # what `site import` leaves for a GPU it does not know: never a guess
            raise ValueError("expected the memory per GPU in GB (10^9 bytes), e.g. 80 for an H100-SXM5-80GB:"
                             " it is not set (site import leaves it empty when it cannot tell)")
        return value

    @property
    def gpus_per_node(self) -> int:
        return len(self.gpus)


class Partition(Section):
    node_type: str = Field(description="the node type (a key of node_types) of every node in the partition")
    nodes: str | None = Field(None, description="hostlist of the partition's nodes, e.g. gpu-[001-128]")
    default: bool = Field(False, description="the partition a spec without `partition` uses (one at most)")
    max_time: str | None = Field(None, description="Slurm MaxTime: 2-00:00:00, 48:00:00, 4h, or minutes")

    @field_validator("max_time")
    @classmethod
    def _max_time(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value, bare_unit=60)
        return value


class Switch(Section):
    name: str = Field(description="the switch's name, as in topology.conf")
    nodes: str | None = Field(None, description="hostlist of nodes on this (leaf) switch")
    switches: str | None = Field(None, description="hostlist of child switches")


class Block(Section):
    name: str = Field(description="the block's name, as in topology.conf")
    nodes: str = Field(description="hostlist of the block's nodes (an NVLink domain spanning nodes: NVL72)")


class Topology(Section):
    kind: Literal["tree", "block", "flat"] = Field(
        "flat", description="Slurm's topology plugin: tree (switches), block (NVL domains) or flat (none)"
    )
    switches: list[Switch] = Field(default_factory=list, description="the switch tree (kind tree), as topology.conf lists it")
    blocks: list[Block] = Field(default_factory=list, description="the blocks (kind block), as topology.conf lists them")
    block_sizes: list[PositiveInt] = Field(
        default_factory=list, description="topology.conf BlockSizes: the allocation sizes a block serves"
    )
    segment_size: PositiveInt | None = Field(
        None,
        description="the most nodes of one block a job may use as one segment (sbatch --segment); below the block's"
        " size to keep trays free as the operator's spares (e.g. 16 of 18); default: the smallest block_sizes entry,"
        " else the smallest block",
    )

    @property
    def usable_segment(self) -> int | None:
        """Nodes a segment may have at most: segment_size, else the smallest BlockSizes entry, else the smallest block."""
        if self.segment_size is not None:
            return self.segment_size
        if self.block_sizes:
            return min(self.block_sizes)
        sizes = [hostlist.count(b.nodes) for b in self.blocks if hostlist.is_valid(b.nodes)]
        return min(sizes) if sizes else None


class Network(Section):
    interface: str | None = Field(None, description="interface whose address is the rendezvous address")
    address_family: Literal["ipv4", "ipv6"] = Field("ipv4", description="the rendezvous and heartbeat sockets' address family")
    addresses: dict[str, str] = Field(default_factory=dict, description="node name -> address (no DNS)")
    port_range: tuple[PositiveInt, PositiveInt] = Field((20000, 29999), description="MASTER_PORT range")
    ephemeral_range: tuple[PositiveInt, PositiveInt] = Field(
        LINUX_EPHEMERAL, description="the nodes' net.ipv4.ip_local_port_range"
    )


def _drain_arg(value: Any) -> Any:
    if isinstance(value, str):
        bad = _CONTROL.search(value)
        if bad:
            raise ValueError(f"expected a plain string without NUL or control characters (found {bad.group()!r})")
    return value


DrainArg = Annotated[str, AfterValidator(_drain_arg)]
"""One argument of the drain hook: it reaches exec(2) as is, where a NUL would cut it short."""


class Reliability(Section):
    """What the admin knows about failures and storage (the checkpoint interval), and how blamed nodes are handled."""

    node_mtbf_hours: float = Field(
        5000.0, gt=0, description="mean time between failures of one node (Llama 3's 16k-GPU run: ~5,600 h)"
    )
    checkpoint_write_gbs_per_node: float = Field(
        2.0, gt=0, description="sustained checkpoint write bandwidth of one node to the checkpoint filesystem, GB/s"
    )
    suspect_hours: float = Field(
        24.0,
        ge=0,
        allow_inf_nan=False,
        description="how long a node a verdict blamed is left out of new submissions, in hours; 0 turns it off",
    )
    drain_command: list[DrainArg] | None = Field(
        None,
        min_length=1,
        description="command run once per suspect node (an admin's drain hook; argv, no shell); {node}, {reason}"
        " and {run} inside an item are replaced; default: none",
    )


class ContainerRuntime(Section):
    runtime: Literal["pyxis", "apptainer", "none"] = Field(
        "none", validation_alias=AliasChoices("runtime", "plugin"),  # `plugin:` is what site configs said before
        description="how images run: pyxis (srun --container-image), apptainer (apptainer exec) or none;"
        " a spec's container.runtime may choose another",
    )
    mounts: list[Annotated[str, Field(pattern=MOUNT)]] = Field(
        default_factory=list, description="SRC[:DST[:FLAGS]] bound into every job's container (shared file systems)"
    )
    python: PlainPath = Field("python3", description="the interpreter inside images (ranks run clusterctl's launcher with it)")
    apptainer: PlainPath = Field("apptainer", description="the apptainer (or singularity) command on the compute nodes")


LOGIN_HOST = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9._:\[\]-]+$")


class Login(Section):
    """How a laptop reaches the cluster: the login node that `--remote` commands run on over SSH."""

    host: Annotated[str, Field(pattern=LOGIN_HOST.pattern)] = Field(
        description="[USER@]HOST[:PORT] or a Host alias of ~/.ssh/config"
    )
    clusterctl: PlainPath = Field(
        "clusterctl", description="the clusterctl command on the login node (found through its login shell's PATH)"
    )
    transport: Literal["auto", "paramiko", "openssh"] = Field(
        "auto", description="paramiko, the ssh/scp executables, or auto (paramiko unless ~/.ssh/config asks for more)"
    )


class Expected(Section):
    """What the admin expects of the hardware: `clusterctl qualify` judges its measurements against it."""

    busbw_gbs: dict[str, float] = Field(
        default_factory=dict, description="all-reduce bus bandwidth per group kind (world, tp, dp, ...), GB/s, at least"
    )
    tokens_per_s_per_gpu: float | None = Field(None, gt=0, description="training throughput per GPU, at least")


class Site(Section):
    """A cluster as its admin describes it."""

    name: str = Field(description="the site's name (what a spec's `site` says)")
    description: str = Field("", description="free text for people: what this cluster is")
    partitions: dict[str, Partition] = Field(min_length=1, description="the Slurm partitions jobs may use, by name")
    node_types: dict[str, NodeType] = Field(min_length=1, description="the kinds of GPU node, by name")
    topology: Topology = Field(default_factory=Topology, description="the network's shape as Slurm's topology plugin sees it")
    slurm_version: Annotated[str, BeforeValidator(parse_site_release)] | None = Field(
        None,
        description='the cluster\'s Slurm release, quoted ("24.05"; what `scontrol --version` prints): which sbatch and'
        " srun options a script may carry (--segment from 24.05, --gres-flags=allow-task-sharing from 23.11);"
        " unknown: --segment is rendered, options it only improves are not",
    )
    network: Network = Field(default_factory=Network, description="how ranks reach each other: interface, addresses, ports")
    env: dict[str, EnvValue] = Field(default_factory=dict, description="environment for every rank (NCCL/UCX)")
    modules: list[Annotated[str, Field(pattern=MODULE_NAME.pattern)]] = Field(
        default_factory=list, description="environment modules every job loads: letters, digits, . _ + / @ -"
    )
    container: ContainerRuntime = Field(default_factory=ContainerRuntime, description="the container runtime the site offers")
    reliability: Reliability = Field(
        default_factory=Reliability, description="suspect nodes: how long they are avoided, the drain hook"
    )
    templates: PlainPath | None = Field(None, description="directory of templates overriding the shipped ones")
    oversubscribe: bool = Field(False, description="emulated GPUs may share CPUs (local and test sites)")
    runs_root: PlainPath | None = Field(
        None, description=("where run directories go when the spec names none; ~ and $VARIABLES are expanded ($USER"
                           " is the submitting user); it must be the user's and writable by no one else: a shared one is"
                           " /shared/runs/$USER under a root-owned sticky parent (docs/admin/shared.md)")
    )
    runs_mode: RunsMode = Field("private", description=RUNS_MODE_DESCRIPTION + "; a spec may choose otherwise")
    runs_group: GroupName | None = Field(None, description="the group `runs_mode: group` shares runs with")
    python: PlainPath | None = Field(None, description="interpreter on the compute nodes (default: the submitting one)")
    gres: Literal["gpus-per-node", "gres", "none"] = Field(
        "gpus-per-node", description="how GPUs are requested from Slurm"
    )
    login: Login | None = Field(None, description="the login node a laptop submits through (clusterctl ... --remote)")
    expected: Expected = Field(default_factory=Expected, description="expected figures clusterctl qualify judges against")

    @property
    def default_partition(self) -> str:
        for name, part in self.partitions.items():
            if part.default:
                return name
        return next(iter(self.partitions))

    def node_type_of(self, partition: str) -> NodeType:
        return self.node_types[self.partitions[partition].node_type]

    def slurm_has(self, since: Release, unknown: bool) -> bool:
        """Whether the site's Slurm is at least `since`; `unknown` when the site does not say."""
        if self.slurm_version is None:
            return unknown
        release = major_minor(self.slurm_version)
        return release is not None and release >= since


# --- semantic checks -----------------------------------------------------------


def site_problems(site: Site) -> list[Problem]:
    """Everything wrong with a site that the field types cannot express."""
    problems: list[Problem] = []
    for name, nt in site.node_types.items():
        problems += _node_type_problems(site, name, nt)
    problems += _partition_problems(site)
    problems += _topology_problems(site)
    problems += _network_problems(site)
    for key in site.env:
        if not ENV_NAME.match(key):
            problems.append(Problem(f"env.{key}", key, "expected an environment variable name"))
    return problems


def _node_type_problems(site: Site, name: str, nt: NodeType) -> list[Problem]:
    problems = []
    base = f"node_types.{name}"
    indices = [g.index for g in nt.gpus]
    if sorted(indices) != list(range(len(indices))):
        problems.append(Problem(f"{base}.gpus", indices, f"expected GPU indices 0..{len(indices) - 1}, each once"))
    n = len(nt.gpus)
    if nt.nvlink_domain % n and n % nt.nvlink_domain:
        problems.append(
            Problem(
                f"{base}.nvlink_domain",
                nt.nvlink_domain,
                f"expected a divisor or a multiple of the GPUs per node ({n})",
            )
        )
    owner: dict[int, int] = {}
    for pos, gpu in enumerate(nt.gpus):
        where = f"{base}.gpus[{pos}]"
        if gpu.numa is None:
            problems.append(Problem(f"{where}.numa", None, "expected the GPU's NUMA node (every GPU needs one)"))
        if not gpu.cpus:
            problems.append(Problem(f"{where}.cpus", None, "expected the GPU's CPU list (every GPU needs one)"))
        if not gpu.nics:
            problems.append(Problem(f"{where}.nics", [], "expected at least one NIC (every GPU needs one)"))
        for nic in gpu.nics:
            if nic not in nt.nics:
                known = ", ".join(nt.nics) or "none defined"
                problems.append(Problem(f"{where}.nics", nic, f"expected a NIC defined under {base}.nics ({known})"))
            elif nt.nics[nic].rail is None:
                problems.append(
                    Problem(f"{base}.nics.{nic}.rail", None, f"a NIC used by GPU {gpu.index} must be on a rail")
                )
        if site.oversubscribe:
            continue
        for cpu in sorted(gpu.cpu_set):
            if cpu in owner:
                problems.append(
                    Problem(
                        f"{where}.cpus",
                        gpu.cpus,
                        f"CPU {cpu} is also bound to GPU {owner[cpu]}; CPU sets must not overlap"
                        " (set oversubscribe: true for emulated GPUs)",
                    )
                )
                break
            owner[cpu] = gpu.index
    return problems


def rail_optimized(nt: NodeType) -> bool:
    """Every GPU has its own first NIC, each on a distinct rail (a rail-optimized fabric)."""
    if nt.gpu_vendor == "emulated" or len(nt.gpus) < 2 or any(not g.nics for g in nt.gpus):
        return False
    firsts = [g.nics[0] for g in nt.gpus]
    rails = [nt.nics[n].rail if n in nt.nics else None for n in firsts]
    return len(set(firsts)) == len(firsts) and None not in rails and len(set(rails)) == len(rails)


def site_warnings(site: Site) -> list[str]:
    """What `site validate` reports without failing: legal, but probably not what the admin meant."""
    warnings: list[str] = []
    for name, nt in site.node_types.items():
        if nt.gpu_vendor == "emulated":
            continue
        users: dict[str, list[Gpu]] = {}
        for gpu in nt.gpus:
            for nic in gpu.nics:
                users.setdefault(nic, []).append(gpu)
        for nic, gpus in users.items():
            numas = sorted({g.numa for g in gpus if g.numa is not None})
            if len(numas) > 1:
                by_numa = "; ".join(
                    f"NUMA {n}: GPU {hostlist.compress([str(g.index) for g in gpus if g.numa == n])}" for n in numas
                )
                warnings.append(
                    f"node_types.{name}.nics.{nic}: shared by GPUs on different NUMA nodes ({by_numa});"
                    " the traffic of GPUs on a NUMA node other than the NIC's crosses the interconnect between them"
                )
    topo = site.topology
    usable = topo.usable_segment
    small = [b.name for b in topo.blocks if usable and hostlist.is_valid(b.nodes) and hostlist.count(b.nodes) < usable]
    if small:
        warnings.append(
            f"topology.blocks: {len(small)} block(s) ({', '.join(small[:8])}{', ...' if len(small) > 8 else ''}) have fewer"
            f" nodes than a segment of {usable} (topology.segment_size or the smallest block_sizes entry): no segment"
            " that size is placed there"
        )
    if "NCCL_CROSS_NIC" not in site.env:
        railed = [name for name, nt in site.node_types.items() if rail_optimized(nt)]
        if railed:
            warnings.append(
                f"env.NCCL_CROSS_NIC is not set, but node type {', '.join(railed)} is rail-optimized (each GPU has"
                " its own NIC on its own rail); set NCCL_CROSS_NIC: 0 so NCCL keeps each rail's traffic on its rail"
            )
    return warnings


def _partition_problems(site: Site) -> list[Problem]:
    problems = []
    defaults = [n for n, p in site.partitions.items() if p.default]
    if len(defaults) > 1:
        problems.append(Problem("partitions", defaults, "expected at most one default partition"))
    for name, part in site.partitions.items():
        if part.node_type not in site.node_types:
            problems.append(
                Problem(
                    f"partitions.{name}.node_type",
                    part.node_type,
                    f"expected one of the node types: {', '.join(site.node_types)}",
                )
            )
        if part.nodes is not None:
            try:
                hostlist.expand(part.nodes)
            except hostlist.HostlistError as exc:
                problems.append(Problem(f"partitions.{name}.nodes", part.nodes, f"expected a hostlist ({exc})"))
    return problems


def known_nodes(site: Site) -> set[str] | None:
    """All node names the partitions list, or None when no partition lists them."""
    names: set[str] = set()
    listed = False
    for part in site.partitions.values():
        if part.nodes:
            listed = True
            try:
                names.update(hostlist.expand(part.nodes))
            except hostlist.HostlistError:
                pass
    return names if listed else None


def _topology_problems(site: Site) -> list[Problem]:
    problems: list[Problem] = []
    nodes = known_nodes(site)
    topo = site.topology
    switch_names = [s.name for s in topo.switches]
    if len(set(switch_names)) != len(switch_names):
        dupes = sorted({n for n in switch_names if switch_names.count(n) > 1})
        problems.append(Problem("topology.switches", dupes, "expected each switch name once"))
    for pos, sw in enumerate(topo.switches):
        where = f"topology.switches[{pos}]"
        if not sw.nodes and not sw.switches:
            problems.append(Problem(where, sw.name, "expected nodes or switches under the switch"))
        problems += _unknown(f"{where}.nodes", sw.nodes, nodes, "node", "the partitions' nodes")
        problems += _unknown(f"{where}.switches", sw.switches, set(switch_names), "switch", "the switches named here")
    for pos, block in enumerate(topo.blocks):
        problems += _unknown(f"topology.blocks[{pos}].nodes", block.nodes, nodes, "node", "the partitions' nodes")
    if topo.kind == "tree" and not topo.switches:
        problems.append(Problem("topology.switches", [], "expected switches for a tree topology"))
    if topo.kind == "block" and not topo.blocks:
        problems.append(Problem("topology.blocks", [], "expected blocks for a block topology"))
    return problems + _block_problems(topo)


def _block_problems(topo: Topology) -> list[Problem]:
    """Blocks are NVLink domains: a node in two of them, or a segment no block can hold, is a mistake."""
    problems: list[Problem] = []
    if topo.segment_size is not None and topo.kind != "block":
        problems.append(Problem("topology.segment_size", topo.segment_size,
                                f"segments need a block topology (topology.kind: block); this one is {topo.kind}"))
    seen: dict[str, str] = {}
    for pos, block in enumerate(topo.blocks):
        if not hostlist.is_valid(block.nodes):
            continue  # reported with the unknown nodes
        twice = [n for n in hostlist.expand(block.nodes) if n in seen]
        if twice:
            problems.append(Problem(f"topology.blocks[{pos}].nodes", block.nodes,
                                    f"{hostlist.compress(twice)} already in block {seen[twice[0]]}; expected each node in one block"))
        seen.update((n, block.name) for n in hostlist.expand(block.nodes))
    sizes = [hostlist.count(b.nodes) for b in topo.blocks if hostlist.is_valid(b.nodes)]
    if topo.segment_size is not None and sizes and topo.segment_size > max(sizes):
        problems.append(Problem("topology.segment_size", topo.segment_size,
                                f"the largest block has {max(sizes)} nodes; expected a segment that fits in one block"))
    return problems


def _unknown(path: str, expr: str | None, known: set[str] | None, what: str, where: str) -> list[Problem]:
    if not expr:
        return []
    try:
        names = hostlist.expand(expr)
    except hostlist.HostlistError as exc:
        return [Problem(path, expr, f"expected a hostlist ({exc})")]
    if known is None:
        return []
    missing = [n for n in names if n not in known]
    if not missing:
        return []
    return [Problem(path, expr, f"unknown {what} {hostlist.compress(missing)}; expected names from {where}")]


def _network_problems(site: Site) -> list[Problem]:
    problems = []
    net = site.network
    lo, hi = net.port_range
    elo, ehi = net.ephemeral_range
    if not 1024 <= lo <= hi <= 65535:
        problems.append(Problem("network.port_range", [lo, hi], "expected [low, high] with 1024 <= low <= high <= 65535"))
    elif lo <= ehi and elo <= hi:
        problems.append(
            Problem(
                "network.port_range",
                [lo, hi],
                f"expected a range outside the ephemeral ports {elo}-{ehi}, where outgoing connections collide",
            )
        )
    nodes = known_nodes(site)
    if nodes is not None:
        unknown = sorted(set(net.addresses) - nodes)
        if unknown:
            problems.append(
                Problem("network.addresses", unknown, "expected node names that a partition lists")
            )
    if not net.addresses and not net.interface:
        problems.append(
            Problem(
                "network",
                OMIT,
                "expected `interface` (to resolve the rendezvous address through) or `addresses` (node -> address)",
            )
        )
    return problems


# --- loading -------------------------------------------------------------------


def shipped_sites() -> dict[str, Path]:
    """The sites that come with clusterctl (site-configs/ in the source tree, clusterctl/site_configs installed)."""
    return {path.stem: path for path in sorted(shipped_dir("site_configs").glob("*.yaml"))}


LOCAL_SITES = "site-configs"  # an admin's site files beside the job specs: ./site-configs/NAME.yaml


def site_dirs() -> list[Path]:
    """Where site names are looked up, lowest priority first: the shipped sites, ./site-configs, $CLUSTERCTL_SITES."""
    extra = [Path(d).expanduser() for d in os.environ.get(SITES_ENV, "").split(os.pathsep) if d]
    return [shipped_dir("site_configs"), Path.cwd() / LOCAL_SITES, *reversed(extra)]


def known_sites() -> dict[str, Path]:
    """Every site this machine knows by name: shipped, in ./site-configs, in $CLUSTERCTL_SITES (a later one wins)."""
    found: dict[str, Path] = {}
    for directory in site_dirs():
        if directory.is_dir():
            found.update((path.stem, path) for path in sorted(directory.glob("*.yaml")))
    return dict(sorted(found.items()))


def resolve_site_path(name_or_path: str) -> Path:
    """A path as given, or a known site's file; a ConfigError lists the choices and where names are looked up."""
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix in (".yaml", ".yml") or os.sep in name_or_path or candidate.is_file():
        if not candidate.is_file():
            raise ConfigError("site", [Problem("site", name_or_path, "expected an existing site YAML file")])
        return candidate
    sites = known_sites()
    if name_or_path not in sites:
        looked = ", ".join(str(d) for d in site_dirs())
        raise ConfigError(
            "site",
            [Problem("site", name_or_path, f"expected a site name ({', '.join(sites)}) or a path to a site YAML file;"
                     f" names are looked up in {looked} (add a directory with {SITES_ENV}=DIR[:DIR...])")],
        )
    return sites[name_or_path]


def site_from_located(located: Located) -> Site:
    site = validate_located(Site, located)
    problems = site_problems(site)
    if problems:
        raise ConfigError(located.source, located.with_lines(problems))
    return site


def load_site(name_or_path: str) -> tuple[Site, Path]:
    """Load and fully check a site config by name or path."""
    path = resolve_site_path(name_or_path)
    return site_from_located(load_yaml(path, "site config")), path
