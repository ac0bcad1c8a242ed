"""NVL72 racks: segments that keep NVLink-bound groups inside one block, rendered for the site's Slurm, and
spares that replace a node of their own rack. Pure: plans, rendered scripts, the site's checks, the recovery
step's choice of nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, cli

from clusterctl.config.site import Site, load_site, site_problems, site_warnings
from clusterctl.config.spec import JobSpec
from clusterctl.errors import ConfigError
from clusterctl.plan import make_plan
from clusterctl.render.scripts import Rendered, render_run
from clusterctl.rundir.runjson import RunJson, host_domains
from clusterctl.runtime.recovery.policy import pick_hosts, place_in_domains

NVL72 = REPO / "site-configs" / "gb200-nvl72.yaml"
MOE = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 32000, "experts": 16}


def nvl72(**changes: Any) -> Site:
    data = yaml.safe_load(NVL72.read_text())
    for key, value in changes.items():
        if key.startswith("topology_"):
            data["topology"][key.removeprefix("topology_")] = value
        else:
            data[key] = value
    return Site.model_validate(data)


def spec(**fields: Any) -> JobSpec:
    base: dict[str, Any] = {"name": "j", "site": "gb200-nvl72", "time_limit": "1h", "command": ["python", "train.py"],
                            "parallel": {"tp": 8}, "nodes": 32}
    for key, value in fields.items():
        if key in ("tp", "pp", "ep", "cp"):
            base["parallel"][key] = value
        elif key in ("segment", "exclusive_topo", "ep_in_nvlink"):
            base.setdefault("topology", {})[key] = value
        else:
            base[key] = value
    return JobSpec.model_validate(base)


def refused(job: JobSpec, site: Site) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        make_plan(job, site)
    return [(p.path, p.allowed) for p in info.value.problems]


def rendered(job: JobSpec, site: Site, tmp_path: Path) -> Rendered:
    return render_run(make_plan(job, site), tmp_path / "run", python="/usr/bin/python3")


def sbatch(job: JobSpec, site: Site, tmp_path: Path) -> str:
    return rendered(job, site, tmp_path).files["job.sbatch"]


def test_tp8_over_two_trays_asks_for_segments_that_keep_each_group_in_a_rack(tmp_path: Path) -> None:
    site = nvl72()
    plan = make_plan(spec(pp=4, spares=4), site)
    seg = plan.segments
    assert seg is not None and (seg.size, seg.count, seg.spares_each, seg.sbatch_size) == (8, 4, 1, 9)
    assert seg.spans == {"tp": 2} and "pp" in seg.crossing and "dp" in seg.inside
    # every tp group's nodes fall in one segment of 8 rank nodes
    assert all(len({r // 4 // 8 for r in g}) == 1 for g in plan.groups["tp"])
    text = sbatch(spec(pp=4, spares=4), site, tmp_path)
    assert "#SBATCH --segment=9\n" in text and "#SBATCH --nodes=36\n" in text and "#SBATCH --exclusive\n" in text
    assert plan.as_json()["segments"]["sbatch"] == 9


def test_without_spares_the_smallest_segment_is_one_group(tmp_path: Path) -> None:
    plan = make_plan(spec(), nvl72())
    assert plan.segments is not None and plan.segments.sbatch_size == 2
    assert "#SBATCH --exclusive=topo\n" in sbatch(spec(exclusive_topo=True), nvl72(), tmp_path)


def test_groups_inside_one_tray_need_no_segment(tmp_path: Path) -> None:
    plan = make_plan(spec(tp=4), nvl72())
    assert plan.segments is None
    assert "--segment" not in sbatch(spec(tp=4), nvl72(), tmp_path)


def test_a_segment_that_does_not_divide_the_nodes_is_refused() -> None:
    problems = refused(spec(segment=5), nvl72())
    assert problems[0][0] == "topology.segment" and "32 nodes are not a whole number of segments of 5" in problems[0][1]
    path, allowed = refused(spec(segment=3, nodes=36), nvl72())[0]
    assert path == "topology.segment" and "a tp group on nodes 2-3 would span two segments of 3" in allowed


def test_spares_that_no_segment_can_share_are_refused_with_a_count_that_works() -> None:
    path, allowed = refused(spec(spares=2), nvl72())[0]
    assert path == "spares"
    assert "2 spares cannot be shared evenly by 16 segments" in allowed
    assert "expected e.g. spares: 4 (segments of 8 nodes with 1 spare each)" in allowed
    assert make_plan(spec(spares=4), nvl72()).segments is not None


def test_a_group_wider_than_a_segment_can_be_is_refused_with_the_numbers() -> None:
    # tp 8 x ep 16 experts: one ep group (ranks 0, 8, ..., 120) spans 31 trays, two racks
    job = spec(tp=8, ep=16, ep_in_nvlink=True, model=MOE, nodes=64, spares=0)
    path, allowed = refused(job, nvl72())[0]
    assert path == "nodes"
    assert "an ep group spans 31 nodes" in allowed and "at most 16 nodes (segment_size)" in allowed
    # ep 16 alone spans 4 trays: segments of 4, each ep group in one rack
    plan = make_plan(spec(tp=1, ep=16, ep_in_nvlink=True, model=MOE, nodes=16), nvl72())
    assert plan.segments is not None and plan.segments.size == 4 and plan.segments.spans == {"ep": 4}


def test_an_older_slurm_gets_no_segment_option_and_a_warning(tmp_path: Path) -> None:
    old = nvl72(slurm_version="23.11")
    plan = make_plan(spec(), old)
    assert plan.segments is not None and not plan.segments.rendered
    assert any("no --segment" in w and "refused at start" in w for w in plan.warnings)
    assert "--segment" not in sbatch(spec(), old, tmp_path)
    path, allowed = refused(spec(exclusive_topo=True), old)[0]
    assert path == "topology.exclusive_topo" and "needs Slurm 24.05 or later" in allowed
    assert make_plan(spec(), nvl72(slurm_version=None)).segments.rendered  # unknown: rendered


def test_segments_need_a_block_site() -> None:
    site, _ = load_site("dgx-h100")
    job = spec(site="dgx-h100", segment=2, exclusive_topo=True, nodes=4)
    assert {path for path, _ in refused(job, site)} == {"topology.segment", "topology.exclusive_topo"}


def test_the_site_checks_its_blocks_segment_size_and_release() -> None:
    assert site_problems(nvl72()) == []
    paths = {p.path: p.allowed for p in site_problems(nvl72(topology_segment_size=20))}
    assert "a segment that fits in one block" in paths["topology.segment_size"]
    blocks = yaml.safe_load(NVL72.read_text())["topology"]["blocks"]
    twice = nvl72(topology_blocks=[*blocks[:3], {"name": "rack4", "nodes": "nvl-[018-035]"}])
    assert any(p.path == "topology.blocks[3].nodes" and "already in block" in p.allowed for p in site_problems(twice))
    assert any("fewer nodes than a segment of 20" in w for w in site_warnings(nvl72(topology_segment_size=None,
                                                                                     topology_block_sizes=[20])))
    with pytest.raises(ValueError, match="quoted release"):
        nvl72(slurm_version=24.1)


def test_spares_replace_a_node_of_their_own_rack() -> None:
    # two segments of 2 rank trays + 1 spare, one in each rack; the node list is in name order
    alloc = ("a1", "a2", "a3", "b1", "b2", "b3")
    domain = {h: h[0] for h in alloc}
    first = place_in_domains(alloc, 4, domain, 2, 1)
    assert first == ["a1", "a2", "b1", "b2"]
    assert pick_hosts(tuple(first), alloc, {"b1"}, 4, domain) == (["a1", "a2", "b2", "b3"], {"b1": "b3"})
    assert pick_hosts(tuple(first), alloc, {"b1", "b2"}, 4, domain) is None  # rack b has one spare
    assert pick_hosts(tuple(first), alloc, {"b1", "b2"}, 4) is not None  # without domains any spare would do
    assert place_in_domains(("a1", "a2", "b1", "b2", "b3", "b4"), 4, domain, 2, 1) is None  # not whole segments


def test_run_json_carries_the_partitions_blocks(tmp_path: Path) -> None:
    record = RunJson.from_dict(json.loads(rendered(spec(spares=4), nvl72(), tmp_path).files["run.json"]))
    assert (record.segment_nodes, record.segment_spares) == (8, 1)
    assert record.domains["rack1"] == "nvl-[001-018]"
    assert host_domains(record)["nvl-019"] == "rack2"


def test_plan_shows_the_segments() -> None:
    result = cli("plan", REPO / "examples" / "llama-70b-nvl72.yaml")
    assert result.exit_code == 0, result.output
    assert "4 x (8 nodes + 1 spare), each inside one block (sbatch --segment=9)" in " ".join(result.stdout.split())


def test_a_tp_group_split_across_racks_is_refused_at_start_naming_both_sides() -> None:
    from clusterctl.exitcodes import ExitCode
    from clusterctl.runtime.controller.admission import judge

    hosts = ["nvl-001", "nvl-002", "nvl-040", "nvl-041"]  # Slurm put the job's second pair in another rack
    fabric = {0: "aa/1", 1: "aa/1", 2: "bb/4", 3: "aa/1"}
    records = {r: {"rank": r, "world_size": 16, "host": hosts[r // 4], "fabric": fabric[r // 4]} for r in range(16)}
    groups = [("tp", list(range(0, 8))), ("tp", list(range(8, 16)))]
    verdict = judge(records, {}, world_size=16, hosts=hosts, gpus_per_node=4, token="", nvlink_groups=groups)
    assert verdict.code == ExitCode.PREFLIGHT_FAILED
    assert verdict.message == ("NVLink placement failed: a tp group spans 2 NVLink domains: ranks 8-11 on nvl-040"
                               " (fabric bb/4); ranks 12-15 on nvl-041 (fabric aa/1)")
    assert verdict.culprit_hosts() == []  # healthy nodes: named, never excluded or drained
    records[12]["fabric"] = records[13]["fabric"] = records[14]["fabric"] = records[15]["fabric"] = "bb/4"
    together = judge(records, {}, world_size=16, hosts=hosts, gpus_per_node=4, token="", nvlink_groups=groups)
    assert together.code != ExitCode.PREFLIGHT_FAILED


def test_the_rendered_job_sets_nccl_for_multi_node_nvlink_and_keeps_peer_access(tmp_path: Path) -> None:
    text = sbatch(spec(), nvl72(), tmp_path / "a")
    assert "export NCCL_MNNVL_ENABLE=1\n" in text and "export NCCL_CUMEM_ENABLE=1\n" in text
    assert "--gres-flags=allow-task-sharing" in text  # the site runs 25.05
    one_tray = sbatch(spec(tp=4), nvl72(), tmp_path / "b")
    assert "NCCL_MNNVL_ENABLE" not in one_tray
    assert "--gres-flags" not in sbatch(spec(), nvl72(slurm_version="23.02"), tmp_path / "c")
    assert "NCCL_MNNVL_ENABLE=1" not in sbatch(spec(env={"NCCL_MNNVL_ENABLE": "0"}), nvl72(), tmp_path / "d")  # the spec's wins
    record = RunJson.from_dict(json.loads(rendered(spec(), nvl72(), tmp_path / "f").files["run.json"]))
    assert record.nvlink_kinds == ("tp",) and record.site_env["NCCL_MNNVL_ENABLE"] == "1"


def test_a_split_group_blames_no_node_and_stops_when_it_happens_again() -> None:
    from clusterctl.exitcodes import ExitCode
    from clusterctl.rundir.history import Fault
    from clusterctl.runtime.recovery.policy import Ended, Policy, Situation, decide

    where = {"job_id": "7", "allocation": ("n1", "n2", "n3"), "rank_hosts": ("n1", "n2"), "nodes": 2}
    first = decide(Ended(ExitCode.PREFLIGHT_FAILED, (), None), Situation(**where), Policy())
    assert first.action == "restart" and first.hosts == ["n1", "n2"] and first.newly_excluded == []
    again = decide(Ended(ExitCode.PREFLIGHT_FAILED, (), None),
                   Situation(**where, faults=(Fault(ExitCode.PREFLIGHT_FAILED, (), None, "7"),)), Policy())
    assert again.action == "stop" and again.exit_code == ExitCode.BUDGET_EXHAUSTED and "twice in a row" in again.reason


def test_an_imported_nvl72_site_plans_a_70b_job_whose_tp_groups_stay_in_a_rack(tmp_path: Path) -> None:
    fixtures = REPO / "tests" / "fixtures" / "siteimport"
    result = cli("site", "import", "--topo", fixtures / "h100-4gpu_nccl-1617.txt", "--nic-names", "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
                 "--topology-conf",
                 fixtures / "topology-nvl72_example.conf", "--gpu-model", "B200-186GB", "--gpu-memory-gb", "186",
                 "--nvlink-domain", "72", "--slurm-version", "25.05", "--name", "nvl72", "--partition", "batch")
    assert result.exit_code == 0, result.output
    site_file = tmp_path / "nvl72.yaml"
    site_file.write_text(result.stdout)
    data = yaml.safe_load(result.stdout)
    assert (data["slurm_version"], data["topology"]["segment_size"]) == ("25.05", 18)
    site, _ = load_site(str(site_file))
    example = yaml.safe_load((REPO / "examples" / "llama-70b-nvl72.yaml").read_text())
    job = JobSpec.model_validate({**example, "site": str(site_file), "container": {**example["container"], "runtime": "pyxis"}})
    plan = make_plan(job, site)
    assert plan.segments is not None and plan.segments.sbatch_size == 9
    text = sbatch(job, site, tmp_path / "pyxis")
    assert "--segment=9" in text and "--container-image=" in text
    other = job.model_copy(update={"container": job.container.model_copy(update={"runtime": "apptainer"})})
    assert "'apptainer' 'exec' '--nv'" in rendered(other, site, tmp_path / "apptainer").files["wrapper.sh"]  # one field apart
    rack = {node: block["name"] for block in data["topology"]["blocks"] for node in _expand(block["nodes"])}
    # Slurm keeps each segment of 9 in one rack; the first attempt puts ranks on each segment's 8 rank trays
    alloc = ("nvl-001", *[f"nvl-{i:03d}" for i in range(2, 10)], *[f"nvl-{i:03d}" for i in range(19, 28)],
             *[f"nvl-{i:03d}" for i in range(37, 46)], *[f"nvl-{i:03d}" for i in range(55, 64)])
    hosts = place_in_domains(alloc, 32, rack, 8, 1)
    assert hosts is not None
    for group in plan.groups["tp"]:
        assert len({rack[hosts[r // 4]] for r in group}) == 1  # never leaves a rack


def _expand(expr: str) -> list[str]:
    from clusterctl.syntax import hostlist

    return hostlist.expand(expr)


def test_a_tp_group_that_slurm_put_in_two_racks_is_refused_before_training(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end on the local backend: two trays of one tp group whose GPUs report two NVLink fabrics (a stand-in
    NVML); the start-up check refuses the attempt naming both sides, and no node is excluded."""
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    site = yaml.safe_load((REPO / "site-configs" / "local.yaml").read_text())
    for node_type in site["node_types"].values():
        node_type.update(gpu_vendor="nvidia", nvlink_domain=2 * len(node_type["gpus"]))
    site["topology"] = {"kind": "block", "blocks": [{"name": "b1", "nodes": "node[1-2]"}, {"name": "b2", "nodes": "node[3-4]"}]}
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(site))
    (tmp_path / "imex").mkdir()
    (tmp_path / "imex" / "channel0").touch()
    fake = REPO / "tests" / "programs" / "fakefabric"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "split", "site": str(tmp_path / "local.yaml"), "time_limit": "10m", "nodes": 2, "gpus_per_node": 1,
        "parallel": {"tp": 2}, "restart": {"budget": 0}, "command": ["true"],
        "env": {"PYTHONPATH": str(fake), "FAKE_FABRIC_RACKS": "node1=1,node2=2", "CLUSTERCTL_IMEX_CHANNELS": str(tmp_path / "imex")}}))
    result = cli("submit", "job.yaml", "--wait", "-b", "local", cwd=tmp_path)
    assert result.exit_code == 87, result.output
    said = " ".join(result.output.split())
    assert ("NVLink placement failed: a tp group spans 2 NVLink domains: rank 0 on node1 (fabric" in said
            and "/1); rank 1 on node2 (fabric" in said), said
    attempts = [json.loads(line) for line in next((tmp_path / "runs").iterdir()).joinpath("attempts.jsonl").read_text().splitlines()]
    assert all(not e.get("exclude") for e in attempts if e.get("event") == "next")  # healthy nodes: none excluded
