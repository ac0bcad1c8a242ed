"""Elastic jobs end to end: a node lost with no spare left, the job shrinks its data parallelism in its allocation.

A 2-node job (1 GPU each: dp 2) of the reference trainer with `elastic:`
and in-memory snapshots, on the local backend and on the real Slurm test
cluster, has its second node lost from outside (`clusterctl drill --node`).
What a user checks afterwards: the next attempt ran in the same job on the
one node left at dp 1 with twice the accumulation (the global batch kept),
attempts.jsonl and `status` say `dp 2 → 1`, it resumed from host memory
with at most the step in flight computed again, the run finished, and every
sample of every step was trained exactly once, none twice and none skipped:
each step's samples are the stretch of the epoch an uninterrupted run takes.
The shrink gives the lost node back to Slurm. With `grow: true` the
full-size job queued at the shrink takes the run back to dp 2, resuming
right after the step the shrunk attempt committed when it was asked to
stop, on the lost node once it is cleared (`suspects --clear`): no other
node is free to it (on the test cluster another job holds them and the
full-size job waits in the queue; on the local backend the spec leaves them
out, Slurm refuses to queue it, and the clear queues it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import cli
from test_recovery_e2e import drill, first_step, losses, nexts, nothing_left, status, story, submit, wait_for

from clusterctl import rundir
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, history
from clusterctl.trainer.loop import DATASET_SIZE
from clusterctl.trainer.sampler import DistributedSampler

STEPS, MICRO, GLOBAL = 80, 2, 4
# The lost node is the only one to grow back onto: on the test cluster another job holds the other two nodes (the
# full-size job is queued and waits), on the local backend the spec leaves them out (Slurm refuses to queue it).
BUSY = ["n3", "n4"]
LEFT_OUT = ["node3", "node4"]


def hold_nodes(tmp_path: Path, nodes: list[str]) -> None:
    """Another job on `nodes`, whole: the run's full-size job must wait for other nodes (cancelled at the test's end:
    its script lives under tmp_path)."""
    script = tmp_path / "busy.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    out = subprocess.run(["sbatch", "--parsable", "--exclusive", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
                          "--time=10", f"--output={tmp_path / 'busy.out'}", str(script)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    wait_for("the other job to hold its nodes", lambda: subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30).stdout.strip() == "RUNNING")


def samples_by_step(run: RunDir) -> dict[int, list[int]]:
    """Every step's sample ids over all ranks, a step computed twice taken from its last attempt."""
    found: dict[int, list[int]] = {}
    for attempt in run.attempts():
        this: dict[int, list[int]] = {}
        for path in sorted(run.attempt(attempt).glob("samples-rank*.jsonl")):
            for line in path.read_text().splitlines():
                row = json.loads(line)
                this.setdefault(row["step"], []).extend(row["ids"])
        found.update(this)
    return found


