"""submitit's `clusterctl` executor: functions as clusterctl runs, on the local backend and the real Slurm test cluster.

The end-to-end cases submit plain-Python functions (no torch in them; the
ranks' launcher imports torch once each) on 2 nodes x 1 rank and read the
outcome through submitit's Job API: every rank's result, an exception with
its traceback, and a Checkpointable callable stopped by the pre-timeout
signal (`clusterctl drill --pre-timeout`) that resumes in the continuation
job from the state its checkpoint() saved.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import submitit
from conftest import BACKEND_SITES
from helpers import cli
from submitit.core import plugins
from submitit.core.utils import DelayedSubmission, FailedJobError, UncompletedJobError, pickle_load

from clusterctl import rundir
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.integrations.submitit import ClusterctlExecutor, ClusterctlJob, ClusterctlJobEnvironment
from clusterctl.integrations.submitit.executor import COMMAND, submitit_state
from clusterctl.integrations.submitit.paths import RunPaths
from clusterctl.integrations.submitit.stop import decide
from clusterctl.rundir import history
from clusterctl.views import state as runstate

# The ranks import this module's functions by value: it is not importable there.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# --- what the ranks run ---------------------------------------------------------------------
def whoami(x: int) -> dict[str, Any]:
    env = submitit.JobEnvironment()
    return {"rank": env.global_rank, "tasks": env.num_tasks, "nodes": env.num_nodes, "node": env.node,
            "host": os.environ.get("SLURMD_NODENAME"), "value": x * 10 + env.global_rank, "cluster": env.cluster}


def refuse_on_rank_1() -> str:
    env = submitit.JobEnvironment()
    if env.global_rank == 1:
        # srun ends the other ranks once one fails: let rank 0 return first.
        deadline = time.monotonic() + 30
        while not RunPaths(env.run_dir, 0).result_pickle.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        raise ValueError("rank 1 refuses")
    return "fine"


class Count(submitit.helpers.Checkpointable):
    """Counts to n, 20 a second; its state (the count) is what checkpoint() pickles."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, n: int, progress: str) -> dict[str, Any]:
        resumed_from = self.count
        env = submitit.JobEnvironment()
        while self.count < n:
            self.count += 1
            if env.global_rank == 0:
                Path(progress).write_text(str(self.count))
            time.sleep(0.05)
        return {"rank": env.global_rank, "count": self.count, "resumed_from": resumed_from, "attempt": env.attempt}


# --- helpers --------------------------------------------------------------------------------
def executor(backend: str, tmp_path: Path, **spec: Any) -> ClusterctlExecutor:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"name": "fn", "site": BACKEND_SITES[backend], "time_limit": "10m", **spec}))
    ex = ClusterctlExecutor(tmp_path / "submitit", spec=path)
    ex.update_parameters(nodes=2, tasks_per_node=1)
    return ex


def story(job: ClusterctlJob) -> str:
    run = job.run_dir
    logs = [p.read_text()[-2500:] for p in sorted(run.glob("slurm-*.out")) + sorted(run.glob("attempt-*/logs/node-*.log"))]
    return f"{(run / rundir.ATTEMPTS).read_text()}\n" + "\n".join(logs)


def wait_for(what: str, check: Any, job: ClusterctlJob, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s\n{story(job)}"
        time.sleep(0.2)
    return found


# --- the plugin, its parameters, its states (no jobs) ---------------------------------------
def test_submitit_finds_the_executor_and_the_environment_through_its_entry_points(tmp_path: Path) -> None:
    assert plugins.get_executors()["clusterctl"] is ClusterctlExecutor
    assert isinstance(plugins.get_job_environments()["clusterctl"], ClusterctlJobEnvironment)
    auto = submitit.AutoExecutor(tmp_path, cluster="clusterctl", clusterctl_max_num_timeout=5)
    assert isinstance(auto._executor, ClusterctlExecutor) and auto._executor.max_num_timeout == 5
    # Never picked unasked, and Slurm's own parameter names still mean Slurm's.
    assert submitit.AutoExecutor.which() != "clusterctl"
    assert auto._deprecated_args.get("partition") == "slurm_partition"
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\ntime_limit: 5\n")
    assert submitit.AutoExecutor(tmp_path, cluster="clusterctl", clusterctl_spec=spec)._executor.spec == spec


def test_submitits_parameters_become_spec_fields(tmp_path: Path) -> None:
    ex = submitit.AutoExecutor(tmp_path / "f", cluster="clusterctl")
    ex.update_parameters(timeout_min=5, nodes=2, tasks_per_node=2, name="probe", clusterctl_overrides=["watchdog.hang_timeout=30"])
    job = ex._executor.load_job()
    spec = job.spec
    # submitit's 5-minute default must not meet the 300 s lead of long jobs: the spec's lead is a tenth of the limit.
    assert (spec.time_limit, spec.lead_s, spec.nodes, spec.gpus_per_node, spec.name) == (300, 30, 2, 2, "probe")
    assert (spec.site, spec.command, spec.restart.budget, spec.watchdog.hang_timeout) == ("local", COMMAND, 0, 30)
    assert Path(spec.runs_root) == tmp_path / "f" and job.plan.world_size == 4
    ex.update_parameters(timeout_min=1)
    assert ex._executor.load_job().spec.lead_s == 6


def test_a_spec_keeps_its_own_values_unless_a_parameter_says_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"name": "mine", "site": "local", "time_limit": "2h", "nodes": 1, "runs_root": str(tmp_path / "r")}))
    ex = ClusterctlExecutor(tmp_path / "f", spec=path)
    spec = ex.load_job().spec
    assert (spec.time_limit, spec.lead_s, spec.runs_root, spec.restart.budget) == (7200, 300, str(tmp_path / "r"), 0)
    path.write_text(json.dumps({"name": "mine", "time_limit": "2h", "nodes": 1, "restart": {"budget": 2}}))
    assert ex.load_job().spec.restart.budget == 2  # the spec's own choice
    ex.update_parameters(restart_budget=1)
    assert ex.load_job().spec.restart.budget == 1
    ex.update_parameters(slurm_partition="local", gpus_per_node=3)
    assert ex.load_job().plan.gpus_per_node == 3


