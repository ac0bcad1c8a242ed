"""`status` and `submit --wait` on real jobs: what a user reads while a job pends, and after preflight fails.

A pending job on the real Slurm test cluster must show Slurm's reason (the
nodes drained under it), then train and complete; a preflight failure must
read as failed with exit 81 and the NIC and node named, never "ranks running".
Stand-in commands keep the ranks cheap; the ranks themselves are clusterctl's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cli

from clusterctl.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parent.parent
CLUSTERCTL = [sys.executable, "-m", "clusterctl.cli"] if (ROOT / "clusterctl" / "cli" / "__main__.py").exists() else [
    str(Path(sys.executable).with_name("clusterctl"))]


def spec(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"name": "st", "time_limit": "10m", "runs_root": str(tmp_path / "runs"), **fields}))
    return path


@pytest.mark.slurm
def test_a_job_pending_on_drained_nodes_shows_slurms_reason_then_completes(slurm_lab, tmp_path: Path) -> None:  # noqa: ANN001
    env = {**os.environ, "SLURM_CONF": slurm_lab.conf}
    job = spec(tmp_path, site="slurm-lab", nodes=1, gpus_per_node=1, command=["python3", "-c", "print('hello')"])
    slurm_lab.run(["scontrol", "update", "nodename=n[1-4]", "state=drain", "reason=maintenance"])
    proc = subprocess.Popen([*CLUSTERCTL, "submit", str(job), "--wait"], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("pending:"):
                break
        assert lines and lines[-1].startswith("pending: Slurm's reason: "), lines
        assert "DRAINED" in lines[-1] or "ReqNodeNotAvail" in lines[-1], lines[-1]
        shown = subprocess.run([*CLUSTERCTL, "status", "--json"], env=env, cwd=tmp_path, text=True, capture_output=True, timeout=60)
        (st,) = json.loads(shown.stdout)
        # Slurm rewords the reason as it re-evaluates (ReqNodeNotAvail, then "Nodes required ... DRAINED ..."): both say why.
        assert st["state"] == "pending" and st["reason"].startswith("Slurm's reason: ") and st["attempts"] == []
        assert "DRAINED" in st["reason"] or "ReqNodeNotAvail" in st["reason"], st["reason"]
    finally:
        slurm_lab.run(["scontrol", "update", "nodename=n[1-4]", "state=resume"])
    try:
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    lines += rest.splitlines()
    assert proc.returncode == 0, "\n".join(lines)
    assert any(line.startswith("starting: ") for line in lines), lines
    assert lines[-2] == "completed: the command finished (exit 0) without reporting a training step" and " completed in job " in lines[-1], lines


def test_a_preflight_failure_reads_as_failed_naming_the_nic_and_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    site = (ROOT / "site-configs" / "local.yaml").read_text()
    site = site.replace('{index: 1, numa: 0, cpus: "1", nics: [lo]}', '{index: 1, numa: 0, cpus: "1", nics: [mlx5_nosuch9]}')
    site = site.replace("lo: {rail: 0, kind: loopback, netdev: lo}", "lo: {rail: 0, kind: loopback, netdev: lo}\n      mlx5_nosuch9: {rail: 1, kind: ib}")
    (tmp_path / "site.yaml").write_text(site)
    job = spec(tmp_path, site=str(tmp_path / "site.yaml"), nodes=1, gpus_per_node=2, restart={"mode": "none"},
               command=["python3", "-c", "print('never')"])
    result = cli("submit", job, "--wait", cwd=tmp_path)
    assert result.exit_code == ExitCode.PREFLIGHT_FAILED, result.output
    failed = [line for line in result.stdout.splitlines() if line.startswith("failed")]
    assert failed and failed[-1].startswith("failed (exit 81): "), result.stdout
    assert "mlx5_nosuch9" in failed[-1] and "node1" in failed[-1], failed[-1]
    assert "ranks running" not in result.stdout
    st = json.loads(cli("status", "--json", cwd=tmp_path).stdout)[0]
    assert (st["state"], st["exit_code"], st["step"]) == ("failed", 81, None)
    assert st["attempts"][0]["culprits"][0]["host"] == "node1"
