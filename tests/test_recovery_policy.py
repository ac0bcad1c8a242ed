"""The restart policy (runtime/recovery.py) on made-up endings: what a user would see happen next."""

from __future__ import annotations

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import history
from clusterctl.rundir.history import Fault
from clusterctl.runtime.recovery import Ended, Policy, Situation, decide, pick_hosts

ALLOC = ("n1", "n2", "n3")  # two nodes needed, one spare


def situation(**kw: object) -> Situation:
    base: dict[str, object] = {"job_id": "7", "allocation": ALLOC, "rank_hosts": ("n1", "n2"), "nodes": 2}
    base.update(kw)
    return Situation(**base)  # type: ignore[arg-type]


def test_a_hang_restarts_in_the_allocation_with_the_spare_in_the_culprits_slot() -> None:
    d = decide(Ended(ExitCode.HANG, ("n1",), 10, "rank 0 hung"), situation(), Policy())
    assert d.action == "restart" and d.hosts == ["n2", "n3"] and d.replaced == {"n1": "n3"}  # allocation order: srun's
    assert d.newly_excluded == ["n1"] and d.exclude == ["n1"] and d.counted


def test_without_a_spare_a_lost_node_continues_in_a_new_job_excluding_it() -> None:
    d = decide(Ended(ExitCode.NODE_LOST, ("n2",), 10), situation(allocation=("n1", "n2")), Policy())
    assert d.action == "continue" and d.exclude == ["n2"] and d.exit_code == ExitCode.NODE_LOST
    assert "too few healthy nodes" in d.reason
    assert decide(Ended(ExitCode.NODE_LOST, ("n2",), 10), situation(allocation=("n1", "n2")), Policy(mode="requeue")).action == "requeue"


def test_a_script_failure_retries_in_place_and_excludes_a_node_only_the_second_time() -> None:
    first = decide(Ended(ExitCode.SCRIPT_FAILED, ("n2",), 10), situation(), Policy())
    assert first.action == "restart" and first.hosts == ["n1", "n2"] and first.exclude == []
    earlier = (Fault(ExitCode.SCRIPT_FAILED, ("n2",), 10, "7"),)
    second = decide(Ended(ExitCode.SCRIPT_FAILED, ("n2",), 20), situation(faults=earlier), Policy())
    assert second.action == "restart" and second.hosts == ["n1", "n3"] and second.newly_excluded == ["n2"]


def test_a_clean_stop_continues_uncounted_and_exits_zero() -> None:
    d = decide(Ended(ExitCode.PRE_TIMEOUT, (), 40), situation(slurm_end="running"), Policy(budget=0))
    assert d.action == "continue" and d.exit_code == 0 and d.record_code == ExitCode.PRE_TIMEOUT and not d.counted


def test_slurm_requeue_and_cancel_submit_nothing() -> None:
    requeued = decide(Ended(ExitCode.PRE_TIMEOUT, (), 40), situation(slurm_end="requeued"), Policy())
    assert requeued.action == "slurm" and requeued.exit_code == 0
    for ended in (Ended(ExitCode.PRE_TIMEOUT), Ended(ExitCode.SCRIPT_FAILED, ("n1",))):
        assert decide(ended, situation(slurm_end="cancelled"), Policy()).action == "stop"
        assert decide(ended, situation(cancel_by="clusterctl cancel"), Policy()).action == "stop"


def test_the_budget_counts_faults_and_then_stops_with_87() -> None:
    faults = tuple(Fault(ExitCode.HANG, (f"x{i}",), i, "7") for i in range(2))
    d = decide(Ended(ExitCode.SCRIPT_FAILED, ("n1",), 30), situation(faults=faults), Policy(budget=2))
    assert d.action == "stop" and d.exit_code == ExitCode.BUDGET_EXHAUSTED and "restart.budget 2" in d.reason
    assert decide(Ended(ExitCode.SCRIPT_FAILED, ("n1",), 30), situation(), Policy(budget=0)).exit_code == 87


