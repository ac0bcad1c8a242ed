"""A run's state derived from its directory and one scheduler answer: every state, goodput, few queries.

The run directories here are written by hand in the formats the batch script,
the recovery step, the controller and the trainer write; the end-to-end tests
(test_recovery_e2e.py, test_status_e2e.py) check the same derivation on real runs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from clusterctl import rundir
from clusterctl.actions import follow
from clusterctl.backends.base import Backend, JobInfo
from clusterctl.cli import app
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, history, list_runs
from clusterctl.rundir.metrics import MetricsFile
from clusterctl.views.state import derive, derive_many, wanted_job
from clusterctl.views.statetext import progress, status_line
from tests.helpers import cli

T0 = 1_800_000_000.0
STEP_S = 0.5


class Run:
    """A run directory written the way a real run writes it."""

    def __init__(self, root: Path, name: str = "demo", stamp: str = "20270115-120000", backend: str = "slurm",
                 job: str = "100", world: int = 4, gpn: int = 2) -> None:
        self.dir = RunDir(root / f"{name}-{stamp}-ab12")
        self.dir.path.mkdir(parents=True)
        (self.dir.path / rundir.RUN_JSON).write_text(json.dumps({"name": name, "world_size": world, "gpus_per_node": gpn, "nodes": world // gpn}))
        self.dir.write_state(state="submitted", backend=backend, job_id=f"local-{job}" if backend == "local" else job)
        self.job = job

    def event(self, event: str, **fields: Any) -> "Run":
        history.append(self.dir, event, **fields)
        return self

    def attempt(self, n: int, start: float, first: int, last: int, job: str | None = None, hosts: tuple[str, ...] = ("n1", "n2"),
                step_s: float = STEP_S, total: int | None = 100, verdict: dict[str, Any] | None = None) -> "Run":
        job = job or self.job
        d = self.dir.attempt(n)
        d.mkdir()
        (d / rundir.ATTEMPT_JSON).write_text(json.dumps({"job_id": job, "attempt": n, "hosts": list(hosts),
                                                         "nodelist": f"n[1-{len(hosts)}]", "spares": 0, "started": start}))
        self.event(history.EVENT_START, attempt=n, job_id=job, time=start, nodes=len(hosts))
        lines = []
        for i, step in enumerate(range(first, last + 1)):
            lines.append(json.dumps({"step": step, "loss": 5.0 - step / 100, "step_s": step_s, "tokens_per_s": 1000.0,
                                     "t": start + 2 + (i + 1) * step_s, "train_s": (i + 1) * step_s,
                                     **({"total_steps": total} if total else {})}))
        if lines:
            (d / rundir.METRICS).write_text("\n".join(lines) + "\n")
        if verdict is not None:
            (d / rundir.VERDICT).write_text(json.dumps(verdict))
        return self

    def end(self, n: int, code: int, at: float, how: str, reason: str, job: str | None = None, **more: Any) -> "Run":
        job = job or self.job
        self.event(history.EVENT_END, attempt=n, job_id=job, exit=code, time=at)
        return self.event(history.EVENT_NEXT, attempt=n, job_id=job, exit=code, how=how, reason=reason, time=at, **more)

    def checkpoint(self, step: int) -> "Run":
        (self.dir.checkpoints / f"step-{step:08d}").mkdir(parents=True)
        return self


HANG = {"ok": False, "code": 82, "message": "rank 3 on n2 hung in forward at step 39",
        "culprits": [{"rank": 3, "host": "n2", "reason": "no progress"}]}


def test_training_shows_step_loss_throughput_and_eta(tmp_path: Path) -> None:
    run = Run(tmp_path).attempt(1, T0, 0, 19)
    st = derive(run.dir, {"100": JobInfo("100", "RUNNING")}, now=T0 + 15)
    assert (st.state, st.job_id, st.step, st.loss, st.tokens_per_s) == ("training", "100", 19, 4.81, 1000.0)
    assert st.eta_s == pytest.approx(80 * STEP_S)  # 80 steps to go at this attempt's mean step time
    (a,) = st.attempts
    assert (a.attempt, a.job_id, a.nodes, a.exit_code, a.steps, a.first_step, a.last_step) == (1, "100", ["n1", "n2"], None, 20, 0, 19)


def test_a_script_that_reports_no_tokens_still_shows_its_pace(tmp_path: Path) -> None:
    """An unmodified script (no record()): the step watcher's step times give the rate tokens/s would have given."""
    run = Run(tmp_path).attempt(1, T0, 0, 19, step_s=0.25)
    metrics = run.dir.attempt(1) / rundir.METRICS
    metrics.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}) + "\n"
                               for line in metrics.read_text().splitlines()))
    st = derive(run.dir, {"100": JobInfo("100", "RUNNING")}, now=T0 + 15)
    assert (st.tokens_per_s, st.step_s) == (None, 0.25)
    assert "step 19/100, loss 4.8100, 4 steps/s, ETA 20s" == progress(st)
    assert "12.5 s a step" in progress(dataclasses.replace(st, step_s=12.5))  # slow steps read as seconds a step
    slow = derive(Run(tmp_path / "slow").attempt(1, T0, 0, 3, step_s=12.5).dir, {"100": JobInfo("100", "RUNNING")}, now=T0 + 60)
    assert slow.tokens_per_s == 1000.0 and "tokens/s" in progress(slow)  # the script's own figure, where it gives one


