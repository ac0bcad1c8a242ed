"""srun's options and the step layout they give (pure: no processes, no files but a --nodelist file).

Accepted: exactly what the rendered batch script uses — --label,
--kill-on-bad-exit[=0|1], --wait=N, --export=ALL[,VAR=value...], --nodes,
--ntasks, --ntasks-per-node, --cpus-per-task, --distribution=block[:*],
--nodelist=<hostlist or file>, --output/--error (patterns %N %n %t %j %J %s
%u %x %%, or none), --open-mode, --overlap — in `--opt=value`, `--opt value`
and short forms. Anything else is refused rather than ignored.

The layout follows Slurm 22.05 as measured on the test cluster: step nodes in
the job's node order whatever the order of --nodelist, tasks spread as evenly
as possible over them (first nodes get the extra tasks) and numbered block-wise,
fewer tasks than nodes shrinks the node count with Slurm's warning, and a
node's tasks times --cpus-per-task must fit in the CPUs the job has there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from clusterctl.backends.local.formats import even_split
from clusterctl.syntax.hostlist import HostlistError, expand


class SrunError(Exception):
    """A refusal; `usage` errors exit 255 like srun's own option errors, others 1."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


# long name -> (short letter, "yes" | "no" | "optional")
OPTIONS: dict[str, tuple[str, str]] = {
    "label": ("l", "no"),
    "kill-on-bad-exit": ("K", "optional"),
    "wait": ("W", "yes"),
    "export": ("", "yes"),
    "nodes": ("N", "yes"),
    "ntasks": ("n", "yes"),
    "ntasks-per-node": ("", "yes"),
    "cpus-per-task": ("c", "yes"),
    "distribution": ("m", "yes"),
    "nodelist": ("w", "yes"),
    "output": ("o", "yes"),
    "error": ("e", "yes"),
    "open-mode": ("", "yes"),
    "overlap": ("", "no"),
}
SHORT = {short: name for name, (short, _) in OPTIONS.items() if short}
_COUNTS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


@dataclass
class Options:
    label: bool = False
    kill_bad_exit: bool = False
    wait: int | None = None
    export: dict[str, str] = field(default_factory=dict)
    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    distribution: str | None = None
    nodelist: str | None = None
    output: str | None = None
    error: str | None = None
    open_mode: str | None = None
    overlap: bool = False
    command: list[str] = field(default_factory=list)


def _unknown(arg: str) -> SrunError:
    known = ", ".join(f"--{name}" for name in OPTIONS)
    return SrunError(f"unrecognized option '{arg}' (the local backend emulates only {known})", usage=True)


