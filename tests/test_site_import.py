"""`clusterctl site import` from real `nvidia-smi topo -m` outputs, topology.conf and gres.conf.

Every fixture under tests/fixtures/siteimport is published output (SOURCES.md
there names each one's source). Each import must load with `load_site` and
pass `site validate`; the tests also pin the rail map each one should give:
which NIC each GPU uses, which NICs are not rails, how shared CPU lists are
split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, cli, expect_cli_config_error

from clusterctl.config.site import load_site
from clusterctl.errors import ConfigError
from clusterctl.siteimport.nvsmi import clean, parse_topo

FIXTURES = Path(__file__).parent / "fixtures" / "siteimport"


def fixture(name: str) -> Path:
    return FIXTURES / name


def imported(tmp_path: Path, *args: Any, name: str = "imported") -> tuple[dict[str, Any], Path, str]:
    """Run `site import ARGS`, write the YAML, check it loads and validates; (data, path, stderr)."""
    result = cli("site", "import", "--name", name, *args)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    path = tmp_path / f"{name}.yaml"
    text = result.stdout
    if "gpu_memory_gb: null" in text:  # an input that does not say: left for a person to write, as here
        assert "gpu_memory_gb is left empty" in result.stderr
        text = text.replace("gpu_memory_gb: null", "gpu_memory_gb: 80")
    path.write_text(text)
    load_site(str(path))
    check = cli("site", "validate", path)
    assert check.exit_code == 0, check.output
    assert check.stdout.startswith(f"ok: site {name} (")
    return yaml.safe_load(text), path, result.stderr


def rail_map(data: dict[str, Any]) -> list[tuple[int, int, str, list[str]]]:
    (nt,) = data["node_types"].values()
    return [(g["index"], g["numa"], g["cpus"], g["nics"]) for g in nt["gpus"]]


def nics_of(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (nt,) = data["node_types"].values()
    return nt["nics"]


def rails(data: dict[str, Any]) -> dict[str, int | None]:
    return {name: nic.get("rail") for name, nic in nics_of(data).items()}


# --- every published output imports, loads and validates -------------------------------------

# fixture -> extra options it needs (a legend cut off in the published copy, a node without NICs)
TOPO_FIXTURES = {
    "dgx-h100_mooncake-2039.txt": [],
    "hgx-h100_nccl-1264.txt": ["--nic-names", ",".join(f"mlx5_{i}" for i in range(10))],
    "hgx-h100-pcie-view_deepep-397.txt": [],
    "h200-bond_weiziyang-blog.txt": [],
    "dgx-a100_ucx-py-749.txt": [],
    "juwels-booster-a100_icon-run-wrapper.txt": [],
    "levante-a100_icon-run-wrapper.txt": [],
    "h100-4gpu_nccl-1617.txt": ["--nic-names", "mlx5_0,mlx5_1,mlx5_2,mlx5_3"],
    "gh200_aerial-cubb-system-checks.txt": [],
    "2x-rtx5090-no-nic_club-3090-1229.txt": ["--nic", "eth0"],
}


def test_every_topo_fixture_is_covered() -> None:
    on_disk = {p.name for p in FIXTURES.glob("*.txt")}
    assert set(TOPO_FIXTURES) | {"2gpu-no-cpu-affinity_vllm-19607.txt"} == on_disk
    sources = (FIXTURES / "SOURCES.md").read_text()
    for name in on_disk | {p.name for p in FIXTURES.glob("*.conf")}:
        assert f"`{name}`" in sources, f"{name} has no source in SOURCES.md"


@pytest.mark.parametrize("name", sorted(TOPO_FIXTURES))
def test_fixture_imports_and_validates(tmp_path: Path, name: str) -> None:
    data, path, _ = imported(tmp_path, "--topo", fixture(name), "--nodes", "gpu-[001-004]", *TOPO_FIXTURES[name])
    site, _ = load_site(str(path))
    (nt,) = site.node_types.values()
    assert [g.index for g in nt.gpus] == list(range(len(nt.gpus)))
    cpus = [g.cpu_set for g in nt.gpus]
    assert all(cpus) and sum(len(c) for c in cpus) == len(frozenset().union(*cpus)), "CPU sets overlap"
    assert all(g.nics and nt.nics[g.nics[0]].rail is not None for g in nt.gpus)
    assert site.partitions["gpu"].nodes == "gpu-[001-004]"


def test_an_unknown_gpus_memory_is_left_empty_and_refused_until_written(tmp_path: Path) -> None:
    result = cli("site", "import", "--name", "club", "--topo", fixture("2x-rtx5090-no-nic_club-3090-1229.txt"), "--nic", "eth0")
    assert result.exit_code == 0, result.output
    (nt,) = yaml.safe_load(result.stdout)["node_types"].values()
    assert nt["gpu_memory_gb"] is None and "gpu_memory_gb is left empty" in result.stderr  # never a guess
    (tmp_path / "club.yaml").write_text(result.stdout)
    refused = cli("site", "validate", tmp_path / "club.yaml")
    assert refused.exit_code == 65 and "gpu_memory_gb" in refused.stderr and "it is not set" in refused.stderr
    (tmp_path / "club.yaml").write_text(result.stdout.replace("gpu_memory_gb: null", "gpu_memory_gb: 32"))
    assert cli("site", "validate", tmp_path / "club.yaml").exit_code == 0


def test_dgx_h100_rails_skip_the_storage_ports(tmp_path: Path) -> None:
    """GPU 0 and 4 are PIX to three NICs each; the Ethernet storage ports (mlx5_1/2/7/8) lose the tie."""
    data, _, _ = imported(tmp_path, "--topo", fixture("dgx-h100_mooncake-2039.txt"), "--gpu-model", "H100-SXM5-80GB")
    assert [g[3] for g in rail_map(data)] == [[n] for n in ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")]
    assert rails(data) == {
        "mlx5_0": 0, "mlx5_1": None, "mlx5_2": None, "mlx5_3": 1, "mlx5_4": 2, "mlx5_5": 3,
        "mlx5_6": 4, "mlx5_7": None, "mlx5_8": None, "mlx5_9": 5, "mlx5_10": 6, "mlx5_11": 7,
    }
    assert [g[1] for g in rail_map(data)] == [0, 0, 0, 0, 1, 1, 1, 1]
    # The container's cpuset (4,6,8,10,12 for socket 0) shows no SMT pairs: one CPU per core, extras to GPU 0.
    assert [g[2] for g in rail_map(data)] == ["4,6", "8", "10", "12", "1,3", "5,7", "9", "11"]
    (nt,) = data["node_types"].values()
    assert nt["nvlink_domain"] == 8 and nt["sockets"] == 2 and nt["gpu_memory_gb"] == 80
    assert data["env"]["NCCL_CROSS_NIC"] == 0  # rail-optimized


def test_shared_socket_cpus_split_like_the_shipped_dgx_h100(tmp_path: Path) -> None:
    """`0-55,112-167` for four GPUs: contiguous shares of cores with their SMT siblings, as site-configs/dgx-h100 has it."""
    # NIC3 and NIC4 are far from every GPU (the storage ports); name the columns as a DGX H100's legend would.
    names = "mlx5_0,mlx5_3,mlx5_4,mlx5_1,mlx5_7,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11"
    data, _, err = imported(tmp_path, "--topo", fixture("hgx-h100_nccl-1264.txt"), "--nic-names", names)
    shipped = yaml.safe_load((REPO / "site-configs" / "dgx-h100.yaml").read_text())["node_types"]["dgx-h100"]
    assert [(g[0], g[1], g[2], g[3]) for g in rail_map(data)] == [
        (g["index"], g["numa"], g["cpus"], g["nics"]) for g in shipped["gpus"]
    ]
    assert rails(data)["mlx5_1"] is None and rails(data)["mlx5_7"] is None
    assert "share their CPU lists" in err


def test_missing_nic_legend_is_named(tmp_path: Path) -> None:
    expect_cli_config_error(
        ["site", "import", "--topo", fixture("hgx-h100_nccl-1264.txt")],
        tmp_path,
        "NIC Legend",
        "NIC0: mlx5_0",
        "--nic-names",
    )
    expect_cli_config_error(
        ["site", "import", "--topo", fixture("hgx-h100_nccl-1264.txt"), "--nic-names", "mlx5_0,mlx5_1"],
        tmp_path,
        "--nic-names",
        "expected 10 names",
    )


def test_ties_at_pxb_are_dealt_one_per_gpu(tmp_path: Path) -> None:
    """DGX A100: GPU pairs see NIC pairs at PXB; each GPU of a pair gets its own (GPU0 mlx5_0, GPU1 mlx5_1)."""
    data, _, err = imported(tmp_path, "--topo", fixture("dgx-a100_ucx-py-749.txt"), "--gpu-model", "A100-SXM4-80GB")
    assert [g[3][0] for g in rail_map(data)] == [f"mlx5_{i}" for i in (0, 1, 2, 3, 6, 7, 8, 9)]
    assert {n for n, r in rails(data).items() if r is None} == {"mlx5_4", "mlx5_5", "mlx5_10", "mlx5_11"}
    # All eight GPUs list 112-127,240-255 (a container's cpuset): two cores with their siblings each.
    assert [g[2] for g in rail_map(data)][:2] == ["112-113,240-241", "114-115,242-243"]
    assert [g[1] for g in rail_map(data)] == [6] * 8
    assert "report several NUMA nodes" in err
    assert "no NVLink between any GPUs" in err


def test_bonded_nic_far_from_the_gpus_is_not_a_rail(tmp_path: Path) -> None:
    data, _, _ = imported(tmp_path, "--topo", fixture("h200-bond_weiziyang-blog.txt"))
    assert nics_of(data)["mlx5_bond_0"] == {"kind": "roce"}
    assert [g[3][0] for g in rail_map(data)] == ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
    # CPU 1 is missing from 0,2-47,96-143; its sibling 97 stays with core 1 in GPU 0's share.
    assert rail_map(data)[0][2] == "0,2-11,96-107"
    assert rail_map(data)[3][2] == "36-47,132-143"


def test_older_driver_format(tmp_path: Path) -> None:
    """JUWELS Booster, `topo -mp` on an older driver: NICs named in the header, no NIC legend."""
    data, _, _ = imported(tmp_path, "--topo", fixture("juwels-booster-a100_icon-run-wrapper.txt"))
    assert rail_map(data) == [
        (0, 3, "18-23,66-71", ["mlx5_0"]),
        (1, 1, "6-11,54-59", ["mlx5_1"]),
        (2, 7, "42-47,90-95", ["mlx5_2"]),
        (3, 5, "30-35,78-83", ["mlx5_3"]),
    ]
    assert data["env"] == {"NCCL_CROSS_NIC": 0}


def test_fewer_nics_than_gpus(tmp_path: Path) -> None:
    """Levante: two NICs for four GPUs; GPU 0 and 3 reach any NIC only across sockets and share the rail NICs."""
    data, path, err = imported(tmp_path, "--topo", fixture("levante-a100_icon-run-wrapper.txt"))
    assert [g[3] for g in rail_map(data)] == [["mlx5_0"], ["mlx5_0"], ["mlx5_1"], ["mlx5_1"]]  # as ICON's wrapper binds them
    assert "GPU0 has no NIC closer than SYS" in err and "GPU3 has no NIC closer than SYS" in err
    assert "env" not in data  # shared NICs: not rail-optimized, and the interface was not given
    result = cli("site", "validate", path)
    assert result.exit_code == 0
    assert "warning: node_types.gpu.nics.mlx5_0: shared by GPUs on different NUMA nodes" in result.stdout


def test_gh200_single_gpu(tmp_path: Path) -> None:
    data, _, _ = imported(tmp_path, "--topo", fixture("gh200_aerial-cubb-system-checks.txt"), "--gpu-model", "GH200-480GB")
    assert rail_map(data) == [(0, 0, "0-71", ["mlx5_0"])]
    assert rails(data) == {"mlx5_0": 0, "mlx5_1": None, "mlx5_2": None, "mlx5_3": None}
    (nt,) = data["node_types"].values()
    assert nt["gpu_memory_gb"] == 96 and nt["nvlink_domain"] == 1
    assert "env" not in data


def test_node_without_nics(tmp_path: Path) -> None:
    expect_cli_config_error(
        ["site", "import", "--topo", fixture("2x-rtx5090-no-nic_club-3090-1229.txt")],
        tmp_path,
        "GPU 0, 1: no NIC to use (the node shows no NIC)",
        "--nic NAME",
    )
    data, _, _ = imported(tmp_path, "--topo", fixture("2x-rtx5090-no-nic_club-3090-1229.txt"), "--nic", "eth0")
    assert rail_map(data) == [(0, 0, "0-31", ["eth0"]), (1, 0, "32-63", ["eth0"])]
    assert nics_of(data) == {"eth0": {"rail": 0, "netdev": "eth0", "kind": "ethernet"}}
    assert data["network"]["interface"] == "eth0"


def test_missing_cpu_affinity_needs_another_source(tmp_path: Path) -> None:
    topo = fixture("2gpu-no-cpu-affinity_vllm-19607.txt")
    names = ",".join(f"mlx5_{i}" for i in range(8))
    expect_cli_config_error(
        ["site", "import", "--topo", topo, "--nic-names", names], tmp_path, "GPU 0, 1: no CPU list", "--gres-conf"
    )
    # gres.conf Cores= fills it in (a constructed two-GPU gres.conf).
    gres = tmp_path / "gres.conf"
    gres.write_text("NodeName=box[1-2] Name=gpu File=/dev/nvidia[0-1] Cores=0-15\n")
    data, _, _ = imported(tmp_path, "--topo", topo, "--nic-names", names, "--gres-conf", gres)
    assert rail_map(data) == [(0, 0, "0-7", ["mlx5_6"]), (1, 0, "8-15", ["mlx5_7"])]
    assert data["partitions"]["gpu"]["nodes"] == "box[1-2]"


def test_excluded_nic_is_never_a_rail(tmp_path: Path) -> None:
    data, _, _ = imported(
        tmp_path, "--topo", fixture("dgx-h100_mooncake-2039.txt"), "--exclude-nic", "mlx5_0", "--exclude-nic", "mlx5_6,mlx5_7"
    )
    assert [g[3][0] for g in rail_map(data)][:1] == ["mlx5_1"]
    assert [g[3][0] for g in rail_map(data)][4] == "mlx5_8"
    assert rails(data)["mlx5_0"] is None and rails(data)["mlx5_6"] is None


# --- pasted output ---------------------------------------------------------------------------


def _rows(text: str) -> list[tuple[int, tuple[str, ...], frozenset[int] | None, tuple[int, ...]]]:
    topo = parse_topo(text)
    return [(g.index, g.nic_levels, g.cpus, g.numa) for g in topo.gpus]


def test_terminal_colour_codes_are_ignored() -> None:
    plain = fixture("dgx-h100_mooncake-2039.txt").read_text()
    lines = plain.splitlines()
    lines[0] = "\x1b[4m" + lines[0] + "\x1b[0m"  # nvidia-smi underlines the header on a terminal
    lines[1] = lines[1].replace("PIX", "\x1b[1;32mPIX\x1b[0m")
    coloured = "\r\n".join(lines) + "\r\n"
    assert _rows(coloured) == _rows(plain)


def _without_esc(text: str, header_on: str = "[4m", header_off: str = "[0m") -> str:
    """`text` as pasted from a web page that kept nvidia-smi's colour codes but lost their ESC bytes."""
    lines = text.splitlines()
    indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
    lines[0] = indent + header_on + lines[0].strip() + header_off
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "name", ["dgx-h100_mooncake-2039.txt", "juwels-booster-a100_icon-run-wrapper.txt", "gh200_aerial-cubb-system-checks.txt"]
)
def test_colour_codes_that_lost_their_esc_are_ignored(tmp_path: Path, name: str) -> None:
    plain = fixture(name).read_text()
    pasted = _without_esc(plain)
    assert "[4mGPU0" in pasted and pasted.splitlines()[0].endswith("[0m")
    topo = parse_topo(pasted)
    assert topo == parse_topo(plain)  # GPUs (links, NIC levels, CPUs, NUMA, lines), NIC names, columns, warnings
    assert topo.gpus and topo.gpus[0].cpus and topo.has_cpu_column
    # and the whole import: the same site as from the clean output
    paste = tmp_path / "pasted" / name  # the same file name: the description names it
    paste.parent.mkdir()
    paste.write_text(pasted)
    assert imported(tmp_path, "--topo", paste)[0] == imported(tmp_path, "--topo", fixture(name))[0]