@pytest.mark.parametrize("grow", [False, True], ids=["shrink", "grow"])
def test_a_node_lost_with_no_spare_left_shrinks_dp_in_the_allocation_and_trains_every_sample_once(
    backend: str, tmp_path: Path, grow: bool
) -> None:
    """Shrink: the run finishes at dp 1 in its first job, the lost node given back to Slurm. Grow: once the lost node
    is cleared the full-size job starts on it, the shrunk attempt saves and stops (85) and hands the run to it, which
    resumes right after."""
    if backend == "slurm" and not grow:
        pytest.skip("the shrink alone is the grow case's first half on the test cluster (and bench/elastic.py's)")
    # With grow the shrunk attempt trains on while the full-size job's warm servers import (seconds on 2 cores):
    # its steps are longer, else the run finishes shrunk before the take-over and the queued job is withdrawn.
    compute_s = "0.15" if grow else "0.05"
    if backend == "slurm":
        hold_nodes(tmp_path, BUSY)
    done = submit(backend, tmp_path, "elastic", steps=STEPS, batch={"micro": MICRO, "global": GLOBAL},
                  elastic={"min_nodes": 1, "batch": "keep", "grow": grow}, checkpoint={"interval": 20, "memory_interval": 1},
                  topology={"exclude": LEFT_OUT if grow and backend == "local" else []},
                  command=["python3", "-m", "clusterctl.trainer", "--steps", str(STEPS), "--eval-interval", "0",
                           "--step-compute-s", compute_s, "--record-samples"])
    run = done.run
    wait_for("step 12", lambda: max(losses(run, 1), default=-1) >= 12, run=run)
    hosts = json.loads((run.attempt(1) / rundir.ATTEMPT_JSON).read_text())["hosts"]
    report = drill(run, "--node", hosts[1])
    assert report["code"] == ExitCode.NODE_LOST and report["culprit_right"], report
    shrink = wait_for("the shrink", lambda: nexts(run), run=run)[0]
    assert (shrink["how"], shrink["hosts"], shrink["released"]) == (history.NEXT_ALLOCATION, hosts[:1], hosts[1:]), story(run)
    assert hosts[1] in shrink["exclude"]
    width = shrink["width"]
    assert (width["dp"], width["grad_accum"], width["global_batch"]) == ([2, 1], [1, 2], [GLOBAL, GLOBAL]), width
    resumed = first_step(run, 2)
    assert max(losses(run, 1)) - (resumed - 1) <= 1, story(run)  # at most the step in flight is computed again
    record = json.loads((run.attempt(2) / rundir.RECORD).read_text())["recovery"]
    assert record["resumed_from"]["memory"] and record["resumed_from"]["from_world_size"] == 2, record
    second = json.loads((run.attempt(2) / rundir.ATTEMPT_JSON).read_text())
    assert (second["hosts"], second["job_id"]) == (hosts[:1], json.loads((run.attempt(1) / rundir.ATTEMPT_JSON).read_text())["job_id"])
    last = 3 if grow else 2
    if grow:  # no node but the lost one: cleared, the full-size job runs there and the shrunk attempt hands over
        if backend == "slurm":
            wait_for("the queued full-size job", lambda: history.read(run).grow_job, run=run)
        else:
            wait_for("Slurm's refusal to queue it", lambda: history.read(run).grow_refused, run=run)
        assert hosts[1] in history.read(run).grow_exclude
        cleared = cli("suspects", "--runs-root", str(run.path.parent), "--clear", hosts[1])
        assert cleared.exit_code == 0 and f"run on {hosts[1]}" in cleared.stdout, cleared.output
        grow_job = history.read(run).grow_job
        handed = wait_for("the hand-over", lambda: len(nexts(run)) > 1 and nexts(run)[1], run=run)
        assert (handed["how"], handed["exit"], handed["next_job"]) == (history.NEXT_CONTINUATION, ExitCode.PRE_TIMEOUT, grow_job)
        third = wait_for("attempt 3", lambda: (run.attempt(3) / rundir.ATTEMPT_JSON).exists()
                         and json.loads((run.attempt(3) / rundir.ATTEMPT_JSON).read_text()), run=run)
        assert third["job_id"] == grow_job and sorted(third["hosts"]) == sorted(hosts), third  # the cleared node back
        assert first_step(run, 3) == handed["committed_step"] + 1 == max(losses(run, 2)) + 1, story(run)
    wait_for("the run to finish", lambda: max(losses(run, last), default=-1) == STEPS - 1, run=run)
    nothing_left(backend, run)
    st = status(run)
    assert (st["state"], st["exit_code"], len(st["attempts"])) == ("completed", 0, last), st
    assert st["attempts"][0]["width"]["dp"] == [2, 1], st["attempts"][0]
    # Every step took the epoch's next GLOBAL samples, as one rank alone would: none twice, none skipped.
    taken = samples_by_step(run)
    whole = DistributedSampler(DATASET_SIZE, 0, 1)
    assert {s: sorted(ids) for s, ids in taken.items()} == {s: sorted(whole.take(GLOBAL)) for s in range(STEPS)}


def test_a_script_that_is_not_elastic_fails_at_the_shrunk_width_and_the_run_waits_for_its_full_width(tmp_path: Path) -> None:
    """Its per-rank files are keyed by the rank count: at dp 1 every rank fails the same way. No node is blamed for
    it, the run does not stop as for a script bug at full width: it goes on at full width in a new job, and shrinks
    no more."""
    script = Path(__file__).parent / "programs" / "not_elastic.py"
    done = submit("local", tmp_path, "plain", elastic={"min_nodes": 1},
                  command=["python3", str(script), str(tmp_path / "state"), "2"])
    run = done.run
    wait_for("both ranks' state", lambda: len(list((tmp_path / "state").glob("rank-*-of-2.txt"))) == 2, run=run)
    hosts = json.loads((run.attempt(1) / rundir.ATTEMPT_JSON).read_text())["hosts"]
    assert drill(run, "--node", hosts[1])["culprit_right"]
    shrink, refused = wait_for("the shrink and its refusal", lambda: len(nexts(run)) > 1 and nexts(run)[:2], run=run)
    assert shrink["how"] == history.NEXT_ALLOCATION and shrink["width"]["dp"] == [2, 1], story(run)
    assert (refused["exit"], refused["how"], refused["unelastic"]) == (ExitCode.SCRIPT_ERROR, history.NEXT_CONTINUATION, True)
    assert "failed at the shrunk width (1 of 2 nodes)" in refused["reason"] and "An elastic script" in refused["reason"]
    third = wait_for("attempt 3", lambda: (run.attempt(3) / rundir.ATTEMPT_JSON).exists()
                     and json.loads((run.attempt(3) / rundir.ATTEMPT_JSON).read_text()), run=run)
    assert third["job_id"] == refused["next_job"] and len(third["hosts"]) == 2  # full width again
    assert history.read(run).unelastic
    assert cli("cancel", str(run.path)).exit_code == 0
    nothing_left("local", run)
