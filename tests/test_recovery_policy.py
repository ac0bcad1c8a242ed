"""The restart policy (runtime/recovery/policy.py) on made-up endings: what a user would see happen next."""

from __future__ import annotations

import json

from clusterctl.backends.base import JobInfo
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import history
from clusterctl.rundir.history import Fault
from clusterctl.runtime.recovery.policy import Ended, Policy, Situation, decide, pick_hosts

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
    # A cancel has one code, whatever the stopped ranks (85: they saved), srun (137 made 84) or the controller said.
    for ended in (Ended(ExitCode.PRE_TIMEOUT), Ended(ExitCode.SCRIPT_FAILED, ("n1",)), Ended(ExitCode.OK),
                  Ended(ExitCode.RENDEZVOUS_FAILED)):
        by_slurm = decide(ended, situation(slurm_end="cancelled"), Policy())
        by_us = decide(ended, situation(cancel_by="clusterctl cancel"), Policy())
        assert [(d.action, d.record_code, d.exit_code, d.cancelled_by, d.newly_excluded) for d in (by_slurm, by_us)] == [
            ("stop", ExitCode.CANCELLED, ExitCode.CANCELLED, "scancel", []),
            ("stop", ExitCode.CANCELLED, ExitCode.CANCELLED, "clusterctl cancel", [])], ended
    # The controller's cancel verdict stops the run even where Slurm could not be asked.
    told = decide(Ended(ExitCode.CANCELLED), situation(slurm_end="running"), Policy())
    assert (told.action, told.record_code, told.cancelled_by) == ("stop", ExitCode.CANCELLED, "scancel")


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


def test_the_scripts_own_error_stops_at_once_and_blames_no_node() -> None:
    said = "the script failed the same way on every rank (4): ValueError: bad lr; this is the script's error"
    d = decide(Ended(ExitCode.SCRIPT_ERROR, ("n1", "n2"), None, said, "script", (0, 1, 2, 3)), situation(), Policy())
    assert d.action == "stop" and d.exit_code == ExitCode.SCRIPT_ERROR and d.reason == said
    assert d.newly_excluded == [] and d.exclude == [] and not d.counted


def test_an_ambiguous_failure_restarts_in_place_without_excluding_anyone() -> None:
    d = decide(Ended(ExitCode.SCRIPT_FAILED, ("n2",), 10, "rank 2 raised", "ambiguous", (2,), "IndexError: N"), situation(), Policy())
    assert d.action == "restart" and d.hosts == ["n1", "n2"] and d.newly_excluded == [] and d.counted
    hang = decide(Ended(ExitCode.HANG, ("n1",), 10, "rank 0 outside the collective", "ambiguous", (0,)), situation(), Policy())
    assert hang.action == "restart" and hang.hosts == ["n1", "n2"] and hang.newly_excluded == []


def test_the_same_error_on_the_same_rank_again_follows_the_rank_and_is_the_scripts() -> None:
    earlier = (Fault(ExitCode.SCRIPT_FAILED, ("n2",), 10, "7", "ambiguous", (2,), "IndexError: shard N"),)
    again = Ended(ExitCode.SCRIPT_FAILED, ("n2",), 10, "rank 2 raised", "ambiguous", (2,), "IndexError: shard N")
    d = decide(again, situation(faults=earlier), Policy())
    assert d.action == "stop" and d.exit_code == ExitCode.SCRIPT_ERROR and d.newly_excluded == []
    assert "follows the rank, not a node" in d.reason and "IndexError: shard N" in d.reason


def test_the_same_failure_through_another_rank_of_the_node_follows_the_node() -> None:
    earlier = (Fault(ExitCode.SCRIPT_FAILED, ("n2",), 10, "7", "ambiguous", (2,), "RuntimeError: bad value N"),)
    other_rank = Ended(ExitCode.SCRIPT_FAILED, ("n2",), 10, "rank 3 raised", "ambiguous", (3,), "RuntimeError: bad value N")
    d = decide(other_rank, situation(faults=earlier), Policy())
    assert d.action == "restart" and d.newly_excluded == ["n2"] and d.hosts == ["n1", "n3"]
    elsewhere = Ended(ExitCode.SCRIPT_FAILED, ("n1",), 10, "rank 0 raised", "ambiguous", (0,), "RuntimeError: bad value N")
    assert decide(elsewhere, situation(faults=earlier), Policy()).newly_excluded == []