def test_colour_codes_that_lost_their_esc_variants() -> None:
    plain = fixture("dgx-h100_mooncake-2039.txt").read_text()
    expected = parse_topo(plain)
    bold = _without_esc(plain, "[1m", "[m")  # bold, and the reset with no parameter
    assert parse_topo(bold) == expected
    compound = _without_esc(plain, "[0;4m", "[0m")
    assert parse_topo(compound) == expected
    # a reset left at the end of every line (some renderers close the style line by line),
    # and a coloured cell in a row, attached to its neighbour
    lines = plain.splitlines()
    lines = [line + "[0m" if line.strip() else line for line in lines]
    lines[1] = lines[1].replace("PIX     PIX", "[1;32mPIX[0mPIX", 1)
    assert "[1;32mPIX[0mPIX" in lines[1]
    assert parse_topo("\n".join(lines)) == expected
    # the ESC shown as `^[` (cat -v) or as the symbol for it
    assert parse_topo(_without_esc(plain, "^[[4m", "^[[0m")) == expected
    assert parse_topo(_without_esc(plain, "\u241b[4m", "\u241b[0m")) == expected
    # a real ESC before one code and none before the other
    assert parse_topo(_without_esc(plain, "\x1b[4m", "[0m")) == expected


def test_bracketed_text_that_is_no_colour_code_is_kept() -> None:
    # inside a word, between pieces that are not the matrix's, `[1m` is text
    assert clean("see a[1mb") == "see a[1mb"
    assert clean("\t[4mGPU0\tGPU1[0m\n") == "\tGPU0\tGPU1\n"
    plain = fixture("gh200_aerial-cubb-system-checks.txt").read_text()
    with pytest.raises(ConfigError, match="no matrix header"):
        parse_topo("x[4mGPU0 GPU1\n" + plain.split("\n", 1)[1])


