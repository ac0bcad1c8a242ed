"""Recovery without a human, end to end: torch ranks, faults from outside, the run's own record.

Each case submits the reference trainer, or a user's own DDP script with the
Contract (2 ranks: 2 nodes x 1 GPU, a tiny model, a checkpoint every 10 steps) on the local backend and on the real
Slurm test cluster, injects a fault with `clusterctl drill` (or scancel,
or `clusterctl cancel`), and asserts what a user checks afterwards: how the
next attempt began (attempts.jsonl `next`), on which nodes, from which step
it resumed, what Slurm says about the job, and that nothing is left queued.
A spent budget (`restart.budget: 0`, a killed rank: the run fails with 87,
`status` names the budget and the culprit) is the recovery guide's runnable
example (docs/guide/recovery.md, run by test_docs_examples); the budget's
arithmetic is test_recovery_policy's.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKEND_SITES, cancel_slurm_jobs_under
from helpers import cli

from clusterctl import rundir
from clusterctl.actions.runjobs import run_jobs
from clusterctl.actions.submit import Submitted, submit_job
from clusterctl.backends import get_backend
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.job import load_job
from clusterctl.rundir import RunDir, history, rankmanifest
from clusterctl.rundir import verdict as verdictfile

INTERVAL = 10  # checkpoint.interval, steps
ROOT = Path(__file__).resolve().parents[1]
CONTRACT_DDP = ROOT / "examples" / "own-script" / "train_ddp_contract.py"


def submit(backend: str, tmp_path: Path, name: str, steps: int = 60, **extra: Any) -> Submitted:
    spec = {
        "name": name,
        "site": BACKEND_SITES[backend],
        "time_limit": "20m",
        "nodes": 2,
        "gpus_per_node": 1,
        "runs_root": str(tmp_path / "runs"),
        "checkpoint": {"interval": INTERVAL, "memory_interval": 0},  # the durable path (test_warm: from memory)
        "model": {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "ffn": 64},
        "seq_len": 16,
        "batch": {"micro": 2, "grad_accum": 1},
        "command": ["python3", "-m", "clusterctl.trainer", "--steps", str(steps), "--eval-interval", "0",
                    "--step-compute-s", "0.05"],
        **extra,
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(spec))
    project = tmp_path / "project"  # where the user types `clusterctl submit`: every job of the run runs there
    project.mkdir(exist_ok=True)
    with contextlib.chdir(project):
        return submit_job(load_job(path), backend)


def ranks_ran_in(run: RunDir, attempt: int) -> set[str]:
    """The working directories the attempt's ranks registered (manifest.json)."""
    return {r.get("cwd") for r in rankmanifest.iter_ranks(run.attempt(attempt) / rundir.MANIFEST)}


