"""`clusterctl logs`: a rank's lines, a node's, an attempt merged in time order, --follow, bad input.

The runs are written by hand: 4 ranks on 2 nodes (2 a node); attempts 1 and 2 in job 11 (a
restart in the allocation), attempt 3 in continuation job 12 with node3 in node1's slot.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from helpers import cli

from clusterctl.cli import logs_cmd
from clusterctl.rundir import RunDir
from clusterctl.views import logs as runlogs

T0 = 1796097000  # 2026-12-01T03:50:00Z


def iso(offset: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + offset))


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(text)


def event(run: Path, **fields: object) -> None:
    append(run / "attempts.jsonl", json.dumps(fields) + "\n")


def attempt_dir(run: Path, n: int, job: str, hosts: list[str], started: int) -> Path:
    path = run / f"attempt-{n}"
    (path / "logs").mkdir(parents=True, exist_ok=True)
    info = {"job_id": job, "attempt": n, "hosts": hosts, "started": T0 + started}
    write(path / "attempt.json", json.dumps(info))
    event(run, event="start", attempt=n, job_id=job, time=T0 + started)
    return path


def base_run(tmp_path: Path) -> Path:
    run = tmp_path / "toy-20261201-035000-abcd"
    write(run / "run.json", json.dumps({"name": "toy", "world_size": 4, "gpus_per_node": 2, "nodes": 2}))
    write(run / "state.json", json.dumps({"run_id": run.name, "state": "submitted"}))
    return run


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = base_run(tmp_path)
    a1 = attempt_dir(run, 1, "11", ["node1", "node2"], 0)
    write(a1 / "logs/node-0.log", f"0: hello from 0\n1: hello from 1\n0: {iso(5)} stamped by rank 0\n1: after stamp\n")
    write(a1 / "logs/node-1.log", f"2: hello from 2\n3: hello from 3\n3: {iso(3)} rank 3 stamped\n2: Traceback (most recent call last):\n")
    event(run, event="end", attempt=1, job_id="11", exit=84)
    event(run, event="next", how="allocation", attempt=1, job_id="11")
    a2 = attempt_dir(run, 2, "11", ["node1", "node2"], 6)
    write(a2 / "logs/node-0.log", "0: again 0\n1: again 1\n")
    write(a2 / "logs/node-1.log", "2: again 2\n3: again 3\n3: saving\n")
    event(run, event="end", attempt=2, job_id="11", exit=85)
    event(run, event="next", how="continuation", next_job="12", attempt=2, job_id="11")
    write(
        run / "slurm-11.out",
        f"{iso(0)} clusterctl: attempt 1 of job 11: 4 ranks on node1..node2, rendezvous 10.0.0.1:20000\n"
        f"{iso(2)} clusterctl controller: all 4 ranks registered and checked\n"
        "srun: error: node2: task 2: Exited with exit code 1\n"
        f"{iso(6)} clusterctl: attempt 1 ended: srun exit 1, exit 84\n"
        f"{iso(6)} clusterctl: attempt 2 of job 11: 4 ranks on node1..node2, rendezvous 10.0.0.1:20001\n"
        f"{iso(9)} clusterctl: received SIGUSR2; asking the ranks to save, commit and stop\n"
        f"{iso(10)} clusterctl: attempt 2 ended: srun exit 85, exit 85\n",
    )
    a3 = attempt_dir(run, 3, "12", ["node3", "node2"], 601)
    write(a3 / "logs/node-0.log", "0: resumed at step 40\n1: resumed\n")
    write(a3 / "logs/node-1.log", "2: resumed\n3: resumed\n")
    write(
        run / "slurm-12.out",
        f"{iso(600)} clusterctl: resuming from step 40\n"
        f"{iso(601)} clusterctl: attempt 3 of job 12: 4 ranks on node3..node2, rendezvous 10.0.0.3:20002\n"
        f"{iso(630)} clusterctl: attempt 3 ended: srun exit 0, exit 0\n",
    )
    event(run, event="end", attempt=3, job_id="12", exit=0)
    event(run, event="next", how="stop", attempt=3, job_id="12", exit=0, reason="training finished")
    return run


def logs(*args: str) -> list[str]:
    result = cli("logs", *args)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def refused(*args: str) -> str:
    result = cli("logs", *args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.stderr


# -- one rank, one node --------------------------------------------------------


def test_rank_of_the_latest_attempt_without_label(run: Path) -> None:
    assert logs(str(run), "--rank", "0") == ["resumed at step 40"]
    assert logs(str(run), "--rank", "3", "--attempt", "1") == ["hello from 3", f"{iso(3)} rank 3 stamped"]
    assert logs(str(run), "-r", "2", "-a", "1") == ["hello from 2", "Traceback (most recent call last):"]


def test_the_latest_attempt_says_which_earlier_ones_failed_and_how_to_see_them(run: Path) -> None:
    result = cli("logs", str(run), "--rank", "0")
    assert result.exit_code == 0 and result.stdout.splitlines() == ["resumed at step 40"]
    assert "note: showing attempt 3; attempt 1 (job 11) ended with exit 84" in result.stderr
    assert "attempt 2" not in result.stderr and f"logs {run} --attempt 1" in result.stderr  # 85 was a planned stop
    assert "note:" not in cli("logs", str(run), "--rank", "0", "--attempt", "3").stderr  # asked for: no note


def test_rank_over_all_attempts_with_headers(run: Path) -> None:
    assert logs(str(run), "--rank", "3", "--attempt", "all") == [
        "==> attempt 1 (job 11) on node1, node2 <==",
        "hello from 3",
        f"{iso(3)} rank 3 stamped",
        "",
        "==> attempt 2 (job 11) on node1, node2 <==",
        "again 3",
        "saving",
        "",
        "==> attempt 3 (job 12) on node3, node2 <==",
        "resumed",
    ]


def test_padded_labels(tmp_path: Path) -> None:
    """srun pads labels to the widest task id (` 3: ` among 12 tasks): the rank and text come out right."""
    run = base_run(tmp_path)
    write(run / "run.json", json.dumps({"world_size": 12, "gpus_per_node": 12, "nodes": 1}))
    a1 = attempt_dir(run, 1, "5", ["gpu-001"], 0)
    write(a1 / "logs/node-0.log", " 3: three\n11: eleven\n 3:   indented\n")
    assert logs(str(run), "--rank", "3") == ["three", "  indented"]
    assert logs(str(run), "--rank", "11") == ["eleven"]
    assert runlogs.parse_label(" 3: x") == (3, "x")
    assert runlogs.parse_label("srun: error: x") == (None, "srun: error: x")


def test_node_by_slot_or_host(run: Path) -> None:
    as_written = ["2: again 2", "3: again 3", "3: saving"]
    assert logs(str(run), "--node", "1", "--attempt", "2") == as_written
    assert logs(str(run), "--node", "node2", "--attempt", "2") == as_written
    # node3 replaced node1 in slot 0 for attempt 3: the host finds its own slot in each attempt
    assert logs(str(run), "--node", "node3") == ["0: resumed at step 40", "1: resumed"]
    assert logs(str(run), "--node", "node1", "--attempt", "all") == [
        "==> attempt 1 (job 11) on node1, node2 <==",
        "0: hello from 0",
        "1: hello from 1",
        f"0: {iso(5)} stamped by rank 0",
        "1: after stamp",
        "",
        "==> attempt 2 (job 11) on node1, node2 <==",
        "0: again 0",
        "1: again 1",
        "",
        "==> attempt 3 (job 12) on node3, node2 <==",
    ]


# -- merged --------------------------------------------------------------------


def test_merged_attempt_in_time_order(run: Path) -> None:
    """Stamped lines by their time; unstamped ones after the last stamped line of their own file."""
    assert logs(str(run), "--attempt", "1") == [
        f"batch   | {iso(0)} clusterctl: attempt 1 of job 11: 4 ranks on node1..node2, rendezvous 10.0.0.1:20000",
        "node1/0 | hello from 0",
        "node1/1 | hello from 1",
        "node2/2 | hello from 2",
        "node2/3 | hello from 3",
        f"batch   | {iso(2)} clusterctl controller: all 4 ranks registered and checked",
        "batch   | srun: error: node2: task 2: Exited with exit code 1",
        f"node2/3 | {iso(3)} rank 3 stamped",
        "node2/2 | Traceback (most recent call last):",
        f"node1/0 | {iso(5)} stamped by rank 0",
        "node1/1 | after stamp",
        f"batch   | {iso(6)} clusterctl: attempt 1 ended: srun exit 1, exit 84",
    ]


def test_a_rank_file_without_stamps_follows_the_rendezvous_not_the_attempts_start(tmp_path: Path) -> None:
    """A rank prints nothing of its own before the controller lets it run (the verdict): its unstamped lines come
    after the controller's first lines, each after the line before it in its file, never before the start-up."""
    run = base_run(tmp_path)
    a1 = attempt_dir(run, 1, "11", ["node1", "node2"], 0)
    write(a1 / "verdict.json", json.dumps({"ok": True, "code": 0, "message": "all 4 ranks registered and checked",
                                            "time": T0 + 40.5}))
    write(a1 / "logs/node-0.log", "0: training from step 0\n0: clusterctl trainer: {\"steps\": 300}\n")
    write(
        run / "slurm-11.out",
        f"{iso(0)} clusterctl: attempt 1 of job 11: 4 ranks on node1..node2, rendezvous 10.0.0.1:20000\n"
        f"{iso(38)} clusterctl controller: hosting the rendezvous store on port 20000 for 4 ranks\n"
        f"{iso(40)} clusterctl controller: all 4 ranks registered and checked\n"
        f"{iso(90)} clusterctl: attempt 1 ended: srun exit 0, exit 0\n",
    )
    assert logs(str(run)) == [
        f"batch   | {iso(0)} clusterctl: attempt 1 of job 11: 4 ranks on node1..node2, rendezvous 10.0.0.1:20000",
        f"batch   | {iso(38)} clusterctl controller: hosting the rendezvous store on port 20000 for 4 ranks",
        f"batch   | {iso(40)} clusterctl controller: all 4 ranks registered and checked",
        "node1/0 | training from step 0",
        'node1/0 | clusterctl trainer: {"steps": 300}',
        f"batch   | {iso(90)} clusterctl: attempt 1 ended: srun exit 0, exit 0",
    ]