def test_columns_that_ran_together() -> None:
    plain = fixture("dgx-h100_mooncake-2039.txt").read_text()
    lines = plain.splitlines()
    lines[0] = lines[0].replace("NIC10   NIC11", "NIC10NIC11")
    lines[6] = lines[6].replace("PIX     NODE    NODE    1,3", "PIXNODE    NODE    1,3")  # GPU5
    assert lines[6] != plain.splitlines()[6]
    assert _rows("\n".join(lines)) == _rows(plain)


def test_truncated_nic_list_is_a_warning() -> None:
    text = "  140 NICs found in the topology, only displaying 56 in the matrix.\n" + fixture("gh200_aerial-cubb-system-checks.txt").read_text()
    topo = parse_topo(text, "paste")
    assert any("found 140 NICs but printed only 56" in w for w in topo.warnings)


GARBAGE = {
    "empty": "",
    "prose": "Sorry, I could not paste the topology, here is my nvidia-smi output instead.\n",
    "nvidia-smi table": (
        "+-----------------------------------------------------------------------------------------+\n"
        "| NVIDIA-SMI 570.124.06             Driver Version: 570.124.06     CUDA Version: 12.8     |\n"
        "|   0  NVIDIA GH200 480GB             On  |   00000000:DD:00.0 Off |                    0 |\n"
    ),
    "p2p matrix": "\tGPU0\tGPU1\t\n GPU0\tX\tGNS\t\n GPU1\tGNS\tX\t\n",
    "bad cell": "\tGPU0\tGPU1\tNIC0\tCPU Affinity\nGPU0\t X \tNV4\tFOO\t0-7\nGPU1\tNV4\t X \tPIX\t8-15\n\nNIC Legend:\n\n  NIC0: mlx5_0\n",
    "missing row": "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\n",
    "bad cpus": "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\nGPU1\tNV4\t X \tall\n",
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_garbage_is_rejected_with_what_was_expected(tmp_path: Path, case: str) -> None:
    bad = tmp_path / "topo.txt"
    bad.write_text(GARBAGE[case])
    needles = {
        "empty": ["is empty", "nvidia-smi topo -m"],
        "prose": ["no matrix header found", "GPU0"],
        "nvidia-smi table": ["no matrix header found", "nvidia-smi topo -m"],
        "p2p matrix": ["GPU0.GPU1", "'GNS'", "NV#, PIX"],
        "bad cell": ["GPU0.NIC0 (line 2)", "'FOO'"],
        "missing row": ["no row for GPU1"],
        "bad cpus": ["GPU1.CPU Affinity", "'all'", "CPU list"],
    }[case]
    expect_cli_config_error(["site", "import", "--topo", bad], tmp_path, f"invalid {bad}", *needles)


def test_missing_input_file(tmp_path: Path) -> None:
    expect_cli_config_error(["site", "import", "--topo", tmp_path / "nope.txt"], tmp_path, "no such file")


def test_usage_errors() -> None:
    assert cli("site", "import").exit_code == 2
    both = cli("site", "import", "--probe", "--topo", fixture("gh200_aerial-cubb-system-checks.txt"))
    assert both.exit_code == 2 and "not both" in both.output


# --- --json ----------------------------------------------------------------------------------


def test_json_rail_map() -> None:
    result = cli("site", "import", "--topo", fixture("levante-a100_icon-run-wrapper.txt"), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows == [
        {"gpu": 0, "numa": 3, "cpus": "48-63,176-191", "nics": ["mlx5_0"]},
        {"gpu": 1, "numa": 1, "cpus": "16-31,144-159", "nics": ["mlx5_0"]},
        {"gpu": 2, "numa": 7, "cpus": "112-127,240-255", "nics": ["mlx5_1"]},
        {"gpu": 3, "numa": 5, "cpus": "80-95,208-223", "nics": ["mlx5_1"]},
    ]


def test_json_rail_map_of_a_node_without_nics() -> None:
    result = cli("site", "import", "--topo", fixture("2x-rtx5090-no-nic_club-3090-1229.txt"), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {"gpu": 0, "numa": 0, "cpus": "0-31", "nics": []},
        {"gpu": 1, "numa": 0, "cpus": "32-63", "nics": []},
    ]
    assert "GPU 0-1 have no NIC" in result.stderr


# --- topology.conf and gres.conf -----------------------------------------------------------------


def test_topology_tree_gives_nodes_and_switches(tmp_path: Path) -> None:
    data, _, _ = imported(
        tmp_path,
        "--topo", fixture("dgx-h100_mooncake-2039.txt"),
        "--topology-conf", fixture("topology-tree_slurm-manpage.conf"),
    )
    assert data["partitions"]["gpu"]["nodes"] == "dev[0-17]"
    assert data["topology"] == {
        "kind": "tree",
        "switches": [
            {"name": "s0", "nodes": "dev[0-5]"},
            {"name": "s1", "nodes": "dev[6-11]"},
            {"name": "s2", "nodes": "dev[12-17]"},
            {"name": "s3", "switches": "s[0-2]"},
        ],
    }


@pytest.fixture(autouse=True)
def _no_local_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imports do not depend on whether this machine's scontrol answers (the test cluster may be up)."""
    monkeypatch.setattr("clusterctl.siteimport.probe.slurm_release", lambda: None)


def test_blocks_get_a_slurm_release_and_a_segment_size(tmp_path: Path) -> None:
    args = ("--topo", fixture("gh200_aerial-cubb-system-checks.txt"),
            "--topology-conf", fixture("topology-block_slurm-manpage.conf"))
    data, _, err = imported(tmp_path, *args, "--slurm-version", "25.05")
    assert (data["slurm_version"], data["topology"]["segment_size"]) == ("25.05", 30)  # the smallest BlockSizes entry
    assert "slurm_version" not in err
    data, _, err = imported(tmp_path, *args)  # scontrol does not answer here: the first release with --segment
    assert data["slurm_version"] == "24.05" and "pass --slurm-version" in " ".join(err.split())
    bad = cli("site", "import", *args, "--slurm-version", "24.1x")
    assert bad.exit_code == 2 and "--slurm-version" in bad.output and "24.05" in bad.output


def test_topology_blocks(tmp_path: Path) -> None:
    data, _, _ = imported(
        tmp_path, "--topo", fixture("gh200_aerial-cubb-system-checks.txt"),
        "--topology-conf", fixture("topology-block_slurm-manpage.conf"),
    )
    assert data["partitions"]["gpu"]["nodes"] == "node[1-128]"
    assert data["topology"]["kind"] == "block"
    assert data["topology"]["block_sizes"] == [30, 120]
    assert [b["nodes"] for b in data["topology"]["blocks"]] == ["node[1-32]", "node[33-64]", "node[65-96]", "node[97-128]"]


def test_topology_narrowed_to_the_gpu_nodes(tmp_path: Path) -> None:
    data, _, err = imported(
        tmp_path, "--topo", fixture("dgx-h100_mooncake-2039.txt"),
        "--topology-conf", fixture("topology-tree_slurm-manpage.conf"), "--nodes", "dev[0-7]",
    )
    assert data["topology"]["switches"] == [
        {"name": "s0", "nodes": "dev[0-5]"},
        {"name": "s1", "nodes": "dev[6-7]"},
        {"name": "s3", "switches": "s[0-1]"},
    ]
    assert "topology.conf lists 10 node(s) no partition has (dev[8-17])" in err


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("SwitchName=s0 Nodes=dev[0-5\n", ["Nodes (line 1)", "hostlist"]),
        ("SwitchName=s0 Nodes=dev[0-5] Speed=100\n", ["Speed (line 1)", "unknown key", "LinkSpeed"]),
        ("SwitchName=s0 Nodes=a1\nSwitchName=s1 Switches=s[0-2]\n", ["unknown switch s2"]),
        ("SwitchName=s0\n", ["s0 (line 1)", "expected Nodes= or Switches="]),
        ("SwitchName=s0 Nodes=a1\nBlockName=b1 Nodes=a2\n", ["both SwitchName and BlockName"]),
        ("SwitchName=s0 Nodes=a1\nSwitchName=s0 Nodes=a2\n", ["each name once (also on line 1)"]),
        ("# only comments\n", ["no SwitchName or BlockName"]),
        ("topology:\n  - topology: t1\n", ["expected a list of topologies"]),
        ("hello world\n", ["expected Key=Value"]),
    ],
)
def test_bad_topology_conf(tmp_path: Path, text: str, needles: list[str]) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(text)
    expect_cli_config_error(
        ["site", "import", "--topo", fixture("gh200_aerial-cubb-system-checks.txt"), "--topology-conf", conf],
        tmp_path, *needles,
    )