def wait_for(what: str, check: Any, timeout: float = 120, run: RunDir | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s" + (f"\n{story(run)}" if run else "")
        time.sleep(0.3)
    return found


def story(run: RunDir) -> str:
    logs = "\n".join(p.read_text()[-3000:] for p in run.path.glob("slurm-*.out"))
    return f"{run.path / rundir.ATTEMPTS}:\n{(run.path / rundir.ATTEMPTS).read_text()}\n{logs}"


def nexts(run: RunDir) -> list[dict[str, Any]]:
    return [e for e in history.read_events(run.events_file) if e.get("event") == history.EVENT_NEXT]


def run_stopped(run: RunDir) -> dict[str, Any] | None:
    """The `next` event that ended the run (finished, stopped), if it came."""
    found = nexts(run)
    return found[-1] if found and found[-1]["how"] in (history.NEXT_STOP, history.NEXT_SLURM) else None


def drill(run: RunDir, *args: str) -> dict[str, Any]:
    result = cli("drill", str(run.path), *args, "--timeout", "120", "--json")
    assert result.exit_code == 0, (result.output, story(run))
    return json.loads(result.stdout)


def first_step(run: RunDir, attempt: int) -> int:
    path = run.attempt(attempt) / rundir.METRICS
    wait_for(f"attempt {attempt}'s first step", lambda: path.exists() and path.read_text().strip(), run=run)
    return json.loads(path.read_text().splitlines()[0])["step"]


def past_a_checkpoint(run: RunDir) -> None:
    """Training went beyond the first committed checkpoint (step INTERVAL - 1): a restart has one to resume."""
    path = run.attempt(1) / rundir.METRICS

    def far() -> bool:
        lines = path.read_text().splitlines() if path.exists() else []
        return bool(lines) and json.loads(lines[-1])["step"] >= INTERVAL + 2

    wait_for("training past the first checkpoint", far, run=run)


def status(run: RunDir) -> dict[str, Any]:
    """What `clusterctl status RUN --json` says: the state a user reads."""
    result = cli("status", str(run.path), "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def nothing_left(backend: str, run: RunDir) -> None:
    be = get_backend(backend)
    for job in run_jobs(run):
        wait_for(f"job {job} to end", lambda job=job: (i := be.info(job)) is None or i.finished, 60, run)


def losses(run: RunDir, attempt: int) -> dict[int, str]:
    """The attempt's loss at each step, as rank 0 recorded it (hex: bitwise)."""
    path = run.attempt(attempt) / rundir.METRICS
    lines = path.read_text().splitlines() if path.exists() else []
    return {r["step"]: r["loss_hex"] for r in map(json.loads, lines) if "loss_hex" in r}


def same_as_uninterrupted(backend: str, tmp_path: Path, run: RunDir, attempts: int, steps: int, spec: dict[str, Any]) -> None:
    """Every loss of `run` (a step computed twice: its last attempt's) bitwise equal to the same job run without a fault."""
    (tmp_path / "whole").mkdir()
    # The reference must run in one attempt: a straggler verdict on one of its healthy ranks (the lab's 4 ranks and
    # its controller share 2 cores) would restart it, and it is a reference for losses, not a test of verdicts.
    calm = {**spec, "watchdog": {**spec.get("watchdog", {}), "straggler_factor": 1000}}
    whole = submit(backend, tmp_path / "whole", "whole", steps=steps, **calm).run
    wait_for("the uninterrupted run", lambda: max(losses(whole, 1), default=-1) == steps - 1, run=whole)
    interrupted: dict[int, str] = {}
    for attempt in range(1, attempts + 1):
        interrupted.update(losses(run, attempt))
    assert interrupted == losses(whole, 1)


def test_a_killed_rank_restarts_in_the_allocation_from_the_last_committed_step(backend: str, tmp_path: Path) -> None:
    """A user's own DDP script with the Contract's few lines (examples/own-script/train_ddp_contract.py)."""
    if backend == "local":
        pytest.skip("a killed rank restarting in the allocation on the local backend: test_integrations_e2e's"
                    " (the Lightning and Hugging Face examples) and qualify's failure rung (the reference trainer)")
    done = submit(backend, tmp_path, "rec-kill", command=["python3", str(CONTRACT_DDP)], env={"STEPS": "60", "BUSY_S": "0.05"})
    run = done.run
    past_a_checkpoint(run)
    report = drill(run, "--kill", "1")
    assert report["code"] == ExitCode.SCRIPT_FAILED and report["culprit_right"] and report["seconds"] < 15, report
    stop = wait_for("the run to finish", lambda: run_stopped(run), run=run)
    verdict = json.loads((run.attempt(1) / "verdict.json").read_text())  # the killed rank blamed, not its peer
    hosts = json.loads((run.attempt(1) / rundir.ATTEMPT_JSON).read_text())["hosts"]
    assert [(c["rank"], c["host"]) for c in verdict["culprits"]] == [(1, hosts[1])] and verdict["evidence"]["how"] == "Killed"
    # the survivor is named as reacting to the kill: the peer error it saw (gloo words it several ways:
    # closed, reset, broken pipe, a store error) or srun's stop
    assert [v["rank"] for v in verdict["victims"]] == [0], verdict
    assert verdict["victims"][0]["reason"].startswith(("peer failure seen here:", "stopped by srun")), verdict
    first = nexts(run)[0]
    assert first["how"] == history.NEXT_ALLOCATION and first["exit"] == ExitCode.SCRIPT_FAILED and first["counted"]
    assert first["hosts"] == hosts  # a first script failure retries in place
    committed = first["committed_step"]
    assert committed is not None and (committed + 1) % INTERVAL == 0
    assert first_step(run, 2) == committed + 1  # resumed right after the newest committed checkpoint
    assert stop["how"] == history.NEXT_STOP and stop["exit"] == 0, story(run)
    assert {e["job_id"] for e in history.read_events(run.events_file) if e.get("event") == history.EVENT_START} == {done.job_id}
    nothing_left(backend, run)
    info = get_backend(backend).info(done.job_id)
    assert info is None or info.state == "COMPLETED"
    st = status(run)
    assert (st["state"], st["exit_code"], st["step"]) == ("completed", 0, 59), st
    one, two = st["attempts"]
    assert (one["exit_code"], one["next"], two["first_step"]) == (ExitCode.SCRIPT_FAILED, "allocation", committed + 1)
    assert one["kept_steps"] == committed + 1 and one["steps"] >= one["kept_steps"]
    assert 0 < st["goodput"] < 1
    if one["steps"] > one["kept_steps"]:  # the kill came after more steps than the checkpoint kept: those were redone
        assert st["lost_gpu_hours"] > 0, st


def test_a_hung_rank_is_replaced_by_the_spare_node(backend: str, tmp_path: Path) -> None:
    if backend == "local":
        pytest.skip("the spare's choice is the batch host's recovery step, the same on both: run on the test cluster")
    done = submit(backend, tmp_path, "rec-hang", steps=400, spares=1,
                  watchdog={"hang_timeout": "20s", "save_timeout": "15s"})  # the stop may come during a save
    run = done.run
    past_a_checkpoint(run)
    report = drill(run, "--hang", "0")  # the first node's: its spare sorts after the other node
    assert report["code"] == ExitCode.HANG and report["culprit_right"]
    before = json.loads((run.attempt(1) / rundir.ATTEMPT_JSON).read_text())
    culprit = before["hosts"][0]
    restart = wait_for("the restart", lambda: nexts(run), run=run)[0]
    assert restart["how"] == history.NEXT_ALLOCATION and restart["exclude"] == [culprit]
    spare = next(iter(set(restart["hosts"]) - set(before["hosts"])))
    # In the allocation's order, as srun places the ranks (rank 0 now runs on the other node).
    assert restart["hosts"] == [before["hosts"][1], spare] and restart["replaced"] == {culprit: spare}
    assert first_step(run, 2) == restart["committed_step"] + 1
    after = json.loads((run.attempt(2) / rundir.ATTEMPT_JSON).read_text())
    assert after["hosts"] == restart["hosts"] and after["job_id"] == done.job_id
    suspects = [json.loads(line) for line in (run.path.parent / "suspects.jsonl").read_text().splitlines()]
    assert [(s["node"], s["code"], s["run"], s["drill"]) for s in suspects] == [(culprit, ExitCode.HANG, run.path.name, True)]
    result = cli("cancel", str(run.path), "--json")
    assert result.exit_code == 0, result.output
    nothing_left(backend, run)


def test_a_lost_node_without_a_spare_continues_in_a_new_job_that_excludes_it(backend: str, tmp_path: Path) -> None:
    if backend == "local":
        pytest.skip("the continuation that excludes a node is the batch host's recovery step, the same on both: run on"
                    " the test cluster (the local backend's lost node: test_detection_e2e's)")
    done = submit(backend, tmp_path, "rec-node", steps=400)
    run = done.run
    past_a_checkpoint(run)
    lost = json.loads((run.attempt(1) / rundir.ATTEMPT_JSON).read_text())["hosts"][1]
    report = drill(run, "--node", lost)
    assert report["code"] == ExitCode.NODE_LOST
    step = wait_for("the continuation", lambda: nexts(run), run=run)[0]
    assert step["how"] == history.NEXT_CONTINUATION and step["exclude"] == [lost] and step["counted"]
    job2 = step["next_job"]
    wait_for("attempt 2", lambda: (run.attempt(2) / rundir.ATTEMPT_JSON).exists(), run=run)
    second = json.loads((run.attempt(2) / rundir.ATTEMPT_JSON).read_text())
    assert second["job_id"] == job2 != done.job_id and lost not in second["hosts"]
    assert first_step(run, 2) == step["committed_step"] + 1
    assert ranks_ran_in(run, 2) == {str(tmp_path / "project")}  # the continuation runs where the user submitted
    st = status(run)
    assert st["state"] == "training" and st["job_id"] == get_backend(backend).display_id(job2), st
    assert [a["exit_code"] for a in st["attempts"]] == [ExitCode.NODE_LOST, None]
    assert cli("cancel", str(run.path)).exit_code == 0
    nothing_left(backend, run)
    assert status(run)["state"] == "cancelled"


def test_restart_mode_requeue_reruns_the_same_job_without_the_culprits_node(backend: str, tmp_path: Path) -> None:
    """restart.mode requeue: the recovery step requeues its own job (the batch host's Slurm client: scontrol requeue,
    then the run's avoided nodes as its ExcNodeList) and the batch shell only exits. The job keeps its id and comes
    back on a node other than the hung rank's, resuming after the committed step."""
    if backend == "local":
        pytest.skip("the requeue is the batch host's recovery step, the same on both: run on the test cluster (the local"
                    " shims' requeue from inside a job: test_localslurm_recovery's)")
    done = submit(backend, tmp_path, "rec-requeue", steps=400, restart={"mode": "requeue", "in_allocation": False},
                  watchdog={"hang_timeout": "20s", "save_timeout": "15s"})  # the stop may come during a save
    run = done.run
    past_a_checkpoint(run)
    report = drill(run, "--hang", "1")
    assert report["code"] == ExitCode.HANG and report["culprit_right"]
    culprit = json.loads((run.attempt(1) / rundir.ATTEMPT_JSON).read_text())["hosts"][1]
    step = wait_for("the requeue", lambda: nexts(run), run=run)[0]
    assert (step["how"], step["exclude"], step["counted"]) == (history.NEXT_REQUEUE, [culprit], True), step
    wait_for("attempt 2", lambda: (run.attempt(2) / rundir.ATTEMPT_JSON).exists(), timeout=180, run=run)
    second = json.loads((run.attempt(2) / rundir.ATTEMPT_JSON).read_text())
    assert second["job_id"] == done.job_id and culprit not in second["hosts"], second
    assert first_step(run, 2) == step["committed_step"] + 1
    info = get_backend(backend).info(done.job_id)
    assert info is not None and info.requeue_count == 1 and info.state == "RUNNING", info
    log = (run.path / f"slurm-{done.job_id}.out").read_text()
    assert f"requeueing job {done.job_id} without {culprit}" in log and "scontrol" not in log, log
    assert cli("cancel", str(run.path)).exit_code == 0
    nothing_left(backend, run)


def test_a_pre_timeout_stop_continues_uncounted_and_the_job_is_not_failed(backend: str, tmp_path: Path) -> None:
    """The batch shell traps the signal, the controller sets the stop flag, the ranks save and commit at their next
    step; the continuation resumes there, and its 4 ranks' losses are bitwise those of a run never stopped."""
    if backend == "local":
        pytest.skip("the pre-timeout stop on the local backend: test_integrations_e2e's and qualify's restart rung")
    steps, spec = 80, {"restart": {"budget": 0}, "gpus_per_node": 2}  # 4 ranks: 2 sum any bucket layout alike
    done = submit(backend, tmp_path, "rec-stop", steps=steps, **spec)
    run = done.run
    report = drill(run, "--pre-timeout")
    assert report["code"] == ExitCode.PRE_TIMEOUT
    step = wait_for("the continuation", lambda: nexts(run), run=run)[0]
    assert step["how"] == history.NEXT_CONTINUATION and not step["counted"] and step["exit"] == ExitCode.PRE_TIMEOUT
    be = get_backend(backend)
    info = wait_for("job 1 to end", lambda: (i := be.info(done.job_id)) and i.finished and i, run=run)
    assert info.state == "COMPLETED" and info.exit_code == 0  # a clean stop is not a failure
    log = (run.path / f"slurm-{done.job_id}.out").read_text()
    events = [e for e in history.read_events(run.events_file) if e.get("job_id") == done.job_id]  # the continuation's come after
    assert [e["event"] for e in events] == ["start", "signal", "end", "next"] and "stop requested" in log, log
    last = json.loads((run.attempt(1) / rundir.METRICS).read_text().splitlines()[-1])["step"]
    assert step["committed_step"] == last < steps - 1  # saved and committed at the step where the ranks stopped
    assert first_step(run, 2) == step["committed_step"] + 1  # budget 0, and still it went on
    assert ranks_ran_in(run, 1) == ranks_ran_in(run, 2) == {str(tmp_path / "project")}
    wait_for("the continuation to finish", lambda: max(losses(run, 2), default=-1) == steps - 1, run=run)
    same_as_uninterrupted(backend, tmp_path, run, 2, steps, spec)
    nothing_left(backend, run)
    saved, loaded = (rundir.read_json(run.attempt(n) / rundir.PHASE_TIMES) or {} for n in (1, 2))
    assert saved["save"] >= 0 and "load" not in saved, saved  # measured (to the aggregators' batching); from scratch
    assert loaded["load_from"] == "durable" and loaded["load"] >= 0, loaded  # attempt 3 would be judged by it


def test_scancel_stops_the_run_and_nothing_continues(backend: str, tmp_path: Path) -> None:
    if backend == "local":
        pytest.skip("the recovery step's reading of a cancel is the same on both: run on the test cluster's real"
                    " scancel (the local backend's scancel: test_local_backend's and test_local_shims')")
    done = submit(backend, tmp_path, "rec-scancel", steps=400)
    run = done.run
    wait_for("training", lambda: first_step(run, 1) is not None, run=run)
    if backend == "slurm":
        subprocess.run(["scancel", done.job_id], check=True)
    else:
        get_backend(backend).cancel(done.job_id)
    nothing_left(backend, run)
    time.sleep(3)  # a continuation, had one been submitted, would be queued by now
    assert run_jobs(run) == [done.job_id], story(run)
    assert not any(e.get("how") == history.NEXT_CONTINUATION for e in nexts(run))
    assert run.attempts() == [1]
    st = status(run)
    assert (st["state"], st["exit_code"]) == ("cancelled", ExitCode.CANCELLED), st
    # The attempt the cancel stopped reads as cancelled (89), whatever code its ranks saved and exited with (85).
    (attempt,) = st["attempts"]
    assert (attempt["cancelled_by"], attempt["meaning"], attempt["exit_code"]) == ("scancel", "cancelled by scancel", 89), st
    given = verdictfile.read(run.attempt(1))  # the ranks the cancel stopped are not at fault: no node to exclude
    assert given is not None and given.culprits == [] and given.code == ExitCode.CANCELLED, story(run)


def test_scancel_lets_warm_ranks_finish_a_save_of_seconds(backend: str, tmp_path: Path) -> None:
    """The ranks are forked from the warm servers, whose step Slurm signals with theirs: the servers stay until
    their ranks have saved (1.2 s, inside KillWait with room for the verdict), and the controller's verdict lands (it was 84, nothing saved)."""
    out = tmp_path / "out"
    out.mkdir()
    done = submit(backend, tmp_path, "rec-save", command=["python3", str(ROOT / "tests" / "programs" /
                                                          "saves_on_sigterm.py"), str(out)])
    run = done.run
    wait_for("both ranks stepping", lambda: all((out / f"step-{r}").exists() for r in (0, 1)), run=run)
    if backend == "slurm":
        subprocess.run(["scancel", done.job_id], check=True)
    else:
        get_backend(backend).cancel(done.job_id)
    nothing_left(backend, run)
    saved = {r: (out / f"saved-{r}").read_text() if (out / f"saved-{r}").exists() else None for r in (0, 1)}
    assert all(saved.values()), (saved, story(run))
    assert "the job's SIGTERM: serving" in "".join(p.read_text() for p in run.path.glob("warm-*.log"))  # the ranks were its children
    st = status(run)
    assert (st["state"], st["exit_code"]) == ("cancelled", ExitCode.CANCELLED), st
    given = verdictfile.read(run.attempt(1))
    assert given is not None and given.code == ExitCode.CANCELLED and given.culprits == [], story(run)


def test_cancel_while_a_continuation_is_on_its_way_leaves_nothing(backend: str, tmp_path: Path) -> None:
    if backend == "local":
        pytest.skip("a pending dependent job is Slurm's to hold: run on the test cluster (the local shims' own tests cover theirs)")
    done = submit(backend, tmp_path, "rec-cancel", steps=400)
    run = done.run
    drill(run, "--pre-timeout")
    wait_for("the continuation", lambda: nexts(run), run=run)
    result = cli("cancel", str(run.path), "--json")
    assert result.exit_code == 0, result.output
    nothing_left(backend, run)
    report = json.loads(result.stdout)
    assert report["cancelled"] or report["stopped"]
    cancel_at = next(e["time"] for e in history.read_events(run.events_file) if e.get("event") == history.EVENT_CANCEL)
    late = [e for e in history.read_events(run.events_file) if e.get("event") == history.EVENT_START and e["time"] > cancel_at + 1]
    assert not late, story(run)
    assert (run.path / rundir.CANCEL).exists()


def test_requeue_by_hand_excludes_the_culprit_and_resumes_on_fewer_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    done = submit("local", tmp_path, "rec-requeue", steps=400, restart={"mode": "none"},
                  watchdog={"hang_timeout": "20s", "save_timeout": "15s"})  # the stop may come during a save
    run = done.run
    past_a_checkpoint(run)
    drill(run, "--hang", "1")
    wait_for("the stop", lambda: run_stopped(run), run=run)
    culprit = json.loads((run.attempt(1) / rundir.ATTEMPT_JSON).read_text())["hosts"][1]
    refused = cli("requeue", str(run.path), "--set", "parallel.tp=2")
    assert refused.exit_code == ExitCode.BAD_CONFIG and "parallel.tp" in refused.output
    # Half the data-parallel ranks (one node), twice the accumulation: the checkpoint reshards on load.
    result = cli("requeue", str(run.path), "--set", "nodes=1", "--set", "batch.grad_accum=2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["exclude"] == [culprit] and any("parallel.dp 2 -> 1" in n for n in report["notes"])
    second = wait_for("attempt 2", lambda: (run.attempt(2) / rundir.ATTEMPT_JSON).exists() and json.loads((run.attempt(2) / rundir.ATTEMPT_JSON).read_text()), run=run)
    assert culprit not in second["hosts"] and len(second["hosts"]) == 1
    assert first_step(run, 2) == report["resume_step"] == nexts(run)[0]["committed_step"] + 1
    assert ranks_ran_in(run, 2) == {str(tmp_path / "project")}  # requeued from wherever: runs where it was submitted
    assert cli("cancel", str(run.path)).exit_code == 0
    nothing_left("local", run)


@pytest.mark.slurm
def test_a_node_lost_for_real_is_replaced_by_the_spare_inside_the_allocation(
    slurm_lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """Its slurmd and every process on it killed (lab.sh kill-node): --no-kill keeps the allocation,
    the verdict (86) names the node, srun is given up on, and the spare takes the node's slot."""
    monkeypatch.setenv("SLURM_CONF", slurm_lab.conf)
    done = submit("slurm", tmp_path, "rec-lost", steps=400, spares=1, topology={"exclude": []})
    run = done.run
    past_a_checkpoint(run)
    before = json.loads((run.attempt(1) / rundir.ATTEMPT_JSON).read_text())
    lost = before["hosts"][1]  # not the batch host
    try:
        slurm_lab.kill_node(lost)
        restart = wait_for("the restart", lambda: nexts(run), 150, run)[0]
        assert restart["how"] == history.NEXT_ALLOCATION and restart["exit"] == ExitCode.NODE_LOST, story(run)
        assert restart["exclude"] == [lost] and list(restart["replaced"]) == [lost]
        assert restart["hosts"][0] == before["hosts"][0] and restart["hosts"][1] not in before["hosts"]
        assert first_step(run, 2) == restart["committed_step"] + 1
        assert json.loads((run.attempt(2) / rundir.ATTEMPT_JSON).read_text())["job_id"] == done.job_id
    finally:
        cancel_slurm_jobs_under(tmp_path)
        slurm_lab.revive(lost)
