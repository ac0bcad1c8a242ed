"""Young/Daly checkpoint interval advice in the plan."""

from __future__ import annotations

import math

import pytest

from clusterctl.config.site import load_site
from clusterctl.config.spec import JobSpec
from clusterctl.plan import make_plan
from clusterctl.plan.interval import young_daly


def test_young_daly_formula() -> None:
    interval, lost = young_daly(60, 86400)
    assert interval == pytest.approx(math.sqrt(2 * 60 * 86400))
    assert lost == pytest.approx(60 / interval + interval / (2 * 86400))


def test_plan_estimates_save_cost_from_state_size_and_site_bandwidth() -> None:
    site, _ = load_site("dgx-h100")
    spec = JobSpec.model_validate(
        {"name": "t", "site": "dgx-h100", "time_limit": "1h", "nodes": 2, "parallel": {"dp": 16}, "model": {"params": "1B"}}
    )
    advice = make_plan(spec, site).checkpoint
    state = 1e9 * (2 + 12)  # bf16 weights + fp32 master and two moments, per GPU (no sharding)
    assert advice.save_estimated
    assert advice.save_s == pytest.approx(state * 8 / (site.reliability.checkpoint_write_gbs_per_node * 1e9))
    assert advice.mtbf_s == pytest.approx(site.reliability.node_mtbf_hours * 3600 / 2)


def test_measured_save_cost_and_job_mtbf_win() -> None:
    site, _ = load_site("dgx-h100")
    spec = JobSpec.model_validate(
        {"name": "t", "site": "dgx-h100", "time_limit": "1h", "nodes": 1,
         "checkpoint": {"save_seconds": 30, "mtbf": "12h", "interval": "auto"}}
    )
    advice = make_plan(spec, site).checkpoint
    assert not advice.save_estimated
    assert advice.interval_s == pytest.approx(math.sqrt(2 * 30 * 12 * 3600))