def test_node_evidence_of_a_hang_excludes_at_once_and_a_kill_on_the_second_time() -> None:
    hang = decide(Ended(ExitCode.HANG, ("n1",), 10, "rank 0 stopped", "node", (0,)), situation(), Policy())
    assert hang.newly_excluded == ["n1"]
    kill = Ended(ExitCode.SCRIPT_FAILED, ("n2",), 10, "rank 2 killed", "node", (2,), "signal Killed")
    assert decide(kill, situation(), Policy()).newly_excluded == []
    twice = decide(kill, situation(faults=(Fault(ExitCode.SCRIPT_FAILED, ("n2",), 10, "7", "node", (2,)),)), Policy())
    assert twice.action == "restart" and twice.newly_excluded == ["n2"]


def test_shared_infrastructure_gets_one_restart_without_blame_then_stops() -> None:
    full = Ended(ExitCode.SCRIPT_FAILED, ("n1", "n2"), 10, "No space left on device", "infrastructure", (0, 1, 2, 3))
    first = decide(full, situation(), Policy())
    assert first.action == "restart" and first.newly_excluded == []
    earlier = (Fault(ExitCode.SCRIPT_FAILED, ("n1", "n2"), 10, "7", "infrastructure", (0, 1, 2, 3)),)
    second = decide(full, situation(faults=earlier), Policy())
    assert second.action == "stop" and second.exit_code == ExitCode.BUDGET_EXHAUSTED and second.newly_excluded == []


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


