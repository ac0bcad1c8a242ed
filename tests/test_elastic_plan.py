"""An elastic job's smaller widths, planned at submit: whole model-parallel groups, the batch kept exact or
shrunk, the memory estimate at each width, and every spec that leaves no width refused by field and value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, cli

from clusterctl.config.site import load_site
from clusterctl.config.spec import JobSpec
from clusterctl.errors import OMIT, ConfigError
from clusterctl.plan import make_plan

DGX, _ = load_site("dgx-h100")
LLAMA_70B = {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672, "vocab": 128256}


def spec(elastic: dict[str, Any] | None, **fields: Any) -> JobSpec:
    base: dict[str, Any] = {"name": "j", "site": "dgx-h100", "partition": "batch", "time_limit": "1h",
                            "command": ["python", "train.py"], "parallel": {"tp": 8, "pp": 4}, "nodes": 16,
                            "batch": {"micro": 1, "global": 512}, "seq_len": 8192, "model": LLAMA_70B,
                            "sharding": "zero1", "elastic": elastic}
    base.update(fields)
    return JobSpec.model_validate(base)


def refused(job: JobSpec) -> list[tuple[str, Any, str]]:
    with pytest.raises(ConfigError) as info:
        make_plan(job, DGX)
    return [(p.path, p.value, p.allowed) for p in info.value.problems]


def test_keeping_the_batch_uses_only_widths_whose_accumulation_keeps_it_exact() -> None:
    plan = make_plan(spec({"min_nodes": 4}), DGX)
    assert plan.elastic is not None and plan.batch.dp == 4
    widths = [(w.nodes, w.dp, w.micro, w.grad_accum, w.global_batch) for w in plan.elastic.widths]
    assert widths == [(8, 2, 1, 256, 512), (4, 1, 1, 512, 512)], widths  # dp 3 (12 nodes) cannot keep 512
    assert all(w.micro * w.grad_accum * w.dp == 512 for w in plan.elastic.widths)
    skipped = dict(plan.elastic.skipped)
    assert "does not divide the global batch 512" in skipped[12] and "rank groups" in skipped[15]
    assert plan.memory is not None
    at = {w.dp: w.as_dict()["memory_gb"] for w in plan.elastic.widths}
    assert plan.memory.total / 1e9 < at[2] < at[1], at  # zero1's optimizer shards grow as dp shrinks
    assert plan.as_json()["elastic"]["widths"][0] == {"nodes": 8, "dp": 2, "micro_batch": 1, "grad_accum": 256,
                                                      "global_batch": 512, "memory_gb": at[2], "capacity_gb": 80.0}


def test_shrinking_the_batch_keeps_micro_and_accumulation_and_the_default_floor_is_half_the_nodes() -> None:
    plan = make_plan(spec({"batch": "shrink"}), DGX)
    assert plan.elastic is not None and plan.elastic.min_nodes == 8
    widths = [(w.nodes, w.dp, w.grad_accum, w.global_batch) for w in plan.elastic.widths]
    assert widths == [(12, 3, 128, 384), (8, 2, 128, 256)], widths


def test_a_width_the_memory_estimate_does_not_fit_is_not_used() -> None:
    plan = make_plan(spec({"min_nodes": 4}, model={**LLAMA_70B, "layers": 120}), DGX)  # dp 1 holds all optimizer state
    assert [w.dp for w in plan.elastic.widths] == [2]
    assert dict(plan.elastic.skipped)[4] == "the memory estimate, 86.6 GB a GPU, does not fit its 80 GB"
    problems = refused(spec({"min_nodes": 4}, model={**LLAMA_70B, "layers": 160}))
    assert problems[0][:2] == ("elastic.min_nodes", 4) and "8 nodes: the memory estimate, 89.1 GB" in problems[0][2]
    assert "No smaller width would do either" in problems[0][2]


@pytest.mark.parametrize("elastic, fields, path, value, says", [
    ({"min_nodes": 20}, {}, "elastic.min_nodes", 20, "expected fewer than nodes = 16"),
    ({"min_nodes": 16}, {}, "elastic.min_nodes", 16, "expected fewer than nodes = 16"),
    ({"min_dp": 4}, {}, "elastic.min_dp", 4, "expected less than dp = 4"),
    ({"min_nodes": 12}, {}, "elastic.min_nodes", 12, "Below it, these widths would do: dp 2 on 8 nodes, dp 1 on 4 nodes;"
                                                      " lower elastic.min_nodes to reach one; or change batch.global"),
    ({}, {"nodes": 4}, "elastic", OMIT, "needs a data-parallel size above 1 to shrink: tp*cp*pp = 32 fills all 4 nodes"),
])
def test_a_spec_that_leaves_no_width_is_refused_by_field_and_value(elastic: dict[str, Any], fields: dict[str, Any],
                                                                   path: str, value: Any, says: str) -> None:
    problems = refused(spec(elastic, **fields))
    assert [(p, v) for p, v, _ in problems] == [(path, value)], problems
    assert says in problems[0][2], problems[0][2]


def test_min_nodes_and_min_dp_together_are_refused_before_planning(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    body = yaml.safe_load((REPO / "examples" / "llama-70b.yaml").read_text())
    path.write_text(yaml.safe_dump({**body, "elastic": {"min_nodes": 8, "min_dp": 2}}))
    result = cli("plan", path)
    assert result.exit_code == 65 and "elastic.min_dp" in result.stderr and "not both" in result.stderr, result.output


def test_plan_shows_each_width_and_json_carries_them(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    body = yaml.safe_load((REPO / "examples" / "llama-70b.yaml").read_text())
    path.write_text(yaml.safe_dump({**body, "elastic": {"min_nodes": 8}}))
    shown = cli("plan", path)
    assert shown.exit_code == 0, shown.output
    assert "Elastic: widths down to 8 nodes" in shown.stdout and "1 x 256" in shown.stdout
    assert "12 nodes: micro x dp = 1 x 3 does not divide the global batch 512" in " ".join(shown.stdout.split())
    data = json.loads(cli("plan", path, "--json").stdout)
    assert [w["nodes"] for w in data["elastic"]["widths"]] == [8]
    assert make_plan(spec(None), DGX).as_json()["elastic"] is None


def test_a_refused_elastic_spec_submits_nothing(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "el", "site": "local", "nodes": 2, "gpus_per_node": 2, "time_limit": "10m",
                                    "command": ["python3", "-c", "pass"], "runs_root": str(runs),
                                    "elastic": {"min_nodes": 2}}))
    result = cli("submit", path)
    assert result.exit_code == 65, result.output
    assert "elastic.min_nodes" in result.stderr and "got 2" in result.stderr and "fewer than nodes = 2" in result.stderr
    assert not runs.exists() or not any(runs.iterdir())