def test_topology_yaml_takes_the_cluster_default_or_the_named_topology(tmp_path: Path) -> None:
    """Slurm 25.05's topology.yaml holds several topologies: the cluster default (a tree here), or --topology NAME."""
    data, _, _ = imported(tmp_path, "--topo", fixture("gh200_aerial-cubb-system-checks.txt"),
                          "--topology-conf", fixture("topology_slurm-manpage.yaml"))
    assert data["partitions"]["gpu"]["nodes"] == "node[01-04]"
    assert data["topology"] == {"kind": "tree", "switches": [{"name": "sw_root", "nodes": "node[01-04]"}]}
    data, _, _ = imported(tmp_path, "--topo", fixture("gh200_aerial-cubb-system-checks.txt"),
                          "--topology-conf", fixture("topology_slurm-manpage.yaml"), "--topology", "topo2")
    assert data["partitions"]["gpu"]["nodes"] == "node[01-16]"
    assert data["topology"]["kind"] == "block" and data["topology"]["block_sizes"] == [4, 16]
    assert [(b["name"], b["nodes"]) for b in data["topology"]["blocks"]] == [
        ("b1", "node[01-04]"), ("b2", "node[05-08]"), ("b3", "node[09-12]"), ("b4", "node[13-16]")]


def test_a_topology_yaml_tree_with_children_matches_the_same_topology_conf(tmp_path: Path) -> None:
    text = """- topology: fabric
  tree:
    switches:
    - {switch: s0, nodes: "dev[0-5]"}
    - {switch: s1, nodes: "dev[6-11]"}
    - {switch: s2, nodes: "dev[12-17]"}
    - {switch: s3, children: "s[0-2]"}
"""
    (tmp_path / "topology.yaml").write_text(text)
    data, _, _ = imported(tmp_path, "--topo", fixture("dgx-h100_mooncake-2039.txt"), "--topology-conf", tmp_path / "topology.yaml")
    conf, _, _ = imported(tmp_path, "--topo", fixture("dgx-h100_mooncake-2039.txt"),
                          "--topology-conf", fixture("topology-tree_slurm-manpage.conf"))
    assert data["topology"] == conf["topology"] and data["partitions"] == conf["partitions"]


