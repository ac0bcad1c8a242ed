"""Straggler jitter: how much time healthy ranks "lose" against their peers, idle and loaded, so the floors sit above it.

Short jobs on the local backend (2 emulated nodes x 2 ranks, gloo) with the
straggler verdict out of reach (`watchdog.straggler_factor: 1000`, so no
verdict cuts a run short): the plain DDP example (examples/own-script/
train_ddp.py, steps from torch's hooks), the reference trainer and the
Lightning example (its own loop and adapter, ~16 ms steps), at a few step sizes, first on an idle machine, then beside CPU burners
(`python3 -c 'while True: pass'`, --burners of them). Each attempt's
timeline is then replayed through the straggler rule's own statistics
(runtime/controller/straggler.py) at every window: what each healthy rank lost a step
against its peers' per-step median, its ratio, and how many windows would
make a suspect with the defaults and with the floors at zero (what the
floors are there to stop). Nothing here is slowed on purpose: every rank is
healthy, so every suspect is a false one.

    python bench/straggler_jitter.py [--quick] [--burners 3] [--steps 600]

Last line: {"defaults": {...}, "suspects_at_defaults": N, "recurring_verdicts": N, "scenarios": [{"script", "busy_s", "load",
"compute_p50_s", "max_lost_s", "p99_lost_s", "max_ratio", "max_lost_past_factor_s",
"max_compute_past_factor_s", "suspect_windows_floors_off", "suspect_windows", "verdicts", "max_untrimmed_lost_s",
"recurring_verdicts"}, ...]}: the untrimmed loss is what the recurring-stall rule judges (every step counted), and
its verdicts need no persistence.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from detection import REPO, spec

SCENARIOS = [("zero-change", 0.0), ("zero-change", 0.002), ("zero-change", 0.02), ("zero-change", 0.1),
             ("trainer", 0.002), ("trainer", 0.02), ("trainer", 0.1), ("lightning", 0.016)]
QUICK = [("zero-change", 0.0), ("zero-change", 0.002)]
LIGHTNING = REPO / "examples" / "own-script" / "train_lightning.py"
LONG_STEP_S = 0.05  # scenarios with steps this long or longer run LONG_STEPS steps, not --steps
LONG_STEPS = 300


def run_job(scratch: Path, name: str, script: str, busy_s: float, steps: int) -> Path:
    """One clean job to its end; its first attempt's directory."""
    from clusterctl.actions.submit import submit_job
    from clusterctl.backends import get_backend
    from clusterctl.plan.job import load_job

    job = spec(name, scratch / "runs", steps, "zero-change" if script == "lightning" else script, busy_s)
    job["watchdog"] = {"straggler_factor": 1000}
    job["checkpoint"] = {"interval": 100, "keep": 1}
    job["restart"] = {"mode": "none"}
    if script == "trainer":
        job["command"] = ["python3", "-m", "clusterctl.trainer", "--steps", str(steps), "--step-compute-s", str(busy_s)]
    if script == "lightning":  # the user's case: Lightning's own loop, its adapter, steps of about STEP_S
        job["command"], job["env"] = ["python3", str(LIGHTNING)], {"STEPS": str(steps), "STEP_S": str(busy_s)}
    path = scratch / f"{name}.yaml"
    path.write_text(json.dumps(job))
    done = submit_job(load_job(path), "local")
    backend = get_backend("local")
    deadline = time.monotonic() + 900
    while not ((info := backend.info(str(done.job_id))) and info.finished):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not finish in 15 minutes")
        time.sleep(1)
    return done.run.path / "attempt-1"


