"""The Hugging Face adapter's TrainingArguments at an elastic job's shrunk width."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from clusterctl import envnames  # noqa: E402


def test_after_a_shrink_the_accumulation_keeps_the_global_batch_and_at_full_size_nothing_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import TrainingArguments

    from clusterctl.integrations.hf import ClusterctlCallback

    plan = {"world_size": 8, "nodes": 2, "gpus_per_node": 4, "parallel": {"dp": 8}, "batch": {"micro": 2, "grad_accum": 3},
            "elastic": {"batch": "keep", "widths": [{"nodes": 1, "dp": 4, "micro": 2, "grad_accum": 6, "global": 48}]}}
    (tmp_path / "run.json").write_text(json.dumps(plan))
    monkeypatch.setenv(envnames.RUN_DIR, str(tmp_path))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), gradient_accumulation_steps=3, report_to=[], use_cpu=True)
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert ClusterctlCallback(directory=tmp_path / "ckpt").training_args(args) is args
    monkeypatch.setenv("WORLD_SIZE", "4")  # shrunk to one node
    shrunk = ClusterctlCallback(directory=tmp_path / "ckpt").training_args(args)
    assert (shrunk.gradient_accumulation_steps, shrunk.output_dir, args.gradient_accumulation_steps) == (6, args.output_dir, 3)
