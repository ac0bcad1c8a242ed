"""`status` over 1,000 runs and `report` on a 100,000-step run.

    .venv/bin/python bench/status.py [--quick] [--runs N] [--lines L] [--report-steps S]

Status: N run directories in one runs root, each with three attempts and an
L-line metrics file split between them (--quick hard-links one metrics file
per attempt into every run instead of writing N of them). A tenth of the runs
are training, a tenth wait for a continuation job, some failed, the rest
completed. The scheduler is the Slurm backend with a stand-in `squeue` on
PATH that answers for the jobs it is asked about and counts its calls.
Timed in-process (interpreter start and imports apart): `derive_many` over
all runs, what `clusterctl status --all` and `clusterctl runs` do before
printing; best of three. Targets: under 1 s, one scheduler query.

Report: `clusterctl report` on a synthetic run of S steps (4 ranks, 2
attempts, one straggler), in a child process so that its peak RSS is its own;
the report reads long timelines in forked workers, so the peak given is the
main process's plus every worker's, as if all peaked at once (an upper bound).
Targets: under 10 s and under 1 GB.

Last line: {"runs", "status_seconds", "scheduler_queries", "report_steps",
"report_seconds", "report_peak_rss_mb"} plus details.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clusterctl import rundir  # noqa: E402
from clusterctl.backends import get_backend  # noqa: E402
from clusterctl.rundir import (
    RunDir,  # noqa: E402
    list_runs,  # noqa: E402
)
from clusterctl.views.state import derive_many  # noqa: E402

T0 = 1_800_000_000.0
ATTEMPTS = 3
SQUEUE = """#!/bin/sh
# A stand-in squeue: counts its calls, answers RUNNING for even job ids and PENDING for odd ones.
echo call >> "{calls}"
for arg in "$@"; do
  case "$arg" in --jobs=*) ids=$(echo "${{arg#--jobs=}}" | tr ',' ' ');; esac
done
for id in $ids; do
  if [ $((id % 2)) -eq 0 ]; then echo "$id|$id|RUNNING|n[1-2]|0|0|n1|None"; else echo "$id|$id|PENDING||0|0||Dependency"; fi
done
"""


def metrics_lines(first: int, count: int, start: float) -> bytes:
    out = []
    for i in range(count):
        step = first + i
        out.append(json.dumps({"step": step, "loss": round(5.0 / (1 + step / 500), 6), "loss_hex": "0x1.0p+2", "step_s": 0.5,
                               "compute_s": 0.4, "tokens_per_s": 65536.0, "t": start + (i + 1) * 0.5,
                               "train_s": (i + 1) * 0.5, "total_steps": 100_000}))
    return ("\n".join(out) + "\n").encode()


def write_runs(root: Path, runs: int, lines: int, share: bool) -> None:
    """N runs; with `share`, every run's attempt-k metrics file is a hard link of one file."""
    per = lines // ATTEMPTS
    shared: dict[int, Path] = {}
    for k in range(1, ATTEMPTS + 1):
        path = root / f".metrics-{k}.jsonl"
        path.write_bytes(metrics_lines((k - 1) * (per - 10), per, T0 + (k - 1) * per))
        shared[k] = path
    for i in range(runs):
        run = RunDir(root / f"bench-{i:05d}-20270101-{i // 60 % 60:02d}{i % 60:02d}00-{i:04x}")
        run.path.mkdir()
        kind = "training" if i % 10 == 0 else "continued" if i % 10 == 1 else "failed" if i % 20 == 2 else "completed"
        job = 1000 + 2 * i  # even: RUNNING in the stand-in squeue
        (run.path / rundir.RUN_JSON).write_text(json.dumps({"name": "bench", "world_size": 8, "gpus_per_node": 4, "nodes": 2}))
        run.write_state(state="submitted", backend="slurm", job_id=str(job))
        events = []
        for k in range(1, ATTEMPTS + 1):
            d = run.attempt(k)
            d.mkdir()
            start = T0 + (k - 1) * per * 0.5
            (d / rundir.ATTEMPT_JSON).write_text(json.dumps({"job_id": str(job), "attempt": k, "hosts": ["n1", "n2"],
                                                             "nodelist": "n[1-2]", "spares": 0}))
            metrics = d / rundir.METRICS
            if share:
                os.link(shared[k], metrics)
            else:
                metrics.write_bytes(shared[k].read_bytes())
            events.append({"event": "start", "attempt": k, "job_id": str(job), "time": start, "nodes": 2})
            last = k == ATTEMPTS
            if last and kind == "training":
                break
            code = 0 if last and kind == "completed" else 82
            if code:
                (d / rundir.VERDICT).write_text(json.dumps({"ok": False, "code": 82, "message": "rank 5 on n2 hung",
                                                            "culprits": [{"rank": 5, "host": "n2"}]}))
            how = "stop" if last and kind in ("completed", "failed") else "allocation"
            nxt: dict[str, object] = {"event": "next", "attempt": k, "job_id": str(job), "exit": code, "how": how,
                                      "reason": "training finished" if code == 0 else "exit 82 (hang)",
                                      "committed_step": k * (per - 10) - 1, "time": start + per * 0.5}
            if last and kind == "continued":
                nxt.update(how="continuation", next_job=str(job + 1))  # odd: PENDING
            events.append({"event": "end", "attempt": k, "job_id": str(job), "exit": code, "time": start + per * 0.5})
            events.append(nxt)
        run.events_file.write_text("".join(json.dumps(e) + "\n" for e in events))