# --- the recovery step's edges (runtime/recovery/nextattempt.py), on a run directory -------------
def test_begin_records_the_end_of_an_attempt_whose_batch_host_died(tmp_path, capsys, monkeypatch) -> None:  # noqa: ANN001
    from clusterctl.rundir import RunDir
    from clusterctl.runtime.recovery import nextattempt

    run = RunDir(tmp_path)
    (tmp_path / "run.json").write_text('{"exclude": ["n4"], "restart": {"budget": 3}}')
    history.append(run, "start", attempt=1, job_id="5")
    history.append(run, "next", attempt=0, job_id="5", how="allocation", exclude=["n4", "n2"], counted=True, exit=82)
    monkeypatch.setattr(nextattempt.batchhost, "job", lambda job: JobInfo("5", "NODE_FAIL") if job == "5" else None)
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-4]")
    assert nextattempt.main(["begin", "--run-dir", str(tmp_path), "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "ACTION=run" in out and "NEXT_HOSTS=(n1 n3)" in out  # the run's excluded nodes are avoided
    end = [e for e in history.read_events(run.events_file) if e["event"] == "end"]
    assert end[0]["attempt"] == 1 and end[0]["exit"] is None and end[0]["slurm_state"] == "NODE_FAIL"
    assert "job 5" in end[0]["reason"] and "(Slurm: NODE_FAIL)" in end[0]["reason"]


def test_begin_of_a_cancelled_run_starts_nothing(tmp_path, capsys, monkeypatch) -> None:  # noqa: ANN001
    from clusterctl.rundir import RunDir
    from clusterctl.runtime.recovery import nextattempt

    (tmp_path / "run.json").write_text("{}")
    (tmp_path / "cancel.json").write_text('{"by": "clusterctl cancel"}')
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    nextattempt.main(["begin", "--run-dir", str(tmp_path), "--nodes", "2"])
    out = capsys.readouterr().out
    assert "ACTION=exit" in out and "EXIT=89" in out
    told = history.read(RunDir(tmp_path))
    assert told.stopped and told.cancelled_by == "clusterctl cancel" and told.exit_code == ExitCode.CANCELLED


def _after(tmp_path, monkeypatch, code: int, verdict: dict | None, slurm: str = "cancelled") -> dict:  # noqa: ANN001
    """The recovery step after attempt 1 of a 2-node run; attempts.jsonl's end event."""
    from clusterctl.runtime.recovery import nextattempt

    (tmp_path / "run.json").write_text("{}")
    (tmp_path / "attempt-1").mkdir()
    if verdict is not None:
        (tmp_path / "attempt-1" / "verdict.json").write_text(json.dumps(verdict))
    monkeypatch.setattr(nextattempt.batchhost, "ending", lambda *_: slurm)
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    nextattempt.main(["after", "--run-dir", str(tmp_path), "--nodes", "2", "--attempt", "1", "--code", str(code),
                      "--srun-exit", "137", "--signal", "TERM"])
    return next(e for e in history.read_events(tmp_path / "attempts.jsonl") if e["event"] == "end")


def test_a_cancel_whose_controller_was_killed_first_is_recorded_as_one_in_verdict_json_too(tmp_path, capsys, monkeypatch) -> None:  # noqa: ANN001
    """A warm process server's step ends with the job and takes the controller along before it gives its verdict: the
    rendezvous's "ok" is all verdict.json says, and srun's 137 made 84. The run's history and verdict.json say 89."""
    from clusterctl.rundir import verdict as verdictfile

    rendezvous = {"ok": True, "code": 0, "message": "all 2 ranks registered and checked", "culprits": []}
    end = _after(tmp_path, monkeypatch, ExitCode.SCRIPT_FAILED, rendezvous)
    assert (end["exit"], end["verdict"]) == (89, "cancelled by scancel: the job was stopped from outside; no node is blamed")
    given = verdictfile.read(tmp_path / "attempt-1")
    assert given is not None and (given.ok, given.code, given.culprits) == (False, ExitCode.CANCELLED, [])
    assert "EXIT=89" in capsys.readouterr().out


def test_a_verdict_naming_culprits_stays_when_a_cancel_follows_it(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    from clusterctl.rundir import verdict as verdictfile

    hang = {"ok": False, "code": 82, "message": "rank 1 on n2 hung", "culprits": [{"rank": 1, "host": "n2"}]}
    assert _after(tmp_path, monkeypatch, ExitCode.HANG, hang)["exit"] == ExitCode.CANCELLED
    assert verdictfile.read(tmp_path / "attempt-1").code == ExitCode.HANG  # the evidence is kept; nobody is excluded
    assert not (tmp_path.parent / "suspects.jsonl").exists()


def test_slurms_own_stop_is_no_cancel(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The time limit's TERM: the controller says 85 and the run goes on; verdict.json keeps the rendezvous's word."""
    from clusterctl.runtime.recovery import nextattempt

    monkeypatch.setattr(nextattempt.batchhost, "submit_after", lambda *_: "7")
    rendezvous = {"ok": True, "code": 0, "message": "all 2 ranks registered and checked", "culprits": []}
    assert _after(tmp_path, monkeypatch, ExitCode.PRE_TIMEOUT, rendezvous, slurm="timeout")["exit"] == ExitCode.PRE_TIMEOUT
    assert json.loads((tmp_path / "attempt-1" / "verdict.json").read_text())["ok"] is True


def test_the_controllers_exit_decides_the_attempts_code() -> None:
    """One verdict reaches the batch script one way: the recovery step takes the controller's exit, else the failing
    verdict.json a killed controller left, else srun's (the batch script's mapping of srun's exit)."""
    from clusterctl.rundir.verdict import Verdict
    from clusterctl.runtime.recovery.nextattempt import attempt_code

    hang = Verdict(False, int(ExitCode.HANG), "rank 1 on n2 hung", [{"rank": 1, "host": "n2"}])
    assert attempt_code(ExitCode.SCRIPT_FAILED, 0, None) == (0, "")  # srun's 137 after a stop is no failure
    assert attempt_code(ExitCode.SCRIPT_FAILED, ExitCode.STRAGGLER, hang) == (ExitCode.STRAGGLER, "")
    code, source = attempt_code(ExitCode.SCRIPT_FAILED, 137, hang)
    assert code == ExitCode.HANG and source.startswith("its verdict.json") and "137" in source
    assert attempt_code(ExitCode.SCRIPT_FAILED, 137, Verdict(True, 0, "all ranks registered"))[0] == ExitCode.SCRIPT_FAILED
    assert attempt_code(ExitCode.NODE_LOST, None, hang) == (ExitCode.NODE_LOST, "")  # an older script's own code stands


def test_the_recovery_step_logs_the_attempts_end_with_the_controllers_code(tmp_path, capsys, monkeypatch) -> None:  # noqa: ANN001
    from clusterctl.runtime.recovery import nextattempt

    (tmp_path / "run.json").write_text('{"restart": {"budget": 0}}')
    (tmp_path / "attempt-1").mkdir()
    (tmp_path / "attempt-1" / "verdict.json").write_text(json.dumps(
        {"ok": False, "code": 82, "message": "rank 1 on n2 hung", "culprits": [{"rank": 1, "host": "n2"}]}))
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    nextattempt.main(["after", "--run-dir", str(tmp_path), "--nodes", "2", "--attempt", "1", "--code", "84",
                      "--controller-exit", "137", "--srun-exit", "137"])
    captured = capsys.readouterr()
    assert "attempt 1 ended: srun exit 137, exit 82 (from its verdict.json: the controller exited with 137" in captured.err
    assert "EXIT=87" in captured.out  # budget 0: the hang stops the run
    end = next(e for e in history.read_events(tmp_path / "attempts.jsonl") if e["event"] == "end")
    assert (end["exit"], end["srun_exit"], end["verdict"]) == (ExitCode.BUDGET_EXHAUSTED, 137, "rank 1 on n2 hung")


def _requeue_run(tmp_path, monkeypatch, requeue) -> list[dict]:  # noqa: ANN001
    """Attempt 1 of a restart.mode requeue run hung on n2 with no spare: the step requeues through `requeue`."""
    from clusterctl.runtime.recovery import nextattempt

    (tmp_path / "run.json").write_text('{"restart": {"mode": "requeue", "budget": 3, "in_allocation": false}}')
    (tmp_path / "attempt-1").mkdir()
    (tmp_path / "attempt-1" / "verdict.json").write_text(json.dumps(
        {"ok": False, "code": 82, "message": "rank 1 on n2 hung", "culprits": [{"rank": 1, "host": "n2"}]}))
    monkeypatch.setattr(nextattempt.batchhost, "requeue_self", requeue)
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    nextattempt.main(["after", "--run-dir", str(tmp_path), "--nodes", "2", "--attempt", "1", "--code", "84",
                      "--controller-exit", "82", "--srun-exit", "137"])
    return [e for e in history.read_events(tmp_path / "attempts.jsonl") if e["event"] == "next"]


def test_a_requeue_is_carried_out_by_the_recovery_step_and_the_shell_only_exits(tmp_path, capsys, monkeypatch) -> None:  # noqa: ANN001
    asked: list[tuple[str, list[str]]] = []
    nexts = _requeue_run(tmp_path, monkeypatch, lambda job, exclude: asked.append((job, exclude)) or "")
    out = capsys.readouterr().out
    assert asked == [("6", ["n2"])] and "ACTION=exit" in out and "EXIT=82" in out
    assert [(n["how"], n["exit"], n["culprit_hosts"]) for n in nexts] == [("requeue", 82, ["n2"])]


def test_a_requeue_slurm_refuses_stops_the_run_and_says_why(tmp_path, capsys, monkeypatch) -> None:  # noqa: ANN001
    from clusterctl.errors import ClusterctlError

    def refused(job_id: str, exclude: list[str]) -> str:
        raise ClusterctlError(f"scontrol requeue {job_id} failed: Requeue of job disabled", ExitCode.BACKEND_UNAVAILABLE)

    nexts = _requeue_run(tmp_path, monkeypatch, refused)
    captured = capsys.readouterr()
    assert "ACTION=exit" in captured.out and "EXIT=82" in captured.out
    assert [n["how"] for n in nexts] == ["stop"]
    assert "requeue failed: scontrol requeue 6 failed: Requeue of job disabled" in nexts[0]["reason"]
    assert "requeue failed" in captured.err


def test_an_elastic_job_with_no_spare_left_shrinks_to_its_largest_planned_width_on_the_survivors() -> None:
    four = ("n1", "n2", "n3", "n4")
    lost = Ended(ExitCode.NODE_LOST, ("n3",), 10, "n3 lost")
    d = decide(lost, situation(allocation=four, rank_hosts=four, nodes=4, widths=(3, 2)), Policy())
    assert (d.action, d.hosts, d.shrunk, d.exclude, d.counted) == ("restart", ["n1", "n2", "n4"], (4, 3), ["n3"], True)
    assert "shrinking in the allocation from 4 to 3 nodes" in d.reason
    # A width the plan refused (3 nodes: say the batch did not divide) is never used: 2 of the 3 survivors.
    d = decide(lost, situation(allocation=four, rank_hosts=four, nodes=4, widths=(2,)), Policy())
    assert (d.action, d.hosts, d.shrunk) == ("restart", ["n1", "n2"], (4, 2))
    # Below the floor: a new job, as without elastic, saying so.
    two_left = situation(allocation=four, rank_hosts=("n1", "n2", "n4"), nodes=4, widths=(3,), excluded=("n3",))
    d = decide(Ended(ExitCode.NODE_LOST, ("n4",), 20), two_left, Policy())
    assert d.action == "continue" and "not even its smallest width, 3 nodes" in d.reason
    # A spare still wins over shrinking.
    d = decide(lost, situation(allocation=(*four, "n5"), rank_hosts=four, nodes=4, widths=(3, 2)), Policy())
    assert (d.action, d.shrunk, d.replaced) == ("restart", None, {"n3": "n5"})


def test_a_shrink_keeps_each_model_parallel_group_in_one_nvlink_domain() -> None:
    four = ("a1", "a2", "b1", "b2")
    domain = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    lost = Ended(ExitCode.NODE_LOST, ("a2",), 10)
    # Groups of two nodes: a1 with b1 would span two domains, so 2 nodes means b1, b2; 3 nodes cannot be whole.
    d = decide(lost, situation(allocation=four, rank_hosts=four, nodes=4, widths=(3, 2), domain=domain, group_nodes=2),
               Policy())
    assert d.action == "restart" and d.hosts == ["b1", "b2"], d


def test_a_shrink_queues_the_full_size_job_when_the_job_grows_back_and_not_otherwise() -> None:
    four = ("n1", "n2", "n3", "n4")
    lost = Ended(ExitCode.NODE_LOST, ("n3",), 10)
    s = situation(allocation=four, rank_hosts=four, nodes=4, widths=(3,))
    assert decide(lost, s, Policy(grow=True)).grow and not decide(lost, s, Policy()).grow
    spare = situation(allocation=(*four, "n5"), rank_hosts=four, nodes=4, widths=(3,))
    assert not decide(lost, spare, Policy(grow=True)).grow  # no shrink, nothing to grow back from


def test_the_history_knows_the_full_size_job_until_it_begins_or_is_withdrawn() -> None:
    grow = {"event": history.EVENT_GROW, "attempt": 1, "job_id": "7", "next_job": "8", "time": 1}
    start = {"event": history.EVENT_START, "attempt": 2, "job_id": "7", "time": 2}
    assert history.fold([grow, start]).grow_job == "8"
    assert history.fold([grow, start, {"event": history.EVENT_START, "attempt": 3, "job_id": "8", "time": 3}]).grow_job is None
    withdrawn = {"event": history.EVENT_NEXT, "attempt": 2, "job_id": "7", "how": "stop", "grow_withdrawn": "8", "time": 3}
    h = history.fold([grow, start, withdrawn])
    assert h.grow_job is None and "8" in h.jobs  # still one of the run's jobs: cancel asks it too


def test_a_script_that_fails_at_the_shrunk_width_is_not_elastic_and_waits_for_its_full_width() -> None:
    four = ("n1", "n2", "n3", "n4")
    bug = Ended(ExitCode.SCRIPT_ERROR, (), 10, "every rank: KeyError: 'rank-3-of-4.pt'")
    shrunk = situation(allocation=four, rank_hosts=("n1", "n2", "n4"), nodes=4, widths=(3,), excluded=("n3",))
    d = decide(bug, shrunk, Policy())
    assert (d.action, d.unelastic, d.exclude) == ("continue", True, ["n3"])
    assert "failed at the shrunk width (3 of 4 nodes)" in d.reason and "An elastic script" in d.reason
    full = situation(allocation=four, rank_hosts=four, nodes=4, widths=(3,))
    assert decide(bug, full, Policy()).action == "stop"  # at full width the script's error stops the run, as ever
    assert history.fold([{"event": "next", "attempt": 2, "job_id": "7", "how": "continuation", "unelastic": True}]).unelastic


def test_the_queued_full_size_job_continues_a_run_that_leaves_and_is_withdrawn_when_it_stops(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """An elastic run shrank and queued job 8: the shrunk attempt's stop (85, the take-over's signal) hands the run to
    job 8 without submitting another; a run that finishes instead cancels job 8."""
    from clusterctl.rundir import RunDir
    from clusterctl.runtime.recovery import nextattempt

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(nextattempt.batchhost, "job", lambda job: JobInfo(job, "PENDING" if job == "8" else "RUNNING"))
    monkeypatch.setattr(nextattempt.batchhost, "ending", lambda *_: "running")
    monkeypatch.setattr(nextattempt.batchhost, "submit_after", lambda *a, **k: calls.append(("submit", "")) or "9")
    monkeypatch.setattr(nextattempt.batchhost, "cancel", lambda job, env: calls.append(("cancel", job)))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    for code, how in ((ExitCode.PRE_TIMEOUT, history.NEXT_CONTINUATION), (ExitCode.OK, history.NEXT_STOP)):
        run_dir = tmp_path / str(code)
        (run_dir / "attempt-2").mkdir(parents=True)
        (run_dir / "run.json").write_text("{}")
        history.append(RunDir(run_dir), history.EVENT_GROW, attempt=1, job_id="7", next_job="8")
        history.append(RunDir(run_dir), history.EVENT_START, attempt=2, job_id="7")
        nextattempt.main(["after", "--run-dir", str(run_dir), "--nodes", "2", "--attempt", "2", "--code", str(code),
                          "--signal", "USR2" if code else ""])
        last = history.read_events(run_dir / "attempts.jsonl")[-1]
        assert last["how"] == how
        if code == ExitCode.PRE_TIMEOUT:
            assert last["next_job"] == "8" and calls == []  # no second continuation
        else:
            assert last["grow_withdrawn"] == "8" and calls == [("cancel", "8")]
