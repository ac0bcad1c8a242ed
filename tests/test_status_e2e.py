"""`status` and `submit --wait` on real jobs: what a user reads while a job pends, after preflight fails, and after a cancel.

A pending job on the real Slurm test cluster must show Slurm's reason (the
nodes drained under it), then train and complete; a preflight failure must
read as failed with exit 81 and the NIC and node named, never "ranks running";
a cancelled job reads as cancelled (89) in every view, blaming no node.
Stand-in commands keep the ranks cheap; the ranks themselves are clusterctl's.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BACKEND_SITES
from helpers import cli

from clusterctl.backends import get_backend
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


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_cancelled_job_reads_cancelled_everywhere_and_submit_wait_exits_89(backend: str, warm: bool, tmp_path: Path) -> None:
    """scancel or `clusterctl cancel` of a running job: one code (89) and one word (cancelled) in `submit --wait`,
    `status`, verdict.json, `report`'s two tables and `trace`, whatever srun (137, 143) or the ranks exited with; no
    node becomes a suspect. Each backend is cancelled both ways, once with warm process servers (which end with the
    job and take the controller along) and once without."""
    how = "scancel" if (backend == "slurm") == warm else "clusterctl cancel"
    job = spec(tmp_path, site=BACKEND_SITES[backend], nodes=1, gpus_per_node=1, restart={"warm": warm},
               command=["python3", "-c", "import time; time.sleep(600)"])
    proc = subprocess.Popen([*CLUSTERCTL, "submit", str(job), "--wait"], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        verdict = wait_for_rendezvous(tmp_path / "runs", proc)
        run = verdict.parent.parent
        job_id = json.loads((run / "state.json").read_text())["job_id"]
        if how == "clusterctl cancel":
            assert cli("cancel", str(run)).exit_code == 0
        elif backend == "slurm":
            subprocess.run(["scancel", job_id], check=True, timeout=30)
        else:
            get_backend("local").cancel(job_id)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    lines = out.splitlines()
    assert proc.returncode == ExitCode.CANCELLED, out
    assert f"cancelled (exit 89): cancelled by {how}" in lines and "with exit code 89" in lines[-1], out
    assert "attempt 1 ended with exit 89: stopped: " in out and "exit 84" not in out and "exit 80" not in out, out

    st = json.loads(cli("status", str(run), "--json").stdout)
    assert (st["state"], st["exit_code"]) == ("cancelled", 89), st
    assert [(a["exit_code"], a["meaning"], a["cancelled_by"], a["culprits"]) for a in st["attempts"]] == [
        (89, f"cancelled by {how}", how, [])], st
    given = json.loads(verdict.read_text())
    assert (given["ok"], given["code"], given["culprits"]) == (False, 89, []), given
    assert given["message"].startswith(f"cancelled by {how}: "), given

    head = json.loads(cli("report", str(run), "-o", str(tmp_path / "report"), "--json").stdout)
    assert [(v["status"], v["code"]) for v in head["verdicts"]] == [("cancelled", 89)], head["verdicts"]
    assert [(a["exit_code"], a["meaning"]) for a in head["attempts_table"]] == [(89, f"cancelled by {how}")]
    trace = json.loads(cli("trace", str(run), "-o", "-").stdout)
    ends = [e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("attempt 1 end")]
    assert ends == [f"attempt 1 end (exit 89: cancelled by {how})"], ends
    suspects = cli("suspects", "--runs-root", str(tmp_path / "runs"), "--all", "--json")
    assert suspects.exit_code == 0 and json.loads(suspects.stdout) == [], suspects.output


def wait_for_rendezvous(root: Path, proc: subprocess.Popen, timeout: float = 120) -> Path:  # type: ignore[type-arg]
    """attempt-1/verdict.json once it says the rendezvous passed: the ranks run the command."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        for path in root.glob("*/attempt-1/verdict.json"):
            with contextlib.suppress(OSError, ValueError):
                if json.loads(path.read_text())["ok"]:
                    return path
        time.sleep(0.2)
    raise AssertionError(f"no rendezvous within {timeout} s")