def compute_series(attempt: Path) -> list[list[tuple[int, float]]]:
    """Each rank's (step, compute_s) in the order the controller received them."""
    series: dict[int, list[tuple[int, float]]] = {}
    for line in (attempt / "timeline.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "step" and record.get("compute_s") is not None:
            series.setdefault(record["rank"], []).append((record["step"], float(record["compute_s"])))
    return [series[r] for r in sorted(series)]


def replay(series: list[list[tuple[int, float]]], window: int, limits: Any) -> dict[str, Any]:
    """The rule's statistics at every window of the attempt (the watchdog sees one each step)."""
    from clusterctl.runtime.controller import straggler
    from clusterctl.runtime.controller.watchdog import PERSIST_STEPS, straggler_warmup

    floors_off = straggler.Limits(limits.factor, 0.0, 0.0)
    usable = [s[straggler_warmup(window):] for s in series]
    compute = [dict(s) for s in usable]
    shared = sorted(set.intersection(*(set(c) for c in compute)))
    lost, ratios, past_lost, past_compute, all_compute = [], [], [0.0], [0.0], []
    by_rank: dict[int, list[float]] = {}
    named: dict[int, int] = {}
    suspects = suspects_off = verdicts = recurring = 0
    untrimmed: list[float] = []
    run: tuple[int, int] | None = None  # (rank, windows in a row it was the suspect)
    for end in range(window, len(shared) + 1):
        found = straggler.standings(compute, shared[end - window : end])
        for s in found:
            lost.append(s.lost_s)
            ratios.append(s.ratio)
            by_rank.setdefault(s.rank, []).append(s.lost_s)
            if s.lost_s > (limits.factor - 1) * s.peers_s:
                past_lost.append(s.lost_s)
                past_compute.append(s.compute_s)
        suspects_off += straggler.slowest(found, floors_off) is not None
        worst = straggler.slowest(found, limits)
        suspects += worst is not None
        if worst is not None:
            named[worst.rank] = named.get(worst.rank, 0) + 1
        run = None if worst is None else (worst.rank, run[1] + 1 if run and run[0] == worst.rank else 1)
        if run and run[1] == PERSIST_STEPS + 1:
            verdicts += 1  # the same rank PERSIST_STEPS steps on: the watchdog would have called it
        untrimmed.extend(s.lost_s for s in straggler.standings(compute, shared[end - window : end], trimmed=0))
        recent = shared[max(0, end - straggler.RECUR_WINDOWS * window) : end]
        recurring += straggler.recurring(straggler.excesses(compute, recent), window, limits) is not None  # no persistence
    for c in compute:
        all_compute.extend(c.values())
    lost.sort()
    return {
        "windows": max(0, len(shared) - window + 1),
        "compute_p50_s": round(sorted(all_compute)[len(all_compute) // 2], 6) if all_compute else None,
        "max_lost_s": round(lost[-1], 6) if lost else None,
        "p99_lost_s": round(lost[int(0.99 * (len(lost) - 1))], 6) if lost else None,
        "max_ratio": round(max(ratios), 3) if ratios else None,
        "max_lost_past_factor_s": round(max(past_lost), 6),
        "max_compute_past_factor_s": round(max(past_compute), 6),
        "suspect_windows_floors_off": suspects_off,
        "suspect_windows": suspects,
        "suspects_by_rank": named,
        "mean_lost_by_rank_s": {r: round(sum(v) / len(v), 6) for r, v in sorted(by_rank.items())},
        "verdicts": verdicts,
        "max_untrimmed_lost_s": round(max(untrimmed), 6) if untrimmed else None,
        "recurring_verdicts": recurring,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the plain DDP script only, at 2 step sizes")
    parser.add_argument("--burners", type=int, default=3, help="CPU burners beside the loaded runs (0: idle only)")
    parser.add_argument("--steps", type=int, default=600, help="steps a job (steps of 0.05 s or more: 300)")
    parser.add_argument("--keep", type=Path, default=None, help="write each scenario's compute times here (JSON)")
    parser.add_argument("--factor", type=float, default=None, help="replay with this straggler_factor (default: the spec's)")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(REPO))
    from clusterctl.config.spec import Watchdog
    from clusterctl.runtime.controller.straggler import Limits

    defaults = Watchdog()
    limits = Limits(args.factor or defaults.straggler_factor, defaults.straggler_min_compute_s,
                    defaults.straggler_min_lost_s)
    loads = [("idle", 0)] + ([("loaded", args.burners)] if args.burners else [])
    results = []
    with tempfile.TemporaryDirectory(prefix="clusterctl-jitter-") as tmp:
        scratch = Path(tmp)
        os.environ["CLUSTERCTL_LOCAL_STATE"] = str(scratch / "local-state")
        for load, burners in loads:
            procs = [subprocess.Popen(["python3", "-c", "while True: pass"]) for _ in range(burners)]
            try:
                for script, busy_s in QUICK if args.quick else SCENARIOS:
                    name = f"jitter-{script}-{busy_s:g}-{load}"
                    steps = LONG_STEPS if busy_s >= LONG_STEP_S else args.steps
                    attempt = run_job(scratch, name, script, busy_s, steps)
                    series = compute_series(attempt)
                    if args.keep:
                        args.keep.mkdir(parents=True, exist_ok=True)
                        (args.keep / f"{name}.json").write_text(json.dumps(series))
                    figures = {"script": script, "busy_s": busy_s, "load": load,
                               **replay(series, defaults.window, limits)}
                    results.append(figures)
                    print(json.dumps(figures), flush=True)
            finally:
                for proc in procs:
                    proc.terminate()
                    proc.wait(timeout=10)
    summary = {
        "defaults": {"straggler_factor": limits.factor, "straggler_min_compute_s": limits.min_compute_s,
                     "straggler_min_lost_s": limits.min_lost_s, "window": defaults.window},
        "suspects_at_defaults": sum(r["suspect_windows"] for r in results),
        "recurring_verdicts": sum(r["recurring_verdicts"] for r in results),
        "scenarios": results,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