@pytest.mark.parametrize(
    ("text", "extra", "needles"),
    [
        ("- topology: a\n  flat: true\n- topology: b\n  flat: true\n", [], ["cluster_default", "--topology NAME", "a, b"]),
        ("- topology: a\n  cluster_default: true\n  flat: true\n", [], ["a.flat", "nothing to import"]),
        ("- topology: a\n  flat: true\n", ["--topology", "z"], ["--topology", "'z'", "expected one of the file's topologies: a"]),
        ("- topology: a\n  block: {blocks: [{block: b1, nodes: 'n[1-2'}]}\n", [], ["a.block.blocks[0].nodes", "hostlist"]),
        ("- topology: a\n  block: {block_sizes: [0], blocks: [{block: b1, nodes: n1}]}\n", [], ["a.block.block_sizes", "positive"]),
        ("- topology: a\n  block: {blocks: [{block: b1, nodes: n1}, {block: b1, nodes: n2}]}\n", [], ["each block name once"]),
        ("- topology: a\n  tree: {switches: [{switch: s1, children: 's[2-3]'}]}\n", [], ["a.tree.switches[0].children", "unknown switch s[2-3]"]),
        ("- topology: a\n  tree: {switches: [{switch: s1, speed: 100, nodes: n1}]}\n", [], ["a.tree.switches[0].speed", "unknown key"]),
        ("- topology: a\n  tree: {switches: []}\n  block: {blocks: []}\n", [], ["expected exactly one of block:, tree: or flat:"]),
        ("- topology: a\n  tree: {switches: [{switch: s1\n", [], ["not valid YAML"]),
    ],
)
def test_bad_topology_yaml(tmp_path: Path, text: str, extra: list[str], needles: list[str]) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    expect_cli_config_error(
        ["site", "import", "--topo", fixture("gh200_aerial-cubb-system-checks.txt"), "--topology-conf", path, *extra],
        tmp_path, *needles,
    )


