"""The Lightning adapter's Trainer arguments merge with the user's own (an existing `L.Trainer(...)` call)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lightning")

from clusterctl import envnames  # noqa: E402
from clusterctl.integrations.lightning import Clusterctl, ClusterctlCallback, ClusterctlEnvironment  # noqa: E402


def in_a_job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, world: int) -> None:
    monkeypatch.setenv(envnames.RUN_DIR, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world))


def test_the_users_trainer_arguments_are_kept_and_clusterctls_added(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cc = Clusterctl(directory=tmp_path / "ckpt")
    in_a_job(monkeypatch, tmp_path, 32)  # as the rank's launcher sets it (the adapter asks when the Trainer is built)
    mine = object()
    options = cc.trainer_options(max_steps=10, devices=8, num_nodes=4, callbacks=mine, plugins=[], strategy="ddp")
    assert (options["max_steps"], options["strategy"], options["devices"], options["num_nodes"]) == (10, "ddp", 1, 32)
    assert options["callbacks"][0] is mine and isinstance(options["callbacks"][1], ClusterctlCallback)
    assert isinstance(options["plugins"][0], ClusterctlEnvironment) and options["plugins"][1] is cc.io
    assert cc.trainer_options(devices="auto")["devices"] == 1  # torchrun's spelling of "every GPU here"


def test_a_device_count_that_makes_another_world_is_refused_with_both_numbers(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cc = Clusterctl(directory=tmp_path / "ckpt")
    in_a_job(monkeypatch, tmp_path, 4)
    with pytest.raises(ValueError, match=r"Trainer\(devices=2, num_nodes=4\) makes 8 processes, but this clusterctl job"
                                         r" has 4 ranks"):
        cc.trainer_options(devices=2, num_nodes=4)


def test_outside_a_job_the_trainer_keeps_its_own_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(envnames.RUN_DIR, raising=False)
    options = Clusterctl(directory=tmp_path / "ckpt").trainer_options(devices=2)
    assert options["devices"] == 2 and "num_nodes" not in options and len(options["callbacks"]) == 1


def test_after_an_elastic_shrink_the_full_size_trainer_call_still_works_and_the_batch_is_kept(tmp_path: Path,
                                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    plan = {"world_size": 32, "nodes": 4, "gpus_per_node": 8, "parallel": {"dp": 32}, "batch": {"micro": 2, "grad_accum": 3},
            "elastic": {"batch": "keep", "widths": [{"nodes": 3, "dp": 24, "micro": 2, "grad_accum": 4, "global": 192}]}}
    (tmp_path / "run.json").write_text(json.dumps(plan))
    in_a_job(monkeypatch, tmp_path, 24)  # shrunk from 4 nodes to 3
    cc = Clusterctl(directory=tmp_path / "ckpt")
    options = cc.trainer_options(devices=8, num_nodes=4, accumulate_grad_batches=3)  # written for the full size
    assert (options["num_nodes"], options["accumulate_grad_batches"]) == (24, 4)  # 2 x 4 x 24 = 2 x 3 x 32
    assert cc.trainer_options()["accumulate_grad_batches"] == 4  # the plan's accumulation when the call gives none
    with pytest.raises(ValueError, match="makes 16 processes"):
        cc.trainer_options(devices=4, num_nodes=4)  # neither the full size nor this width
