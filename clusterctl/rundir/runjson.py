"""run.json: the static plan of a run — one typed definition, its writer's layout and its reader.

`render` builds it from the plan (`RunJson.to_dict` is the file's layout);
everything else reads it through `read` and its typed fields: the batch
host's recovery step, the controller, each rank's launcher and trainer, and
every view. It stays small at any scale: sizes and formulas, never per-rank
lists (a wrapper computes its own binding from the node type's table).

A file of an older version reads too: a key it lacks takes the default its
spec field has, and keys this version does not know are ignored. Keys are
only ever added; `version` says which layout wrote the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.envnames import NODES as NODES_ENV
from clusterctl.rundir.jsonio import read_json
from clusterctl.rundir.layout import CHECKPOINTS, RUN_JSON

VERSION = 2  # 1: before run.json had a typed definition (same keys)


def _key(name: str, **extra: Any) -> Any:
    """A field stored under another JSON key (`global`, `async`)."""
    return field(metadata={"key": name}, **extra)


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    vpp: int = 1

    def sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "cp": self.cp, "ep": self.ep, "dp": self.dp, "pp": self.pp}


@dataclass(frozen=True)
class NodeTypeRecord:
    name: str = ""  # the site's node type the partition has
    gpu_model: str = ""  # as the site names it (H100-SXM5-80GB)
    gpu_vendor: str = "nvidia"  # nvidia, amd or emulated
    visibility_var: str = "CUDA_VISIBLE_DEVICES"  # the variable Slurm sets to the node's GPUs (ROCR_VISIBLE_DEVICES on AMD)
    binding: tuple[dict[str, Any], ...] = ()  # per physical GPU index: plan/binding.py's GpuBinding rows

    def row(self, gpu: int | None) -> dict[str, Any]:
        """The binding row of one physical GPU ({} when unknown)."""
        return dict(self.binding[gpu]) if gpu is not None and 0 <= gpu < len(self.binding) else {}


@dataclass(frozen=True)
class BatchRecord:
    micro: int = 1
    grad_accum: int = 1
    global_: int = _key("global", default=1)


@dataclass(frozen=True)
class WidthRecord:
    """One smaller width an elastic job may train at (plan/elastic.py's Width): its nodes, dp and batch."""

    nodes: int = 0  # nodes an attempt at this width runs on
    dp: int = 1  # its data-parallel size (tp, cp, pp as planned)
    micro: int = 1  # its micro-batch per rank
    grad_accum: int = 1  # its gradient accumulation steps
    global_: int = _key("global", default=1)  # its global batch: micro x accumulation x dp


@dataclass(frozen=True)
class ElasticRecord:
    """The spec's elastic section as planned: the widths below the full one, largest first (none: not elastic)."""

    batch: str = "keep"  # keep: the global batch stays exact through accumulation; shrink: it follows dp
    grow: bool = False  # a shrink queues the full-size job, which takes over when it starts
    min_nodes: int = 0  # the smallest width's nodes
    widths: tuple[WidthRecord, ...] = ()  # the widths below the full one the job may shrink to, largest first


@dataclass(frozen=True)
class RendezvousRecord:
    port_range: tuple[int, int] = (29500, 29999)
    interface: str | None = None
    address_family: str = "ipv4"  # the site's network.address_family
    timeout_s: float = 300.0  # rendezvous.timeout, in seconds


@dataclass(frozen=True)
class SignalRecord:
    name: str = "USR2"
    lead_s: int = 300


@dataclass(frozen=True)
class CheckpointRecord:
    dir: str | None = None
    interval: Any = None  # steps, "auto", or null
    keep: int = 2
    async_: bool = _key("async", default=False)
    save_seconds: float | None = None
    mtbf: float | None = None
    auto_interval_s: float | None = None  # Young/Daly's interval for `interval: auto`, in seconds
    memory_interval: int = 0  # steps between in-memory snapshots (checkpoint/snapshots.py), 0: none


@dataclass(frozen=True)
class RestartRecord:
    budget: int = 3
    mode: str = "continuation"
    in_allocation: bool = True
    warm: bool = False  # the batch script runs warm process servers (runtime/node/warm/)


@dataclass(frozen=True)
class WatchdogRecord:
    hang_timeout: float = 120.0
    straggler_factor: float = 1.25
    straggler_min_compute_s: float = 0.02
    straggler_min_lost_s: float = 0.01
    window: int = 20
    save_timeout: float = 900.0
    load_timeout: float = 900.0
    steps: str = "auto"  # auto | contract | off (runtime/rank/stepwatch.py)


@dataclass(frozen=True)
class PreflightRecord:
    checks: tuple[str, ...] = ()
    timeout: float = 120.0


@dataclass(frozen=True)
class RunJson:
    """The static plan of a run, as run.json holds it."""

    version: int = VERSION  # the file's layout version
    run_id: str | None = None  # the run directory's name
    name: str = ""
    site: str = ""
    partition: str = ""
    mode: str = "managed"  # managed (through clusterctl.launch) or standalone
    world_size: int = 0  # ranks: nodes x gpus_per_node
    nodes: int = 0
    spares: int = 0
    exclude: tuple[str, ...] = ()  # nodes the spec excludes (expanded)
    segment_nodes: int = 0  # a block site's segment: rank nodes per segment (0: no segment)
    segment_spares: int = 0  # spares per segment: a spare replaces a node of its own block
    domains: dict[str, str] = field(default_factory=dict)  # block name -> hostlist of its nodes (NVLink domains), with segments
    container: str = ""  # the runtime the ranks run under (pyxis, apptainer), "" without a container
    nvlink_kinds: tuple[str, ...] = ()  # group kinds the segments keep in one NVLink domain: checked at start (fabric ids)
    gpus_per_node: int = 0
    parallel: Parallel = Parallel()
    rank_order: str = "tp-cp-ep-dp-pp"  # the order of the dimensions in the rank, fastest first (Megatron-Core's)
    node_type: NodeTypeRecord = NodeTypeRecord()  # the partition's node type, as the wrapper needs it
    batch: BatchRecord = BatchRecord()
    elastic: ElasticRecord = ElasticRecord()  # the widths the job may shrink to (docs/guide/recovery.md, "Elastic")
    seq_len: int = 0
    model: dict[str, Any] | None = None  # the spec's model section, as resolved
    precision: dict[str, Any] = field(default_factory=dict)  # the spec's precision section
    spec_hash: str = ""  # sha256 of the resolved spec: a checkpoint records it
    argv: tuple[str, ...] = ()  # what the wrapper execs
    command: tuple[str, ...] = ()  # the spec's command
    env: dict[str, str] = field(default_factory=dict)
    site_env: dict[str, str] = field(default_factory=dict)  # the site's env for every job (the spec's env wins)
    rendezvous: RendezvousRecord = RendezvousRecord()
    signal: SignalRecord = SignalRecord()
    time_limit_s: int | None = None  # time_limit, in seconds
    checkpoint: CheckpointRecord = CheckpointRecord()
    restart: RestartRecord = RestartRecord()
    watchdog: WatchdogRecord = WatchdogRecord()
    preflight: PreflightRecord = PreflightRecord()
    secret_env: tuple[str, ...] = ()  # the names of the spec's secret_env (their values are never here)
    runs_mode: str = "private"  # who may read the run: private (its owner) or group (runs_group too): rundir/access.py
    runs_group: str | None = None  # the group a `group` run is shared with
    exit_codes: dict[str, int] = field(default_factory=dict)  # clusterctl's exit codes by name, for the batch script

    @property
    def standalone(self) -> bool:
        return self.mode == "standalone"

    def checkpoint_dir(self, run_path: Path) -> Path:
        """Where the run's checkpoints live: the spec's checkpoint.dir, else <run>/checkpoints."""
        return Path(self.checkpoint.dir) if self.checkpoint.dir else Path(run_path) / CHECKPOINTS

    def widths(self) -> tuple[int, ...]:
        """The node counts an attempt may run on, the full width first."""
        return (self.nodes, *(w.nodes for w in self.elastic.widths))

    def at_width(self, nodes: int | None) -> RunJson:
        """The plan of an attempt on `nodes` nodes: the full plan, or an elastic width's world, dp and batch.

        Every reader on the nodes (controller, ranks, trainer) takes the plan through here, so that a shrunk
        attempt's ranks, groups and batch agree; ValueError for a width the plan does not have.
        """
        if not nodes or nodes == self.nodes:
            return self
        width = next((w for w in self.elastic.widths if w.nodes == nodes), None)
        if width is None:
            raise ValueError(f"run.json plans no width of {nodes} nodes (widths: {', '.join(map(str, self.widths()))})")
        return dataclasses.replace(
            self, nodes=nodes, world_size=nodes * self.gpus_per_node, parallel=dataclasses.replace(self.parallel, dp=width.dp),
            batch=BatchRecord(micro=width.micro, grad_accum=width.grad_accum, global_=width.global_),
        )

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunJson":
        return _load(cls, data)


def load(run_dir: Path) -> RunJson:
    """run.json of a run directory, for the node side: raises OSError or ValueError when it cannot be read."""
    data = json.loads((Path(run_dir) / RUN_JSON).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{Path(run_dir) / RUN_JSON} is not a JSON object")
    return RunJson.from_dict(data)


def load_attempt(run_dir: Path, env: Mapping[str, str] | None = None) -> RunJson:
    """run.json at the width of the attempt this process belongs to (the batch script's CLUSTERCTL_NODES)."""
    env = os.environ if env is None else env
    nodes = env.get(NODES_ENV, "")
    return load(run_dir).at_width(int(nodes) if nodes.isdigit() else None)


def read(run_dir: Path) -> RunJson | None:
    """run.json of a run directory; None when it is missing or unreadable (views show what they can)."""
    data = read_json(Path(run_dir) / RUN_JSON)
    return RunJson.from_dict(data) if data is not None else None


# --- the layout: dataclass fields <-> JSON keys ----------------------------------------------------------------
def _json_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def _dump(record: Any) -> Any:
    if dataclasses.is_dataclass(record):
        return {_json_key(f): _dump(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, tuple):
        return [_dump(v) for v in record]
    if isinstance(record, dict):
        return {k: _dump(v) for k, v in record.items()}
    return record


_HINTS: dict[type, dict[str, Any]] = {}


def _load(cls: type, data: Any) -> Any:
    """A record from its JSON object: known keys converted to the field's type, missing ones defaulted."""
    if not isinstance(data, dict):
        return cls()
    hints = _HINTS.get(cls)
    if hints is None:
        import typing

        hints = _HINTS[cls] = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = _json_key(f)
        if key not in data:
            continue
        value, kind = data[key], hints[f.name]
        if dataclasses.is_dataclass(kind):
            values[f.name] = _load(kind, value)
        elif getattr(kind, "__origin__", None) is tuple and isinstance(value, list):
            item = kind.__args__[0]
            values[f.name] = tuple(_load(item, v) for v in value) if dataclasses.is_dataclass(item) else tuple(value)
        else:
            values[f.name] = value
    return cls(**values)


def host_domains(record: RunJson) -> dict[str, str]:
    """Node name -> its NVLink domain (block), from the record's hostlists."""
    from clusterctl.syntax import hostlist

    return {node: name for name, nodes in record.domains.items() for node in hostlist.expand(nodes)}
