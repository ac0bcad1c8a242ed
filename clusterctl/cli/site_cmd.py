"""`clusterctl site ...`: check what the admin wrote before users depend on it, import it, show it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from clusterctl.cli.app import err_console, new_app, out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.config.site import Site, load_site, site_warnings

site_app = new_app("Site configs: validate, import and show them.")


def _warn(message: str, console: Console | None = None) -> None:
    (console or err_console).print(Text.assemble(("warning: ", "yellow"), message), soft_wrap=True)


@site_app.command("validate")
def validate(site: Annotated[str, typer.Argument(metavar="SITE", help="site name or path to a site YAML")],
             as_json: JsonOpt = False) -> None:
    """Check a site config (name or path): rail map, CPU sets, topology, network, and the rendered binding."""
    from clusterctl.siteimport.checks import check_bindings

    loaded, path = load_site(site)
    warnings = check_bindings(loaded, path, f"site config {path}") + site_warnings(loaded)
    gpus = sum(len(nt.gpus) for nt in loaded.node_types.values())
    if as_json:
        print(json.dumps({"site": loaded.name, "path": str(path), "ok": True, "partitions": len(loaded.partitions),
                          "node_types": len(loaded.node_types), "gpu_slots": gpus, "warnings": warnings}, indent=1))
        return
    console = out_console()
    console.print(
        f"ok: site {loaded.name} ({path}): {len(loaded.partitions)} partition(s), "
        f"{len(loaded.node_types)} node type(s), {gpus} GPU slot(s) described"
    )
    for warning in warnings:
        _warn(warning, console)


def _names(values: Optional[list[str]]) -> list[str]:
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


@site_app.command("import")
def import_(
    topo: Annotated[
        Optional[Path], typer.Option("--topo", help="saved output of `nvidia-smi topo -m` from one compute node")
    ] = None,
    topology_conf: Annotated[
        Optional[Path], typer.Option("--topology-conf", help="Slurm topology.conf or topology.yaml (switch tree or blocks)")
    ] = None,
    topology_name: Annotated[
        Optional[str], typer.Option("--topology", metavar="NAME",
                                    help="the topology of a topology.yaml to import (default: its cluster_default one)")
    ] = None,
    gres_conf: Annotated[
        Optional[Path], typer.Option("--gres-conf", help="Slurm gres.conf (GPU devices, Cores=, node names)")
    ] = None,
    probe: Annotated[bool, typer.Option("--probe", help="read this node live (nvidia-smi and sysfs)")] = False,
    name: Annotated[Optional[str], typer.Option("--name", help="site name (default: from the node names)")] = None,
    nodes: Annotated[
        Optional[str], typer.Option("--nodes", metavar="HOSTLIST", help="hostlist of the partition's nodes, e.g. 'gpu-[001-016]'")
    ] = None,
    partition: Annotated[str, typer.Option("--partition", help="Slurm partition name")] = "gpu",
    node_type: Annotated[
        Optional[str], typer.Option("--node-type", help="node type name (default: from the GPU model)")
    ] = None,
    interface: Annotated[
        Optional[str],
        typer.Option("--interface", help="network.interface: the interface ranks rendezvous through (default: ib0/eth0)"),
    ] = None,
    gpu_model: Annotated[Optional[str], typer.Option("--gpu-model", help="e.g. H100-SXM5-80GB")] = None,
    gpu_memory_gb: Annotated[
        Optional[float], typer.Option("--gpu-memory-gb", min=0.001, help="memory per GPU in GB (10^9 bytes)")
    ] = None,
    nvlink_domain: Annotated[
        Optional[int],
        typer.Option("--nvlink-domain", min=1, help="GPUs per NVLink domain (topo -mp hides NVLink; NVL72: 72)"),
    ] = None,
    sockets: Annotated[Optional[int], typer.Option("--sockets", min=1, help="CPU sockets per node")] = None,
    nic_names: Annotated[
        Optional[str],
        typer.Option("--nic-names", help="names of the NIC0, NIC1.. columns when the NIC Legend is missing (comma-separated)"),
    ] = None,
    exclude_nic: Annotated[
        Optional[list[str]],
        typer.Option("--exclude-nic", help="NIC that is never a rail (storage, management); repeatable or comma-separated"),
    ] = None,
    nic: Annotated[
        Optional[list[str]],
        typer.Option("--nic", help="NIC for GPUs the input shows none for (gres.conf imports, no RDMA); repeatable"),
    ] = None,
    smt_offset: Annotated[
        Optional[int],
        typer.Option("--smt-offset", min=1, help="gres.conf Cores=: core c's second thread is CPU c+N"),
    ] = None,
    host_memory_gb: Annotated[
        Optional[float], typer.Option("--host-memory-gb", min=0.001, help="memory per node in GB (10^9 bytes)")
    ] = None,
    slurm_conf: Annotated[
        Optional[Path], typer.Option("--slurm-conf", help="slurm.conf: the nodes' RealMemory (host_memory_gb)")
    ] = None,
    slurm_version: Annotated[
        Optional[str],
        typer.Option("--slurm-version", metavar="RELEASE", help="the cluster's Slurm release, e.g. 24.05 (default: this"
                     " machine's `scontrol --version`; else 24.05 for a topology with blocks)"),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the rail map as JSON (gpu, numa, cpus, nics per GPU) instead of YAML")
    ] = False,
    root: Annotated[
        Path, typer.Option("--root", help="--probe: read sys/ and proc/ under this directory instead of /")
    ] = Path("/"),
    nvidia_smi: Annotated[
        str, typer.Option("--nvidia-smi", help="--probe: the nvidia-smi command (e.g. 'ssh node7 nvidia-smi')")
    ] = "nvidia-smi",
) -> None:
    """Write a site config from nvidia-smi topo -m, topology.conf (or topology.yaml) and gres.conf, or from this node (--probe).

    The YAML goes to standard output, warnings to standard error.
    """
    from clusterctl.siteimport.build import ImportOptions, rail_map
    from clusterctl.siteimport.importer import import_site, slurm_conf_memory
    from clusterctl.siteimport.probe import probe as probe_node
    from clusterctl.siteimport.probe import slurm_release
    from clusterctl.siteimport.siteyaml import to_yaml
    from clusterctl.syntax.slurmrelease import parse_site_release

    if probe and topo is not None:
        raise typer.BadParameter("give either --probe (read this node) or --topo FILE (saved output), not both")
    if not probe and topo is None and gres_conf is None:
        raise typer.BadParameter(
            "expected --topo FILE (saved `nvidia-smi topo -m`), --probe (on a compute node), or --gres-conf FILE"
        )
    if slurm_version is not None:
        try:
            slurm_version = parse_site_release(slurm_version)
        except ValueError as exc:
            raise typer.BadParameter(f"got {slurm_version!r}; {exc}", param_hint="--slurm-version") from None
    opts = ImportOptions(
        slurm_version=slurm_version if slurm_version is not None else slurm_release(),
        name=name,
        nodes=nodes,
        partition=partition,
        node_type=node_type,
        interface=interface,
        gpu_model=gpu_model,
        gpu_memory_gb=gpu_memory_gb,
        host_memory_gb=host_memory_gb or (slurm_conf_memory(slurm_conf, nodes) if slurm_conf is not None else None),
        nvlink_domain=nvlink_domain,
        sockets=sockets,
        exclude_nics=_names(exclude_nic),
        extra_nics=_names(nic),
        smt_offset=smt_offset,
    )
    built = import_site(
        opts,
        topo=topo,
        topology_conf=topology_conf,
        topology_name=topology_name,
        gres_conf=gres_conf,
        probe=probe,
        nic_names=_names([nic_names]) if nic_names else None,
        probe_facts=lambda: probe_node(root, nvidia_smi),
        rail_map_only=as_json,
    )
    for warning in built.warnings:
        _warn(warning)
    if as_json:
        typer.echo(json.dumps(rail_map(built.data["node_types"]["rail map"]), indent=1))
        return
    typer.echo(to_yaml(built.data, list(built.sources), list(built.warnings)), nl=False)


def node_type_tables(site: Site) -> list[tuple[str, Table, str]]:
    """Per node type: a heading, the rail map table, and a note on NICs that are on no rail."""
    out = []
    for name, nt in site.node_types.items():
        partitions = [p for p, part in site.partitions.items() if part.node_type == name]
        heading = (
            f"node type {name}: {len(nt.gpus)} x {nt.gpu_vendor} {nt.gpu_model}, {nt.gpu_memory_gb:g} GB,"
            f" NVLink domain {nt.nvlink_domain}, {nt.sockets} socket(s); partitions: {', '.join(partitions) or 'none'}"
        )
        table = Table()
        for column in ("GPU", "NUMA", "CPUs", "NICs", "rails"):
            table.add_column(column, justify="right" if column in ("GPU", "NUMA") else "left")
        for gpu in sorted(nt.gpus, key=lambda g: g.index):
            rails = [nt.nics[n].rail if n in nt.nics else None for n in gpu.nics]
            table.add_row(
                str(gpu.index),
                "-" if gpu.numa is None else str(gpu.numa),
                f"{gpu.cpus or '-'} ({len(gpu.cpu_set)})",
                ",".join(gpu.nics) or "-",
                ",".join("-" if r is None else str(r) for r in rails) or "-",
            )
        others = [n for n, nic in nt.nics.items() if nic.rail is None]
        note = ("not on a rail: " + ", ".join(f"{n} ({nt.nics[n].kind})" for n in others)) if others else ""
        out.append((heading, table, note))
    return out


@site_app.command("show")
def show(site: Annotated[str, typer.Argument(metavar="SITE", help="site name or path to a site YAML")], as_json: JsonOpt = False) -> None:
    """The rail map of each node type: GPU -> NUMA node -> CPUs -> NICs -> rails."""
    loaded, path = load_site(site)
    if as_json:
        data = {
            "site": loaded.name,
            "node_types": {
                name: [
                    {
                        "gpu": g.index,
                        "numa": g.numa,
                        "cpus": g.cpus,
                        "nics": list(g.nics),
                        "rails": [nt.nics[n].rail if n in nt.nics else None for n in g.nics],
                    }
                    for g in sorted(nt.gpus, key=lambda g: g.index)
                ]
                for name, nt in loaded.node_types.items()
            },
        }
        typer.echo(json.dumps(data, indent=1))
        return
    console = out_console()
    console.print(f"site {loaded.name} ({path})")
    for heading, table, note in node_type_tables(loaded):
        console.print(heading)
        console.print(table)
        if note:
            console.print(note)
    for warning in site_warnings(loaded):
        _warn(warning, console)