def test_topology_names_a_topology_of_a_topology_yaml_only(tmp_path: Path) -> None:
    expect_cli_config_error(
        ["site", "import", "--topo", fixture("gh200_aerial-cubb-system-checks.txt"),
         "--topology-conf", fixture("topology-block_slurm-manpage.conf"), "--topology", "topo2"],
        tmp_path, "--topology", "is a topology.conf",
    )


def test_ring_topology_is_refused(tmp_path: Path) -> None:
    expect_cli_config_error(
        ["site", "import", "--topo", fixture("gh200_aerial-cubb-system-checks.txt"),
         "--topology-conf", fixture("topology-ring_slurm-manpage.conf")],
        tmp_path, "RingName (line 5)", "topology/ring", "SwitchName",
    )


def test_gres_nodes_and_out_of_service_gpu(tmp_path: Path) -> None:
    """tux3 lists /dev/nvidia[0,2-3]: left out; tux[0-2] and tux[4-15] are one node type."""
    data, _, err = imported(
        tmp_path, "--topo", fixture("juwels-booster-a100_icon-run-wrapper.txt"),
        "--gres-conf", fixture("gres-nodes_slurm-manpage.conf"),
    )
    assert data["partitions"]["gpu"]["nodes"] == "tux[0-2,4-15]"
    assert "tux3 list GPU devices 0,2,3" in err
    assert len(data["node_types"]) == 1