def test_pending_gives_slurms_reason_in_words(tmp_path: Path) -> None:
    run = Run(tmp_path)
    st = derive(run.dir, {"100": JobInfo("100", "PENDING", reason="ReqNodeNotAvail")})
    assert st.state == "pending" and "ReqNodeNotAvail" in st.reason and "down, drained or reserved" in st.reason
    assert derive(run.dir, {"100": JobInfo("100", "RUNNING")}).state == "starting"


def test_a_verdict_being_carried_out_is_restarting_and_names_the_culprit(tmp_path: Path) -> None:
    run = Run(tmp_path).attempt(1, T0, 0, 39, verdict=HANG)
    st = derive(run.dir, {"100": JobInfo("100", "RUNNING")})
    assert st.state == "restarting" and "rank 3 on n2 hung" in st.reason
    assert st.attempts[0].culprits == HANG["culprits"]
    # The next attempt is starting (no step yet): the first one keeps only what the checkpoint holds.
    run.checkpoint(29).end(1, ExitCode.HANG, T0 + 28, history.NEXT_ALLOCATION, "exit 82 (hang); restarting in the allocation")
    run.attempt(2, T0 + 30, 0, -1)
    st = derive(run.dir, {"100": JobInfo("100", "RUNNING")})
    assert st.state == "starting" and (st.attempts[0].steps, st.attempts[0].kept_steps) == (40, 30)


def test_restart_in_the_allocation_keeps_what_was_committed_and_counts_the_rest_as_lost(tmp_path: Path) -> None:
    # Attempt 1 trains steps 0-39 (20 s), hangs; the verdict and restart take until T0+30; attempt 2 resumes
    # at 30 (checkpoint 29 committed) and finishes 30-99 (35 s) by T0+69.
    run = Run(tmp_path).attempt(1, T0, 0, 39, verdict=HANG)
    run.end(1, ExitCode.HANG, T0 + 28, history.NEXT_ALLOCATION, "exit 82 (hang); restarting in the allocation", committed_step=29)
    run.attempt(2, T0 + 30, 30, 99).end(2, 0, T0 + 69, history.NEXT_STOP, "training finished").checkpoint(29).checkpoint(99)
    st = derive(run.dir, {}, now=T0 + 1000)
    assert (st.state, st.exit_code, st.checkpoint, st.step) == ("completed", 0, 99, 99)
    assert progress(st).startswith("all 100 steps done")  # not "step 99/100": steps count from 0
    first, second = st.attempts
    assert (first.exit_code, first.next, first.steps, first.kept_steps, first.kept_s) == (82, "allocation", 40, 30, 15.0)
    assert (second.first_step, second.kept_steps, second.kept_s, second.meaning) == (30, 70, 35.0, "success")
    # Allocated: 4 GPUs x 69 s (the restart gap belongs to the allocation); kept (useful): 4 ranks x (15 + 35) s;
    # start-up: 2 s before each attempt's first step; lost: the 10 steps (5 s) redone and the 6 s from attempt 1's
    # last step (T0+22) to its end, every GPU waiting for the hang verdict; other: the rest (the restart gap, the
    # wind-down after the last step of the attempt that finished).
    assert st.goodput == pytest.approx(round(200 / 276, 4))
    hours = (st.useful_gpu_hours, st.startup_gpu_hours, st.lost_gpu_hours, st.other_gpu_hours, st.allocated_gpu_hours)
    assert hours == pytest.approx(tuple(round(x / 3600, 6) for x in (200, 16, 20 + 24, 40 - 24, 276)))
    assert wanted_job(run.dir) is None  # a stopped run needs no scheduler