def bench_status(runs: int, lines: int, quick: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="clusterctl-bench-status-") as tmp:
        root = Path(tmp) / "runs"
        root.mkdir()
        began = time.perf_counter()
        write_runs(root, runs, lines, share=quick)
        written = time.perf_counter() - began
        bindir = Path(tmp) / "bin"
        bindir.mkdir()
        calls = Path(tmp) / "squeue-calls"
        (bindir / "squeue").write_text(SQUEUE.format(calls=calls))
        (bindir / "squeue").chmod(0o755)
        os.environ["PATH"] = f"{bindir}:{os.environ['PATH']}"
        os.environ["CLUSTERCTL_SLURM_QUERY"] = "cli"  # the stand-in squeue answers, not a real slurmctld through pyslurm
        times, queries, states = [], [], []
        for _ in range(3):
            calls.write_text("")
            began = time.perf_counter()
            states, notes = derive_many(list_runs(root), get_backend)
            times.append(time.perf_counter() - began)
            queries.append(len(calls.read_text().splitlines()))
            assert not notes, notes
        counts: dict[str, int] = {}
        for st in states:
            counts[st.state] = counts.get(st.state, 0) + 1
        return {"runs": len(states), "status_seconds": round(min(times), 3), "scheduler_queries": max(queries),
                "status_runs_all": [round(t, 3) for t in times], "states": counts, "metrics_lines_per_run": lines,
                "metrics_shared": quick, "write_seconds": round(written, 1)}


CHILD = """
import json, resource, sys, time
from pathlib import Path
from clusterctl.views.report import build_report
from clusterctl.rundir import RunDir
began = time.perf_counter()
figures = build_report(RunDir(Path(sys.argv[1])), Path(sys.argv[2]))
seconds = time.perf_counter() - began
from clusterctl.views.report.timeline import _workers
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "own_mb": own, "worker_mb": child, "workers": min(_workers(), 8)}))
"""


def bench_report(steps: int) -> dict[str, object]:
    try:
        from clusterctl.testing.runsynth import write_synthetic_run
    except ImportError as exc:
        return {"report_steps": steps, "report_seconds": None, "report_peak_rss_mb": None, "report_error": str(exc)}
    with tempfile.TemporaryDirectory(prefix="clusterctl-bench-report-") as tmp:
        began = time.perf_counter()
        run = write_synthetic_run(Path(tmp), steps=steps, ranks=4, attempts=2, straggler=2)
        written = time.perf_counter() - began
        size = sum(p.stat().st_size for p in Path(run).rglob("*.jsonl"))
        out = subprocess.run([sys.executable, "-c", CHILD, str(run), str(Path(tmp) / "report")], capture_output=True, text=True,
                             cwd=ROOT, check=False)
        if out.returncode != 0:
            raise SystemExit(f"report failed:\n{out.stderr[-3000:]}")
        child = json.loads(out.stdout.strip().splitlines()[-1])
        # The report reads a large timeline in forked workers: the peak is counted as if the main process and
        # every worker were at their own peaks at once (an upper bound; the workers' pages are partly shared).
        peak = child["own_mb"] + child["workers"] * child["worker_mb"] if child["worker_mb"] else child["own_mb"]
        return {"report_steps": steps, "report_seconds": round(child["seconds"], 2), "report_peak_rss_mb": round(peak, 1),
                "report_main_rss_mb": round(child["own_mb"], 1), "report_worker_rss_mb": round(child["worker_mb"], 1),
                "report_workers": child["workers"],
                "report_input_mb": round(size / 2**20, 1), "report_write_seconds": round(written, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="share the metrics files, a 20,000-step report (under a minute)")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--report-steps", type=int, default=None)
    args = parser.parse_args()
    steps = args.report_steps or (20_000 if args.quick else 100_000)
    status = bench_status(args.runs, args.lines, args.quick)
    print(f"status: {status['runs']} runs in {status['status_seconds']} s (best of 3: {status['status_runs_all']}),"
          f" {status['scheduler_queries']} scheduler query; states {status['states']}", file=sys.stderr)
    report = bench_report(steps)
    print(f"report: {steps} steps in {report['report_seconds']} s, peak RSS {report['report_peak_rss_mb']} MB", file=sys.stderr)
    print(json.dumps({**status, **report}))


if __name__ == "__main__":
    main()