def test_gres_autodetect_nodes_take_the_topology(tmp_path: Path) -> None:
    data, _, _ = imported(
        tmp_path, "--topo", fixture("juwels-booster-a100_icon-run-wrapper.txt"),
        "--gres-conf", fixture("gres-autodetect_slurm-manpage.conf"),
    )
    assert data["partitions"]["gpu"]["nodes"] == "tux3"


def test_gres_autodetect_groups_merge_and_amd_nodes_are_left_out(tmp_path: Path) -> None:
    data, _, err = imported(
        tmp_path, "--topo", fixture("juwels-booster-a100_icon-run-wrapper.txt"),
        "--gres-conf", fixture("gres-mixed_slurm-manpage.conf"),
    )
    assert data["partitions"] == {"gpu": {"node_type": "gpu", "nodes": "tux[0-7,12-15]", "default": True}}
    assert "tux[8-11] detect AMD GPUs (AutoDetect=rsmi)" in err


def test_gres_alone_with_types_and_cores(tmp_path: Path) -> None:
    data, _, err = imported(
        tmp_path, "--gres-conf", fixture("gres-types_slurm-manpage.conf"), "--nic", "mlx5_0", "--nodes", "tux[0-3]"
    )
    assert rail_map(data) == [(0, 0, "0-1", ["mlx5_0"]), (1, 1, "2-3", ["mlx5_0"])]
    (nt,) = data["node_types"].values()
    assert nt["gpu_model"] == "gtx560"
    assert "mix GPU types" in err and "no NUMA node given" in err


def test_gres_legacy_cpus_are_split(tmp_path: Path) -> None:
    data, _, _ = imported(
        tmp_path, "--gres-conf", fixture("gres-legacy-cpus_slurm-manpage.conf"), "--nic", "mlx5_0,mlx5_1", "--nodes", "n1"
    )
    assert rail_map(data) == [
        (0, 0, "0", ["mlx5_0"]), (1, 0, "1", ["mlx5_0"]), (2, 1, "2", ["mlx5_1"]), (3, 1, "3", ["mlx5_1"])
    ]