def test_a_continuation_waits_with_slurms_reason_then_its_attempt_trains(tmp_path: Path) -> None:
    run = Run(tmp_path).attempt(1, T0, 0, 49, hosts=("n1", "n2"))
    run.end(1, ExitCode.NODE_LOST, T0 + 40, history.NEXT_CONTINUATION, "node n2 lost; continuing in a new job", next_job="101",
            committed_step=39)
    assert wanted_job(run.dir) == "101"
    st = derive(run.dir, {"101": JobInfo("101", "PENDING", reason="Dependency")}, now=T0 + 41)
    assert st.state == "continued" and st.job_id == "101" and "pending (Dependency)" in st.reason
    assert st.attempts[0].kept_steps == 40  # it will resume after the committed step 39
    run.attempt(2, T0 + 60, 40, 45, job="101", hosts=("n1", "n3"))
    st = derive(run.dir, {"101": JobInfo("101", "RUNNING")}, now=T0 + 70)
    assert (st.state, st.job_id, [a.job_id for a in st.attempts]) == ("training", "101", ["100", "101"])
    assert st.attempts[0].kept_steps == 40 and st.attempts[1].kept_steps == 6


def test_a_batch_script_that_died_with_its_job_is_failed_from_the_run_directory_alone(tmp_path: Path) -> None:
    """slurmctld forgot the job and there is no accounting: the missing end is the evidence."""
    run = Run(tmp_path).attempt(1, T0, 0, 9)
    st = derive(run.dir, {"100": None})
    assert st.state == "failed" and "recorded no end" in st.reason and "slurm-100.out" in st.reason
    st = derive(run.dir, {"100": JobInfo("100", "NODE_FAIL")})
    assert st.state == "failed" and "NODE_FAIL" in st.reason


def test_stops_read_as_the_user_means_them(tmp_path: Path) -> None:
    failed = Run(tmp_path, name="budget").attempt(1, T0, 0, 9, verdict=HANG)
    failed.end(1, ExitCode.BUDGET_EXHAUSTED, T0 + 9, history.NEXT_STOP, "exit 82 (hang); restart.budget 0 is spent")
    st = derive(failed.dir, {})
    assert (st.state, st.exit_code) == ("failed", 87) and "restart.budget 0" in st.reason
    assert st.attempts[0].culprits[0]["host"] == "n2"

    timeout = Run(tmp_path, name="timeout").attempt(1, T0, 0, 9)
    timeout.end(1, ExitCode.PRE_TIMEOUT, T0 + 9, history.NEXT_STOP, "pre-timeout: checkpoint step 9 committed; restart.mode none")
    st = derive(timeout.dir, {})
    assert st.state == "cancelled" and st.exit_code == 85 and "clusterctl requeue continues it" in st.reason  # not failed

    # A cancel has one code (89), and `submit --wait` exits with it: whatever an older run recorded (srun's 84), or
    # none at all (the batch script died with the job, or the job was cancelled while it pended).
    cancelled = Run(tmp_path, name="cancelled").attempt(1, T0, 0, 9).event(history.EVENT_CANCEL, by="clusterctl cancel", save=False)
    cancelled.end(1, ExitCode.SCRIPT_FAILED, T0 + 9, history.NEXT_STOP, "stopped: by clusterctl cancel")
    st = derive(cancelled.dir, {})
    assert (st.state, st.exit_code, follow.exit_code(st)) == ("cancelled", 89, 89)
    assert status_line(st) == "cancelled (exit 89): cancelled by clusterctl cancel"

    scancelled = Run(tmp_path, name="scancelled").attempt(1, T0, 0, 9)  # scancel: the batch script died too
    st = derive(scancelled.dir, {"100": JobInfo("100", "CANCELLED")})
    assert (st.state, st.exit_code, follow.exit_code(st)) == ("cancelled", 89, 89)
    pending = Run(tmp_path, name="pending")  # scancel of a job that never started
    st = derive(pending.dir, {"100": JobInfo("100", "CANCELLED")})
    assert (st.state, st.exit_code, follow.exit_code(st)) == ("cancelled", 89, 89)

    refused = Run(tmp_path, name="refused")
    refused.dir.write_state(state="failed", reason="Slurm rejected the job: invalid partition")
    st = derive(refused.dir, {})
    assert st.state == "failed" and "invalid partition" in st.reason


