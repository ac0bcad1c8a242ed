"""Verdicts users can trust, end to end: finished work is never repeated, a script's bug blames no node.

Real ranks on the local backend (and the Slurm test cluster where the
backend fixture says so), driven as a user drives them: `submit --wait`,
then `status --json` and `suspects --json`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import BACKEND_SITES
from helpers import cli

from clusterctl.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "programs"


def spec(tmp_path: Path, site: str, command: list[str], **fields: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({
        "name": "trust", "site": site, "nodes": 2, "gpus_per_node": 2, "time_limit": "10m",
        "runs_root": str(tmp_path / "runs"), "command": command, **fields,
    }))
    return path


def attempts(tmp_path: Path) -> list[dict]:
    (st,) = json.loads(cli("status", "--json", cwd=tmp_path).stdout)
    return st["attempts"]


def suspects(tmp_path: Path) -> list[dict]:
    result = cli("suspects", "--runs-root", tmp_path / "runs", "--json", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_ddp_script_that_returns_with_its_model_alive_completes_in_one_attempt(tmp_path: Path, warm: bool) -> None:
    """It used to hang in gloo's destructor on most ranks: srun killed them 60 s later, a finished run was judged
    84 and run again."""
    (tmp_path / "train.py").write_text((PROGRAMS / "ddp_exit_shape.py").read_text())
    job = spec(tmp_path, "local", ["python3", "train.py"], restart={"warm": warm})
    began = time.monotonic()
    result = cli("submit", job, "--wait", cwd=tmp_path)
    took = time.monotonic() - began
    assert result.exit_code == 0, result.output
    assert "every rank finished" in result.stdout
    (only,) = attempts(tmp_path)
    assert only["exit_code"] == 0
    assert took < 50, f"{took:.0f} s: a rank outlived its script (srun waits 60 s before it kills the rest)"
    assert suspects(tmp_path) == []


def test_the_same_exception_on_every_rank_stops_after_one_attempt_and_blames_no_node(backend: str, tmp_path: Path) -> None:
    command = ["python3", "-c", "import os; raise ValueError(f\"learning rate must be positive (rank {os.environ['RANK']})\")"]
    job = spec(tmp_path, BACKEND_SITES[backend], command, restart={"budget": 3})
    result = cli("submit", job, "--wait", cwd=tmp_path)
    assert result.exit_code == ExitCode.SCRIPT_ERROR, result.output
    failed = [line for line in result.stdout.splitlines() if line.startswith("failed")]
    assert failed and "ValueError: learning rate must be positive" in failed[-1], result.stdout
    assert "every rank" in failed[-1] and "not a node's" in failed[-1]
    (only,) = attempts(tmp_path)
    assert only["exit_code"] == ExitCode.SCRIPT_ERROR
    assert suspects(tmp_path) == []
