"""Parse Slurm's `topology.conf` and `gres.conf` into what a site config needs.

Both files are lines of `Key=Value` pairs; keys are case insensitive, `#`
starts a comment, a trailing backslash continues a line, and node, switch
and device lists are Slurm hostlist expressions (`dgx[001-032]`,
`/dev/nvidia[0-3]`).

topology.conf (topology/tree, topology/block):

    SwitchName=s0 Nodes=dev[0-5]          a leaf switch and its nodes
    SwitchName=s3 Switches=s[0-2]         a switch above other switches
    BlockName=block1 Nodes=node[1-32]     a block of nodes
    BlockSizes=30,120                     the block sizes Slurm enforces

gres.conf (GPU lines; other GRES such as mps or bandwidth are skipped):

    NodeName=tux[0-15] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-13 Links=-1,18,18,18
    AutoDetect=nvml

`Cores=` lists Slurm's logical core numbers (the first hardware thread of
each core on usual x86 numbering); Slurm before 15.08 called it `CPUs=`.
`Links=` counts NVLinks from this GPU to each GPU on the node (-1: itself).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from clusterctl.errors import OMIT, ConfigError, Problem
from clusterctl.syntax import hostlist
from clusterctl.syntax.cpulist import parse_cpulist

_TRAILING_NUMBER = re.compile(r"(\d+)$")


def _records(text: str, source: str) -> list[tuple[int, list[tuple[str, str]]]]:
    """(line number, [(key as written, value)]) per logical line."""
    out: list[tuple[int, list[tuple[str, str]]]] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if not line:
            continue
        pairs = []
        for token in line.split():
            key, eq, value = token.partition("=")
            if not eq or not key:
                raise ConfigError(
                    source,
                    [Problem("", token, "expected Key=Value pairs separated by spaces", start)],
                )
            pairs.append((key, value.strip("\"'")))
        out.append((start, pairs))
    return out


def hostlist_names(expr: str, source: str, path: str, line: int | None = None) -> list[str]:
    """The names of a hostlist a Slurm file gives at `path` (its line, when it has lines); ConfigError when it is none."""
    try:
        names = hostlist.expand(expr)
    except hostlist.HostlistError as exc:
        raise ConfigError(source, [Problem(path, expr, f"expected a Slurm hostlist ({exc})", line)]) from None
    if not names:
        raise ConfigError(source, [Problem(path, expr, "expected at least one name", line)])
    return names


# --- slurm.conf: what its NodeName lines say of memory ----------------------------------------


def real_memory_gb(text: str, source: str = "slurm.conf", nodes: set[str] | None = None) -> float | None:
    """The smallest RealMemory of the NodeName lines (of `nodes`, when given), in GB; None when none says.

    RealMemory is in megabytes as Slurm counts them (MiB): 16000 is 16.8 GB.
    Other slurm.conf lines are left alone (they are not all Key=Value).
    """
    found: list[float] = []
    lines = [line for line in text.replace("\r\n", "\n").split("\n") if line.lstrip().lower().startswith("nodename=")]
    for line_no, pairs in _records("\n".join(lines), source):
        values = {key.lower(): value for key, value in pairs}
        memory = values.get("realmemory", "")
        if not memory.isdigit() or values.get("nodename", "").upper() == "DEFAULT":
            continue
        names = set(hostlist_names(values["nodename"], source, "NodeName", line_no))
        if nodes is None or names & nodes:
            found.append(int(memory) * 2**20 / 1e9)
    return round(min(found), 1) if found else None


# --- topology.conf ----------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmTopology:
    """A switch tree or a set of blocks, as the site config's `topology` section holds them."""

    kind: str  # "tree" or "block"
    switches: tuple[dict[str, str], ...] = ()
    blocks: tuple[dict[str, str], ...] = ()
    block_sizes: tuple[int, ...] = ()

    def nodes(self) -> list[str]:
        """Every node the file names, in the order it names them."""
        seen: dict[str, None] = {}
        for entry in (*self.switches, *self.blocks):
            if entry.get("nodes"):
                for name in hostlist.expand(entry["nodes"]):
                    seen.setdefault(name, None)
        return list(seen)

    def restricted_to(self, keep: set[str]) -> SlurmTopology:
        """Only the nodes in `keep`; switches and blocks left empty are dropped (and references to them)."""
        def narrow(expr: str | None) -> str | None:
            if not expr:
                return None
            names = [n for n in hostlist.expand(expr) if n in keep]
            return hostlist.compress(names) if names else None

        if self.kind == "block":
            blocks = []
            for block in self.blocks:
                nodes = narrow(block["nodes"])
                if nodes:
                    blocks.append({"name": block["name"], "nodes": nodes})
            return SlurmTopology("block", blocks=tuple(blocks), block_sizes=self.block_sizes)
        leaves = {s["name"]: narrow(s.get("nodes")) for s in self.switches}
        kept: dict[str, dict[str, str]] = {}
        changed = True
        switches = list(self.switches)
        while changed:  # drop switches that end up with nothing below them, bottom up
            changed = False
            kept = {}
            for sw in switches:
                entry: dict[str, str] = {"name": sw["name"]}
                if leaves.get(sw["name"]):
                    entry["nodes"] = leaves[sw["name"]] or ""
                if sw.get("switches"):
                    names = [c for c in hostlist.expand(sw["switches"]) if c in {s["name"] for s in switches}]
                    if names:
                        entry["switches"] = hostlist.compress(names)
                if "nodes" in entry or "switches" in entry:
                    kept[sw["name"]] = entry
            if len(kept) != len(switches):
                switches = [s for s in switches if s["name"] in kept]
                changed = True
        return SlurmTopology("tree", switches=tuple(kept.values()))

    def as_site(self) -> dict[str, object]:
        if self.kind == "block":
            data: dict[str, object] = {"kind": "block", "blocks": [dict(b) for b in self.blocks]}
            if self.block_sizes:
                data["block_sizes"] = list(self.block_sizes)
            return data
        return {"kind": "tree", "switches": [dict(s) for s in self.switches]}


