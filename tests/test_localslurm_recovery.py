"""The local backend's emulated Slurm under what automatic recovery does: a continuation job
submitted from inside a job, a requeue from inside, what a batch script's TERM trap sees while
Slurm kills it (requeue or cancel), and a node failure with and without --no-kill.

Small bash batch scripts only; each test runs a few seconds of real time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_local_shims import state  # noqa: F401 - the emulated Slurm's private state directory, shims first on PATH

from clusterctl.backends.local import BIN_DIR
from clusterctl.backends.local.backend import LocalBackend
from clusterctl.backends.local.batchopts import OptionError, parse_request

# What a recovery step does before it calls sbatch or scontrol for the next attempt: drop the
# job's own SLURM_*/SBATCH_* variables (the CLUSTERCTL_LOCAL_* ones stay).
CLEAN_ENV = 'for v in $(compgen -e | grep -E "^(SLURM|SBATCH)_"); do unset "$v"; done'

# The batch script's TERM trap writes what `scontrol show job` says while the job is being killed.
# Shared with the same check on the Slurm test cluster (test_slurmlab_nodeloss.py).
TRAP_SCRIPT = """#!/bin/bash
#SBATCH --job-name=trap-term
#SBATCH --open-mode=append
on_term() {
  scontrol show job -o "$SLURM_JOB_ID" | grep -o 'JobState=[^ ]*\\|Restarts=[^ ]*' | tr '\\n' ' ' \\
    > "term-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}.txt"
  echo "SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}" >> "term-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}.txt"
  exit 0
}
trap on_term TERM
if [ -n "${SLURM_RESTART_COUNT:-}" ]; then
  echo "rerun $SLURM_RESTART_COUNT"
  exit 0
fi
touch "ready-$SLURM_JOB_ID"
sleep 60 &
wait
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30)