def test_gres_cores_with_smt_offset_and_links(tmp_path: Path) -> None:
    """A constructed gres.conf in the usual DGX H100 shape: Cores per socket, NVLinks to every GPU."""
    links = lambda i: ",".join("-1" if j == i else "18" for j in range(8))  # noqa: E731
    lines = [
        f"NodeName=dgx[001-004] Name=gpu Type=h100 File=/dev/nvidia{i} Cores={'0-55' if i < 4 else '56-111'} Links={links(i)}"
        for i in range(8)
    ]
    gres = tmp_path / "gres.conf"
    gres.write_text("AutoDetect=off\n" + "\n".join(lines) + "\n")
    nics = "mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11"
    data, _, _ = imported(tmp_path, "--gres-conf", gres, "--smt-offset", "112", "--nic", nics, "--interface", "bond0")
    shipped = yaml.safe_load((REPO / "site-configs" / "dgx-h100.yaml").read_text())["node_types"]["dgx-h100"]
    assert [g[2] for g in rail_map(data)] == [g["cpus"] for g in shipped["gpus"]]
    assert [g[3] for g in rail_map(data)] == [g["nics"] for g in shipped["gpus"]]
    (nt,) = data["node_types"].values()
    assert nt["nvlink_domain"] == 8 and nt["gpu_model"] == "h100"
    assert data["env"] == {"NCCL_SOCKET_IFNAME": "bond0", "NCCL_CROSS_NIC": 0}


def test_gres_count_must_match_the_topology(tmp_path: Path) -> None:
    gres = tmp_path / "gres.conf"
    gres.write_text("NodeName=n[1-2] Name=gpu File=/dev/nvidia[0-7]\n")
    expect_cli_config_error(
        ["site", "import", "--topo", fixture("juwels-booster-a100_icon-run-wrapper.txt"), "--gres-conf", gres],
        tmp_path, "no node group has the 4 GPUs",
    )


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("Name=gpu Type=a100 File=/dev/nvidia[0-3 Cores=0-7\n", ["File (line 1)", "hostlist"]),
        ("Name=gpu File=/dev/nvidia0 Cores=zero\n", ["Cores (line 1)", "core list"]),
        ("Name=gpu Type=a100\n", ["expected File="]),
        ("Name=gpu File=/dev/nvidia[0-1] Links=-1,4\n", ["Links (line 1)", "one device file"]),
        ("Name=gpu File=/dev/nvidia0\nName=gpu File=/dev/nvidia0\n", ["each GPU device once"]),
        ("NodeName=tux[1-4 Name=gpu File=/dev/nvidia0\n", ["NodeName (line 1)"]),
    ],
)
def test_bad_gres_conf(tmp_path: Path, text: str, needles: list[str]) -> None:
    gres = tmp_path / "gres.conf"
    gres.write_text(text)
    expect_cli_config_error(["site", "import", "--gres-conf", gres, "--nic", "eth0"], tmp_path, *needles)


def test_nothing_to_import(tmp_path: Path) -> None:
    gres = tmp_path / "gres.conf"
    gres.write_text("AutoDetect=nvml\n")
    expect_cli_config_error(["site", "import", "--gres-conf", gres], tmp_path, "nothing describes the GPUs", "--probe")


def test_import_refuses_what_validation_would(tmp_path: Path) -> None:
    expect_cli_config_error(
        ["site", "import", "--topo", fixture("gh200_aerial-cubb-system-checks.txt"), "--nodes", "gh[1-4",],
        tmp_path, "--nodes", "hostlist",
    )


def test_errors_raise_config_error_from_the_api() -> None:
    with pytest.raises(ConfigError) as info:
        parse_topo("GPU0 GPU1\nGPU0 X NV4\n", "t.txt")
    assert info.value.exit_code == 65
    assert "no row for GPU1" in str(info.value)


def test_host_memory_comes_from_slurm_confs_real_memory_of_the_imported_nodes(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nSlurmctldHost=head # a comment\nNodeName=DEFAULT Sockets=2\n"
                    "NodeName=gpu-[001-004] CPUs=64 RealMemory=2000000 Gres=gpu:8\n"
                    "NodeName=gpu-[005-008] CPUs=64 RealMemory=1000000 Gres=gpu:8\nPartitionName=gpu Nodes=ALL\n")
    topo = fixture("dgx-h100_mooncake-2039.txt")
    ours = cli("site", "import", "--name", "m", "--topo", topo, "--slurm-conf", conf, "--nodes", "gpu-[001-004]")
    assert ours.exit_code == 0, ours.output
    (nt,) = yaml.safe_load(ours.stdout)["node_types"].values()
    assert nt["host_memory_gb"] == 2097.2  # 2,000,000 MiB in GB (10^9 bytes)
    every = cli("site", "import", "--name", "m", "--topo", topo, "--slurm-conf", conf)
    assert next(iter(yaml.safe_load(every.stdout)["node_types"].values()))["host_memory_gb"] == 1048.6  # the smallest
    unknown = cli("site", "import", "--name", "m", "--topo", topo)
    assert "host_memory_gb" not in next(iter(yaml.safe_load(unknown.stdout)["node_types"].values()))
    assert "host_memory_gb unknown: pass --host-memory-gb or --slurm-conf" in unknown.stderr  # warned, never refused
    missing = cli("site", "import", "--name", "m", "--topo", topo, "--slurm-conf", tmp_path / "nothere.conf")
    assert missing.exit_code == 65 and "slurm.conf" in missing.stderr and "no such file" in missing.stderr