def test_requeue_by_hand_after_a_cancel_goes_on(tmp_path: Path) -> None:
    run = Run(tmp_path).attempt(1, T0, 0, 9).event(history.EVENT_CANCEL, by="clusterctl cancel", save=True)
    run.end(1, ExitCode.PRE_TIMEOUT, T0 + 9, history.NEXT_STOP, "stopped: by clusterctl cancel")
    run.event(history.EVENT_REQUEUE, by="clusterctl requeue", next_job="102", exclude=[])
    st = derive(run.dir, {"102": JobInfo("102", "PENDING", reason="Priority")})
    assert st.state == "continued" and st.job_id == "102" and "Priority" in st.reason


class CountingBackend(Backend):
    name = "slurm"

    def __init__(self, answers: dict[str, JobInfo]) -> None:
        self.answers, self.queries = answers, []

    def check(self) -> None: ...
    def submit(self, script, workdir, options=None):  # noqa: ANN001, ANN201
        raise NotImplementedError
    def info(self, job_id: str) -> JobInfo | None:
        raise AssertionError("one query for all runs, never one per job")
    def info_many(self, job_ids):  # noqa: ANN001, ANN201
        self.queries.append(list(job_ids))
        return {j: self.answers.get(j) for j in job_ids}
    def cancel(self, job_id: str) -> None: ...
    def signal(self, job_id: str, sig: str) -> None: ...


def test_many_runs_cost_one_scheduler_query_and_finished_runs_none(tmp_path: Path) -> None:
    for i in range(12):
        run = Run(tmp_path, name=f"r{i:02d}", stamp=f"20270115-1200{i:02d}", job=str(200 + i)).attempt(1, T0, 0, 5)
        if i % 3 == 0:
            run.end(1, 0, T0 + 5, history.NEXT_STOP, "training finished")
    backend = CountingBackend({str(200 + i): JobInfo(str(200 + i), "RUNNING") for i in range(12)})
    runs = list_runs(tmp_path)
    assert [r.path.name[:3] for r in runs] == [f"r{i:02d}" for i in reversed(range(12))]  # newest first
    states, notes = derive_many(runs, lambda name: backend)
    assert not notes and len(backend.queries) == 1
    assert sorted(backend.queries[0]) == sorted(str(200 + i) for i in range(12) if i % 3)
    assert [s.state for s in states].count("completed") == 4 and [s.state for s in states].count("training") == 8


def test_metrics_lookups_survive_torn_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "step_s": 0.25, "loss": 1.0}) for s in range(10, 1000)]
    lines.insert(500, '{"step": 510, "loss": 1.0, "st')  # a rank killed mid-write, then the next attempt appended
    path.write_text("\n".join(lines) + '\n{"step": 1000, "lo')
    with MetricsFile(path) as m:
        assert m.first()["step"] == 10 and m.last()["step"] == 999
        assert m.at_or_before(5) is None and m.at_or_before(10)["step"] == 10
        assert all(m.at_or_before(s)["step"] == s for s in (11, 499, 509, 510, 777, 998))
        assert m.at_or_before(5000)["step"] == 999
        assert m.time_through(19) == pytest.approx(2.5)  # no train_s: summed