def test_merged_continuation_job_has_its_own_batch_log(run: Path) -> None:
    """Attempt 3 ran in job 12: its batch lines, the preamble before its marker too, come from slurm-12.out only."""
    assert logs(str(run)) == [
        f"batch   | {iso(600)} clusterctl: resuming from step 40",
        f"batch   | {iso(601)} clusterctl: attempt 3 of job 12: 4 ranks on node3..node2, rendezvous 10.0.0.3:20002",
        "node3/0 | resumed at step 40",
        "node3/1 | resumed",
        "node2/2 | resumed",
        "node2/3 | resumed",
        f"batch   | {iso(630)} clusterctl: attempt 3 ended: srun exit 0, exit 0",
    ]


def test_all_attempts_split_one_batch_log_between_them(run: Path) -> None:
    out = logs(str(run), "--attempt", "all", "--grep", r"clusterctl: attempt \d|again 0|SIGUSR2")
    assert out == [
        "==> attempt 1 (job 11) on node1, node2 <==",
        f"batch   | {iso(0)} clusterctl: attempt 1 of job 11: 4 ranks on node1..node2, rendezvous 10.0.0.1:20000",
        f"batch   | {iso(6)} clusterctl: attempt 1 ended: srun exit 1, exit 84",
        "",
        "==> attempt 2 (job 11) on node1, node2 <==",
        f"batch   | {iso(6)} clusterctl: attempt 2 of job 11: 4 ranks on node1..node2, rendezvous 10.0.0.1:20001",
        "node1/0 | again 0",
        f"batch   | {iso(9)} clusterctl: received SIGUSR2; asking the ranks to save, commit and stop",
        f"batch   | {iso(10)} clusterctl: attempt 2 ended: srun exit 85, exit 85",
        "",
        "==> attempt 3 (job 12) on node3, node2 <==",
        f"batch   | {iso(601)} clusterctl: attempt 3 of job 12: 4 ranks on node3..node2, rendezvous 10.0.0.3:20002",
        f"batch   | {iso(630)} clusterctl: attempt 3 ended: srun exit 0, exit 0",
    ]


