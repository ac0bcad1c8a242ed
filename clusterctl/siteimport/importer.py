"""`clusterctl site import`: read the inputs, group nodes into node types, build the site.

Which input says what:

- the GPU facts of one node come from `--topo FILE` (saved `nvidia-smi topo
  -m`) or `--probe` (this node, live); gres.conf `Cores=` fills CPU lists
  they lack, and `Type=` names the model;
- node names come from `--nodes`, else gres.conf `NodeName=`, else the
  nodes topology.conf lists;
- node types: one per distinct GPU configuration in gres.conf (identical
  node groups merge), else one; nodes whose gres.conf lists a gap in the
  device numbers (a GPU out of service) are left out with a warning;
- the switch tree or blocks come from topology.conf, or one topology of a
  topology.yaml (`--topology NAME`, else its cluster default: Slurm reads
  topology.yaml instead of topology.conf when both exist), narrowed to the
  partition's nodes when it also lists others (CPU-only nodes, say).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

from clusterctl.errors import OMIT, ConfigError, Problem
from clusterctl.siteimport.build import (
    Built,
    ImportOptions,
    NodeFacts,
    build_site,
    facts_from_gres,
    facts_from_topo,
    merge_facts,
    node_type_from_facts,
)
from clusterctl.siteimport.nvsmi import parse_topo
from clusterctl.siteimport.slurmconf import GresNodes, hostlist_names, parse_gres_conf, parse_topology_conf, real_memory_gb
from clusterctl.siteimport.topologyyaml import looks_like_topology_yaml, parse_topology_yaml
from clusterctl.syntax import hostlist


def read_input(path: Path, what: str) -> str:
    source = f"{what} {path}"
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise ConfigError(source, [Problem("", OMIT, "no such file")]) from None
    except IsADirectoryError:
        raise ConfigError(source, [Problem("", OMIT, f"is a directory, expected a {what} file")]) from None
    except OSError as exc:
        raise ConfigError(source, [Problem("", OMIT, f"cannot be read ({exc.strerror})")]) from None


def slurm_conf_memory(path: Path, nodes: str | None) -> float | None:
    """host_memory_gb from slurm.conf: the smallest RealMemory of the imported nodes (of every NodeName line without --nodes)."""
    names = set(hostlist_names(nodes, "--nodes", "--nodes")) if nodes else None
    return real_memory_gb(read_input(path, "slurm.conf"), str(path), names)


def import_site(
    opts: ImportOptions,
    *,
    topo: Path | None = None,
    topology_conf: Path | None = None,
    topology_name: str | None = None,
    gres_conf: Path | None = None,
    probe: bool = False,
    nic_names: list[str] | None = None,
    probe_facts: Callable[[], NodeFacts] | None = None,
    rail_map_only: bool = False,
) -> Built:
    """The site the inputs describe, checked; ConfigError on bad input, NoGpuError when probing finds no GPU.

    `rail_map_only` (for `--json`): just the first node type's GPUs, NUMA nodes, CPUs and NICs, with GPUs
    that have no NIC allowed; the site around them is neither assembled nor checked.
    """
    sources: list[str] = []
    warnings: list[str] = []
    primary: NodeFacts | None = None
    if topo is not None:
        primary = facts_from_topo(parse_topo(read_input(topo, "nvidia-smi topo -m output"), f"{topo}", nic_names))
        sources.append(f"nvidia-smi topo -m ({topo.name})")
    elif probe:
        assert probe_facts is not None
        primary = probe_facts()
        sources.append("a live probe of the node")

    topology, topology_file = None, "topology.conf"
    if topology_conf is not None:
        text = read_input(topology_conf, "topology file")
        if looks_like_topology_yaml(text):
            topology_file = "topology.yaml"
            topology = parse_topology_yaml(text, str(topology_conf), topology_name)
            sources.append(f"topology.yaml ({topology_conf.name}{f', topology {topology_name}' if topology_name else ''})")
        elif topology_name is not None:
            raise ConfigError("site import", [Problem("--topology", topology_name, (
                f"names one topology of a topology.yaml; {topology_conf} is a topology.conf (one topology)"))])
        else:
            topology = parse_topology_conf(text, str(topology_conf))
            sources.append(f"topology.conf ({topology_conf.name})")
    elif topology_name is not None:
        raise ConfigError("site import", [Problem("--topology", topology_name,
                                                  "expected --topology-conf FILE (a topology.yaml) with it")])

    groups: list[tuple[str | None, NodeFacts | None]] = []
    if gres_conf is not None:
        gres = parse_gres_conf(read_input(gres_conf, "gres.conf"), str(gres_conf))
        sources.append(f"gres.conf ({gres_conf.name})")
        warnings += gres.warnings
        groups = _gres_groups(gres.groups, str(gres_conf), primary, opts, warnings)
    elif primary is not None:
        groups = [(None, primary)]
    if not groups:
        raise ConfigError(
            "site import",
            [
                Problem(
                    "",
                    OMIT,
                    "nothing describes the GPUs: expected --topo FILE (saved `nvidia-smi topo -m`), --probe"
                    " (on a compute node), or --gres-conf FILE with File= lines",
                )
            ],
        )

    # Node names.
    if opts.nodes:
        try:
            hostlist.expand(opts.nodes)
        except hostlist.HostlistError as exc:
            raise ConfigError("site import", [Problem("--nodes", opts.nodes, f"expected a hostlist ({exc})")]) from None
        if len(groups) == 1:
            groups = [(opts.nodes, groups[0][1])]
        else:
            groups = [(nodes or opts.nodes, facts) for nodes, facts in groups]
    if topology is not None and len(groups) == 1 and groups[0][0] is None:
        groups = [(hostlist.compress(topology.nodes()), groups[0][1])]
    if topology is not None:
        listed = {n for nodes, _ in groups if nodes for n in hostlist.expand(nodes)}
        extra = [n for n in topology.nodes() if n not in listed]
        if listed and extra:
            warnings.append(
                f"{topology_file} lists {len(extra)} node(s) no partition has ({hostlist.compress(extra[:64])}"
                f"{', ...' if len(extra) > 64 else ''}); the imported switch tree keeps only the partition's nodes"
            )
            topology = topology.restricted_to(listed)
            if not (topology.switches or topology.blocks):
                raise ConfigError(
                    str(topology_conf),
                    [Problem("", OMIT, "names none of the partition's nodes; expected the GPU nodes' switches or blocks")],
                )

    if rail_map_only:
        facts = next(f for _, f in groups if f is not None)
        section, notes = node_type_from_facts(copy.deepcopy(facts), opts, allow_no_nic=True)
        notes = [n for n in notes if not n.startswith(("gpu_memory_gb", "gpu_model"))]  # not in the rail map
        if sum(1 for _, f in groups if f is not None) > 1:
            notes.append(f"--json shows the first of {len(groups)} node types ({facts.source})")
        return Built({"node_types": {"rail map": section}}, warnings + notes, sources)
    interface_guess = primary.interface if (probe and primary is not None) else None
    built = build_site(
        [(facts, nodes) for nodes, facts in groups if facts is not None],
        opts,
        topology.as_site() if topology is not None else None,
        sources,
        interface_guess=interface_guess,
    )
    built.warnings[:0] = warnings
    return built


def _gres_groups(
    gres_groups: list[GresNodes],
    source: str,
    primary: NodeFacts | None,
    opts: ImportOptions,
    warnings: list[str],
) -> list[tuple[str | None, NodeFacts | None]]:
    merged: dict[tuple[object, ...], list[GresNodes]] = {}
    for group in gres_groups:
        where = group.nodes or "nodes without NodeName"
        indices = [g.index for g in group.gpus]
        if group.gpus and indices != list(range(len(indices))):
            warnings.append(
                f"{source}: {where} list GPU devices {','.join(map(str, indices))} (one out of service?);"
                " left out of the site"
            )
            continue
        if not group.gpus:
            if primary is not None and group.autodetect == "rsmi" and primary.gpu_vendor == "nvidia":
                warnings.append(
                    f"{source}: {where} detect AMD GPUs (AutoDetect=rsmi), which {primary.source} does not describe;"
                    " left out"
                )
                continue
            if primary is None:
                warnings.append(
                    f"{source}: {where} detect their GPUs (AutoDetect={group.autodetect}) and list no File=;"
                    " left out (import with --topo or --probe to describe them)"
                )
                continue
        merged.setdefault((group.signature(), group.autodetect, group.legacy_cpus), []).append(group)
    out: list[tuple[str | None, NodeFacts | None]] = []
    matched = False
    for members in merged.values():
        exprs = [m.nodes for m in members]
        nodes = None if None in exprs else hostlist.compress([n for e in exprs for n in hostlist.expand(e or "")])
        first = members[0]
        if not first.gpus:
            facts = copy.deepcopy(primary)
            matched = True
        else:
            facts = facts_from_gres(first, source, opts.smt_offset)
            if primary is not None and len(primary.gpus) == len(facts.gpus):
                facts = merge_facts(copy.deepcopy(primary), facts)
                matched = True
            elif primary is not None:
                warnings.append(
                    f"{source}: {nodes or 'these nodes'} have {len(facts.gpus)} GPUs, {primary.source} shows"
                    f" {len(primary.gpus)}; their node type comes from gres.conf alone"
                )
        out.append((nodes, facts))
    if primary is not None and out and not matched:
        raise ConfigError(
            source,
            [
                Problem(
                    "File",
                    OMIT,
                    f"no node group has the {len(primary.gpus)} GPUs {primary.source} shows;"
                    " expected gres.conf and the topology to describe the same nodes",
                )
            ],
        )
    return out
