"""`clusterctl site ...`: check what the admin wrote before users depend on it."""

from __future__ import annotations

from clusterctl.cli.app import new_app, out_console
from clusterctl.site import load_site

site_app = new_app("Site configs: validate them.")


@site_app.command("validate")
def validate(site: str) -> None:
    """Check a site config (name or path): rail map, CPU sets, topology, network."""
    loaded, path = load_site(site)
    gpus = sum(len(nt.gpus) for nt in loaded.node_types.values())
    out_console().print(
        f"ok: site {loaded.name} ({path}): {len(loaded.partitions)} partition(s), "
        f"{len(loaded.node_types)} node type(s), {gpus} GPU slot(s) described"
    )