def test_grep_matches_the_text_not_the_source(run: Path) -> None:
    assert logs(str(run), "--attempt", "1", "--grep", "^hello from [13]$") == ["node1/1 | hello from 1", "node2/3 | hello from 3"]
    assert logs(str(run), "--attempt", "1", "--grep", "node1") == [
        f"batch   | {iso(0)} clusterctl: attempt 1 of job 11: 4 ranks on node1..node2, rendezvous 10.0.0.1:20000"
    ]


def test_time_parsing() -> None:
    assert runlogs.parse_time(f"{iso(0)} clusterctl: x") == T0
    assert runlogs.parse_time("2026-12-01T04:50:00.5+01:00 x") == T0 + 0.5
    assert runlogs.parse_time("2026-12-01T03:50:00") == T0
    assert runlogs.parse_time("srun: error") is None
    assert runlogs.parse_time("2026-12-01T03:50:00Zoo") is None


# -- bad input -----------------------------------------------------------------


def test_unknown_attempt_rank_node_say_what_exists(run: Path) -> None:
    assert "attempt 7 does not exist; attempts: 1, 2, 3" in refused(str(run), "--attempt", "7")
    assert "--attempt takes an attempt number or 'all', not 'last'" in refused(str(run), "--attempt", "last")
    assert "rank 4 does not exist; ranks: 0-3" in refused(str(run), "--rank", "4")
    assert "rank -1 does not exist" in refused(str(run), "--rank", "-1")
    err = refused(str(run), "--node", "node1")
    assert "node 'node1' did not run attempt 3; nodes: node2, node3" in err
    assert "node slot 2 does not exist; slots: 0, 1" in refused(str(run), "--node", "2")
    assert "cannot be given together" in refused(str(run), "--rank", "1", "--node", "0")