def split_argv(argv: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(option, value) pairs and the command, which starts at the first non-option."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return pairs, argv[i + 1:]
        if not arg.startswith("-") or arg == "-":
            return pairs, argv[i:]
        i += 1
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if name not in OPTIONS:
                raise _unknown(arg)
            kind = OPTIONS[name][1]
            if kind == "no" and eq:
                raise SrunError(f"option '--{name}' doesn't allow an argument", usage=True)
            if kind == "yes" and not eq:
                if i >= len(argv):
                    raise SrunError(f"option '--{name}' requires an argument", usage=True)
                value = argv[i]
                i += 1
            pairs.append((name, value if eq or kind == "yes" else None))
            continue
        j = 1
        while j < len(arg):  # bundled short options: -lK, -N2, -n 4
            name = SHORT.get(arg[j])
            if name is None:
                raise _unknown(f"-{arg[j]}")
            kind = OPTIONS[name][1]
            rest = arg[j + 1:]
            if kind == "no":
                pairs.append((name, None))
                j += 1
                continue
            if kind == "optional":
                pairs.append((name, rest or None))
                break
            if not rest:
                if i >= len(argv):
                    raise SrunError(f"option requires an argument -- '{arg[j]}'", usage=True)
                rest = argv[i]
                i += 1
            pairs.append((name, rest))
            break
    return pairs, []


def _count(name: str, value: str | None, minimum: int = 1) -> int:
    try:
        number = int(value or "")
    except ValueError:
        raise SrunError(f"invalid --{name} argument {value!r}") from None
    if number < minimum:
        raise SrunError(f"invalid --{name} argument {value!r}")
    return number


def parse(argv: list[str]) -> Options:
    pairs, command = split_argv(argv)
    opts = Options(command=command)
    for name, value in pairs:
        if name == "label":
            opts.label = True
        elif name == "kill-on-bad-exit":
            if value not in (None, "0", "1"):
                raise SrunError(f"invalid --kill-on-bad-exit argument {value!r}: expected 0 or 1")
            opts.kill_bad_exit = value != "0"
        elif name == "wait":
            opts.wait = _count(name, value, minimum=0) or None
        elif name == "export":
            head, *rest = (value or "").split(",")
            if head != "ALL" or any("=" not in item for item in rest):
                raise SrunError(f"--export={value}: the local backend emulates only ALL and ALL,VAR=value,...")
            opts.export = dict(item.split("=", 1) for item in rest)
        elif name == "nodes":
            opts.nodes = _count(name, (value or "").split("-")[0])
        elif name == "ntasks":
            opts.ntasks = _count(name, value)
        elif name == "ntasks-per-node":
            opts.ntasks_per_node = _count(name, value)
        elif name == "cpus-per-task":
            opts.cpus_per_task = _count(name, value)
        elif name == "distribution":
            if (value or "").split(":")[0] != "block":
                raise SrunError(f"--distribution={value}: the local backend emulates only block (and block:*)")
            opts.distribution = value
        elif name == "nodelist":
            opts.nodelist = value
        elif name in ("output", "error"):
            if value is not None and value.isdigit():
                raise SrunError(f"--{name}={value}: per-task selection by number is not emulated")
            setattr(opts, name, value)
        elif name == "open-mode":
            if value not in ("append", "truncate"):
                raise SrunError(f"invalid --open-mode argument {value!r}: expected append or truncate")
            opts.open_mode = value
        elif name == "overlap":
            opts.overlap = True
    if not opts.command:
        raise SrunError("No command given to execute.")
    return opts


def expand_counts(text: str) -> list[int]:
    """`2(x3),1` -> [2, 2, 2, 1]."""
    out: list[int] = []
    for item in text.split(","):
        match = _COUNTS.match(item.strip())
        if not match:
            raise ValueError(f"bad count list {text!r}")
        out.extend([int(match.group(1))] * int(match.group(2) or 1))
    return out


def read_nodelist(value: str) -> list[str]:
    """--nodelist: a hostlist, or (when it names a file, as with a `/`) the hosts in that file."""
    text = value
    if "/" in value:
        try:
            with open(value, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise SrunError(f"cannot read --nodelist file {value}: {exc.strerror}") from None
    try:
        return expand(text)
    except HostlistError as exc:
        raise SrunError(f"--nodelist: {exc}") from None


@dataclass
class Layout:
    nodes: list[str]  # step nodes, in the job's order
    counts: list[int]  # tasks per step node
    cpus_per_task: int
    warnings: list[str]

    @property
    def ntasks(self) -> int:
        return sum(self.counts)

    def tasks(self) -> list[tuple[int, int, int]]:
        """(rank, node index, local id) in block order."""
        out = []
        rank = 0
        for index, count in enumerate(self.counts):
            for local in range(count):
                out.append((rank, index, local))
                rank += 1
        return out


def layout(opts: Options, env: Mapping[str, str], job_id: str) -> Layout:
    """Which nodes, how many tasks on each: as Slurm 22.05 lays out a step inside an allocation."""
    refuse = f"Unable to create step for job {job_id}"
    job_nodes = expand(env.get("SLURM_JOB_NODELIST", ""))
    if not job_nodes:
        raise SrunError("SLURM_JOB_NODELIST is empty: srun of the local backend runs inside a job")
    warnings: list[str] = []
    required: list[str] = []
    if opts.nodelist:
        required = read_nodelist(opts.nodelist)
        unknown = [n for n in required if n not in job_nodes]
        if unknown:
            raise SrunError(f"{refuse}: Requested node configuration is not available (not in the job: {','.join(unknown)})")
        required = sorted(set(required), key=job_nodes.index)
    env_ntpn = env.get("SLURM_NTASKS_PER_NODE", "")
    ntpn = opts.ntasks_per_node or (int(env_ntpn) if env_ntpn.isdigit() else None)
    nnodes = opts.nodes or (len(required) if required else None)
    if nnodes is None:
        if opts.ntasks and ntpn:
            nnodes = min(len(job_nodes), math.ceil(opts.ntasks / ntpn))
        elif opts.ntasks:
            nnodes = min(len(job_nodes), opts.ntasks)
        else:
            nnodes = len(job_nodes)
    if opts.ntasks:
        ntasks = opts.ntasks
    elif opts.ntasks_per_node or (ntpn and nnodes != len(job_nodes)):
        ntasks = nnodes * (ntpn or 1)
    else:
        env_ntasks = env.get("SLURM_NTASKS", "")
        ntasks = int(env_ntasks) if env_ntasks.isdigit() and nnodes == len(job_nodes) else nnodes * (ntpn or 1)
    if nnodes > len(job_nodes) or len(required) > nnodes:
        raise SrunError(f"{refuse}: Requested node configuration is not available")
    if ntasks < nnodes:
        warnings.append(f"can't run {ntasks} processes on {nnodes} nodes, setting nnodes to {ntasks}")
        nnodes = ntasks
        required = required[:nnodes]
    if ntpn and ntasks != nnodes * ntpn and ntasks > nnodes:
        warnings.append(
            f"can't honor --ntasks-per-node set to {ntpn} which doesn't match the requested tasks {ntasks} "
            f"with the number of requested nodes {nnodes}. Ignoring --ntasks-per-node."
        )
    nodes = required + [n for n in job_nodes if n not in required][: nnodes - len(required)]
    nodes = sorted(nodes, key=job_nodes.index)
    counts = even_split(ntasks, nnodes)
    cpt = opts.cpus_per_task or _env_int(env, "SRUN_CPUS_PER_TASK") or 1
    per_node = env.get("SLURM_JOB_CPUS_PER_NODE", "")
    if per_node:
        job_cpus = dict(zip(job_nodes, expand_counts(per_node), strict=False))
        if any(count * cpt > job_cpus.get(node, 0) for node, count in zip(nodes, counts, strict=True)):
            raise SrunError(f"{refuse}: More processors requested than permitted")
    return Layout(nodes, counts, cpt, warnings)


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def ranges(numbers: list[int]) -> str:
    """[0, 2, 3] -> `0,2-3` (srun's task lists)."""
    out = []
    numbers = sorted(numbers)
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        out.append(str(numbers[i]) if i == j else f"{numbers[i]}-{numbers[j]}")
        i = j + 1
    return ",".join(out)
