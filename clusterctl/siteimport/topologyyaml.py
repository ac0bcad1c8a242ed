"""Parse Slurm's `topology.yaml` (Slurm 25.05 and later) into the same switch tree or blocks as topology.conf.

topology.yaml lists several named topologies; a partition names the one it
uses (slurm.conf `Topology=`), the others take the one marked
`cluster_default: true`. Slurm reads it instead of topology.conf when both
exist. One topology is imported: the one asked for by name, else the
cluster default, else the only one.

    - topology: topo1
      cluster_default: true
      tree:
        switches:
        - switch: s0           a leaf switch and its nodes
          nodes: dev[0-5]
        - switch: s3           a switch above other switches
          children: s[0-2]
    - topology: topo2
      block:
        block_sizes: [16, 64]  the block sizes Slurm enforces
        blocks:
        - block: b1
          nodes: node[1-16]
    - topology: topo3
      flat: true               no topology: nothing to import
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from clusterctl.errors import OMIT, ConfigError, Problem
from clusterctl.siteimport.slurmconf import SlurmTopology, hostlist_names, unknown_switches
from clusterctl.syntax import hostlist

_START = re.compile(r"^\s*-\s*topology\s*:", re.M)
_TOP_KEYS = ("topology", "cluster_default", "block", "tree", "flat")
_KINDS = ("block", "tree", "flat")


def _fail(source: str, at: str, value: object, expected: str) -> ConfigError:
    return ConfigError(source, [Problem(at, value, expected)])


def looks_like_topology_yaml(text: str) -> bool:
    """Whether `text` is a topology.yaml (a list of `- topology: NAME` entries) rather than topology.conf lines."""
    return bool(_START.search(text))


def parse_topology_yaml(text: str, source: str = "topology.yaml", name: str | None = None) -> SlurmTopology:
    """The switch tree or blocks of one topology of a topology.yaml; ConfigError naming the entry on anything else."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise _fail(source, "", OMIT, f"is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, list) or not data or not all(isinstance(t, dict) for t in data):
        raise _fail(source, "", OMIT, "expected a list of topologies, each `- topology: NAME` with block:, tree: or flat:")
    names = [str(t.get("topology") or "") for t in data]
    for pos, (entry, title) in enumerate(zip(data, names)):
        if not title:
            raise _fail(source, f"[{pos}].topology", entry.get("topology"), "expected each topology's name")
        unknown = [k for k in entry if k not in _TOP_KEYS]
        if unknown:
            raise _fail(source, f"{title}.{unknown[0]}", entry[unknown[0]], f"unknown key; expected {', '.join(_TOP_KEYS)}")
    chosen = _choose(data, names, name, source)
    title = names[chosen]
    entry = data[chosen]
    kinds = [k for k in _KINDS if k in entry and entry[k] not in (None, False)]
    if len(kinds) != 1:
        raise _fail(source, title, kinds or OMIT, "expected exactly one of block:, tree: or flat: true")
    kind = kinds[0]
    if kind == "flat":
        raise _fail(source, f"{title}.flat", True, (
            "a flat topology has nothing to import; leave --topology-conf out, or name another with --topology"))
    body = entry[kind]
    if not isinstance(body, dict):
        raise _fail(source, f"{title}.{kind}", body, "expected a mapping")
    if kind == "block":
        return _blocks(body, f"{title}.block", source)
    return _tree(body, f"{title}.tree", source)


def _choose(data: list[dict[str, Any]], names: list[str], name: str | None, source: str) -> int:
    """Which topology: the named one, else the cluster default, else the only one."""
    if name is not None:
        if name not in names:
            raise _fail(source, "--topology", name, f"expected one of the file's topologies: {', '.join(names)}")
        return names.index(name)
    defaults = [i for i, t in enumerate(data) if t.get("cluster_default") is True]
    if defaults:
        return defaults[0]  # Slurm takes the first one marked
    if len(data) == 1:
        return 0
    raise _fail(source, "cluster_default", OMIT, (
        f"expected one topology marked cluster_default: true, or --topology NAME (the file has {', '.join(names)})"))