def test_parameters_a_user_gets_wrong_are_refused_with_the_reason(tmp_path: Path) -> None:
    ex = ClusterctlExecutor(tmp_path / "f")
    with pytest.raises(ClusterctlError, match="unknown parameter qos") as unknown:
        ex.update_parameters(qos="high")
    assert unknown.value.exit_code == ExitCode.USAGE
    ex.update_parameters(tasks_per_node=2, gpus_per_node=4)
    with pytest.raises(ClusterctlError, match="one rank per GPU"):
        ex.load_job()
    ex = ClusterctlExecutor(tmp_path / "f")
    ex.update_parameters(nodes=9)  # the local site has 4 nodes
    with pytest.raises(ClusterctlError) as refused:
        ex.submit(pow, 2, 10)
    assert refused.value.exit_code == ExitCode.BAD_CONFIG and "nodes" in refused.value.message
    assert not list((tmp_path / "f").glob("fn-*")) and not list((tmp_path / "f").glob("submitit-*"))  # nothing submitted
    with pytest.warns(UserWarning, match="cpus_per_task is ignored"):
        ex.update_parameters(cpus_per_task=8)
    with pytest.raises(ClusterctlError, match="no such file"):
        ClusterctlExecutor(tmp_path / "f", spec=tmp_path / "missing.yaml")


def test_clusterctl_states_in_submitits_words() -> None:
    words = {state: submitit_state(state) for state in runstate.STATES}
    assert words == {"pending": "PENDING", "starting": "RUNNING", "training": "RUNNING", "restarting": "RUNNING",
                     "stopping": "RUNNING",
                     "continued": "REQUEUED", "completed": "COMPLETED", "failed": "FAILED", "cancelled": "CANCELLED",
                     "dry-run": "UNKNOWN"}  # nothing was submitted: submitit has no word for it


