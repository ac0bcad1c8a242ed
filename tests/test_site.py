"""Site configs: every shipped site validates, and each mistake an admin can make is named precisely.

Each error test checks the API (ConfigError, exit code 65, path, value, what
is allowed, line) and `clusterctl site validate` on the same file (exit 65,
one message on stderr, no traceback), and that nothing was written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from helpers import (
    REPO,
    assert_names,
    cli,
    expect_cli_config_error,
    expect_config_error,
    line_of,
    minimal_site,
    write_yaml,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.config.site import LINUX_EPHEMERAL, known_sites, load_site, shipped_sites
from clusterctl.errors import OMIT
from clusterctl.syntax.cpulist import format_cpulist, parse_cpulist

# --- shipped sites -------------------------------------------------------------------


def test_shipped_sites_are_the_site_configs_directory() -> None:
    sites = shipped_sites()
    assert set(sites) == {p.stem for p in (REPO / "site-configs").glob("*.yaml")}
    assert {"local", "dgx-h100"} <= set(sites)


@pytest.mark.parametrize("name", sorted(shipped_sites()))
def test_every_shipped_site_validates(name: str) -> None:
    site, path = load_site(name)
    assert path == shipped_sites()[name]
    assert site.name == name
    assert site.default_partition in site.partitions
    for partition in site.partitions:
        node_type = site.node_type_of(partition)
        assert [g.index for g in node_type.gpus] == list(range(len(node_type.gpus)))
    result = cli("site", "validate", name)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok: site {name} (")


def test_sites_dir_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_yaml(tmp_path, minimal_site(), "extra-site.yaml")
    monkeypatch.setenv("CLUSTERCTL_SITES", str(tmp_path))
    assert known_sites()["extra-site"] == tmp_path / "extra-site.yaml"
    site, _ = load_site("extra-site")
    assert site.name == "mini"


# --- a minimal site ------------------------------------------------------------------


def test_minimal_site_loads(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, minimal_site(), "site.yaml")
    site, where = load_site(str(path))
    assert where == path
    assert site.default_partition == "gpu"
    box = site.node_type_of("gpu")
    assert box.gpus_per_node == 2
    assert [g.cpu_set for g in box.gpus] == [frozenset(range(4)), frozenset(range(4, 8))]
    assert site.network.ephemeral_range == LINUX_EPHEMERAL
    result = cli("site", "validate", path)
    assert result.exit_code == 0, result.output
    assert "1 partition(s), 1 node type(s), 2 GPU slot(s) described" in result.stdout


def test_first_partition_is_the_default_when_none_is_marked(tmp_path: Path) -> None:
    data = minimal_site()
    data["partitions"]["gpu"]["default"] = False
    data["partitions"]["other"] = {"node_type": "box"}
    site, _ = load_site(str(write_yaml(tmp_path, data, "site.yaml")))
    assert site.default_partition == "gpu"


def test_overlapping_cpus_are_fine_with_oversubscribe(tmp_path: Path) -> None:
    data = minimal_site()
    data["node_types"]["box"]["gpus"][1]["cpus"] = "2-5"
    data["oversubscribe"] = True
    site, _ = load_site(str(write_yaml(tmp_path, data, "site.yaml")))
    assert site.oversubscribe


@pytest.mark.parametrize("domain", [1, 2, 4, 8])
def test_nvlink_domain_divisor_or_multiple(tmp_path: Path, domain: int) -> None:
    data = minimal_site()
    data["node_types"]["box"]["nvlink_domain"] = domain
    site, _ = load_site(str(write_yaml(tmp_path, data, "site.yaml")))
    assert site.node_types["box"].nvlink_domain == domain


# --- each semantic check -------------------------------------------------------------

Mutate = Callable[[dict[str, Any]], Any]


def _gpu(data: dict[str, Any], i: int) -> dict[str, Any]:
    return data["node_types"]["box"]["gpus"][i]


def _box(data: dict[str, Any]) -> dict[str, Any]:
    return data["node_types"]["box"]


def _tree(*switches: dict[str, str]) -> Mutate:
    return lambda d: d.update(topology={"kind": "tree", "switches": list(switches)})


# (id, mutation, path, value, allowed fragments, (needle, after-needle) locating the line)
SITE_ERRORS: list[tuple[str, Mutate, str, Any, tuple[str, ...], tuple[str, str | None]]] = [
    ("cpus-overlap", lambda d: _gpu(d, 1).update(cpus="2-5"), "node_types.box.gpus[1].cpus", "2-5",
     ("CPU 2 is also bound to GPU 0", "CPU sets must not overlap", "oversubscribe: true"), ("cpus: 2-5", None)),
    ("no-numa", lambda d: _gpu(d, 1).pop("numa"), "node_types.box.gpus[1].numa", None,
     ("the GPU's NUMA node",), ("- index: 1", None)),
    ("no-cpus", lambda d: _gpu(d, 1).pop("cpus"), "node_types.box.gpus[1].cpus", None,
     ("the GPU's CPU list",), ("- index: 1", None)),
    ("no-nics", lambda d: _gpu(d, 1).pop("nics"), "node_types.box.gpus[1].nics", [],
     ("at least one NIC",), ("- index: 1", None)),
    ("undefined-nic", lambda d: _gpu(d, 1).update(nics=["ib9"]), "node_types.box.gpus[1].nics", "ib9",
     ("a NIC defined under node_types.box.nics (ib0, ib1)",), ("nics:", "- index: 1")),
    ("nic-without-rail", lambda d: _box(d)["nics"]["ib1"].pop("rail"), "node_types.box.nics.ib1.rail", None,
     ("a NIC used by GPU 1 must be on a rail",), ("ib1: {}", None)),
    ("gpu-index-gap", lambda d: _gpu(d, 1).update(index=2), "node_types.box.gpus", [0, 2],
     ("GPU indices 0..1, each once",), ("  gpus:", None)),
    ("gpu-index-twice", lambda d: _gpu(d, 0).update(index=1), "node_types.box.gpus", [1, 1],
     ("GPU indices 0..1, each once",), ("  gpus:", None)),
    ("nvlink-domain", lambda d: _box(d).update(nvlink_domain=3), "node_types.box.nvlink_domain", 3,
     ("a divisor or a multiple of the GPUs per node (2)",), ("nvlink_domain:", None)),
    ("unknown-node-type", lambda d: d["partitions"]["gpu"].update(node_type="nobox"), "partitions.gpu.node_type", "nobox",
     ("one of the node types: box",), ("node_type: nobox", None)),
    ("two-defaults", lambda d: d["partitions"].update(dbg={"node_type": "box", "default": True}), "partitions", ["gpu", "dbg"],
     ("at most one default partition",), ("partitions:", None)),
    ("bad-hostlist", lambda d: d["partitions"]["gpu"].update(nodes="n[1-"), "partitions.gpu.nodes", "n[1-",
     ("expected a hostlist",), ("nodes:", None)),
    ("switch-unknown-nodes", _tree({"name": "s1", "nodes": "n[1-2],m9"}), "topology.switches[0].nodes", "n[1-2],m9",
     ("unknown node m9", "names from the partitions' nodes"), ("nodes: n[1-2],m9", None)),
    ("switch-unknown-children", _tree({"name": "s1", "nodes": "n[1-4]"}, {"name": "top", "switches": "s[1-3]"}),
     "topology.switches[1].switches", "s[1-3]", ("unknown switch s[2-3]", "names from the switches named here"), ("switches: s[1-3]", None)),
    ("switch-twice", _tree({"name": "s1", "nodes": "n[1-2]"}, {"name": "s1", "nodes": "n[3-4]"}), "topology.switches", ["s1"],
     ("each switch name once",), ("  switches:", None)),
    ("switch-empty", _tree({"name": "s1"}), "topology.switches[0]", "s1",
     ("nodes or switches under the switch",), ("- name: s1", None)),
    ("tree-without-switches", lambda d: d.update(topology={"kind": "tree"}), "topology.switches", [],
     ("switches for a tree topology",), ("topology:", None)),
    ("block-without-blocks", lambda d: d.update(topology={"kind": "block"}), "topology.blocks", [],
     ("blocks for a block topology",), ("topology:", None)),
    ("block-unknown-nodes", lambda d: d.update(topology={"kind": "block", "blocks": [{"name": "b1", "nodes": "x[1-2]"}]}),
     "topology.blocks[0].nodes", "x[1-2]", ("unknown node x[1-2]",), ("nodes: x[1-2]", None)),
    ("addresses-unknown", lambda d: d["network"].update(addresses={"n1": "10.0.0.1", "zz9": "10.0.0.2"}), "network.addresses", ["zz9"],
     ("node names that a partition lists",), ("addresses:", None)),
    ("ports-ephemeral", lambda d: d["network"].update(port_range=[30000, 40000]), "network.port_range", [30000, 40000],
     ("outside the ephemeral ports 32768-60999",), ("port_range:", None)),
    ("ports-low", lambda d: d["network"].update(port_range=[100, 200]), "network.port_range", [100, 200],
     ("1024 <= low <= high <= 65535",), ("port_range:", None)),
    ("cpus-backwards", lambda d: _gpu(d, 0).update(cpus="3-1"), "node_types.box.gpus[0].cpus", "3-1",
     ("range '3-1' runs backwards",), ("cpus: 3-1", None)),
    ("cpus-garbage", lambda d: _gpu(d, 0).update(cpus="abc"), "node_types.box.gpus[0].cpus", "abc",
     ("'abc' is not a CPU id or range like 0-7",), ("cpus: abc", None)),
    ("env-name", lambda d: d.update(env={"1X": "y"}), "env.1X", "1X",
     ("an environment variable name",), ("1X:", None)),
    ("unknown-key", lambda d: d.update(partitons={}), "partitons", OMIT,
     ("did you mean 'partitions'?", "valid keys here: name, description, partitions, node_types"), ("partitons:", None)),
    ("gpu-unknown-key", lambda d: _gpu(d, 0).update(nic=["ib0"]), "node_types.box.gpus[0].nic", OMIT,
     ("did you mean 'nics'?",), ("nic:", None)),
    ("memory-zero", lambda d: _box(d).update(gpu_memory_gb=0), "node_types.box.gpu_memory_gb", 0,
     ("greater than 0",), ("gpu_memory_gb:", None)),
]

# Messages holding "[low, high]" lose it on the CLI (rich markup; see test_cli.py).
CLI_SHOWS_PART = {"ports-low"}


@pytest.mark.parametrize(
    ("mutate", "path", "value", "allowed", "where", "cli_full"),
    [pytest.param(*case[1:], case[0] not in CLI_SHOWS_PART, id=case[0]) for case in SITE_ERRORS],
)
def test_site_error(
    tmp_path: Path,
    mutate: Mutate,
    path: str,
    value: Any,
    allowed: tuple[str, ...],
    where: tuple[str, str | None],
    cli_full: bool,
) -> None:
    data = minimal_site()
    mutate(data)
    site = write_yaml(tmp_path, data, "site.yaml")
    err = expect_config_error(lambda: load_site(str(site)), tmp_path)
    assert len(err.problems) == 1, str(err)
    assert str(err).startswith(f"invalid site config {site}: ")
    needle, after = where
    line = line_of(site, needle, line_of(site, after) if after else 0)
    problem = assert_names(err, path, value, *allowed, line=line)
    shown = problem.render() if cli_full else f"{path} (line {line}): got {value!r}"
    expect_cli_config_error(["site", "validate", site], tmp_path, str(site), shown)


def test_no_interface_and_no_addresses(tmp_path: Path) -> None:
    data = minimal_site()
    data["network"] = {"port_range": [20000, 29999]}
    site = write_yaml(tmp_path, data, "site.yaml")
    err = expect_config_error(lambda: load_site(str(site)), tmp_path)
    assert_names(err, "network", OMIT, "`interface`", "`addresses` (node -> address)", line=line_of(site, "network:"))
    expect_cli_config_error(["site", "validate", site], tmp_path, "network (line")
    # Either one alone is enough.
    data["network"]["addresses"] = {"n1": "10.0.0.1"}
    load_site(str(write_yaml(tmp_path, data, "ok.yaml")))


def test_overlap_is_checked_per_gpu_pair(tmp_path: Path) -> None:
    data = minimal_site()
    _gpu(data, 0)["cpus"] = "5"  # GPU 1 owns 4-7
    site = write_yaml(tmp_path, data, "site.yaml")
    err = expect_config_error(lambda: load_site(str(site)), tmp_path)
    assert_names(err, "node_types.box.gpus[1].cpus", "4-7", "CPU 5 is also bound to GPU 0")


def test_several_site_problems_are_reported_together(tmp_path: Path) -> None:
    data = minimal_site()
    _gpu(data, 1).pop("numa")
    _box(data)["nvlink_domain"] = 3
    data["network"]["port_range"] = [40000, 40100]
    site = write_yaml(tmp_path, data, "site.yaml")
    err = expect_config_error(lambda: load_site(str(site)), tmp_path)
    assert {p.path for p in err.problems} == {
        "node_types.box.gpus[1].numa",
        "node_types.box.nvlink_domain",
        "network.port_range",
    }
    assert all(p.line is not None for p in err.problems)


def test_unknown_site_name(tmp_path: Path) -> None:
    err = expect_config_error(lambda: load_site("nosuch"), tmp_path)
    problem = assert_names(err, "site", "nosuch", "or a path to a site YAML file")
    assert ", ".join(shipped_sites()) in problem.allowed
    expect_cli_config_error(["site", "validate", "nosuch"], tmp_path, ", ".join(shipped_sites()))


def test_missing_site_file(tmp_path: Path) -> None:
    missing = tmp_path / "gone.yaml"
    err = expect_config_error(lambda: load_site(str(missing)), tmp_path)
    assert_names(err, "site", str(missing), "an existing site YAML file")
    expect_cli_config_error(["site", "validate", missing], tmp_path, str(missing))


def test_malformed_site_yaml(tmp_path: Path) -> None:
    site = write_yaml(tmp_path, "name: x\npartitions: {gpu: {node_type: box}\nnode_types: {}\n", "site.yaml")
    err = expect_config_error(lambda: load_site(str(site)), tmp_path)
    assert_names(err, "", OMIT, "malformed YAML", "the `{` on this line is never closed", line=2)  # where it opened


def test_bad_partition_max_time_is_a_site_error(tmp_path: Path) -> None:
    data = minimal_site()
    data["partitions"]["gpu"]["max_time"] = "forever"
    site = write_yaml(tmp_path, data, "site.yaml")
    err = expect_config_error(lambda: load_site(str(site)), tmp_path)
    assert_names(err, "partitions.gpu.max_time", "forever", "1-00:00:00", line=line_of(site, "max_time:"))


def test_empty_partitions_message_reads_well(tmp_path: Path) -> None:
    data = minimal_site()
    data["partitions"] = {}
    site = write_yaml(tmp_path, data, "site.yaml")
    err = expect_config_error(lambda: load_site(str(site)), tmp_path)
    problem = assert_names(err, "partitions", {})
    assert "expected dictionary should" not in problem.allowed
    assert "partition" in problem.allowed


# --- CPU lists -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cpus", "canonical"),
    [
        ("0", {0}, "0"),
        ("0-3", {0, 1, 2, 3}, "0-3"),
        ("0-13,112-125", set(range(14)) | set(range(112, 126)), "0-13,112-125"),
        ("3,1,2", {1, 2, 3}, "1-3"),
        (" 0-1 , 4 ", {0, 1, 4}, "0-1,4"),
        ("5-5", {5}, "5"),
        ("0-2,1-3", {0, 1, 2, 3}, "0-3"),
    ],
)
def test_parse_and_format_cpulist(text: str, cpus: set[int], canonical: str) -> None:
    assert parse_cpulist(text) == frozenset(cpus)
    assert format_cpulist(parse_cpulist(text)) == canonical


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(min_value=0, max_value=1023), min_size=1, max_size=200))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == frozenset(cpus)
    # Canonical: sorted, disjoint, non-adjacent ranges; formatting is idempotent.
    assert format_cpulist(parse_cpulist(text)) == text
    bounds = [tuple(map(int, part.split("-"))) if "-" in part else (int(part), int(part)) for part in text.split(",")]
    for (lo, hi), (next_lo, _) in zip(bounds, bounds[1:]):
        assert lo <= hi and hi + 1 < next_lo


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty CPU list"),
        ("   ", "empty CPU list"),
        ("abc", "'abc' is not a CPU id or range like 0-7"),
        ("1,,2", "'' is not a CPU id or range like 0-7"),
        ("-1", "'-1' is not a CPU id or range like 0-7"),
        ("1-", "'1-' is not a CPU id or range like 0-7"),
        ("0-3:2", "'0-3:2' is not a CPU id or range like 0-7"),
        ("3-1", "range '3-1' runs backwards"),
    ],
)
def test_parse_cpulist_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_cpulist(text)
    assert str(info.value) == message
