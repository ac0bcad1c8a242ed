"""Elastic shrink: a node lost with no spare left, the job goes on in its allocation at a smaller dp.

The reference trainer, 2 nodes x 1 emulated GPU (dp 2), micro 2 and a global
batch of 4 (accumulation 1; 2 at dp 1), `elastic: {min_nodes: 1, batch: keep}`,
in-memory snapshots every step, `--record-samples`, 0.05 s of busy compute a
step. Three runs of the same steps on each backend:

* `elastic`: the second node lost from outside (`clusterctl drill --node`) once
  step KILL_AT is done; the job shrinks to 1 node and finishes there;
* `clean`: the same job never interrupted, at full size (the loss reference);
* `grow`: the elastic run with `grow: true`, 0.15 s steps: the full-size job
  queued at the shrink starts on the idle nodes at once and, once its warm
  servers have imported, takes over;
* `reordered`: the same job at dp 1 from the start (1 node, accumulation 2):
  the same samples in every step, only the order the floats are summed in
  differs. Its largest loss difference from `clean` over the run is
  `loss_tolerance`: the divergence that reduction order alone makes, plus one
  spacing of the float32 losses' grid (bench/README.md).

Figures: `shrink_resume_s` (verdict.json's time to the first step at the
smaller dp: metrics.jsonl's end of that step minus its step_s),
`steps_lost` (steps computed twice), `loss_delta_vs_clean` (the largest
difference from `clean` at the same step, the steps after the shrink; before
it the losses must be bitwise equal), `samples_repeated` and
`samples_skipped` (over every kept step, against the epoch's stretch each
step takes), `grow_resume_s` (the grow run's pause: the shrunk attempt's last
step's end to the full-size attempt's first step's start, against the save and
the cold start it is made of), and `goodput_vs_wait` under the queue-wait model
of bench/README.md.

    python bench/elastic.py [--quick] [--keep]

--quick: the local backend only (about 2 minutes); without it the Slurm test
cluster too (its keys start with `lab_`), brought up when it is down.
Last line: {"shrink_resume_s", "steps_lost", "loss_delta_vs_clean", "loss_tolerance", "samples_repeated",
"samples_skipped", "grow_resume_s", "goodput_vs_wait", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from recovery import Jobs, Misbehaved, describe, drill, drill_report, lab_up, records, settle, wait_steps  # noqa: E402

from clusterctl.rundir import read_json  # noqa: E402
from clusterctl.trainer.loop import DATASET_SIZE  # noqa: E402
from clusterctl.trainer.sampler import DistributedSampler  # noqa: E402

MODEL = {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "ffn": 64}
MICRO, GLOBAL = 2, 4
STEPS, KILL_AT = 160, 30
QUICK_STEPS, QUICK_KILL_AT = 100, 20
STEP_COMPUTE_S = 0.05
# The grow run's steps are longer: the shrunk attempt trains on while the full-size job's warm servers import
# (seconds on 2 cores); in fewer seconds than that the run would finish shrunk and withdraw the queued job.
GROW_STEP_COMPUTE_S = 0.15
# The queue-wait model (bench/README.md): a continuation job waits WAIT_S in the queue for a whole allocation, and
# the run's remaining time after the loss is HORIZON_S; a cold start costs COLD_START_S.
WAIT_S, HORIZON_S, COLD_START_S = 3600.0, 4 * 3600.0, 60.0


def show(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def spec(name: str, site: str, runs: Path, nodes: int, steps: int, grow: bool = False,
         compute_s: float = STEP_COMPUTE_S) -> dict[str, Any]:
    return {
        "name": name, "site": site, "time_limit": "30m", "nodes": nodes, "gpus_per_node": 1, "runs_root": str(runs),
        "checkpoint": {"interval": 50, "memory_interval": 1}, "model": MODEL, "seq_len": 16,
        "batch": {"micro": MICRO, "global": GLOBAL},
        **({"elastic": {"min_nodes": 1, "batch": "keep", "grow": grow}} if nodes > 1 else {}),
        "watchdog": {"straggler_factor": 1000},  # a reference run, not a test of verdicts: 2 cores run all of it
        "command": ["python3", "-m", "clusterctl.trainer", "--steps", str(steps), "--eval-interval", "0",
                    "--step-compute-s", f"{compute_s:g}", "--record-samples"],
    }


def submit(jobs: Jobs, scratch: Path, name: str, site: str, backend: str, nodes: int, steps: int, grow: bool = False,
           compute_s: float = STEP_COMPUTE_S) -> Path:
    from clusterctl.actions.submit import submit_job
    from clusterctl.plan.job import load_job

    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / f"{name}.yaml"
    path.write_text(json.dumps(spec(name, site, scratch / "runs", nodes, steps, grow, compute_s)))
    done = submit_job(load_job(path), backend)
    jobs.runs.append((done.run.path, backend))
    return done.run.path


def attempts(run: Path) -> list[Path]:
    return sorted(run.glob("attempt-*"), key=lambda p: int(p.name.split("-")[1]))


def losses(run: Path) -> dict[int, float]:
    """Rank 0's loss at each step, a step computed twice taken from its last attempt."""
    found: dict[int, float] = {}
    for attempt in attempts(run):
        found.update({r["step"]: float.fromhex(r["loss_hex"]) for r in records(attempt / "metrics.jsonl") if "loss_hex" in r})
    return found