def test_bad_regex_is_named(run: Path) -> None:
    err = refused(str(run), "--grep", "step (")
    assert "--grep 'step (' is not a valid Python regular expression" in err


def test_run_without_attempts(tmp_path: Path) -> None:
    run = base_run(tmp_path)
    assert "the run has no attempts yet" in refused(str(run))


def test_missing_run() -> None:
    result = cli("logs", "/nonexistent/run")
    assert result.exit_code == 2
    assert "no run" in result.stderr


# -- files that grow, appear, are truncated --------------------------------------


def test_tail_reads_whole_lines_and_starts_over_when_replaced(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    tail = runlogs.Tail(path)
    assert tail.read() == []  # not there yet
    write(path, "a\nb")
    assert tail.read() == ["a"]
    append(path, "c\nd\n")
    assert tail.read() == ["bc", "d"]
    write(path, "x\n")  # truncated and rewritten
    assert tail.read() == ["x"]
    path.rename(tmp_path / "f.log.1")  # rotated: a new file under the old name
    write(path, "new\nlast")
    assert tail.read() == ["new"]
    assert tail.read(final=True) == ["last"]


def test_follow_picks_up_new_lines_new_attempts_and_a_continuation_job(tmp_path: Path) -> None:
    """Driven step by step: each poll's wait writes the next piece, so every line's place is exact."""
    run = base_run(tmp_path)
    a1 = attempt_dir(run, 1, "21", ["node1", "node2"], 0)
    append(run / "slurm-21.out", f"{iso(0)} clusterctl: attempt 1 of job 21: 4 ranks on node1..node2, rendezvous x\n")
    append(a1 / "logs/node-0.log", "0: step 1\n")

    def start_attempt_2() -> None:
        append(run / "slurm-21.out", f"{iso(8)} clusterctl: attempt 1 ended: srun exit 1, exit 84\n")
        event(run, event="end", attempt=1, job_id="21", exit=84)
        event(run, event="next", how="continuation", next_job="22", attempt=1, job_id="21")
        a2 = attempt_dir(run, 2, "22", ["node3", "node4"], 20)
        append(run / "slurm-22.out", f"{iso(20)} clusterctl: attempt 2 of job 22: 4 ranks on node3..node4, rendezvous y\n")
        append(a2 / "logs/node-1.log", "3: back\n")

    steps = [
        lambda: append(a1 / "logs/node-0.log", "1: step 1\n0: st"),  # half a line: held back
        lambda: append(a1 / "logs/node-0.log", "ep 2\n") or append(a1 / "logs/node-1.log", "2: late file\n"),
        lambda: write(a1 / "logs/node-1.log", "3: after truncation\n"),
        start_attempt_2,
        lambda: append(run / "slurm-22.out", f"{iso(30)} clusterctl: attempt 2 ended: srun exit 0, exit 0\n"),
        lambda: event(run, event="next", how="stop", attempt=2, job_id="22"),
        lambda: append(run / "slurm-22.out", f"{iso(30)} clusterctl: training finished\n"),
    ]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if steps:
            steps.pop(0)()

    clock = iter(range(1000)).__next__
    out = list(
        runlogs.follow(
            RunDir(run), runlogs.Selection(), None, None, lambda: runlogs.run_over(RunDir(run), lambda: True),
            sleep=sleep, clock=lambda: float(clock()), linger_s=2,
        )
    )
    assert out == [
        "==> attempt 1 (job 21) on node1, node2 <==",
        f"batch   | {iso(0)} clusterctl: attempt 1 of job 21: 4 ranks on node1..node2, rendezvous x",
        "node1/0 | step 1",
        "node1/1 | step 1",
        "node1/0 | step 2",
        "node2/2 | late file",
        "node2/3 | after truncation",
        f"batch   | {iso(8)} clusterctl: attempt 1 ended: srun exit 1, exit 84",
        "",
        "==> attempt 2 (job 22) on node3, node4 <==",
        f"batch   | {iso(20)} clusterctl: attempt 2 of job 22: 4 ranks on node3..node4, rendezvous y",
        "node4/3 | back",
        f"batch   | {iso(30)} clusterctl: attempt 2 ended: srun exit 0, exit 0",
        f"batch   | {iso(30)} clusterctl: training finished",  # written after the stop event: read while lingering
    ]
    assert set(waits) == {runlogs.POLL_S}


def test_follow_cli_with_a_writer_thread(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's lines appear while `logs --follow` runs; a new attempt, then the stop event, end it."""
    lines = (run / "attempts.jsonl").read_text().splitlines()
    (run / "attempts.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # attempt 3 has not stopped yet
    monkeypatch.setattr(logs_cmd, "job_active", lambda target: lambda: True)
    node = run / "attempt-3/logs/node-1.log"

    def writer() -> None:
        for step in range(5):
            time.sleep(0.2)
            append(node, f"3: step {step}\n")
        a4 = run / "attempt-4"
        (a4 / "logs").mkdir(parents=True)
        write(a4 / "attempt.json", json.dumps({"job_id": "12", "attempt": 4, "hosts": ["node3", "node2"], "started": T0 + 700}))
        time.sleep(0.6)
        append(a4 / "logs/node-1.log", "3: attempt 4 begins\n")
        time.sleep(0.6)
        event(run, event="next", how="stop", attempt=4, job_id="12")

    thread = threading.Thread(target=writer)
    thread.start()
    started = time.monotonic()
    try:
        out = logs(str(run), "--rank", "3", "--follow")
    finally:
        thread.join()
    assert time.monotonic() - started < 30
    assert out == [
        "==> attempt 3 (job 12) on node3, node2 <==",
        "resumed",
        *[f"step {n}" for n in range(5)],
        "",
        "==> attempt 4 (job 12) on node3, node2 <==",
        "attempt 4 begins",
    ]


def test_follow_of_an_ended_run_prints_and_returns(run: Path) -> None:
    out = logs(str(run), "--follow", "--attempt", "2", "--node", "1")
    assert out == [
        "==> attempt 2 (job 11) on node1, node2 <==",
        "2: again 2",
        "3: again 3",
        "3: saving",
        "",
        "==> attempt 3 (job 12) on node3, node2 <==",
        "2: resumed",
        "3: resumed",
    ]


def test_run_over_needs_a_stop_or_no_job(run: Path, tmp_path: Path) -> None:
    assert runlogs.run_over(RunDir(run), lambda: True)  # next how=stop
    other = base_run(tmp_path / "other")
    attempt_dir(other, 1, "30", ["node1", "node2"], 0)
    event(other, event="end", attempt=1, job_id="30", exit=84)
    assert not runlogs.run_over(RunDir(other), lambda: True)  # the job may still decide what comes next
    assert runlogs.run_over(RunDir(other), lambda: False)  # no job left: nothing more will be written
