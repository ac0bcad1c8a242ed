"""The Lightning and Hugging Face examples under clusterctl, end to end: a real tiny model, 2 ranks, faults from outside.

Each framework's example (examples/own-script/) runs as a user would run it,
with the adapter's few lines, 2 nodes x 1 GPU, a checkpoint every 10 steps:
Lightning on the local backend, the Hugging Face Trainer on the Slurm test
cluster. A pre-timeout stop (`clusterctl drill --pre-timeout`) must save,
commit and exit 85, and the continuation job resume right after the
committed step (the new job's nodes hold no snapshot: the committed
checkpoint); then a killed rank (`drill --kill 1`) must restart in the
allocation from the framework's own checkpoint kept in host memory
(`checkpoint.memory_interval: 1`), the step in flight at most computed
again; the run then finishes, the Trainer's with every loss equal to an
uninterrupted run's. What a user checks: the steps in
metrics.jsonl, where the run record says each attempt resumed from,
`clusterctl status`, and `clusterctl checkpoints` listing the framework's
own checkpoints, verified.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import BACKEND_SITES
from helpers import cli
from test_recovery_e2e import drill, first_step, nexts, nothing_left, run_stopped, status, story, wait_for

from clusterctl import rundir
from clusterctl.actions.submit import submit_job
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.job import load_job
from clusterctl.rundir import RunDir, history

pytestmark = pytest.mark.framework
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "own-script"
INTERVAL, STEPS = 10, 60
SCRIPTS = {"lightning": ("train_lightning.py", "lightning"), "hf": ("train_hf.py", "transformers")}


def past_step(run: RunDir, attempt: int, step: int) -> None:
    path = run.attempt(attempt) / rundir.METRICS

    def far() -> bool:
        lines = path.read_text().splitlines() if path.exists() else []
        return bool(lines) and json.loads(lines[-1])["step"] >= step

    wait_for(f"attempt {attempt} past step {step}", far, timeout=180, run=run)


@pytest.mark.parametrize("framework", sorted(SCRIPTS))
def test_a_framework_script_stops_in_time_resumes_after_a_kill_and_finishes(
    backend: str, framework: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, module = SCRIPTS[framework]
    if (backend, framework) in (("slurm", "lightning"), ("local", "hf")):
        pytest.skip("the adapters share integrations/rank/framework.py: Lightning runs on the local backend, the Hugging Face"
                    " example on the test cluster")
    pytest.importorskip(module, reason=f"the {framework} extra is not installed")
    monkeypatch.chdir(tmp_path)  # the ranks run here (the Trainer's output_dir is relative)
    spec = {
        "name": f"fw-{framework}", "site": BACKEND_SITES[backend], "time_limit": "20m", "nodes": 2, "gpus_per_node": 1,
        "runs_root": str(tmp_path / "runs"), "checkpoint": {"interval": INTERVAL, "keep": 2, "memory_interval": 1},
        "command": ["python3", str(EXAMPLES / script)], "env": {"STEPS": str(STEPS), "STEP_S": "0.05"},
    }
    (tmp_path / "job.yaml").write_text(json.dumps(spec))
    done = submit_job(load_job(tmp_path / "job.yaml"), backend)
    run = done.run

    # A pre-timeout stop: every rank saves the same step, rank 0 commits it, all exit 85; a new job continues.
    past_step(run, 1, INTERVAL + 2)
    assert drill(run, "--pre-timeout")["code"] == ExitCode.PRE_TIMEOUT
    stop = wait_for("the continuation", lambda: nexts(run), run=run)[0]
    assert stop["how"] == history.NEXT_CONTINUATION and stop["exit"] == ExitCode.PRE_TIMEOUT, story(run)
    last = json.loads((run.attempt(1) / rundir.METRICS).read_text().splitlines()[-1])["step"]
    assert stop["committed_step"] == last, story(run)  # saved at the step where the ranks stopped
    assert first_step(run, 2) == last + 1, story(run)
    assert resumed_how(run, 2) == f"resumed from step {last}", story(run)
    kill_and_resume(run, 2, last)
    nothing_left(backend, run)

    st = status(run)
    assert (st["state"], st["step"]) == ("completed", STEPS - 1), st
    assert isinstance(st.get("loss"), float), st  # the loss the framework computed, from rank 0's metrics
    listed = cli("checkpoints", str(run.path), "--verify", "--json")
    assert listed.exit_code == 0, listed.output
    generations = [g for g in json.loads(listed.stdout)["generations"] if g["kind"] == "committed"]
    assert [g["step"] for g in generations] == [STEPS - 1, STEPS - INTERVAL - 1], generations  # keep: 2
    assert all(not g["problems"] for g in generations), generations
    if framework == "hf":  # the Trainer resumes mid-epoch where it stopped (Lightning restarts the epoch's batches)
        (tmp_path / "whole").mkdir()
        spec.update(name="fw-hf-whole", runs_root=str(tmp_path / "whole"))
        (tmp_path / "whole.yaml").write_text(json.dumps(spec))
        whole = submit_job(load_job(tmp_path / "whole.yaml"), backend).run
        wait_for("the uninterrupted run", lambda: run_stopped(whole), timeout=240, run=whole)
        # From a committed folder, then from memory: the same losses. The killed attempt's last step may have no
        # logged loss (killed between the step and the Trainer's log) and, resumed after from its snapshot, none at all.
        interrupted, uninterrupted = logged_losses(run, 3), logged_losses(whole, 1)
        assert interrupted == {s: uninterrupted[s] for s in interrupted} and len(uninterrupted) - len(interrupted) <= 1


def logged_losses(run: RunDir, attempts: int) -> dict[int, float]:
    """Every step's logged loss over the run's attempts (the last attempt's, where one was computed twice)."""
    found: dict[int, float] = {}
    for attempt in range(1, attempts + 1):
        for line in (run.attempt(attempt) / rundir.METRICS).read_text().splitlines():
            record = json.loads(line)
            if record.get("loss") is not None:
                found[record["step"]] = record["loss"]
    return found


def resumed_how(run: RunDir, attempt: int) -> str:
    """Where the adapter says this attempt resumed from (attempt-N/record.json, rank 0)."""
    return json.loads((run.attempt(attempt) / rundir.RECORD).read_text())["recovery"]["how"]


def kill_and_resume(run: RunDir, attempt: int, last: int) -> None:
    """A killed rank in attempt `attempt`: a restart in the same job, from the in-memory snapshot of the newest step."""
    past_step(run, attempt, last + 3)  # snapshots newer than the committed step; steps left for the drill to land in
    assert drill(run, "--kill", "1")["code"] == ExitCode.SCRIPT_FAILED
    end = wait_for("the run to finish", lambda: run_stopped(run), timeout=240, run=run)
    killed = nexts(run)[attempt - 1]
    assert killed["how"] == history.NEXT_ALLOCATION and killed["exit"] == ExitCode.SCRIPT_FAILED, story(run)
    reached = json.loads((run.attempt(attempt) / rundir.METRICS).read_text().splitlines()[-1])["step"]
    resumed = first_step(run, attempt + 1)
    assert reached - (resumed - 1) <= 1, story(run)  # at most the step in flight computed again
    # From memory; the committed checkpoint only when the kill came right after its step, before that step's snapshot
    # was whole (a snapshot as new as the committed step wins).
    how = resumed_how(run, attempt + 1)
    assert how == f"resumed from the in-memory snapshot of step {resumed - 1}" or (
        resumed - 1 == killed["committed_step"] and how == f"resumed from step {resumed - 1}"), story(run)
    assert end["how"] == history.NEXT_STOP and end["exit"] == 0, story(run)