def finished(run: Path, steps: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while max(losses(run), default=-1) < steps - 1:
        if time.monotonic() > deadline:
            raise Misbehaved(f"{run.name}: not at step {steps - 1} within {timeout:g} s\n{describe(run)}")
        stopped = [e for e in records(run / "attempts.jsonl") if e.get("event") == "next" and e.get("how") == "stop"]
        if stopped and stopped[-1].get("exit") != 0:
            raise Misbehaved(f"{run.name} stopped: {stopped[-1].get('reason')}\n{describe(run)}")
        time.sleep(0.5)


def samples(run: Path, steps: int) -> dict[str, int]:
    """Repeated and skipped samples over the kept steps, against the stretch of the epoch each step takes."""
    by_step: dict[int, list[int]] = {}
    for attempt in attempts(run):
        this: dict[int, list[int]] = {}
        for path in attempt.glob("samples-rank*.jsonl"):
            for row in records(path):
                this.setdefault(row["step"], []).extend(row["ids"])
        by_step.update(this)
    whole = DistributedSampler(DATASET_SIZE, 0, 1)
    expected = {i for _ in range(steps) for i in whole.take(GLOBAL)}
    trained = [i for s in range(steps) for i in by_step.get(s, [])]
    return {"samples_repeated": len(trained) - len(set(trained)), "samples_skipped": len(expected - set(trained)),
            "samples_foreign": len(set(trained) - expected)}


def elastic_run(jobs: Jobs, scratch: Path, site: str, backend: str, steps: int, kill_at: int) -> dict[str, Any]:
    run = submit(jobs, scratch, "elastic", site, backend, 2, steps)
    show(f"{backend}: elastic run {run.name}: training to step {kill_at}")
    first = run / "attempt-1"
    wait_steps(first, kill_at, 240, show)
    hosts = (read_json(first / "attempt.json") or {}).get("hosts") or []
    report = drill_report(drill(run, "--node", str(hosts[1])))
    if not report.get("culprit_right"):
        raise Misbehaved(f"the lost node was not named: {report}")
    settle(run, 1, 60)
    nexts = [e for e in records(run / "attempts.jsonl") if e.get("event") == "next"]
    if not nexts or nexts[0].get("how") != "allocation" or not nexts[0].get("width"):
        raise Misbehaved(f"no shrink in the allocation after the lost node\n{describe(run)}")
    finished(run, steps, 240)
    verdict = read_json(first / "verdict.json") or {}
    resumed = records(run / "attempt-2" / "metrics.jsonl")[0]
    reached = max(r["step"] for r in records(first / "metrics.jsonl") if isinstance(r.get("step"), int))
    record = (read_json(run / "attempt-2" / "record.json") or {}).get("recovery") or {}
    return {
        "run": run, "width": nexts[0]["width"], "resumed_step": resumed["step"],
        "shrink_resume_s": round(resumed["t"] - resumed["step_s"] - float(verdict["time"]), 3),
        "steps_lost": reached - (resumed["step"] - 1), "resumed_from": record.get("how"),
        "detect_s": report.get("seconds"),
    }


def grow_run(jobs: Jobs, scratch: Path, site: str, backend: str, steps: int, kill_at: int) -> dict[str, Any]:
    """The same loss with `grow: true`: the full-size job queued at the shrink starts on the idle nodes and takes
    over. The pause: the shrunk attempt's last step's end to the full-size attempt's first step's start."""
    submitted = time.time()
    run = submit(jobs, scratch, "grow", site, backend, 2, steps, grow=True, compute_s=GROW_STEP_COMPUTE_S)
    show(f"{backend}: grow-back run {run.name}: training to step {kill_at}")
    first = run / "attempt-1"
    wait_steps(first, kill_at, 240, show)
    hosts = (read_json(first / "attempt.json") or {}).get("hosts") or []
    drill_report(drill(run, "--node", str(hosts[1])))
    finished(run, steps, 300)
    nexts = [e for e in records(run / "attempts.jsonl") if e.get("event") == "next"]
    if len(nexts) < 2 or nexts[1].get("how") != "continuation" or len(attempts(run)) < 3:
        raise Misbehaved(f"no hand-over to the full-size job\n{describe(run)}")
    first_steps, shrunk, full = (records(run / f"attempt-{n}" / "metrics.jsonl") for n in (1, 2, 3))
    starts = {e.get("attempt"): float(e["time"]) for e in records(run / "attempts.jsonl") if e.get("event") == "start"}
    saved = (read_json(run / "attempt-2" / "phase-times.json") or {}).get("save")
    began = full[0]["t"] - full[0]["step_s"]
    pause = began - shrunk[-1]["t"]
    # The cold start a continuation job takes on an idle cluster: this job's submission to its first step.
    cold = first_steps[0]["t"] - first_steps[0]["step_s"] - submitted
    return {"grow_resume_s": round(pause, 3), "grow_save_s": saved, "grow_cold_start_s": round(cold, 3),
            "grow_attempt_start_s": round(began - starts[3], 3),
            "grow_within_target": saved is not None and pause <= 2 * saved + cold,
            "grow_steps_lost": shrunk[-1]["step"] - (full[0]["step"] - 1),
            **{f"grow_{k}": v for k, v in samples(run, steps).items()}}


def goodput_vs_wait(dp_before: int, dp_after: int, shrink_s: float, grow_s: float) -> dict[str, float]:
    """The work done over HORIZON_S after the loss, in full-width hours, against a continuation job that waits
    WAIT_S and starts cold: shrinking after shrink_s, training at dp_after/dp_before through the wait, then the
    full-size job taking over after a pause of grow_s (grow: true); and without grow-back, shrunk to the end."""
    wait = max(0.0, HORIZON_S - WAIT_S - COLD_START_S)
    share = dp_after / dp_before
    grow = share * max(0.0, WAIT_S - shrink_s) + max(0.0, HORIZON_S - WAIT_S - grow_s)
    return {"goodput_vs_wait": round(grow / wait, 3),
            "goodput_vs_wait_without_grow": round(share * max(0.0, HORIZON_S - shrink_s) / wait, 3),
            "goodput_vs_wait_64_nodes": round(((63 / 64) * max(0.0, WAIT_S - shrink_s) + max(0.0, HORIZON_S - WAIT_S - grow_s)) / wait, 3)}


def measure(jobs: Jobs, scratch: Path, site: str, backend: str, steps: int, kill_at: int) -> dict[str, Any]:
    got = elastic_run(jobs, scratch, site, backend, steps, kill_at)
    clean = submit(jobs, scratch, "clean", site, backend, 2, steps)
    show(f"{backend}: the clean run at dp 2 and the reordered one at dp 1")
    finished(clean, steps, 300)
    reordered = submit(jobs, scratch, "reordered", site, backend, 1, steps)
    finished(reordered, steps, 300)
    ours, ref, other = losses(got["run"]), losses(clean), losses(reordered)
    before = [s for s in range(got["resumed_step"]) if ours[s] != ref[s]]
    if before:
        raise Misbehaved(f"steps {before[:5]} before the shrink differ from the clean run: the same computation")
    after = range(got["resumed_step"], steps)
    delta = max(abs(ours[s] - ref[s]) for s in after)
    reordering = max(abs(other[s] - ref[s]) for s in range(steps))
    # The losses are float32: a divergence measured on one run is known to one spacing of their grid (bench/README.md).
    grid = max(float(np.spacing(np.float32(abs(ref[s])))) for s in after)  # the steps the delta is taken over
    tolerance = reordering + grid
    dp = got["width"]["dp"]
    grown = grow_run(jobs, scratch, site, backend, steps, kill_at)
    return {
        "shrink_resume_s": got["shrink_resume_s"], "steps_lost": got["steps_lost"],
        "loss_delta_vs_clean": delta, "loss_tolerance": tolerance, "within_tolerance": delta <= tolerance,
        "loss_reordering": reordering, "loss_grid": grid,
        **samples(got["run"], steps), **grown,
        **goodput_vs_wait(dp[0], dp[1], got["shrink_resume_s"] + (got["detect_s"] or 0.0), grown["grow_resume_s"]),
        "detect_s": got["detect_s"], "width": got["width"], "resumed_from": got["resumed_from"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the local backend only, fewer steps (about 2 minutes)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    steps, kill_at = (QUICK_STEPS, QUICK_KILL_AT) if args.quick else (STEPS, KILL_AT)
    scratch = Path(tempfile.mkdtemp(prefix="clusterctl-elastic-"))
    jobs = Jobs()
    result: dict[str, Any] = {"errors": {}}
    os.environ["CLUSTERCTL_LOCAL_STATE"] = str(scratch / "local-state")
    try:
        try:
            result.update(measure(jobs, scratch / "local", "local", "local", steps, kill_at))
        except (Misbehaved, RuntimeError, KeyError, IndexError) as exc:
            result["errors"]["local"] = str(exc)
            show(f"local: {exc}")
        if not args.quick:
            if lab_up(show, allow_up=True):
                try:
                    lab = measure(jobs, scratch / "lab", "slurm-lab", "slurm", steps, kill_at)
                    result.update({f"lab_{k}": v for k, v in lab.items()})
                except (Misbehaved, RuntimeError, KeyError, IndexError) as exc:
                    result["errors"]["lab"] = str(exc)
                    show(f"lab: {exc}")
            else:
                result["errors"]["lab"] = "the Slurm test cluster could not be brought up"
    finally:
        jobs.cancel_all()
        if args.keep or result["errors"]:
            show(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    for key in ("shrink_resume_s", "steps_lost", "loss_delta_vs_clean", "loss_tolerance", "samples_repeated",
                "samples_skipped", "grow_resume_s", "goodput_vs_wait"):
        result.setdefault(key, None)
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
