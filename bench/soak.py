"""A chaos soak: the reference trainer runs to its end while a seeded random fault lands every few minutes.

    .venv/bin/python bench/soak.py [--quick] [--seed N] [--local] [--minutes M] [--every S]

The reference trainer (2 nodes x 2 ranks, 1 spare; the Slurm test cluster,
`--local`: the local backend's emulated nodes) trains a fixed number of
steps, sized to take `--minutes` clean (30; `--quick` 5). A seeded random
fault comes every ~`--every` seconds (180; `--quick` 100), injected from
outside through `clusterctl drill` (so every node it blames is marked
`drill` and returns): a killed rank, a stopped rank (SIGSTOP), a 1.5x slowed
rank (judged with the spec's defaults; `--straggler-factor F` sets
`watchdog.straggler_factor`), a lost node, the job's pre-timeout signal. The restart budget is the number of
faults + 2. The next fault waits until the run trains again, and
none comes in the last fifth of the run, so it can finish.

A step is "committed" when no later attempt computed it again: it was in a
durable generation or an in-memory snapshot every rank held when the run
went on. Figures:

* `ettr`: committed steps x the clean median step time / wall time from the
  first allocation's start to the run's last step (the clean median is that of
  the steps no fault touched); `ettr_window_min`, the lowest over 10-minute
  windows (the whole run when shorter);
* `steps_lost_per_fault` (mean; `steps_lost_max`), the steps computed again;
* `false_verdicts`, failing verdicts no injected fault explains, and
  `faults_found`, faults whose drill saw the expected verdict with the exact
  culprit, over `faults`;
* `final_loss_bitwise`: the last step's loss equals an uninterrupted run's
  bit for bit (the same steps and seed, without the busy loop; the busy loop
  does not touch the model), and `loss_mismatches`, committed steps whose
  loss differs from that run's.

Last line: {"ettr", "ettr_window_min", "faults", "faults_found", "steps_lost_per_fault", "steps_lost_max",
"false_verdicts", "final_loss_bitwise", "loss_mismatches", "steps", "wall_s", "completed"}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from precision import state as status_of
from recovery import MODEL, SEQ_LEN, Jobs, drill, drill_report, lab_up, records

from clusterctl.rundir import read_json

STEP_COMPUTE_S = 0.25  # the busy loop of a step: about 0.3 s a step with the rest on this machine
FAULTS = ("kill", "hang", "slow", "node", "pre-timeout")
WINDOW_S = 600.0


def spec(name: str, site: str, runs: Path, steps: int, budget: int, compute_s: float,
         straggler_factor: float | None = None) -> dict[str, Any]:
    return {
        "name": name, "site": site, "time_limit": "3h", "nodes": 2, "gpus_per_node": 2, "spares": 1 if compute_s else 0,
        "runs_root": str(runs), "model": MODEL, "seq_len": SEQ_LEN,
        "restart": {"budget": budget},
        "watchdog": {"straggler_factor": straggler_factor} if straggler_factor else {},
        "checkpoint": {"interval": 100, "keep": 2},
        "command": ["python3", "-m", "clusterctl.trainer", "--steps", str(steps), "--eval-interval", "0",
                    "--step-compute-s", f"{compute_s:g}"],
    }


def submit(jobs: Jobs, scratch: Path, body: dict[str, Any], backend: str) -> Path:
    from clusterctl.actions.submit import submit_job
    from clusterctl.plan.job import load_job

    path = scratch / f"{body['name']}.yaml"
    path.write_text(json.dumps(body))
    run = submit_job(load_job(path), backend).run.path
    jobs.runs.append((run, backend))
    return run


def attempts(run: Path) -> list[Path]:
    return sorted(run.glob("attempt-*"), key=lambda p: int(p.name.split("-")[1]))


def steps_of(attempt: Path) -> list[dict[str, Any]]:
    return [r for r in records(attempt / "metrics.jsonl") if isinstance(r.get("step"), int)]


def run_state(run: Path) -> str:
    """The run's state as `clusterctl status` tells it (the one reader of the run's history)."""
    return str(status_of(run).get("state") or "")


def ended(run: Path) -> bool:
    return run_state(run) in ("completed", "failed", "cancelled")


def training_attempt(run: Path, after: int, timeout: float) -> Path | None:
    """The first attempt numbered above `after` that has trained a step (None: none within `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not ended(run):
        for attempt in attempts(run):
            if int(attempt.name.split("-")[1]) > after and steps_of(attempt):
                return attempt
        time.sleep(1)
    return None


def pick(rng: random.Random, kind: str, attempt: Path) -> list[str]:
    """The drill's arguments for one fault of `kind` on the attempt: a rank, or a node that does not run the batch
    script or the controller (losing those ends the job: a different test)."""
    info = read_json(attempt / "attempt.json") or {}
    if kind in ("kill", "hang"):
        return [f"--{kind}", str(rng.randrange(4))]
    if kind == "slow":
        return ["--slow", f"{rng.randrange(4)}:1.5"]
    if kind == "node":
        hosts = [h for h in info.get("hosts") or [] if h not in (info.get("batch_host"), info.get("master_host"))]
        return ["--node", rng.choice(hosts)] if hosts else ["--kill", str(rng.randrange(4))]
    return ["--pre-timeout"]


def committed(run: Path) -> list[dict[str, Any]]:
    """Each attempt's steps that no later attempt computed again, in order; and the number computed again."""
    series = [steps_of(a) for a in attempts(run)]
    kept: list[dict[str, Any]] = []
    for i, steps in enumerate(series):
        later = [s for s in series[i + 1:] if s]
        redo = later[0][0]["step"] if later else None
        kept += [r for r in steps if redo is None or r["step"] < redo]
    return kept


def lost_per_attempt(run: Path) -> list[int]:
    series = [s for s in (steps_of(a) for a in attempts(run)) if s]
    return [sum(1 for r in steps if r["step"] >= nxt[0]["step"]) for steps, nxt in zip(series, series[1:])]


def ettr(kept: list[dict[str, Any]], step_s: float, start: float, end: float) -> tuple[float, float]:
    """Cumulative ETTR and its lowest over 10-minute windows (counted by each step's finish time)."""
    total = len(kept) * step_s / max(end - start, 1e-9)
    width = min(WINDOW_S, end - start)
    lows = []
    t = start
    while t + width <= end + 1e-6:
        n = sum(1 for r in kept if t <= r["t"] < t + width)
        lows.append(n * step_s / width)
        t += width / 2
    return round(total, 4), round(min(lows) if lows else total, 4)


def clean_step_s(run: Path, touched: list[tuple[float, float]]) -> float:
    """The median wall time of a step that no fault touched (between consecutive steps of one attempt)."""
    gaps = []
    for attempt in attempts(run):
        steps = steps_of(attempt)
        for a, b in zip(steps, steps[1:]):
            if b["step"] == a["step"] + 1 and not any(lo <= b["t"] <= hi for lo, hi in touched):
                gaps.append(b["t"] - a["t"])
    return statistics.median(gaps) if gaps else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about 5 minutes, 2 faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--straggler-factor", type=float, default=None,
                        help="watchdog.straggler_factor for the run (default: the spec's, 1.25)")
    parser.add_argument("--local", action="store_true", help="on the local backend (default: the Slurm test cluster)")
    parser.add_argument("--minutes", type=float, default=None, help="the clean run's length (30; --quick 5)")
    parser.add_argument("--every", type=float, default=None, help="seconds between faults, about (180; --quick 100)")
    args = parser.parse_args()
    minutes = args.minutes or (5.0 if args.quick else 30.0)
    every = args.every or (100.0 if args.quick else 180.0)

    def show(text: str) -> None:
        print(text, flush=True)

    if not args.local and not lab_up(show, allow_up=True):
        raise SystemExit("the Slurm test cluster is not up and could not be started: tests/slurmlab/lab.sh up")
    site, backend = ("local", "local") if args.local else ("slurm-lab", "slurm")
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    rng = random.Random(args.seed)
    steps = int(minutes * 60 / (STEP_COMPUTE_S + 0.05))
    planned = max(1, int(minutes * 60 / every))
    kinds = [FAULTS[i % len(FAULTS)] for i in range(planned)]
    rng.shuffle(kinds)
    jobs = Jobs()
    reports: list[dict[str, Any]] = []
    touched: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="clusterctl-soak-") as tmp:
        scratch = Path(tmp)
        os.environ["CLUSTERCTL_LOCAL_STATE"] = str(scratch / "local-state")
        try:
            run = submit(jobs, scratch, spec("soak", site, scratch / "runs", steps, planned + 2, STEP_COMPUTE_S,
                                              args.straggler_factor), backend)
            show(f"soak: {steps} steps, {planned} faults ({', '.join(kinds)}), every ~{every:g} s; run {run}")
            current = training_attempt(run, 0, 600)
            if current is None:
                raise SystemExit(f"the soak's first attempt never trained: {run}")
            starts = [e["time"] for e in records(run / "attempts.jsonl") if e.get("event") == "start"]
            first_t = float(starts[0]) if starts else steps_of(current)[0]["t"]  # the first allocation's start
            for kind in kinds:
                wait_until = time.monotonic() + every * rng.uniform(0.7, 1.3)
                while time.monotonic() < wait_until and not ended(run):
                    time.sleep(1)
                live = [a for a in attempts(run) if steps_of(a)]
                done = max((r["step"] for r in steps_of(live[-1])), default=0) if live else 0
                if ended(run) or done > 0.8 * steps:
                    break
                current = live[-1]
                argv = pick(rng, kind, current)
                began = time.time()
                report = drill_report(drill(run, *argv))
                number = int(current.name.split("-")[1])
                again = training_attempt(run, number, 600)
                touched.append((began - 5, (steps_of(again)[0]["t"] if again else time.time()) + 5))
                report["argv"] = argv
                reports.append(report)
                show(f"{' '.join(argv)}: {report.get('verdict')} (code {report.get('code')}) detected="
                     f"{report.get('detected')} culprit_right={report.get('culprit_right')} in {report.get('seconds')} s;"
                     f" training again in attempt {again.name.split('-')[1] if again else '-'}")
                if again is None:
                    break
            deadline = time.monotonic() + minutes * 60 * 2
            while not ended(run) and time.monotonic() < deadline:
                time.sleep(2)
            state = run_state(run)
            kept = committed(run)
            last_t = max((r["t"] for a in attempts(run) for r in steps_of(a)), default=first_t)
            step_s = clean_step_s(run, touched)
            total, window = ettr(kept, step_s, first_t, last_t)
            lost = lost_per_attempt(run)
            fault_verdicts = {int(a.name.split("-")[1]) for a in attempts(run)} - {int(r.get("attempt") or 0) for r in reports}
            false = []
            for attempt in attempts(run):
                v = read_json(attempt / "verdict.json") or {}
                if not v.get("ok", True) and int(attempt.name.split("-")[1]) in fault_verdicts:
                    false.append(f"{attempt.name}: {v.get('message')}")
            show(f"run {state}; {len(kept)} committed of {steps} steps; clean step {step_s:.3f} s; lost per fault {lost}")
            for text in false:
                show(f"  false verdict: {text}")
            show("the uninterrupted run, for its losses")
            ref = submit(jobs, scratch, spec("soak-reference", site, scratch / "runs", steps, 0, 0.0), backend)
            deadline = time.monotonic() + 1200
            while not ended(ref) and time.monotonic() < deadline:
                time.sleep(2)
            want = {r["step"]: r.get("loss_hex") for a in attempts(ref) for r in steps_of(a)}
            mismatches = [r["step"] for r in kept if want.get(r["step"]) != r.get("loss_hex")]
            bitwise = bool(kept) and kept[-1]["step"] == steps - 1 and want.get(steps - 1) == kept[-1].get("loss_hex")
            if mismatches:
                show(f"  losses differ from step {mismatches[0]} ({len(mismatches)} steps)")
        finally:
            with contextlib.suppress(Exception):
                jobs.cancel_all()
    print(json.dumps({
        "ettr": total, "ettr_window_min": window, "faults": len(reports),
        "faults_found": sum(1 for r in reports if r.get("detected") and r.get("culprit_right") is not False),
        "steps_lost_per_fault": round(sum(lost) / len(reports), 1) if reports else 0.0,
        "steps_lost_max": max(lost, default=0), "false_verdicts": len(false), "final_loss_bitwise": bitwise,
        "loss_mismatches": len(mismatches), "steps": steps, "wall_s": round(last_t - first_t, 1),
        "completed": state == "completed", "kinds": [r["argv"][0].lstrip("-") for r in reports],
    }))


if __name__ == "__main__":
    sys.exit(main())