def wait_until(check, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def sbatch(*args: str) -> str:
    out = run("sbatch", "--parsable", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def finished(job_id: str, timeout: float = 20) -> dict[str, str]:
    wait_until(lambda: LocalBackend().info(job_id).finished, timeout, f"job {job_id} to end")
    return show(job_id)


def show(job_id: str) -> dict[str, str]:
    out = run("scontrol", "show", "job", "-o", job_id).stdout
    return dict(word.split("=", 1) for word in out.split() if "=" in word)


def text(path: Path) -> str:
    return path.read_text() if path.exists() else f"({path.name} missing)"


def record(root: Path, job_id: str) -> dict:
    return json.loads((root / "jobs" / job_id / "state.json").read_text())


def script(path: Path, body: str, *directives: str) -> Path:
    path.write_text("\n".join(["#!/bin/bash", *(f"#SBATCH {d}" for d in directives), body]) + "\n")
    return path


# -- continuation and requeue from inside the job ---------------------------------------------


def test_a_continuation_submitted_from_inside_outlives_the_job_that_submitted_it(state: Path, tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    body = f"""
echo "$SLURM_JOB_ID ${{SLURM_RESTART_COUNT:-0}} $SLURM_JOB_NODELIST" >> runs.txt
if [ ! -e continued ]; then
  touch continued
  sleep 60 &  # left behind: the end of this job kills it, and nothing of the next job
  me=$SLURM_JOB_ID
  next=$( {CLEAN_ENV}; sbatch --parsable --exclude=node2 --dependency=afterany:$me {path} ) || exit 3
  echo "$next" > next-id
  while [ ! -e go ]; do sleep 0.05; done
fi
"""
    first = sbatch(str(script(path, body, "--nodes=2", "--output=out-%j.txt")))
    wait_until(lambda: (tmp_path / "next-id").exists(), 15, "the continuation's submission")
    second = (tmp_path / "next-id").read_text().strip()
    assert int(second) == int(first) + 1
    assert (show(second)["JobState"], show(second)["Reason"]) == ("PENDING", "Dependency")
    (tmp_path / "go").touch()
    assert finished(first)["JobState"] == "COMPLETED"
    info = finished(second)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), text(tmp_path / f"out-{second}.txt")
    runs = (tmp_path / "runs.txt").read_text().split("\n")
    assert runs[:2] == [f"{first} 0 node[1-2]", f"{second} 0 node[1,3]"]
    assert record(state, second)["start_time"] >= record(state, first)["end_time"]


def test_a_requeue_from_inside_reruns_the_job_without_the_node_its_term_trap_excluded(state: Path, tmp_path: Path) -> None:
    body = f"""
echo "$SLURM_JOB_ID ${{SLURM_RESTART_COUNT:-0}} $SLURM_JOB_NODELIST" >> runs.txt
if [ -z "${{SLURM_RESTART_COUNT:-}}" ]; then
  me=$SLURM_JOB_ID
  on_term() {{ scontrol update jobid=$me ExcNodeList=node2 >> trap.txt 2>&1; echo "update rc=$?" >> trap.txt; exit 0; }}
  trap on_term TERM
  ( {CLEAN_ENV}; scontrol requeue $me ) || exit 3
  sleep 30 &
  wait
fi
"""
    job = sbatch(str(script(tmp_path / "r.sbatch", body, "--nodes=2", "--output=r.out", "--open-mode=append")))
    info = finished(job)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), text(tmp_path / "r.out")
    assert (tmp_path / "trap.txt").read_text() == "update rc=0\n"  # during the kill, as on Slurm 22.05
    assert (tmp_path / "runs.txt").read_text().split("\n")[:2] == [f"{job} 0 node[1-2]", f"{job} 1 node[1,3]"]
    assert "DUE TO JOB REQUEUE" in (tmp_path / "r.out").read_text()


# -- what the TERM trap sees: requeue against cancel --------------------------------------------


def start_trap_job(tmp_path: Path) -> str:
    job = sbatch("--output=trap.out", str(script(tmp_path / "trap.sbatch", TRAP_SCRIPT.split("\n", 1)[1])))
    wait_until(lambda: (tmp_path / f"ready-{job}").exists(), 15, "the batch script")
    return job


def test_the_term_trap_sees_completing_with_restarts_incremented_on_requeue_and_unchanged_on_cancel(
    state: Path, tmp_path: Path
) -> None:
    requeued = start_trap_job(tmp_path)
    assert run("scontrol", "requeue", requeued).returncode == 0
    info = finished(requeued)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1")
    assert (tmp_path / f"term-{requeued}-0.txt").read_text() == "JobState=COMPLETING Restarts=1 SLURM_RESTART_COUNT=0\n"

    cancelled = start_trap_job(tmp_path)
    assert run("scancel", cancelled).returncode == 0
    info = finished(cancelled)
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0")
    assert (tmp_path / f"term-{cancelled}-0.txt").read_text() == "JobState=COMPLETING Restarts=0 SLURM_RESTART_COUNT=0\n"
    update = run("scontrol", "update", f"jobid={cancelled}", "ExcNodeList=node2")
    assert update.returncode == 1 and "Job has already finished" in update.stderr


# -- node failure ---------------------------------------------------------------------------------


def test_no_kill_is_accepted_in_directives_and_on_the_command_line() -> None:
    assert parse_request("#!/bin/bash\n#SBATCH --no-kill\n", []).no_kill
    assert parse_request("#!/bin/bash\n#SBATCH -k\n#SBATCH -N2\n", []).no_kill
    assert parse_request("#!/bin/bash\n", ["-k", "-N", "2"]).nodes == 2
    assert not parse_request("#!/bin/bash\n#SBATCH --no-kill\n", ["--no-kill=off"]).no_kill
    assert not parse_request("#!/bin/bash\n", []).no_kill
    with pytest.raises(OptionError):
        parse_request("#!/bin/bash\n#SBATCH --no-kill=maybe\n", [])


def test_scontrol_marks_emulated_nodes_down_and_back(state: Path) -> None:
    no_reason = run("scontrol", "update", "NodeName=node2", "State=DOWN")
    assert no_reason.returncode == 1 and "You must specify a reason when DOWNING" in no_reason.stderr
    unknown = run("scontrol", "update", "NodeName=node9", "State=DOWN", "Reason=x")
    assert unknown.returncode == 1 and "Invalid node name specified" in unknown.stderr
    up = run("scontrol", "update", "NodeName=node2", "State=RESUME")
    assert up.returncode == 1 and "Invalid node state specified" in up.stderr  # it was not down
    assert run("scontrol", "update", "NodeName=node[2-3]", "State=DOWN", "Reason=bad gpu").returncode == 0
    assert sorted(p.stem for p in (state / "nodes").glob("*.json")) == ["node2", "node3"]
    assert run("scontrol", "update", "NodeName=node[2-3]", "State=RESUME").returncode == 0
    assert list((state / "nodes").glob("*.json")) == []


NODE_LOSS_BODY = """
srun -N2 sleep 30 &
wait $!
echo "srun rc=$?"
scontrol show job -o $SLURM_JOB_ID | grep -o 'JobState=[^ ]*\\|NumNodes=[^ ]*\\|NodeList=node[^ ]*' | tr '\\n' ' '; echo
srun --nodelist=node1 -N1 printenv SLURMD_NODENAME; echo "srun alive rc=$?"
srun --nodelist=node2 -N1 true; echo "srun lost rc=$?"
srun printenv SLURMD_NODENAME; echo "srun plain rc=$?"
timeout -s TERM 0.5 srun -N2 true; echo "srun -N2 rc=$?"
"""


def step_running(state: Path, job: str) -> bool:
    return any((state / "jobs" / job / "steps").glob("*.json"))


def test_a_no_kill_job_loses_the_node_and_its_step_and_runs_on(state: Path, tmp_path: Path) -> None:
    job = sbatch(str(script(tmp_path / "nk.sbatch", NODE_LOSS_BODY, "--nodes=2", "--no-kill", "--output=nk.out")))
    wait_until(lambda: step_running(state, job), 15, "the step")
    assert run("scontrol", "update", "NodeName=node2", "State=DOWN", "Reason=lost").returncode == 0
    info = finished(job)
    out = text(tmp_path / "nk.out")
    assert (info["JobState"], info["ExitCode"], info["NodeList"], info["NumNodes"]) == ("COMPLETED", "0:0", "node1", "1"), out
    lines = out.splitlines()
    # srun's own words when the node's slurmd died (Slurm 22.05, measured): the lost node's tasks go unreported.
    assert lines[:4] == [
        "srun: error: Node failure on node2",
        "srun: error: node1: task 0: Killed",
        f"srun: Force Terminated StepId={job}.0",
        "srun rc=137",
    ], out
    assert lines[4].split() == ["JobState=RUNNING", "NodeList=node1", "NumNodes=1"], out
    assert lines[5:7] == ["node1", "srun alive rc=0"], out
    assert lines[7:9] == [
        f"srun: error: Unable to create step for job {job}: Requested node configuration is not available",
        "srun lost rc=1",
    ], out
    assert lines[9:12] == [
        "srun: error: SLURM_JOB_NUM_NODES environment variable conflicts with allocated node count (2 != 1).",
        "node1",
        "srun plain rc=0",
    ], out
    assert lines[12:15] == [  # more nodes than are left: pending until signalled, as on Slurm
        "srun: Cancelled pending job step with signal 15",
        f"srun: error: Unable to create step for job {job}: Job/step already completing or completed",
        "srun -N2 rc=124",
    ], out


def test_without_no_kill_a_node_failure_requeues_the_job_away_from_the_down_node(state: Path, tmp_path: Path) -> None:
    body = 'echo "run ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST"\n[ -n "${SLURM_RESTART_COUNT:-}" ] || { srun -N2 sleep 30 & wait; }'
    job = sbatch(str(script(tmp_path / "rq.sbatch", body, "--nodes=2", "--output=rq.out", "--open-mode=append")))
    wait_until(lambda: step_running(state, job), 15, "the step")
    assert run("scontrol", "update", "NodeName=node2", "State=DOWN", "Reason=lost").returncode == 0
    info = finished(job)
    out = text(tmp_path / "rq.out")
    assert (info["JobState"], info["Restarts"], info["NodeList"]) == ("COMPLETED", "1", "node[1,3]"), out
    assert "run 0 on node[1-2]" in out and "run 1 on node[1,3]" in out
    assert "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS" in out


def test_without_no_kill_or_requeue_a_node_failure_ends_the_job_node_fail(state: Path, tmp_path: Path) -> None:
    body = "srun -N2 sleep 30 &\nwait"
    job = sbatch(str(script(tmp_path / "nf.sbatch", body, "--nodes=2", "--no-requeue", "--output=nf.out")))
    wait_until(lambda: step_running(state, job), 15, "the step")
    assert run("scontrol", "update", "NodeName=node2", "State=DOWN", "Reason=lost").returncode == 0
    info = finished(job)
    assert (info["JobState"], info["Reason"], info["Restarts"]) == ("NODE_FAIL", "NodeDown", "0")
    assert info["ExitCode"] == "0:15"  # the batch shell died of SIGTERM, as measured
    assert f"*** JOB {job} ON node1 CANCELLED AT " in (tmp_path / "nf.out").read_text()


def test_new_jobs_do_not_start_on_down_nodes(state: Path, tmp_path: Path) -> None:
    assert run("scontrol", "update", "NodeName=node2", "State=DOWN", "Reason=lost").returncode == 0
    anywhere = sbatch("--nodes=2", str(script(tmp_path / "a.sbatch", "true")))
    pinned = sbatch("--nodelist=node2", str(script(tmp_path / "p.sbatch", "true")))
    assert finished(anywhere)["NodeList"] == "node[1,3]"
    wait_until(lambda: show(pinned).get("Reason") == "ReqNodeNotAvail", 10, "the pinned job to wait")
    assert show(pinned)["JobState"] == "PENDING"
    assert run("scontrol", "update", "NodeName=node2", "State=RESUME").returncode == 0
    assert finished(pinned)["NodeList"] == "node2"