def test_the_same_fault_twice_without_progress_stops_with_87_and_with_progress_goes_on() -> None:
    earlier = (Fault(ExitCode.HANG, ("n1",), 10, "7"),)
    stuck = decide(Ended(ExitCode.HANG, ("n1",), 10), situation(faults=earlier, excluded=("n1",)), Policy())
    assert stuck.exit_code == ExitCode.BUDGET_EXHAUSTED and "no progress" in stuck.reason
    moved = decide(Ended(ExitCode.HANG, ("n1",), 20), situation(faults=earlier, excluded=("n1",), rank_hosts=("n2", "n3")), Policy())
    assert moved.action != "stop"


def test_rendezvous_failure_restarts_in_the_allocation_once_per_job() -> None:
    assert decide(Ended(ExitCode.RENDEZVOUS_FAILED), situation(), Policy()).action == "restart"
    again = decide(Ended(ExitCode.RENDEZVOUS_FAILED), situation(faults=(Fault(80, (), None, "7"),)), Policy())
    assert again.action == "continue"


def test_do_not_requeue_and_mode_none_stop() -> None:
    assert decide(Ended(ExitCode.DO_NOT_REQUEUE), situation(), Policy()).exit_code == 93
    none = decide(Ended(ExitCode.HANG, ("n1",)), situation(), Policy(mode="none"))
    assert none.action == "stop" and none.exit_code == ExitCode.HANG


def test_pick_hosts_keeps_untouched_slots() -> None:
    assert pick_hosts(("a", "b", "c"), ("a", "b", "c", "d"), {"b"}, 3) == (["a", "c", "d"], {"b": "d"})
    assert pick_hosts(("b", "c"), ("a", "b", "c"), {"b"}, 2) == (["a", "c"], {"b": "a"})  # srun places ranks in this order
    assert pick_hosts(("a", "b"), ("a", "b"), {"a"}, 2) is None


# --- the recovery step's edges (runtime/nextattempt.py), on a run directory -------------
def test_begin_records_the_end_of_an_attempt_whose_batch_host_died(tmp_path, capsys, monkeypatch) -> None:  # noqa: ANN001
    from clusterctl.rundir import RunDir
    from clusterctl.runtime import nextattempt

    run = RunDir(tmp_path)
    (tmp_path / "run.json").write_text('{"exclude": ["n4"], "restart": {"budget": 3}}')
    history.append(run, "start", attempt=1, job_id="5")
    history.append(run, "next", attempt=0, job_id="5", how="allocation", exclude=["n4", "n2"], counted=True, exit=82)
    monkeypatch.setattr(nextattempt, "slurm_job", lambda job: {"JobState": "NODE_FAIL", "Reason": "None"} if job == "5" else {})
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-4]")
    assert nextattempt.main(["begin", "--run-dir", str(tmp_path), "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "ACTION=run" in out and "NEXT_HOSTS=(n1 n3)" in out  # the run's excluded nodes are avoided
    end = [e for e in history.read_events(run.events_file) if e["event"] == "end"]
    assert end[0]["attempt"] == 1 and end[0]["exit"] is None and end[0]["slurm_state"] == "NODE_FAIL"
    assert "job 5" in end[0]["reason"]


def test_begin_of_a_cancelled_run_starts_nothing(tmp_path, capsys, monkeypatch) -> None:  # noqa: ANN001
    from clusterctl.rundir import RunDir
    from clusterctl.runtime import nextattempt

    (tmp_path / "run.json").write_text("{}")
    (tmp_path / "cancel.json").write_text('{"by": "clusterctl cancel"}')
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    nextattempt.main(["begin", "--run-dir", str(tmp_path), "--nodes", "2"])
    assert "ACTION=exit" in capsys.readouterr().out
    told = history.read(RunDir(tmp_path))
    assert told.stopped and told.cancelled_by == "clusterctl cancel"
