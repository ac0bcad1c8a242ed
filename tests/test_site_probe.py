"""`clusterctl site import --probe`: a node read live, here a sysfs tree and an nvidia-smi stand-in.

The stand-in prints a published `nvidia-smi topo -m` (the H200 fixture) and
a `--query-gpu` listing; the sysfs tree under --root gives the NICs' link
layers, ports and network interfaces, the NUMA nodes' CPUs, the SMT
siblings, and the default route.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import yaml
from helpers import cli

from clusterctl.config.site import load_site

FIXTURES = Path(__file__).parent / "fixtures" / "siteimport"
H200 = FIXTURES / "h200-bond_weiziyang-blog.txt"

FAKE_SMI = """\
import sys
args = sys.argv[1:]
mode = {mode!r}
if mode == "broken":
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", file=sys.stderr)
    sys.exit(9)
if args[:2] == ["topo", "-m"]:
    sys.stdout.write(open({topo!r}).read())
elif args and args[0].startswith("--query-gpu"):
    if mode == "none":
        print("No devices were found")
    else:
        for i in range(8):
            print(f"{{i}}, NVIDIA H200, 143771, 00000000:{{0x18 + i:02X}}:00.0")
else:
    sys.exit(2)
"""

NETDEVS = {
    "mlx5_0": "ibp24s0", "mlx5_3": "ibp64s0", "mlx5_4": "ibp79s0", "mlx5_5": "ibp94s0",
    "mlx5_6": "ibp154s0", "mlx5_7": "ibp170s0", "mlx5_8": "ibp192s0", "mlx5_9": "ibp206s0",
}


def fake_smi(tmp_path: Path, mode: str = "ok") -> str:
    script = tmp_path / f"nvidia-smi-{mode}.py"
    script.write_text(FAKE_SMI.format(mode=mode, topo=str(H200)))
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    ib = root / "sys/class/infiniband"
    for name, netdev in NETDEVS.items():
        numa = 0 if name in ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5") else 1
        state = "1: DOWN" if name == "mlx5_9" else "4: ACTIVE"
        write(ib / name / "ports/1/state", state)
        write(ib / name / "ports/1/link_layer", "InfiniBand")
        write(ib / name / "device/numa_node", str(numa))
        (ib / name / "device/net" / netdev).mkdir(parents=True)
    write(ib / "mlx5_bond_0/ports/1/state", "4: ACTIVE")
    write(ib / "mlx5_bond_0/ports/1/link_layer", "Ethernet")
    write(ib / "mlx5_bond_0/device/numa_node", "0")
    (ib / "mlx5_bond_0/device/net/bond0").mkdir(parents=True)
    # An RDMA NIC that nvidia-smi's matrix does not show.
    write(ib / "mlx5_12/ports/1/state", "4: ACTIVE")
    write(ib / "mlx5_12/ports/1/link_layer", "Ethernet")
    write(ib / "mlx5_12/device/numa_node", "1")
    write(root / "sys/devices/system/node/node0/cpulist", "0-47,96-143")
    write(root / "sys/devices/system/node/node1/cpulist", "48-95,144-191")
    for cpu in range(192):
        core = cpu % 96
        write(root / f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", f"{core},{core + 96}")
        write(root / f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", "0" if core < 48 else "1")
    write(
        root / "proc/net/route",
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "ibp24s0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "bond0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0",
    )
    return root


def test_probe_reads_the_node(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    result = cli(
        "site", "import", "--probe", "--root", root, "--nvidia-smi", fake_smi(tmp_path),
        "--nodes", "h200-[01-16]", "--name", "h200",
    )
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    (name, nt), = data["node_types"].items()
    assert name == "h200" and nt["gpu_model"] == "H200" and nt["gpu_memory_gb"] == 150.8 and nt["sockets"] == 2
    gpus = [(g["index"], g["numa"], g["cpus"], g["nics"]) for g in nt["gpus"]]
    # mlx5_9 has no active port: GPU 7 falls back to a rail of its socket (NODE), sharing it with GPU 4.
    assert [g[3][0] for g in gpus] == ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_6"]
    assert gpus[0][2] == "0,2-11,96-107"  # siblings from sysfs: CPU 1 missing, its sibling 97 kept with core 1
    nics = nt["nics"]
    assert nics["mlx5_0"] == {"rail": 0, "netdev": "ibp24s0", "kind": "ib"}
    assert nics["mlx5_9"] == {"netdev": "ibp206s0", "kind": "ib"}
    assert nics["mlx5_bond_0"] == {"netdev": "bond0", "kind": "roce"}
    assert nics["mlx5_12"] == {"kind": "roce"}
    assert data["network"]["interface"] == "bond0"  # the default route
    assert data["env"] == {"NCCL_SOCKET_IFNAME": "bond0"}  # GPU 4 and 7 share mlx5_6: not rail-optimized
    assert "mlx5_9 has no active port" in result.stderr
    assert "mlx5_12 is not in nvidia-smi's matrix" in result.stderr
    path = tmp_path / "h200.yaml"
    path.write_text(result.stdout)
    load_site(str(path))
    assert cli("site", "validate", path).exit_code == 0


def test_probe_json(tmp_path: Path) -> None:
    result = cli("site", "import", "--probe", "--root", fake_root(tmp_path), "--nvidia-smi", fake_smi(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows[7] == {"gpu": 7, "numa": 1, "cpus": "84-95,180-191", "nics": ["mlx5_6"]}
    assert set(rows[0]) == {"gpu", "numa", "cpus", "nics"}


def no_gpu(tmp_path: Path, nvidia_smi: str, *needles: str) -> None:
    result = cli("site", "import", "--probe", "--root", tmp_path, "--nvidia-smi", nvidia_smi)
    assert result.exit_code == 69, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    assert result.stderr.startswith("error: no NVIDIA GPUs here")
    for needle in needles:
        assert needle in result.stderr


def test_probe_without_nvidia_smi(tmp_path: Path) -> None:
    no_gpu(tmp_path, str(tmp_path / "no-such-nvidia-smi"), "is not installed", "--topo FILE")


def test_probe_with_a_broken_driver(tmp_path: Path) -> None:
    no_gpu(tmp_path, fake_smi(tmp_path, "broken"), "couldn't communicate with the NVIDIA driver")


def test_probe_without_devices(tmp_path: Path) -> None:
    no_gpu(tmp_path, fake_smi(tmp_path, "none"), "lists no device")


def test_this_machines_slurm_release_is_read_from_scontrol() -> None:
    from subprocess import CompletedProcess

    from clusterctl.siteimport import probe

    answer = lambda out, code: lambda *a, **k: CompletedProcess(a, code, out, "")  # noqa: E731
    assert probe.slurm_release(answer("slurm 24.05.3\n", 0)) == "24.05"
    assert probe.slurm_release(answer("slurm-wlm 22.05.8\n", 0)) == "22.05"
    assert probe.slurm_release(answer("", 1)) is None  # no configuration to reach: scontrol fails