def test_status_and_runs_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(tmp_path / "runs", backend="local", job="7").attempt(1, T0, 0, 39, verdict=HANG)
    run.end(1, ExitCode.BUDGET_EXHAUSTED, T0 + 28, history.NEXT_STOP, "exit 82 (hang); restart.budget 0 is spent")
    monkeypatch.chdir(tmp_path)
    result = cli("status", "--json")
    assert result.exit_code == 0, result.output
    (data,) = json.loads(result.stdout)
    for key in ("run", "state", "reason", "step", "loss", "job_id", "attempts", "checkpoint", "goodput", "lost_gpu_hours"):
        assert key in data
    assert (data["state"], data["job_id"], data["step"]) == ("failed", "local-7", 39)
    assert set(data["attempts"][0]) >= {"attempt", "job_id", "nodes", "start", "end", "exit_code", "meaning", "steps"}
    assert data["attempts"][0]["job_id"] == "local-7" and data["attempts"][0]["meaning"].startswith("restart budget exhausted")
    by_job = cli("status", "local-7")  # a job id finds its run
    assert by_job.exit_code == 0 and "demo-20270115-120000-ab12  failed" in by_job.stdout and "culprit rank 3 on n2" in by_job.stdout
    listed = json.loads(cli("runs", "--json").stdout)
    assert [(r["run"], r["state"], r["attempts"]) for r in listed] == [(run.dir.path.name, "failed", 1)]
    missing = cli("status", "nope")
    assert missing.exit_code == ExitCode.USAGE and "no run 'nope'" in missing.output
    assert app  # the CLI module loads without the scheduler


def test_a_standalone_run_ends_with_its_one_attempt(tmp_path: Path) -> None:
    """Standalone scripts decide nothing after the attempt: its end settles the run, no scheduler needed."""
    run = Run(tmp_path).attempt(1, T0, 0, 9)
    data = json.loads(run.dir.run_json.read_text())
    (run.dir.run_json).write_text(json.dumps({**data, "mode": "standalone"}))
    run.event(history.EVENT_END, attempt=1, job_id="100", exit=ExitCode.SCRIPT_FAILED, time=T0 + 9)
    assert wanted_job(run.dir) is None
    st = derive(run.dir, {})
    assert (st.state, st.exit_code) == ("failed", 84) and "a rank's script failed" in st.reason