def _items(body: dict[str, Any], key: str, allowed: tuple[str, ...], where: str, source: str) -> list[dict[str, str]]:
    """The list under `key`: each entry a mapping of the allowed keys to strings."""
    items = body.get(key)
    if not isinstance(items, list) or not items:
        raise _fail(source, f"{where}.{key}", items, f"expected a list of {allowed[0]}s")
    out = []
    for pos, item in enumerate(items):
        at = f"{where}.{key}[{pos}]"
        if not isinstance(item, dict):
            raise _fail(source, at, item, f"expected a mapping with {', '.join(allowed)}")
        unknown = [k for k in item if k not in allowed]
        if unknown:
            raise _fail(source, f"{at}.{unknown[0]}", item[unknown[0]], f"unknown key; expected {', '.join(allowed)}")
        out.append({k: str(v) for k, v in item.items() if v is not None})
        if not out[-1].get(allowed[0]):
            raise _fail(source, f"{at}.{allowed[0]}", OMIT, f"expected the {allowed[0]}'s name")
    return out


def _unique(items: list[dict[str, str]], key: str, at: str, source: str) -> None:
    seen: set[str] = set()
    for item in items:
        if item[key] in seen:
            raise _fail(source, at, item[key], f"expected each {key} name once")
        seen.add(item[key])


def _blocks(body: dict[str, Any], where: str, source: str) -> SlurmTopology:
    unknown = [k for k in body if k not in ("block_sizes", "blocks")]
    if unknown:
        raise _fail(source, f"{where}.{unknown[0]}", body[unknown[0]], "unknown key; expected block_sizes, blocks")
    sizes = body.get("block_sizes") or []
    if not isinstance(sizes, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
        raise _fail(source, f"{where}.block_sizes", sizes, "expected positive node counts such as [16, 64]")
    items = _items(body, "blocks", ("block", "nodes"), where, source)
    _unique(items, "block", f"{where}.blocks", source)
    blocks = []
    for pos, item in enumerate(items):
        if not item.get("nodes"):
            raise _fail(source, f"{where}.blocks[{pos}].nodes", OMIT, "expected the block's nodes")
        hostlist_names(item["nodes"], source, f"{where}.blocks[{pos}].nodes")
        blocks.append({"name": item["block"], "nodes": item["nodes"]})
    return SlurmTopology("block", blocks=tuple(blocks), block_sizes=tuple(sizes))


def _tree(body: dict[str, Any], where: str, source: str) -> SlurmTopology:
    unknown = [k for k in body if k != "switches"]
    if unknown:
        raise _fail(source, f"{where}.{unknown[0]}", body[unknown[0]], "unknown key; expected switches")
    items = _items(body, "switches", ("switch", "children", "nodes"), where, source)
    _unique(items, "switch", f"{where}.switches", source)
    names = {item["switch"] for item in items}
    switches = []
    for pos, item in enumerate(items):
        at = f"{where}.switches[{pos}]"
        entry = {"name": item["switch"]}
        if item.get("nodes"):
            hostlist_names(item["nodes"], source, f"{at}.nodes")
            entry["nodes"] = item["nodes"]
        if item.get("children"):
            hostlist_names(item["children"], source, f"{at}.children")
            unknown_children = unknown_switches(item["children"], names)
            if unknown_children:
                raise _fail(source, f"{at}.children", item["children"], (
                    f"unknown switch {hostlist.compress(unknown_children)}; expected switches this topology names"))
            entry["switches"] = item["children"]
        if len(entry) == 1:
            raise _fail(source, at, item["switch"], "expected nodes: or children: under the switch")
        switches.append(entry)
    return SlurmTopology("tree", switches=tuple(switches))