_SWITCH_KEYS = {"switchname": "name", "nodes": "nodes", "switches": "switches", "linkspeed": None}
_BLOCK_KEYS = {"blockname": "name", "nodes": "nodes"}


def parse_topology_conf(text: str, source: str = "topology.conf") -> SlurmTopology:
    """The switch tree or blocks of a topology.conf; ConfigError naming the line on anything else."""
    if re.search(r"^\s*-?\s*topology\s*:", text, re.M):
        raise ConfigError(
            source,
            [Problem("", OMIT, "looks like topology.yaml; expected topology.conf lines (SwitchName=... or BlockName=...)")],
        )
    switches: list[dict[str, str]] = []
    blocks: list[dict[str, str]] = []
    sizes: list[int] = []
    lines_of: dict[str, int] = {}
    for line, pairs in _records(text, source):
        first = pairs[0][0].lower()
        if first == "blocksizes":
            if len(pairs) > 1:
                raise ConfigError(source, [Problem(pairs[1][0], pairs[1][1], "expected BlockSizes alone on its line", line)])
            try:
                sizes = [int(v) for v in pairs[0][1].split(",")]
                if any(v <= 0 for v in sizes):
                    raise ValueError
            except ValueError:
                raise ConfigError(
                    source, [Problem("BlockSizes", pairs[0][1], "expected positive node counts such as 16,64", line)]
                ) from None
            continue
        if first == "ringname":
            raise ConfigError(
                source,
                [
                    Problem(
                        "RingName",
                        pairs[0][1],
                        "topology/ring has no counterpart in site configs; expected SwitchName (topology/tree)"
                        " or BlockName (topology/block) lines",
                        line,
                    )
                ],
            )
        if first not in ("switchname", "blockname"):
            raise ConfigError(
                source,
                [Problem(pairs[0][0], pairs[0][1], "expected a line starting with SwitchName=, BlockName= or BlockSizes=", line)],
            )
        allowed = _SWITCH_KEYS if first == "switchname" else _BLOCK_KEYS
        entry: dict[str, str] = {}
        for key, value in pairs:
            target = allowed.get(key.lower(), "?")
            if target == "?":
                names = ", ".join(k for k in ("Nodes", "Switches", "LinkSpeed") if k.lower() in allowed)
                raise ConfigError(
                    source, [Problem(key, value, f"unknown key on a {pairs[0][0]} line; expected {names}", line)]
                )
            if target:
                entry[target] = value
        name = entry["name"]
        if not name:
            raise ConfigError(source, [Problem(pairs[0][0], name, "expected a name", line)])
        if name in lines_of:
            raise ConfigError(
                source, [Problem(pairs[0][0], name, f"expected each name once (also on line {lines_of[name]})", line)]
            )
        lines_of[name] = line
        for key in ("nodes", "switches"):
            if key in entry:
                hostlist_names(entry[key], source, key.capitalize(), line)
        if first == "switchname":
            if not entry.get("nodes") and not entry.get("switches"):
                raise ConfigError(source, [Problem(name, OMIT, "expected Nodes= or Switches= under the switch", line)])
            switches.append(entry)
        else:
            if not entry.get("nodes"):
                raise ConfigError(source, [Problem(name, OMIT, "expected Nodes= in the block", line)])
            blocks.append(entry)
    if switches and blocks:
        raise ConfigError(
            source, [Problem("", OMIT, "has both SwitchName and BlockName lines; expected one topology plugin's lines")]
        )
    if not switches and not blocks:
        raise ConfigError(source, [Problem("", OMIT, "has no SwitchName or BlockName lines; nothing to import")])
    names = set(lines_of)
    for sw in switches:
        if sw.get("switches"):
            unknown = unknown_switches(sw["switches"], names)
            if unknown:
                raise ConfigError(
                    source,
                    [
                        Problem(
                            "Switches",
                            sw["switches"],
                            f"unknown switch {hostlist.compress(unknown)}; expected switches this file names",
                            lines_of[sw["name"]],
                        )
                    ],
                )
    if switches:
        return SlurmTopology("tree", switches=tuple(switches))
    return SlurmTopology("block", blocks=tuple(blocks), block_sizes=tuple(sizes))