def test_a_recorded_run_with_a_killed_rank(tmp_path: Path) -> None:
    """A real run directory (rank 1 SIGKILLed, restart in the allocation) as status reads it."""
    import tarfile

    with tarfile.open(Path(__file__).resolve().parent / "fixtures" / "run-killed-rank.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    (path,) = tmp_path.iterdir()
    st = derive(RunDir(path), {})
    assert (st.state, st.exit_code, st.step, st.total_steps, st.job_id) == ("completed", 0, 199, 200, "local-5")
    one, two = st.attempts
    assert (one.exit_code, one.next, one.culprits[0]["rank"], one.culprits[0]["host"]) == (84, "allocation", 1, "node1")
    assert one.kept_steps == two.first_step == 100 and one.steps > 100 and two.kept_steps == two.steps == 100
    assert 0 < st.goodput < 1


def test_status_watch_refreshes_until_the_run_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No scheduler to ask here (no squeue): the run directory alone says training, then completed."""
    import threading
    import time

    run = Run(tmp_path / "runs").attempt(1, T0, 0, 19)
    monkeypatch.setenv("PATH", str(tmp_path))  # squeue cannot be found: status says so and goes on
    finish = threading.Timer(1.5, lambda: run.end(1, 0, T0 + 30, history.NEXT_STOP, "training finished"))
    finish.start()
    began = time.monotonic()
    result = cli("status", "--watch", "--every", "0.3", cwd=tmp_path)
    finish.join()
    assert result.exit_code == 0, result.output
    assert 1.4 < time.monotonic() - began < 30
    assert "  completed" in result.stdout and "could not be asked" in result.stderr


# --- what users saw go wrong, fixed ------------------------------------------------------------------------


def test_cancel_of_an_ended_run_says_so_exits_non_zero_and_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))  # the emulated Slurm knows no job
    run = Run(tmp_path / "runs", backend="local", job="7").attempt(1, T0, 0, 39)
    run.end(1, 0, T0 + 30, history.NEXT_STOP, "training finished")
    before = run.dir.events_file.read_bytes(), sorted(p.name for p in run.dir.path.iterdir())
    result = cli("cancel", str(run.dir.path))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "has already ended (completed: training finished at step 39): nothing to cancel" in result.output
    assert (run.dir.events_file.read_bytes(), sorted(p.name for p in run.dir.path.iterdir())) == before
    assert derive(run.dir, {}).state == "completed"  # history not rewritten


def test_a_dry_run_is_shown_as_such_and_never_hides_the_newest_real_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Run(tmp_path / "runs", stamp="20270115-120000").attempt(1, T0, 0, 19)
    real.end(1, 0, T0 + 30, history.NEXT_STOP, "training finished")
    dry = RunDir(tmp_path / "runs" / "demo-20270115-130000-cd34")
    dry.path.mkdir()
    (dry.path / rundir.RUN_JSON).write_text(json.dumps({"name": "demo", "world_size": 4, "gpus_per_node": 2}))
    dry.write_state(state="dry-run", backend="local")
    monkeypatch.chdir(tmp_path)
    assert derive(dry, {}).state == "dry-run"
    (shown,) = json.loads(cli("status", "--json").stdout)
    assert (shown["run"], shown["state"]) == (real.dir.path.name, "completed")
    listed = {r["run"]: r["state"] for r in json.loads(cli("runs", "--json").stdout)}
    assert listed == {dry.path.name: "dry-run", real.dir.path.name: "completed"}


def test_a_clean_run_states_its_useful_share_and_start_up_apart_from_lost_work(tmp_path: Path) -> None:
    # One attempt: 2 s of start-up, 20 steps of 0.5 s (10 s), then 3 s to the end: 15 s x 4 GPUs allocated.
    run = Run(tmp_path / "runs").attempt(1, T0, 0, 19).end(1, 0, T0 + 15, history.NEXT_STOP, "training finished")
    st = derive(run.dir, {})
    assert st.reason == "training finished at step 19"
    hours = (st.useful_gpu_hours, st.startup_gpu_hours, st.lost_gpu_hours, st.other_gpu_hours, st.allocated_gpu_hours)
    assert hours == pytest.approx(tuple(round(x / 3600, 6) for x in (40, 8, 0, 12, 60)))
    assert st.goodput == pytest.approx(40 / 60, abs=1e-4)
    screen = cli("status", str(run.dir.path)).stdout
    assert "goodput 66.7% of 0.017 GPU-hours: start-up 13.3%, lost 0.0%, other 20.0%" in screen


def test_a_run_that_never_reported_a_step_has_no_goodput_and_does_not_claim_training_finished(tmp_path: Path) -> None:
    run = Run(tmp_path / "runs").attempt(1, T0, 0, -1).end(1, 0, T0 + 15, history.NEXT_STOP, "training finished")
    st = derive(run.dir, {})
    assert (st.state, st.goodput, st.step) == ("completed", None, None)
    assert st.reason == "the command finished (exit 0) without reporting a training step"
    # Its time cannot be split (a script that reports no steps): neither start-up nor lost, but the rest.
    assert (st.startup_gpu_hours, st.lost_gpu_hours, st.other_gpu_hours) == (0, 0, st.allocated_gpu_hours)
    screen = cli("status", str(run.dir.path)).stdout
    assert "goodput unknown (no training step reported)" in screen and "other 100.0%" not in screen
    row = next(line for line in screen.splitlines() if line.startswith("1 "))
    assert row.split()[-2:] == ["-", "stop"], row  # no steps reported: no "0" steps


def test_an_attempt_stopped_by_a_cancel_reads_cancelled_not_pre_timeout(tmp_path: Path) -> None:
    run = Run(tmp_path / "runs").attempt(1, T0, 0, 19)
    run.event(history.EVENT_END, attempt=1, job_id="100", exit=ExitCode.PRE_TIMEOUT, time=T0 + 15)
    run.event(history.EVENT_NEXT, attempt=1, job_id="100", exit=ExitCode.PRE_TIMEOUT, how=history.NEXT_STOP,
              reason="stopped: the job was cancelled (scancel)", cancelled_by="scancel", time=T0 + 15)
    st = derive(run.dir, {})
    assert (st.state, st.reason, st.exit_code) == ("cancelled", "cancelled by scancel", ExitCode.CANCELLED)
    (a,) = st.attempts
    assert (a.cancelled_by, a.meaning, a.exit_code) == ("scancel", "cancelled by scancel", ExitCode.CANCELLED)
    table = cli("status", str(run.dir.path)).stdout
    assert "cancelled" in table and "pre timeout" not in table and " 85 " not in table


def test_a_cancel_verdict_while_the_end_is_recorded_is_not_a_restart(tmp_path: Path) -> None:
    """The controller has said "cancelled" (89), the recovery step has not recorded the end yet."""
    cancel = {"ok": False, "code": 89, "message": "cancelled by scancel: the job was stopped from outside; no node is blamed",
              "culprits": []}
    st = derive(Run(tmp_path).attempt(1, T0, 0, 19, verdict=cancel).dir, {"100": JobInfo("100", "RUNNING")})
    assert st.state == "training" and not st.attempts[0].culprits


def test_the_attempts_table_fits_80_columns_without_breaking_a_word(tmp_path: Path) -> None:
    """A default terminal (or a pipe): `straggler` and `script failed` wrap between words, never inside one."""
    from typer.testing import CliRunner

    run = Run(tmp_path / "runs")
    run.attempt(1, T0, 0, 19, job="1234567").end(1, 83, T0 + 100, history.NEXT_CONTINUATION, "straggler", next_job="1234568")
    run.attempt(2, T0 + 200, 20, 39, job="1234568").end(2, 84, T0 + 300, history.NEXT_ALLOCATION, "script failed")
    run.attempt(3, T0 + 400, 40, 59, job="1234568").end(3, 88, T0 + 500, history.NEXT_STOP, "script error")  # ended: no query
    shown = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["status", str(run.dir.path)]).output
    assert "#  job" in shown, shown
    at = shown.index("#  job")
    lines = shown[at:].splitlines()[:-1]  # the table (the run's path under it is one line, for scripts that read it)
    assert lines and max(map(len, lines)) <= 80, shown
    assert any(" straggler " in line for line in lines) and not any(line.rstrip().endswith("straggl") for line in lines), shown
    assert not any(line.rstrip().endswith(("scrip", "strag")) for line in lines), shown


def test_a_shrunk_run_shows_its_width_change_and_the_full_size_job_queued_to_grow_back(tmp_path: Path) -> None:
    width = {"nodes": [2, 1], "world_size": [4, 2], "dp": [4, 2], "grad_accum": [1, 2], "global_batch": [8, 8]}
    run = Run(tmp_path).attempt(1, T0, 0, 39)
    run.end(1, ExitCode.NODE_LOST, T0 + 21, history.NEXT_ALLOCATION, "exit 86; no spare left: shrinking", width=width,
            hosts=["n1"])
    run.event(history.EVENT_GROW, attempt=1, job_id="100", next_job="101", time=T0 + 21)
    run.attempt(2, T0 + 22, 40, 45, hosts=("n1",))
    st = derive(run.dir, {"100": JobInfo("100", "RUNNING")}, now=T0 + 30)
    assert (st.state, st.grow_job, st.attempts[0].width["dp"]) == ("training", "101", [4, 2])
    from rich.console import Console

    from clusterctl.cli.status_view import run_screen

    console = Console(width=200, record=True)
    console.print(run_screen(st, now=T0 + 30))
    shown = console.export_text()
    assert "restart dp 4 → 2" in shown and "full-size job 101 queued to grow back" in shown, shown
    assert st.as_dict()["grow_job"] == "101"
