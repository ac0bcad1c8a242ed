"""The memory estimate against published numbers and the pinned formulas."""

from __future__ import annotations

import pytest

from clusterctl.config.site import load_site
from clusterctl.config.spec import JobSpec
from clusterctl.plan import make_plan
from clusterctl.plan.batch import bubble_fraction
from clusterctl.plan.memory import count_params

GB = 1e9


def plan_for(**fields):  # noqa: ANN003, ANN201
    data = {"name": "t", "site": "dgx-h100", "time_limit": "1h", **fields}
    site, _ = load_site(data["site"])
    return make_plan(JobSpec.model_validate(data), site)


@pytest.mark.parametrize(
    ("sharding", "expected_gb"),
    [("none", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9), ("full_shard", 1.9)],
)
def test_zero_paper_worked_example(sharding: str, expected_gb: float) -> None:
    """ZeRO (Rajbhandari et al.), Figure 1: 7.5B params, 64 DP ranks, K = 12."""
    plan = plan_for(
        nodes=8, parallel={"dp": 64}, model={"params": "7.5B"}, precision="bf16", optimizer="adam", sharding=sharding
    )
    mem = plan.memory
    assert mem is not None and mem.activations is None  # params only: no shape, no activation estimate
    states = mem.params + mem.grads + mem.optimizer
    assert round(states / GB, 1) == expected_gb


def test_sixteen_bytes_per_param_mixed_precision_adam() -> None:
    plan = plan_for(nodes=1, parallel={"dp": 8}, model={"params": 1_000_000_000}, precision="bf16", optimizer="adamw")
    mem = plan.memory
    assert (mem.params, mem.grads, mem.optimizer) == (2 * 10**9, 2 * 10**9, 12 * 10**9)


def test_fp32_has_no_master_copy_and_sgd_one_state() -> None:
    plan = plan_for(nodes=1, parallel={"dp": 8}, model={"params": 10**9}, precision="fp32", optimizer="sgd")
    mem = plan.memory
    assert (mem.params, mem.grads, mem.optimizer) == (4 * 10**9, 4 * 10**9, 4 * 10**9)


def test_states_split_over_tp_and_pp() -> None:
    plan = plan_for(nodes=2, parallel={"tp": 8, "pp": 2}, model={"params": 16 * 10**9}, precision="bf16")
    assert plan.memory.params == 2 * 10**9  # 16e9 / 16 ranks * 2 bytes


SHAPE = {"layers": 32, "hidden": 4096, "heads": 32, "vocab": 32000, "ffn": 11008}


def per_layer(s: float, b: int, h: int, a: int, t: int, recompute: str) -> float:
    if recompute == "full":
        return 2 * s * b * h
    if recompute == "selective":
        return 34 * s * b * h / t
    return s * b * h * (34 + 5 * a * s / h) / t


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize(("tp", "pp", "cp", "accum"), [(1, 1, 1, 4), (8, 1, 1, 1), (4, 4, 1, 2), (2, 4, 2, 16)])
def test_activations_korthikanti(recompute: str, tp: int, pp: int, cp: int, accum: int) -> None:
    seq, micro = 4096, 2
    dp = 64 // (tp * pp * cp)
    plan = plan_for(
        nodes=8,
        parallel={"tp": tp, "pp": pp, "cp": cp, "dp": dp},
        batch={"micro": micro, "grad_accum": accum},
        seq_len=seq,
        model=SHAPE,
        recompute=recompute,
    )
    expected = per_layer(seq / cp, micro, 4096, 32, tp, recompute) * (32 / pp) * min(pp, accum)
    assert plan.memory.activations == pytest.approx(expected, rel=1e-9)


def test_llama2_7b_param_count() -> None:
    counts = count_params(
        layers=32, hidden=4096, heads=32, kv_heads=None, ffn=11008, vocab=32000,
        gated_mlp=True, tied_embeddings=False, experts=0, params=None,
    )
    assert counts.total == pytest.approx(6.74e9, rel=0.01)  # Llama 2 7B: 6,738,415,616


def test_llama3_70b_param_count() -> None:
    counts = count_params(
        layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256,
        gated_mlp=True, tied_embeddings=False, experts=0, params=None,
    )
    assert counts.total == pytest.approx(70.55e9, rel=0.01)


def test_mixtral_8x7b_param_count_and_expert_split() -> None:
    counts = count_params(
        layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
        gated_mlp=True, tied_embeddings=False, experts=8, params=None,
    )
    assert counts.total == pytest.approx(46.7e9, rel=0.01)
    assert counts.expert == 32 * 8 * 3 * 4096 * 14336


def test_does_not_fit_verdict() -> None:
    plan = plan_for(nodes=1, parallel={"dp": 8}, model={"params": "7B"}, precision="bf16", sharding="none")
    assert plan.memory.total == 7 * 10**9 * 16
    assert not plan.memory.fits
    assert any("does not fit" in w for w in plan.warnings)


@pytest.mark.parametrize(("pp", "vpp", "m", "expected"), [(1, 1, 8, 0.0), (4, 1, 8, 3 / 11), (4, 2, 8, 3 / 19)])
def test_bubble_fraction(pp: int, vpp: int, m: int, expected: float) -> None:
    assert bubble_fraction(pp, vpp, m) == pytest.approx(expected)


def test_in_memory_snapshots_are_sized_against_the_nodes_host_memory() -> None:
    from clusterctl.errors import ConfigError

    shape = {"nodes": 2, "gpus_per_node": 8, "model": {"params": 7_000_000_000}, "parallel": {"tp": 8},
             "checkpoint": {"memory_interval": 1}}
    fits = plan_for(**shape)  # 7B over tp 8: 14 GB of state per GPU; 4 copies, 8 GPUs: 448 GB of the node's 2,048
    assert fits.snapshots.per_gpu == 4 * (fits.memory.params + fits.memory.optimizer)
    assert fits.snapshots.per_node == 8 * fits.snapshots.per_gpu and fits.snapshots.fits
    with pytest.raises(ConfigError) as refused:
        plan_for(**{**shape, "model": {"params": 70_000_000_000}, "parallel": {"tp": 8, "pp": 2}, "nodes": 2})
    (problem,) = refused.value.problems
    assert problem.path == "checkpoint.memory_interval" and problem.value == 1
    assert "1960.00 GB per node of the node's 2048.00 GB" in problem.allowed and "set 0 (no snapshots)" in problem.allowed
    assert plan_for(**{**shape, "checkpoint": {"memory_interval": 0}}).snapshots is None


def test_snapshots_by_default_wherever_they_are_known_to_fit() -> None:
    shape = {"nodes": 2, "gpus_per_node": 8, "model": {"params": 7_000_000_000}, "parallel": {"tp": 8}}
    assert plan_for(**shape).memory_interval == 1  # auto: dgx-h100 says 2,048 GB a node
    too_big = plan_for(**{**shape, "model": {"params": 70_000_000_000}, "parallel": {"tp": 8, "pp": 2}})
    assert too_big.memory_interval == 0 and too_big.snapshots is None  # auto never refuses: it leaves them off
    assert plan_for(nodes=2, gpus_per_node=8).memory_interval == 0  # no model shape: the state's size is unknown
