"""The local backend end to end: the rendered quickstart job, real processes, real signals.

Each test submits examples/quickstart.yaml (2 emulated nodes x 2 ranks)
through clusterctl.actions.submit.submit_job with a small stdlib stand-in rank, and
checks what the batch script, the srun shim and the supervisor did: the
per-rank environment against the plan, per-node logs, the attempt records,
a failing rank, the time limit with its pre-timeout signal, a requeue that
excludes a node, and a cancel that leaves no process behind.

Time limits are driven through CLUSTERCTL_LOCAL_TIME_SCALE (real seconds per
emulated second), so a one-minute limit passes in a few seconds. Jobs are
rendered in standalone mode (the wrapper execs the stand-in directly): managed
mode's controller and launcher import torch, which these tests never do.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import cli

import clusterctl.actions.submit
from clusterctl.actions.submit import submit_job
from clusterctl.backends.base import JobInfo
from clusterctl.backends.local import BIN_DIR
from clusterctl.backends.local.backend import LocalBackend
from clusterctl.errors import ClusterctlError
from clusterctl.plan.binding import binding_table, rank_env
from clusterctl.plan.job import PlannedJob, load_job
from clusterctl.render.runfiles import create_run
from clusterctl.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.yaml"

# A stand-in rank (standard library only): reports its environment and pid,
# then does what argv[1] says.
RANK = r'''
import json, os, signal, sys, time

mode = sys.argv[1] if len(sys.argv) > 1 else "report"
rank = os.environ["RANK"]
report = {k: v for k, v in os.environ.items()
          if k.startswith(("CLUSTERCTL_", "SLURM")) or k in (
              "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
              "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "UCX_NET_DEVICES")}
report["pid"], report["ppid"] = os.getpid(), os.getppid()
out = os.path.join(os.environ["CLUSTERCTL_ATTEMPT_DIR"], f"rank-{rank}.json")
with open(out + ".tmp", "w") as fh:
    json.dump(report, fh)
os.replace(out + ".tmp", out)
print(f"rank {rank} on {os.environ['SLURMD_NODENAME']}", flush=True)
if mode == "fail":
    if rank == "3":
        time.sleep(0.3)
        print("rank 3 gives up", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(60)
elif mode == "sleep":
    signal.signal(signal.SIGUSR2, lambda *_: print(f"rank {rank} got SIGUSR2", flush=True))
    while True:
        time.sleep(0.05)
'''


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A private state directory and working directory; every job left running is cancelled afterwards."""
    state = tmp_path / "state"
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(state))
    monkeypatch.delenv("CLUSTERCTL_LOCAL_NODES", raising=False)
    monkeypatch.delenv("CLUSTERCTL_LOCAL_TIME_SCALE", raising=False)
    monkeypatch.delenv("CLUSTERCTL_LOCAL_REQUEUE_DELAY", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(clusterctl.actions.submit, "create_run", functools.partial(create_run, standalone=True))
    (tmp_path / "rank.py").write_text(RANK)
    yield tmp_path
    backend = LocalBackend()
    ids = [p.name for p in (state / "jobs").glob("*")] if (state / "jobs").is_dir() else []
    for job_id in ids:
        backend.cancel(job_id)
    for job_id in ids:
        wait_finished(job_id, timeout=15)


def quickstart(tmp_path: Path, mode: str, *overrides: str) -> PlannedJob:
    return load_job(
        QUICKSTART,
        overrides=[f"command=[python3,{tmp_path / 'rank.py'},{mode}]", f"runs_root={tmp_path / 'runs'}", *overrides],
    )


def wait_finished(job_id: str, timeout: float = 20) -> JobInfo:
    backend = LocalBackend()
    deadline = time.monotonic() + timeout
    while True:
        info = backend.info(job_id)
        assert info is not None, f"job {job_id} unknown"
        if info.finished:
            return info
        assert time.monotonic() < deadline, f"job {job_id} still {info.state} after {timeout} s"
        time.sleep(0.05)


def wait_for(predicate: Callable[[], bool], timeout: float = 15, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def reports(attempt: Path, world: int) -> list[dict]:
    return [json.loads((attempt / f"rank-{r}.json").read_text()) for r in range(world)]


def all_reported(attempt: Path, world: int) -> bool:
    return all((attempt / f"rank-{r}.json").exists() for r in range(world))


def events(run: RunDir) -> list[dict]:
    return [json.loads(line) for line in run.file("attempts.jsonl").read_text().splitlines() if line.strip()]


def batch_log(run: RunDir, job_id: str) -> str:
    return run.file(f"slurm-{job_id}.out").read_text()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is gone too (its parent just has not reaped it)
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def shim(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}", CLUSTERCTL_LOCAL_PYTHON=sys.executable)
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=30)


def node_logs(attempt: Path) -> dict[str, list[str]]:
    return {p.name: p.read_text().splitlines() for p in sorted((attempt / "logs").glob("*.log"))}


def test_quickstart_ranks_get_the_plan(local: Path) -> None:
    job = quickstart(local, "report")
    submitted = submit_job(job)
    assert submitted.backend == "local" and submitted.job_id
    info = wait_finished(submitted.job_id)
    assert (info.state, info.exit_code, info.nodes) == ("COMPLETED", 0, "node[1-2]")

    plan = job.plan
    run = submitted.run
    attempt = run.attempt(1)
    record = json.loads((attempt / "attempt.json").read_text())
    assert record["job_id"] == submitted.job_id and record["attempt"] == 1
    assert record["hosts"] == ["node1", "node2"] and record["master_addr"] == "127.0.0.1"
    table = binding_table(plan.node_type)
    for got in reports(attempt, plan.world_size):
        rank = int(got["RANK"])
        expected = rank_env(plan.dims.layout, plan.gpus_per_node, table, plan.node_type.gpu_vendor, rank)
        for key, value in expected.items():
            assert got.get(key) == value, (rank, key)
        assert got["MASTER_ADDR"] == "127.0.0.1" and got["MASTER_PORT"] == str(record["master_port"])
        assert got["SLURMD_NODENAME"] == record["hosts"][rank // plan.gpus_per_node]
        assert got["SLURM_PROCID"] == str(rank) and got["SLURM_LOCALID"] == str(rank % 2)
        assert got["SLURM_NODEID"] == str(rank // 2) and got["SLURM_NTASKS"] == "4"
        assert got["SLURM_JOB_ID"] == submitted.job_id and got["SLURM_STEP_NODELIST"] == "node[1-2]"
        assert got["CLUSTERCTL_ATTEMPT"] == "1" and got["CLUSTERCTL_RUN_DIR"] == str(run.path)
        assert got["CLUSTERCTL_NODES"] == "2" and "SLURM_RESTART_COUNT" not in got

    logs = node_logs(attempt)  # one file per node, every line labelled with its rank as `srun --label` does
    assert sorted(sorted(lines) for lines in logs.values()) == [
        ["0: rank 0 on node1", "1: rank 1 on node1"],
        ["2: rank 2 on node2", "3: rank 3 on node2"],
    ], logs

    start, end = events(run)
    assert start["event"] == "start" and start["attempt"] == 1 and start["job_id"] == submitted.job_id
    assert submitted.display_id == f"local-{submitted.job_id}" == run.read_state()["job_id"]
    assert start["master"] == f"127.0.0.1:{record['master_port']}"
    assert end["event"] == "end" and end["exit"] == 0 and end["srun_exit"] == 0
    assert f"attempt 1 of job {submitted.job_id}: 4 ranks on node1..node2" in batch_log(run, submitted.job_id)


def test_local_job_ids_are_shown_as_local_n_and_both_forms_are_taken(local: Path) -> None:
    """`local-N` wherever clusterctl shows a local job, so that it is never mistaken for Slurm's job N."""
    result = cli("submit", QUICKSTART, "--set", f"command=[python3,{local / 'rank.py'},report]",
                 "--set", f"runs_root={local / 'runs'}", "--wait")
    assert result.exit_code == 0, result.output
    shown = re.search(r"^submitted job (\S+) \(local\): 4 ranks on 2 nodes$", result.stdout, re.M)
    assert shown is not None, result.stdout
    job_id = shown.group(1)
    assert re.fullmatch(r"local-[0-9]+", job_id), job_id
    number = job_id.removeprefix("local-")
    assert re.search(rf"^run \S+ completed in job {job_id} with exit code 0$", result.stdout, re.M), result.stdout
    (run_path,) = (local / "runs").iterdir()
    run = RunDir(run_path)
    assert run.read_state()["job_id"] == job_id and run.read_state()["backend"] == "local"
    logs = result.stdout.replace("\n", "")  # the `logs:` line names the batch log by Slurm's kind of id
    assert f"{run.path}/slurm-{number}.out" in logs and run.file(f"slurm-{number}.out").exists()
    # Inside the job the id is Slurm's kind: a number (SLURM_JOB_ID, the port hash, attempt.json).
    assert json.loads((run.attempt(1) / "attempt.json").read_text())["job_id"] == number
    backend = LocalBackend()
    assert backend.display_id(number) == backend.display_id(job_id) == job_id
    assert backend.info(job_id) == backend.info(number) and backend.info(job_id).state == "COMPLETED"
    assert backend.info("slurm-3") is None and backend.info("local-") is None
    backend.cancel(job_id)  # a finished job: nothing to do, as scancel
    with pytest.raises(ClusterctlError, match="'12x' is not a local job id"):
        backend.cancel("12x")


def test_a_failing_rank_ends_the_job_with_84_and_the_others_are_killed(local: Path) -> None:
    submitted = submit_job(quickstart(local, "fail"))
    info = wait_finished(submitted.job_id)
    assert (info.state, info.exit_code) == ("FAILED", 84)
    attempt = submitted.run.attempt(1)
    for got in reports(attempt, 4):
        assert gone(got["pid"]), got["RANK"]
    end = events(submitted.run)[-1]
    # Slurm 22.05: srun exits with the largest task code, 128+15 for the ranks it terminated.
    assert end["event"] == "end" and end["exit"] == 84 and end["srun_exit"] == 143
    log = batch_log(submitted.run, submitted.job_id)
    assert "srun: error: node2: task 3: Exited with exit code 3" in log
    assert f"Terminating StepId={submitted.job_id}.0" in log
    assert "3: rank 3 gives up" in "\n".join(sum(node_logs(attempt).values(), []))


def test_time_limit_signals_the_batch_shell_first_and_ends_as_timeout(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_TIME_SCALE", "0.1")  # the 1-minute limit lasts 6 s, USR2 at 3 s
    submitted = submit_job(quickstart(local, "sleep", "time_limit=1", "signal.lead_s=30"))
    started = time.monotonic()
    info = wait_finished(submitted.job_id, timeout=30)
    elapsed = time.monotonic() - started
    assert info.state == "TIMEOUT" and info.reason == "TimeLimit"
    assert 5.5 <= elapsed <= 12, elapsed
    log = batch_log(submitted.run, submitted.job_id)
    assert "clusterctl: received SIGUSR2; passing it to the ranks" in log
    assert f"*** JOB {submitted.job_id} ON node1 CANCELLED AT " in log and "DUE TO TIME LIMIT ***" in log
    assert log.index("received SIGUSR2") < log.index("DUE TO TIME LIMIT")
    kinds = [e["event"] for e in events(submitted.run)]
    assert kinds[:2] == ["start", "signal"] and kinds[-1] == "end"
    attempt = submitted.run.attempt(1)
    lines = "\n".join(sum(node_logs(attempt).values(), []))
    for got in reports(attempt, 4):
        assert f"{got['RANK']}: rank {got['RANK']} got SIGUSR2" in lines  # forwarded by the batch shell through srun
        assert gone(got["pid"])


def test_scontrol_requeue_runs_attempt_2_without_the_excluded_node(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_REQUEUE_DELAY", "2")  # pending long enough for the update, even on a busy machine
    submitted = submit_job(quickstart(local, "sleep"))
    job_id, run = submitted.job_id, submitted.run
    wait_for(lambda: all_reported(run.attempt(1), 4), what="attempt 1's ranks")
    first = reports(run.attempt(1), 4)

    out = shim("scontrol", "requeue", job_id)
    assert out.returncode == 0, out.stderr
    backend = LocalBackend()
    wait_for(lambda: backend.info(job_id).state == "PENDING", what="the requeued job to be pending")
    out = shim("scontrol", "update", f"jobid={job_id}", "ExcNodeList=node1")
    assert out.returncode == 0, out.stderr
    wait_for(lambda: all_reported(run.attempt(2), 4), what="attempt 2's ranks")

    assert all(gone(got["pid"]) for got in first)
    second = reports(run.attempt(2), 4)
    assert {got["SLURMD_NODENAME"] for got in second} == {"node2", "node3"}
    assert all(got["SLURM_RESTART_COUNT"] == "1" and got["CLUSTERCTL_ATTEMPT"] == "2" for got in second)
    record = json.loads((run.attempt(2) / "attempt.json").read_text())
    assert record["job_id"] == job_id and record["hosts"] == ["node2", "node3"]
    show = shim("scontrol", "show", "job", "-o", job_id).stdout
    assert "Restarts=1 " in show and " ExcNodeList=node1 " in show and " NodeList=node[2-3] " in show
    kinds = [(e["event"], e["attempt"]) for e in events(run)]
    assert kinds[0] == ("start", 1) and ("start", 2) in kinds
    log = batch_log(run, job_id)  # appended across runs, never truncated
    assert "attempt 1 of job" in log and "attempt 2 of job" in log and "DUE TO JOB REQUEUE" in log


def test_scancel_ends_the_job_cancelled_with_no_process_left(local: Path) -> None:
    submitted = submit_job(quickstart(local, "sleep"))
    attempt = submitted.run.attempt(1)
    wait_for(lambda: all_reported(attempt, 4), what="the ranks")
    backend = LocalBackend()
    running = backend.info(submitted.job_id)
    assert running.state == "RUNNING" and running.nodes == "node[1-2]"
    got = reports(attempt, 4)
    pids = {r["pid"] for r in got} | {r["ppid"] for r in got}  # ranks and the srun shim
    out = shim("scancel", submitted.job_id)
    assert out.returncode == 0, out.stderr
    info = wait_finished(submitted.job_id)
    assert info.state == "CANCELLED"
    for pid in pids:
        assert gone(pid), pid
    assert f"*** JOB {submitted.job_id} ON node1 CANCELLED AT " in batch_log(submitted.run, submitted.job_id)
    assert backend.info("999999") is None
