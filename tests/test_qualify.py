"""`clusterctl qualify`: the whole ladder as real jobs on the local backend, its first rungs on the real
Slurm test cluster, and a rung that fails stopping the ladder with its reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, cli

from clusterctl.exitcodes import ExitCode

TINY = {"batch": {"micro": 4, "grad_accum": 1}, "seq_len": 32, "precision": "fp32", "recompute": "none",
        "model": {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "ffn": 64}, "signal": {"lead_s": 60}}


def spec(tmp_path: Path, site: str = "local", **qualify: Any) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"name": "qual", "site": site, "time_limit": "20m", "nodes": 2, "gpus_per_node": 1, **TINY,
                                "qualify": {"steps": 24, "eval_interval": 8, "target_loss": 4.0, "long_s": 2,
                                            "data_samples": 192, **qualify}}))
    return path


def block_local(tmp_path: Path) -> Path:
    """The local site as NVL-style racks: an NVLink domain of two nodes, each pair of nodes a block."""
    site = yaml.safe_load((REPO / "site-configs" / "local.yaml").read_text())
    for node_type in site["node_types"].values():
        node_type["nvlink_domain"] = 2 * len(node_type["gpus"])
    site["topology"] = {"kind": "block", "blocks": [{"name": "b1", "nodes": "node[1-2]"}, {"name": "b2", "nodes": "node[3-4]"}]}
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(site))
    return tmp_path / "local.yaml"


def test_the_whole_ladder_on_the_local_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    result = cli("qualify", spec(tmp_path, site=str(block_local(tmp_path))), "-o", tmp_path / "out", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report == json.loads((tmp_path / "out" / "report.json").read_text())
    names = [r["name"] for r in report["rungs"]]
    assert names == ["worker", "node", "comm", "nvlink", "boundary", "scaling", "data", "restart", "failure", "long", "report"]
    assert all(r["passed"] for r in report["rungs"]) and report["passed"] and report["stopped_at"] is None and report["started_at"] is None
    assert all(r["criterion"] and isinstance(r["measured"], dict) for r in report["rungs"])
    rung = {r["name"]: r for r in report["rungs"]}
    # Save and restore round-trip bit for bit; the resumed run continues the uninterrupted one bit for bit.
    assert rung["worker"]["measured"]["steps_differing"] == 0 and rung["worker"]["measured"]["steps_compared"] == 12
    restart = rung["restart"]["measured"]
    assert restart["stopped_with"] == ExitCode.PRE_TIMEOUT and restart["max_loss_difference"] == 0.0 and restart["steps_compared"] > 0
    # The approved failure: the killed rank is the one blamed, and training came back.
    failure = rung["failure"]["measured"]
    assert failure["drill"]["culprit_right"] and failure["drill"]["code"] == ExitCode.SCRIPT_FAILED and failure["recovery_s"] > 0
    assert failure["drill"]["seconds"] > 0  # how long the verdict took after the kill
    data = rung["data"]["measured"]
    assert data["unique"] and data["epoch_crossed"] and data["shuffled"] and data["input_wait_s"]["cold"] is not None
    assert rung["boundary"]["measured"]["crossing_groups"]["dp"]["cross_node"] == 1
    comm = rung["comm"]["measured"]
    assert comm["busbw_gbs"]["world"] > 0 and {r["op"] for r in comm["results"]} == {"all_reduce", "all_gather", "reduce_scatter"}
    # Racks of two nodes: a tp group across two nodes of one block, inside one segment, all-reduces.
    nvlink = rung["nvlink"]
    assert nvlink["passed"] and len(nvlink["runs"]) == 1 and nvlink["measured"]["tp_busbw_gbs"] > 0
    assert nvlink["measured"]["segment"]["size"] == 2 and nvlink["measured"]["segment"]["spans"] == {"tp": 2}
    # Emulated GPUs share CPUs: performance measured, not judged.
    assert not rung["node"]["judged"] and not rung["scaling"]["judged"]
    assert [p["nodes"] for p in report["scaling"]] == [1, 2]
    assert all({"nodes", "throughput", "efficiency", "step_time_p50", "step_time_p90"} <= set(p) for p in report["scaling"])
    assert report["scaling"][0]["efficiency"] == 1.0 and report["scaling"][1]["throughput"] > 0
    quality = report["quality"]
    assert quality["target"] == 4.0 and quality["reached"] and quality["time_to_target_s"] > 0
    assert report["definition"]["version"] == 1 and report["software"]["nodes"][0]["versions"]["torch"]
    page = (tmp_path / "out" / "index.html").read_text()
    assert "PASSED" in page and "time to target" in page and (tmp_path / "out" / "scaling.png").stat().st_size > 1000


def test_a_rung_that_fails_stops_the_ladder_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    result = cli("qualify", spec(tmp_path, steps=1), "-o", tmp_path / "out")
    assert result.exit_code == ExitCode.QUALIFY_FAILED, result.output
    assert "STOPPED at worker" in result.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["stopped_at"] == "worker" and not report["passed"] and [r["name"] for r in report["rungs"]] == ["worker"]
    assert report["rungs"][0]["reason"].startswith("the loss did not fall")
    assert report["failures"] == [{"rung": "worker", "reason": report["rungs"][0]["reason"]}]
    assert "STOPPED at worker" in (tmp_path / "out" / "index.html").read_text()
    bad = cli("qualify", spec(tmp_path), "-o", tmp_path / "o2", "--up-to", "summit")
    assert bad.exit_code == ExitCode.USAGE and "--up-to 'summit'" in bad.output
    backwards = cli("qualify", spec(tmp_path), "-o", tmp_path / "o2", "--from", "long", "--up-to", "node")
    assert backwards.exit_code == ExitCode.USAGE and "--from long comes after --up-to node" in backwards.output
    assert not (tmp_path / "o2" / "runs").exists()  # refused before any job


@pytest.mark.slurm
def test_the_first_node_boundary_on_the_slurm_test_cluster(slurm_lab, tmp_path: Path,  # noqa: ANN001
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The rung that differs on real hosts (--from): the rungs below it are the local ladder's. The test cluster has
    no NVLink domain spanning nodes: the nvlink rung runs no job and says why."""
    monkeypatch.setenv("SLURM_CONF", slurm_lab.conf)
    result = cli("qualify", spec(tmp_path, site="slurm-lab"), "-o", tmp_path / "out", "--from", "nvlink", "--up-to", "boundary",
                 "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["name"] for r in report["rungs"]] == ["nvlink", "boundary"] and report["started_at"] == "nvlink"
    assert all(r["passed"] for r in report["rungs"]), report["rungs"]
    nvlink = report["rungs"][0]
    assert not nvlink["runs"] and not nvlink["judged"] and "has no NVLink domain spanning nodes" in nvlink["reason"]
    boundary = {r["name"]: r for r in report["rungs"]}["boundary"]["measured"]
    assert {a["host"] for a in boundary["adapters"].values()} <= {"n1", "n2", "n3", "n4"} and len(boundary["adapters"]) == 2
    assert all(a["nics"] == ["lo"] for a in boundary["adapters"].values())