def unknown_switches(expr: str, names: set[str]) -> list[str]:
    """The switches a switch's list of children names that the topology does not define."""
    return [c for c in hostlist.expand(expr) if c not in names]


# --- gres.conf ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GresGpu:
    index: int  # the device number (/dev/nvidia3 -> 3)
    type: str | None
    cores: frozenset[int] | None
    links: tuple[int, ...] | None
    line: int


@dataclass
class GresNodes:
    """The GPUs gres.conf gives one set of nodes (`nodes` None: lines without NodeName)."""

    nodes: str | None
    gpus: list[GresGpu] = field(default_factory=list)
    autodetect: str | None = None
    legacy_cpus: bool = False  # CPUs= (Slurm before 15.08): CPU ids rather than core numbers

    def signature(self) -> tuple[object, ...]:
        return tuple((g.index, g.type, g.cores, g.links) for g in self.gpus)


@dataclass
class GresConf:
    groups: list[GresNodes]
    autodetect: str | None  # the global AutoDetect= (a line without NodeName)
    warnings: list[str] = field(default_factory=list)


_GRES_KEYS = {
    "nodename", "name", "type", "file", "files", "multiplefiles", "cores", "cpus", "count", "links",
    "flags", "autodetect",
}


def parse_gres_conf(text: str, source: str = "gres.conf") -> GresConf:
    """GPU devices per node group; ConfigError naming the line on anything malformed."""
    groups: dict[str | None, GresNodes] = {}
    autodetect = None
    warnings: list[str] = []
    for line, pairs in _records(text, source):
        keys = {k.lower(): (k, v) for k, v in pairs}
        for key, (written, value) in keys.items():
            if key not in _GRES_KEYS:
                warnings.append(f"{source} line {line}: key {written}={value} is not read by the importer")
        node_expr = keys.get("nodename", (None, None))[1]
        if node_expr is not None:
            hostlist_names(node_expr, source, "NodeName", line)
        group = groups.setdefault(node_expr, GresNodes(node_expr))
        if "autodetect" in keys:
            value = keys["autodetect"][1].lower()
            if node_expr is None and "name" not in keys:
                autodetect = value
            else:
                group.autodetect = value
        if "name" not in keys:
            continue
        if keys["name"][1].lower() != "gpu":
            continue
        gtype = keys.get("type", (None, None))[1]
        cores = None
        for key in ("cores", "cpus"):
            if key in keys:
                try:
                    cores = parse_cpulist(keys[key][1])
                except ValueError as exc:
                    raise ConfigError(
                        source, [Problem(keys[key][0], keys[key][1], f"expected a core list such as 0-13 ({exc})", line)]
                    ) from None
                group.legacy_cpus = group.legacy_cpus or key == "cpus"
        file_key = next((k for k in ("file", "files", "multiplefiles") if k in keys), None)
        if file_key is not None:
            written, expr = keys[file_key]
            indices = []
            for path in hostlist_names(expr, source, written, line):
                match = _TRAILING_NUMBER.search(path)
                if not match:
                    raise ConfigError(
                        source, [Problem(written, expr, "expected device files ending in their number (/dev/nvidia0)", line)]
                    )
                indices.append(int(match.group(1)))
            if file_key == "multiplefiles":
                indices = indices[:1]
        elif "count" in keys:
            try:
                count = int(keys["count"][1])
            except ValueError:
                raise ConfigError(source, [Problem(keys["count"][0], keys["count"][1], "expected a GPU count", line)]) from None
            start = max((g.index for g in group.gpus), default=-1) + 1
            indices = list(range(start, start + count))
        else:
            raise ConfigError(source, [Problem("Name", "gpu", "expected File= (the GPU device files) or Count=", line)])
        links = None
        if "links" in keys:
            written, value = keys["links"]
            try:
                links = tuple(int(v) for v in value.split(","))
            except ValueError:
                raise ConfigError(
                    source, [Problem(written, value, "expected NVLink counts per GPU such as -1,18,18,18", line)]
                ) from None
            if len(indices) != 1:
                raise ConfigError(source, [Problem(written, value, "expected Links= on a line with one device file", line)])
        for index in indices:
            if any(g.index == index for g in group.gpus):
                raise ConfigError(source, [Problem("File", f"/dev/...{index}", "expected each GPU device once per node", line)])
            group.gpus.append(GresGpu(index, gtype, cores, links, line))
    for group in groups.values():
        group.gpus.sort(key=lambda g: g.index)
    return GresConf([g for g in groups.values() if g.gpus or g.autodetect], autodetect, warnings)


def gres_nvlink_domain(gpus: list[GresGpu]) -> int | None:
    """The NVLink domain that Links= shows (same rule as for nvidia-smi), or None without Links."""
    if not gpus or any(g.links is None or len(g.links) != len(gpus) for g in gpus):
        return None
    n = len(gpus)

    def linked(a: int, b: int) -> bool:
        return a == b or (gpus[a].links or ())[b] > 0

    for d in range(n, 0, -1):
        if n % d == 0 and all(
            linked(a, b) for s in range(0, n, d) for a in range(s, s + d) for b in range(s, s + d)
        ):
            return d
    return 1
