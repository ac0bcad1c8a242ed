"""The Slurm test cluster under what automatic recovery meets: what a batch script's TERM trap
sees while Slurm kills it (requeue against cancel), and a node lost for real under a
--no-kill job (lab.sh kill-node). The first is the same script as the local backend's check in
test_localslurm_recovery.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from test_localslurm_recovery import TRAP_SCRIPT

from tests.slurmlab.plugin import SlurmLab, wait_job

pytestmark = pytest.mark.slurm


def wait_for(check, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def text(path: Path) -> str:
    return path.read_text() if path.exists() else f"({path.name} missing)"


def test_the_term_trap_sees_completing_with_restarts_incremented_on_requeue_and_unchanged_on_cancel(
    slurm_lab: SlurmLab, tmp_path: Path
) -> None:
    path = tmp_path / "trap.sbatch"
    path.write_text(TRAP_SCRIPT)
    jobs = [slurm_lab.sbatch(f"--chdir={tmp_path}", f"--output={tmp_path}/trap-%j.out", str(path)) for _ in range(2)]
    try:
        requeued, cancelled = jobs
        wait_for(lambda: all((tmp_path / f"ready-{j}").exists() for j in jobs), 30, "both batch scripts")
        slurm_lab.run(["scontrol", "requeue", str(requeued)])
        slurm_lab.run(["scancel", str(cancelled)])
        result = wait_job(slurm_lab, cancelled, timeout=20)
        assert result.state == "CANCELLED"
        assert text(tmp_path / f"term-{cancelled}-0.txt") == "JobState=COMPLETING Restarts=0 SLURM_RESTART_COUNT=0\n"
        result = wait_job(slurm_lab, requeued, timeout=30)  # back after cred_expire + 1 s
        restarts = int(result.info.get("restart_cnt", result.info.get("Restarts", -1)))
        assert (result.state, restarts) == ("COMPLETED", 1), text(tmp_path / f"trap-{requeued}.out")
        assert text(tmp_path / f"term-{requeued}-0.txt") == "JobState=COMPLETING Restarts=1 SLURM_RESTART_COUNT=0\n"
    finally:
        slurm_lab.run(["scancel", *map(str, jobs)], check=False)


NO_KILL_JOB = """#!/bin/bash
#SBATCH --job-name=lab-nodeloss
#SBATCH --nodes=2
#SBATCH --exclusive
#SBATCH --no-kill
#SBATCH --time=3
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
echo "${nodes[*]}" > nodes.txt
srun -N2 sleep 300 &
wait $!
echo "srun rc=$?"
srun --nodelist="${nodes[0]}" -N1 printenv SLURMD_NODENAME
echo "survivor rc=$?"
"""


def test_a_no_kill_job_survives_losing_a_node_and_runs_a_step_on_the_other(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    """--exclusive: the node is killed for real, so no other test run's job may share it."""
    if not os.environ.get("CLUSTERCTL_LAB_FACTS"):
        pytest.skip("Slurm's own behaviour, recorded in the lab notes; clusterctl's use of it is drilled end to end by"
                    " test_recovery_e2e's node-lost-for-real case (CLUSTERCTL_LAB_FACTS=1 runs it)")
    path = tmp_path / "nodeloss.sbatch"
    path.write_text(NO_KILL_JOB)
    out = tmp_path / "nodeloss.out"
    job = slurm_lab.sbatch(f"--chdir={tmp_path}", f"--output={out}", str(path))
    victim = None
    try:
        def step_running() -> bool:
            steps = slurm_lab.run(["squeue", "-h", "-s", "-j", str(job), "-o", "%i"], check=False).stdout.split()
            return f"{job}.0" in steps and (tmp_path / "nodes.txt").exists()

        wait_for(step_running, 60, "the job's two-node step")
        survivor, victim = (tmp_path / "nodes.txt").read_text().split()
        killed_at = slurm_lab.kill_node(victim)
        result = wait_job(slurm_lab, job, timeout=60)
        lines = text(out).splitlines()
        assert (result.state, result.exit_code) == ("COMPLETED", 0), text(out)
        assert f"srun: error: Node failure on {victim}" in lines and "srun rc=137" in lines, text(out)
        assert lines[-2:] == [survivor, "survivor rc=0"], text(out)
        assert slurm_lab.show_job(job)["NodeList"] == survivor  # the lost node left the allocation
        assert time.time() - killed_at < 50
    finally:
        slurm_lab.run(["scancel", str(job)], check=False)
        if victim is not None:
            slurm_lab.revive(victim)
