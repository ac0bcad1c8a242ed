"""`preflight.skip`: one check left out of the default set without listing the others."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import expect_cli_config_error, write_spec

from clusterctl.config.spec import DEFAULT_PREFLIGHT, load_spec
from clusterctl.errors import ConfigError
from clusterctl.plan.job import load_job
from clusterctl.render.scripts import render_run
from clusterctl.rundir.runjson import RunJson
from clusterctl.runtime.rank import launch
from clusterctl.runtime.rank import preflight as preflight_mod

LOCAL = ["nodes=2", "gpus_per_node=2", "parallel.tp=2"]


def run_json(tmp_path: Path, overrides: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    spec = write_spec(tmp_path, site="local", command=["python3", "train.py"], **fields)
    job = load_job(spec, LOCAL + (overrides or []))
    return render_run(job.plan, tmp_path / "run", python="/usr/bin/python3", site_path=job.site_path).run_json.to_dict()


def checks_a_rank_runs(run: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The names launch.py hands to the preflight checks of one rank, read from run.json."""
    asked: list[str] = []
    monkeypatch.setattr(preflight_mod, "run_checks", lambda names, ctx: asked.extend(names) or [])
    info = SimpleNamespace(
        run=RunJson.from_dict(json.loads(json.dumps(run))), rank=0, local_rank=0, host="node1", gpu=0, cpus="", nics=(),
        run_dir=tmp_path, attempt_dir=tmp_path / "attempt-1", token="",
    )
    launch.preflight(info)
    return asked


def test_skip_leaves_one_default_check_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_json(tmp_path, preflight={"skip": ["nic"]})
    expected = [c for c in DEFAULT_PREFLIGHT if c != "nic"]
    assert run["preflight"]["checks"] == expected
    assert "skip" not in run["preflight"]  # applied already: run.json says what runs
    assert checks_a_rank_runs(run, monkeypatch, tmp_path) == expected


def test_skip_from_the_command_line(tmp_path: Path) -> None:
    assert "shared_fs" not in run_json(tmp_path, ["preflight.skip=shared_fs"])["preflight"]["checks"]
    assert run_json(tmp_path, ["preflight.skip=[nic, gpu]"])["preflight"]["checks"] == ["cpu", "memory", "dirs", "shared_fs"]


def test_no_skip_changes_nothing(tmp_path: Path) -> None:
    assert run_json(tmp_path)["preflight"] == {"checks": list(DEFAULT_PREFLIGHT), "timeout": 120}


def test_skip_with_an_explicit_list_removes_nothing_it_lists(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, preflight={"checks": ["gpu", "comm"], "skip": ["nic"]}))
    assert spec.preflight.checks == ["gpu", "comm"]


def test_unknown_name_is_refused_with_the_choices(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, preflight={"skip": ["nic", "gpus"]})
    with pytest.raises(ConfigError) as err:
        load_spec(spec)
    text = str(err.value)
    assert "preflight.skip[1]" in text and "'gpus'" in text
    assert "one of gpu, nic, cpu, memory, dirs, shared_fs, comm, compute" in text
    expect_cli_config_error(["plan", spec], tmp_path, "preflight.skip[1]", "'gpus'", "gpu, nic, cpu")


def test_skipping_a_check_listed_explicitly_is_a_contradiction(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, preflight={"checks": ["gpu", "nic"], "skip": ["nic"]})
    stderr = expect_cli_config_error(["plan", spec], tmp_path, "preflight.skip", "'nic' is also listed in preflight.checks")
    assert "leave it out of that list instead" in stderr