def test_the_job_environment_is_the_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {"SUBMITIT_EXECUTOR": "clusterctl", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                        "GROUP_RANK": "1", "CLUSTERCTL_NODES": "2", "SLURM_JOB_ID": "77", "CLUSTERCTL_ATTEMPT": "2",
                        "CLUSTERCTL_RUN_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    env = submitit.JobEnvironment()
    assert isinstance(env, ClusterctlJobEnvironment)
    assert (env.global_rank, env.num_tasks, env.local_rank, env.node, env.num_nodes, env.job_id, env.attempt) == (3, 4, 1, 1, 2, "77", 2)
    assert env.paths.result_pickle == tmp_path / "submitit" / "rank-3.result.pkl"


def test_a_stop_checkpoints_a_checkpointable_callable_and_runs_on_without_one(tmp_path: Path) -> None:
    """submitit's rules, decided by rank 0 when the stop flag comes."""
    submitted = tmp_path / "submitted.pkl"
    counter = Count()
    counter.count = 7
    delayed = DelayedSubmission(counter, 10, "p")
    delayed.set_timeout(5, 1)
    assert decide(delayed, submitted, timed_out=True).go
    resumed = pickle_load(submitted)
    assert (resumed.function.count, resumed.args, resumed._timeout_countdown) == (7, (10, "p"), 0)
    assert not decide(resumed, submitted, timed_out=True).go  # max_num_timeout reached: it runs on
    plain = DelayedSubmission(pow, 2, 10)
    plain.set_timeout(5, 3)
    assert not decide(plain, tmp_path / "none.pkl", timed_out=True).go  # nothing to save: rerunning would time out again
    assert decide(plain, tmp_path / "none.pkl", timed_out=False).go  # preempted: called again from the start
    assert not (tmp_path / "none.pkl").exists()


# --- functions as runs ----------------------------------------------------------------------
def test_pow_on_a_laptop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    job = submitit.AutoExecutor(tmp_path / "f", cluster="clusterctl").submit(pow, 2, 10)
    assert job.result() == 1024
    assert job.state == "COMPLETED" and job.done()
    job.cancel()  # an ended run stays as it ended
    assert job.state == "COMPLETED"


def test_cancel_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    monkeypatch.setattr(ClusterctlJob, "_results_timeout_s", 0)
    job = ClusterctlExecutor(tmp_path / "f").submit(time.sleep, 600)
    job.cancel()
    job.wait()  # the batch script may still be on its way out
    assert job.state == "CANCELLED"
    error = job.exception()
    assert isinstance(error, UncompletedJobError) and "cancelled" in str(error)


def test_a_two_node_function_returns_every_ranks_result(backend: str, tmp_path: Path) -> None:
    if backend == "local":
        pytest.skip("the plugin's path is the same on both backends: run on the test cluster (the local backend: below)")
    job = executor(backend, tmp_path).submit(whoami, 4)
    assert job.num_tasks == 2 and job.state in ("PENDING", "RUNNING")
    results = job.results()
    assert [(r["rank"], r["tasks"], r["nodes"], r["node"], r["value"], r["cluster"]) for r in results] == [
        (0, 2, 2, 0, 40, "clusterctl"), (1, 2, 2, 1, 41, "clusterctl")], story(job)
    assert results[0]["host"] != results[1]["host"]
    assert job.state == "COMPLETED" and job.task(1).result() == results[1]
    assert job.get_info()["RunState"] == "completed" and job.run_dir.parent == tmp_path / "submitit"


def test_an_exception_comes_back_with_its_traceback(backend: str, tmp_path: Path) -> None:
    if backend == "slurm":
        pytest.skip("the plugin's path is the same on both backends: run on the local one (the test cluster: above)")
    job = executor(backend, tmp_path).submit(refuse_on_rank_1)
    error = job.exception()
    assert isinstance(error, FailedJobError), story(job)
    assert "Traceback" in str(error) and "ValueError: rank 1 refuses" in str(error) and "refuse_on_rank_1" in str(error)
    with pytest.raises(FailedJobError, match="rank 1 refuses"):
        job.results()
    assert job.task(0).result() == "fine"
    # clusterctl's side tells the same: the verdict names rank 1 and keeps the traceback; no restart.
    assert job.state == "FAILED" and job.get_info()["Reason"]
    verdict = json.loads((job.run_dir / "attempt-1" / rundir.VERDICT).read_text())
    assert verdict["code"] == ExitCode.SCRIPT_FAILED and verdict["culprits"][0]["rank"] == 1
    assert "ValueError: rank 1 refuses" in verdict["evidence"]["traceback"]
    assert rundir.RunDir(job.run_dir).attempts() == [1]
    assert "rank 1 refuses" in (job.task(1).stderr() or "")


def test_a_checkpointable_function_resumes_after_the_pre_timeout_signal(backend: str, tmp_path: Path) -> None:
    if backend == "local":
        pytest.skip("the plugin's path is the same on both backends; the local backend's signal is test_recovery_e2e's")
    progress = tmp_path / "progress"
    job = executor(backend, tmp_path).submit(Count(), 60, str(progress))
    wait_for("counting", lambda: progress.exists() and int(progress.read_text() or 0) >= 3, job)
    drilled = cli("drill", str(job.run_dir), "--pre-timeout", "--timeout", "120", "--json")
    assert drilled.exit_code == 0, (drilled.output, story(job))
    assert json.loads(drilled.stdout)["code"] == ExitCode.PRE_TIMEOUT
    results = job.results()
    assert [r["rank"] for r in results] == [0, 1] and all(r["count"] == 60 for r in results), story(job)
    # Both ranks resumed from rank 0's checkpoint, in attempt 2 (the continuation job).
    resumed = {r["resumed_from"] for r in results}
    assert len(resumed) == 1 and 0 < resumed.pop() < 60 and {r["attempt"] for r in results} == {2}
    run = rundir.RunDir(job.run_dir)
    step = next(e for e in history.read_events(run.events_file) if e.get("event") == history.EVENT_NEXT)
    assert step["how"] == history.NEXT_CONTINUATION and step["exit"] == ExitCode.PRE_TIMEOUT and not step["counted"]
    second = json.loads((run.attempt(2) / rundir.ATTEMPT_JSON).read_text())
    assert second["job_id"] == step["next_job"] != json.loads((run.attempt(1) / rundir.ATTEMPT_JSON).read_text())["job_id"]
    assert job.state == "COMPLETED"
