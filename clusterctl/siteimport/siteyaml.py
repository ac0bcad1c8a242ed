"""A built site config as YAML the way the shipped sites are written: a GPU's row on one line, no aliases."""

from __future__ import annotations

from typing import Any

import yaml


class FlowMap(dict):  # type: ignore[type-arg]
    """A mapping written on one line ({index: 0, numa: 0, ...}), as the shipped sites write GPU rows."""


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # site configs reject YAML aliases
        return True


def _flow(dumper: yaml.SafeDumper, data: FlowMap) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)


def _list_flow_in_rows(dumper: yaml.SafeDumper, data: list) -> yaml.Node:  # type: ignore[type-arg]
    flow = all(isinstance(v, (str, int, float)) for v in data) and len(data) <= 8
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(FlowMap, _flow)
_Dumper.add_representer(list, _list_flow_in_rows)


def to_yaml(data: dict[str, Any], sources: list[str], warnings: list[str]) -> str:
    """The site config as YAML, with a header saying where it came from (`sources`) and what to check."""
    header = [
        f"# Site {data['name']}: written by `clusterctl site import` from {', '.join(sources)}.",
        "# Each GPU's NIC is the closest one in `nvidia-smi topo -m` (PIX < PXB < PHB < NODE < SYS), ties dealt",
        "# out one per GPU; NICs no GPU chose (storage, management) have no rail. GPUs sharing a socket's CPU",
        "# list got contiguous shares of whole cores. See docs/admin/sites.md, 'Encoding a site'.",
    ]
    if warnings:
        header.append("# Check before use:")
        header += [f"#   - {w}" for w in warnings]
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
    return "\n".join(header) + "\n" + body
