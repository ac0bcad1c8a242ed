"""Read a node's rail map live: nvidia-smi for the GPUs, sysfs for NUMA, CPUs and NICs.

What is read, all under `root` (normally `/`; tests and saved copies of a
node's files use another directory):

- `nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id` and
  `nvidia-smi topo -m`: the GPUs, their model and memory, their distance to
  each NIC, their CPU and NUMA affinity (the command is configurable, e.g.
  `--nvidia-smi 'ssh node7 nvidia-smi'`);
- `sys/bus/pci/devices/<bus id>/numa_node`: each GPU's NUMA node when
  nvidia-smi does not print it;
- `sys/devices/system/node/node*/cpulist`: each NUMA node's CPUs;
- `sys/devices/system/cpu/cpu*/topology/thread_siblings_list` and
  `physical_package_id`: which CPUs are SMT siblings, how many sockets;
- `sys/class/infiniband/<dev>/ports/<n>/{link_layer,state}`,
  `sys/class/infiniband/<dev>/device/net/*` and `.../device/numa_node`:
  each RDMA NIC's kind (InfiniBand or RoCE), active port, network
  interface and NUMA node;
- `proc/meminfo`: the node's memory (host_memory_gb);
- `proc/net/route`: the interface of the default route, proposed as the
  rendezvous interface.

A machine without NVIDIA GPUs (no nvidia-smi, a driver that does not
answer, or no devices) is reported as such and exits 69; nothing is written.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.siteimport.build import NicFacts, NodeFacts, facts_from_topo, guess_kind
from clusterctl.siteimport.nvsmi import parse_topo
from clusterctl.syntax.cpulist import parse_cpulist
from clusterctl.syntax.slurmrelease import major_minor, release_name

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
QUERY = ["--query-gpu=index,name,memory.total,pci.bus_id", "--format=csv,noheader,nounits"]


class NoGpuError(ClusterctlError):
    """The machine has no NVIDIA GPU that nvidia-smi can report (exit 69)."""

    exit_code = ExitCode.BACKEND_UNAVAILABLE


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _nvidia_smi(command: Sequence[str], args: list[str], run: Runner) -> str:
    shown = " ".join([*command, *args])
    hint = "run `clusterctl site import --probe` on a GPU compute node, or import saved output with --topo FILE"
    try:
        done = run([*command, *args], capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise NoGpuError(f"no NVIDIA GPUs here: `{command[0]}` is not installed; {hint}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoGpuError(f"no NVIDIA GPUs here: `{shown}` failed ({exc}); {hint}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout or "").strip().splitlines()
        reason = said[0] if said else f"exit status {done.returncode}"
        raise NoGpuError(f"no NVIDIA GPUs here: `{shown}` says: {reason}; {hint}")
    return done.stdout


def read_host_memory_gb(root: Path) -> float | None:
    """MemTotal of proc/meminfo, in GB (what the kernel has; a little under what slurm.conf's RealMemory may say)."""
    try:
        for line in (root / "proc" / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) * 1024 / 1e9, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_numa_cpus(root: Path) -> dict[int, frozenset[int]]:
    out = {}
    for node in sorted((root / "sys/devices/system/node").glob("node[0-9]*")):
        text = _read(node / "cpulist")
        if text:
            try:
                out[int(node.name[4:])] = parse_cpulist(text)
            except ValueError:
                continue
    return out


def read_cpu_topology(root: Path) -> tuple[dict[int, frozenset[int]], int | None]:
    siblings: dict[int, frozenset[int]] = {}
    packages = set()
    for cpu in (root / "sys/devices/system/cpu").glob("cpu[0-9]*"):
        topo = cpu / "topology"
        text = _read(topo / "thread_siblings_list") or _read(topo / "core_cpus_list")
        if text:
            try:
                siblings[int(cpu.name[3:])] = parse_cpulist(text)
            except ValueError:
                pass
        package = _read(topo / "physical_package_id")
        if package is not None:
            packages.add(package)
    return siblings, (len(packages) or None)


def read_rdma_nics(root: Path) -> dict[str, NicFacts]:
    out: dict[str, NicFacts] = {}
    for dev in sorted((root / "sys/class/infiniband").glob("*")):
        ports = sorted((dev / "ports").glob("*"), key=lambda p: _int(p.name) or 0)
        active = None
        layer = None
        for port in ports:
            state = (_read(port / "state") or "").upper()
            layer = layer or _read(port / "link_layer")
            if "ACTIVE" in state and active is None:
                active = _int(port.name)
                layer = _read(port / "link_layer") or layer
        netdevs = sorted(p.name for p in (dev / "device/net").glob("*"))
        numa = _int(_read(dev / "device/numa_node"))
        kind = {"infiniband": "ib", "ethernet": "roce"}.get((layer or "").lower()) or guess_kind(dev.name)
        out[dev.name] = NicFacts(
            name=dev.name,
            kind=kind,
            netdev=netdevs[0] if netdevs else None,
            port=active or (_int(ports[0].name) if ports else 1),
            numa=numa if numa is not None and numa >= 0 else None,
            usable=active is not None or not ports,
        )
    return out


def default_route_interface(root: Path) -> str | None:
    text = _read(root / "proc/net/route")
    for line in (text or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def probe(
    root: Path = Path("/"),
    nvidia_smi: Sequence[str] | str = ("nvidia-smi",),
    run: Runner = subprocess.run,
) -> NodeFacts:
    """Everything this node says about its GPUs, CPUs and NICs."""
    command = shlex.split(nvidia_smi) if isinstance(nvidia_smi, str) else list(nvidia_smi)
    listing = _nvidia_smi(command, QUERY, run)
    gpus: list[dict[str, str]] = []
    for line in listing.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 4 and fields[0].isdigit():
            gpus.append({"index": fields[0], "name": fields[1], "memory": fields[2], "bus": fields[3]})
    if not gpus:
        raise NoGpuError(
            "no NVIDIA GPUs here: nvidia-smi lists no device; run `clusterctl site import --probe` on a GPU compute node"
        )
    topo = parse_topo(_nvidia_smi(command, ["topo", "-m"], run), "nvidia-smi topo -m on this node")
    if len(topo.gpus) != len(gpus):
        raise ClusterctlError(
            f"nvidia-smi lists {len(gpus)} GPUs but its topology shows {len(topo.gpus)}", ExitCode.BACKEND_UNAVAILABLE
        )
    facts = facts_from_topo(topo)
    facts.source = "this node (nvidia-smi and sysfs)"
    facts.gpu_model = gpus[0]["name"].removeprefix("NVIDIA ").replace(" ", "-")
    mib = _int(gpus[0]["memory"])
    if mib:
        facts.gpu_memory_gb = round(mib * 1024 * 1024 / 1e9, 1)
    if len({g["name"] for g in gpus}) > 1:
        facts.warnings.append(f"this node mixes GPU models {sorted({g['name'] for g in gpus})}; using {gpus[0]['name']}")

    facts.host_memory_gb = read_host_memory_gb(root)
    facts.numa_cpus = read_numa_cpus(root) or None
    siblings, sockets = read_cpu_topology(root)
    facts.siblings = siblings or None
    facts.sockets = sockets
    for gpu, listed in zip(facts.gpus, gpus):
        if gpu.numa is None:
            bus = listed["bus"].lower()
            if len(bus.split(":")[0]) == 8:  # nvidia-smi prints an 8-digit PCI domain, sysfs 4
                bus = bus[4:]
            gpu.numa = _int(_read(root / "sys/bus/pci/devices" / bus / "numa_node"))
            if gpu.numa is not None and gpu.numa < 0:
                gpu.numa = None

    rdma = read_rdma_nics(root)
    for nic in facts.nics:
        seen = rdma.get(nic.name)
        if seen:
            nic.kind, nic.netdev, nic.port, nic.numa, nic.usable = seen.kind, seen.netdev, seen.port, seen.numa, seen.usable
    shown = {n.name for n in facts.nics}
    for name, seen in rdma.items():
        if name in shown:
            continue
        # An RDMA NIC the matrix leaves out: same NUMA node as the GPU counts as NODE, else SYS.
        facts.nics.append(seen)
        for gpu in facts.gpus:
            same = seen.numa is not None and seen.numa == gpu.numa
            gpu.levels[name] = "NODE" if same else "SYS"
        facts.warnings.append(f"{name} is not in nvidia-smi's matrix; its distance to each GPU is taken from NUMA nodes")
    facts.interface = default_route_interface(root)
    return facts


def slurm_release(run: Runner = subprocess.run) -> str | None:
    """This machine's Slurm release ("24.05") from `scontrol --version`, or None when it does not answer."""
    from clusterctl.backends.slurm.pyslurmprobe import scontrol_version

    text = scontrol_version(run=run)
    release = major_minor(text) if text else None
    return release_name(release) if release else None
