"""The importer's rules on their own (CPU split, NIC choice) and what `site validate`/`site show` add."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import REPO, cli, expect_cli_config_error, minimal_site, write_yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.config.site import load_site, rail_optimized, shipped_sites, site_warnings
from clusterctl.siteimport.build import GpuFacts, NicFacts, NodeFacts, assign_nics, guess_kind
from clusterctl.siteimport.checks import binding_problems, wrapper_arrays
from clusterctl.siteimport.cpus import CpuSplitError, cores_of, disjoint_sets, sibling_offset, split_cpus
from clusterctl.syntax.cpulist import format_cpulist, parse_cpulist

# --- the CPU split rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpus", "shares", "expected"),
    [
        ("0-55,112-167", 4, ["0-13,112-125", "14-27,126-139", "28-41,140-153", "42-55,154-167"]),
        ("56-111,168-223", 4, ["56-69,168-181", "70-83,182-195", "84-97,196-209", "98-111,210-223"]),
        ("0,2-47,96-143", 4, ["0,2-11,96-107", "12-23,108-119", "24-35,120-131", "36-47,132-143"]),
        ("112-127,240-255", 8, ["112-113,240-241", "114-115,242-243", "116-117,244-245", "118-119,246-247",
                                "120-121,248-249", "122-123,250-251", "124-125,252-253", "126-127,254-255"]),
        ("0-71", 4, ["0-17", "18-35", "36-53", "54-71"]),  # Grace: no SMT shape, one CPU per core
        ("4,6,8,10,12", 4, ["4,6", "8", "10", "12"]),  # five cores for four GPUs: the first gets the extra one
        ("0-9", 3, ["0-3", "4-6", "7-9"]),
    ],
)
def test_split_rule(cpus: str, shares: int, expected: list[str]) -> None:
    assert [format_cpulist(s) for s in split_cpus(parse_cpulist(cpus), shares)] == expected


def test_sibling_offset_needs_a_mirrored_upper_half() -> None:
    assert sibling_offset(parse_cpulist("0-55,112-167")) == 112
    assert sibling_offset(parse_cpulist("0-71")) is None
    assert sibling_offset(parse_cpulist("0,2,4,6")) is None  # equal gaps: no single split
    assert sibling_offset(parse_cpulist("0-7,100-101")) is None  # the upper part does not mirror the lower
    assert sibling_offset(parse_cpulist("6,14,22,30")) is None


def test_kernel_siblings_override_the_guess() -> None:
    # On this (made-up) numbering CPU c's sibling is c+1: cores are pairs of neighbours.
    siblings = {c: frozenset({c - c % 2, c - c % 2 + 1}) for c in range(16)}
    assert [format_cpulist(c) for c in cores_of(parse_cpulist("0-7"), siblings)] == ["0-1", "2-3", "4-5", "6-7"]
    assert [format_cpulist(s) for s in split_cpus(parse_cpulist("0-7"), 2, siblings)] == ["0-3", "4-7"]


def test_too_many_gpus_for_the_cpus() -> None:
    with pytest.raises(CpuSplitError, match="4 GPUs share 2 CPU"):
        split_cpus(parse_cpulist("0-1"), 4)


def test_only_overlapping_lists_are_split() -> None:
    lists = [parse_cpulist("0-7"), parse_cpulist("0-7"), parse_cpulist("8-15"), None]
    assert [format_cpulist(s) if s else None for s in disjoint_sets(lists)] == ["0-3", "4-7", "8-15", None]


@settings(max_examples=60, deadline=None)
@given(
    cores=st.integers(min_value=1, max_value=64),
    smt=st.booleans(),
    start=st.integers(min_value=0, max_value=64),
    shares=st.integers(min_value=1, max_value=8),
)
def test_split_properties(cores: int, smt: bool, start: int, shares: int) -> None:
    """Disjoint, covering, whole cores, contiguous, and sizes within one core of each other."""
    total = 256
    cpus = frozenset(range(start, start + cores)) | (
        frozenset(range(start + total, start + total + cores)) if smt else frozenset()
    )
    if cores < shares and len(cpus) < shares:
        with pytest.raises(CpuSplitError):
            split_cpus(cpus, shares)
        return
    parts = split_cpus(cpus, shares)
    assert len(parts) == shares
    assert frozenset().union(*parts) == cpus
    assert sum(len(p) for p in parts) == len(cpus)
    if cores >= shares:
        firsts = [sorted(c for c in p if c < start + total) for p in parts]
        assert all(f == list(range(f[0], f[-1] + 1)) for f in firsts), "cores are contiguous"
        assert max(map(len, firsts)) - min(map(len, firsts)) <= 1
        if smt:
            assert all({c + total for c in f} <= p for f, p in zip(firsts, parts)), "siblings go with their core"


# --- choosing NICs ---------------------------------------------------------------------------


def facts(levels: list[dict[str, str]], nics: list[str], down: tuple[str, ...] = ()) -> NodeFacts:
    return NodeFacts(
        "t",
        [GpuFacts(i, levels=lv) for i, lv in enumerate(levels)],
        [NicFacts(n, usable=n not in down) for n in nics],
    )


def test_closest_nic_wins() -> None:
    f = facts([{"a": "SYS", "b": "PXB", "c": "PIX"}], ["a", "b", "c"])
    assert assign_nics(f, set()) == {0: "c"}


def test_four_gpus_behind_one_nic_share_it() -> None:
    f = facts([{"n": "PHB", "m": "SYS"}] * 4, ["n", "m"])
    assert assign_nics(f, set()) == {0: "n", 1: "n", 2: "n", 3: "n"}


def test_far_gpus_share_a_rail_rather_than_a_storage_nic() -> None:
    # GPU 0 and 1 have PIX NICs; GPU 2 sees the storage NIC at NODE and the rails at SYS.
    f = facts(
        [{"r0": "PIX", "r1": "SYS", "st": "NODE"}, {"r0": "SYS", "r1": "PIX", "st": "SYS"}, {"r0": "SYS", "r1": "SYS", "st": "NODE"}],
        ["r0", "r1", "st"],
    )
    assert assign_nics(f, set()) == {0: "r0", 1: "r1", 2: "r0"}


def test_down_and_excluded_nics_are_skipped() -> None:
    f = facts([{"a": "PIX", "b": "PIX", "c": "PXB"}], ["a", "b", "c"], down=("a",))
    assert assign_nics(f, set()) == {0: "b"}
    assert assign_nics(f, {"b"}) == {0: "c"}
    assert assign_nics(f, {"b", "c"}) == {0: None}


def test_kinds_from_names() -> None:
    assert [guess_kind(n) for n in ("mlx5_0", "mlx5_bond_0", "bnxt_re3", "rdmap16s27", "cxi0", "eth0", "lo")] == [
        "ib", "roce", "roce", "efa", "slingshot", "ethernet", "loopback"
    ]


# --- site validate: rendered binding and warnings ------------------------------------------------


@pytest.mark.parametrize("name", sorted(shipped_sites()))
def test_shipped_sites_render_their_rail_map(name: str) -> None:
    site, path = load_site(name)
    assert binding_problems(site, path) == ([], [])


def test_rail_optimized() -> None:
    assert rail_optimized(load_site("dgx-h100")[0].node_types["dgx-h100"])
    assert not rail_optimized(load_site("pcie-4gpu")[0].node_types["pcie-4gpu"])
    assert not rail_optimized(load_site("slurm-lab")[0].node_types["lab"])  # emulated
    assert not rail_optimized(load_site("gh200")[0].node_types["gh200-1"])  # one GPU


def test_missing_cross_nic_is_a_warning_not_an_error(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, minimal_site(), "mini.yaml")
    result = cli("site", "validate", path)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: site mini (")
    assert "warning: env.NCCL_CROSS_NIC is not set, but node type box is rail-optimized" in result.stdout
    data = minimal_site()
    data["env"] = {"NCCL_CROSS_NIC": 1}  # the admin's explicit choice stands
    site, _ = load_site(str(write_yaml(tmp_path, data, "mini2.yaml")))
    assert site_warnings(site) == []


def test_nic_shared_across_numa_nodes_warns(tmp_path: Path) -> None:
    data = minimal_site()
    data["node_types"]["box"]["gpus"][1]["nics"] = ["ib0"]
    data["env"] = {"NCCL_CROSS_NIC": 0}
    path = write_yaml(tmp_path, data, "mini.yaml")
    result = cli("site", "validate", path)
    assert result.exit_code == 0, result.output
    assert "warning: node_types.box.nics.ib0: shared by GPUs on different NUMA nodes (NUMA 0: GPU 0; NUMA 1: GPU 1)" in result.stdout


def _site_with_templates(tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    templates = tmp_path / "tpl"
    templates.mkdir()
    wrapper = (REPO / "templates" / "wrapper.sh.j2").read_text()
    (templates / "wrapper.sh.j2").write_text(edit(wrapper))
    data = minimal_site()
    data["templates"] = "tpl"
    data["env"] = {"NCCL_CROSS_NIC": 0}
    return write_yaml(tmp_path, data, "mini.yaml")


def test_a_template_that_binds_wrongly_fails_validation(tmp_path: Path) -> None:
    # A site template that binds every rank to GPU 0's CPUs.
    path = _site_with_templates(
        tmp_path, lambda w: w.replace("{% for row in table %}{{ row.cpus | sq }} {% endfor %}", "{% for row in table %}'0-3' {% endfor %}")
    )
    expect_cli_config_error(
        ["site", "validate", path],
        tmp_path,
        f"invalid site config {path}",
        "node_types.box.gpus[1]",
        "the rendered wrapper gives GPU 1 GPU_CPUS='0-3'; the rail map says '4-7'",
    )


def test_a_template_without_the_arrays_is_a_warning(tmp_path: Path) -> None:
    path = _site_with_templates(tmp_path, lambda w: w.replace("GPU_", "MY_GPU_"))
    result = cli("site", "validate", path)
    assert result.exit_code == 0, result.output
    assert "the wrapper template defines no GPU_CPUS/GPU_NICS arrays" in result.stdout


def test_wrapper_arrays_parse_quoted_values() -> None:
    text = "GPU_CPUS=('0-13,112-125' '14-27' )\nGPU_HCA=('' '=mlx5_0:1' )\n"
    assert wrapper_arrays(text) == {"GPU_CPUS": ["0-13,112-125", "14-27"], "GPU_HCA": ["", "=mlx5_0:1"]}


def test_node_type_without_partition_is_a_warning(tmp_path: Path) -> None:
    data = minimal_site()
    data["node_types"]["spare"] = data["node_types"]["box"]
    data["env"] = {"NCCL_CROSS_NIC": 0}
    result = cli("site", "validate", write_yaml(tmp_path, data, "mini.yaml"))
    assert result.exit_code == 0, result.output
    assert "node_types.spare: no partition uses this node type" in result.stdout


# --- site show -------------------------------------------------------------------------------


def test_show_dgx_h100() -> None:
    result = cli("site", "show", "dgx-h100")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "node type dgx-h100: 8 x nvidia H100-SXM5-80GB, 80 GB, NVLink domain 8, 2 socket(s); partitions: batch, debug" in out
    assert "│   0 │    0 │ 0-13,112-125 (28)   │ mlx5_0  │ 0     │" in out
    assert "│   7 │    1 │ 98-111,210-223 (28) │ mlx5_11 │ 7     │" in out
    assert "not on a rail: mlx5_1 (ethernet), mlx5_7 (ethernet)" in out


def test_show_by_path_and_json(tmp_path: Path) -> None:
    path = tmp_path / "copy.yaml"
    shutil.copy(REPO / "site-configs" / "pcie-4gpu.yaml", path)
    result = cli("site", "show", path)
    assert result.exit_code == 0 and "│   3 │    0 │ 24-31,56-63 (16) │ mlx5_0 │ 0     │" in result.stdout
    data = json.loads(cli("site", "show", "gh200", "--json").stdout)
    assert data["node_types"]["gh200-4"][2] == {"gpu": 2, "numa": 2, "cpus": "144-215", "nics": ["mlx5_2"], "rails": [2]}


def test_show_unknown_site(tmp_path: Path) -> None:
    expect_cli_config_error(["site", "show", "nonexistent-site"], tmp_path, "expected a site name")
