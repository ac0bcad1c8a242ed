"""A synthetic run directory, written fast and deterministically: for tests and benchmarks of `report`.

The files have the layout and line format of a real run: the small records
are written by their own modules (rundir/runjson.py, attemptjson, verdict,
history); timeline.jsonl and metrics.jsonl lines, millions of them, by
format strings laid out as rundir/timeline.py and rundir/metrics.py define
(tests compare them), so the report's fast line parser is exercised on the
real format. Attempt 1 ends in a
failure (a straggler verdict when `straggler` is given, else a killed rank)
and restarts in the allocation from its latest checkpoint; later attempts
but the last end at the job's time limit (pre-timeout, checkpoint committed)
and continue in a new job that waits in the queue first; the last finishes.

Steps are synchronous: each step starts on every rank when the slowest rank
of the previous one is done. A straggler rank takes STRAGGLER_FACTOR times
as long; the first WARMUP_STEPS steps of each attempt are slow (warm-up); a
few steps have a large outlier on one rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from clusterctl import rundir
from clusterctl.rundir import RunDir, history, jobid, timeline
from clusterctl.rundir import verdict as verdictfile
from clusterctl.rundir.runjson import CheckpointRecord, RunJson
from clusterctl.rundir.verdict import Verdict

T0 = 1_796_000_000.0  # the synthetic run's submission time (fixed: deterministic files)
QUEUE_S = 45.0  # first job's wait in the queue
STARTUP_S = 30.0  # attempt start -> first step (rendezvous, preflight, loading)
RESTART_GAP_S = 12.0  # attempt end -> next attempt start, in the allocation
CONTINUATION_QUEUE_S = 60.0  # a continuation job's wait in the queue
BASE_STEP_S = 0.2
STRAGGLER_FACTOR = 1.6
SAVE_S = 2.5
EVAL_S = 1.5
TOKENS_PER_STEP = 4 * 8 * 2048
WARMUP_SLOWDOWN = (4.0, 2.5, 1.8, 1.4, 1.2)
OUTLIER_EVERY = 997  # about one step in this many has one rank at OUTLIER_FACTOR
OUTLIER_FACTOR = 6.0
GPUS_PER_NODE = 2

_PHASE = '{"t": %.7f, "kind": "phase", "rank": %d, "node": "%s", "step": %d, "phase": "%s", "at": %.7f}\n'
_STEP = (
    '{"t": %.7f, "kind": "step", "rank": %d, "node": "%s", "step": %d, "phase": "collective", "at": %.7f, '
    '"step_s": %.7f, "compute_s": %.7f}\n'
)


def _dump(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _ranges(steps: int, attempts: int, interval: int) -> list[tuple[int, int, int]]:
    """(first step, last step done, committed step) per attempt; a failed first attempt redoes its tail."""
    out: list[tuple[int, int, int]] = []
    first = 0
    for k in range(1, attempts + 1):
        if k == attempts:
            out.append((first, steps - 1, steps - 1))
            break
        last = max(first + 8, steps * k // attempts + 7)
        last = min(last, steps - 2)
        if k == 1:  # failed: the steps after its latest checkpoint are redone
            committed = ((last + 1) // interval) * interval - 1
            committed = max(committed, first - 1)
        else:  # pre-timeout: a checkpoint is committed at the end
            committed = last
        out.append((first, last, committed))
        first = committed + 1
    return out


def write_synthetic_run(
    root: Path,
    steps: int,
    ranks: int = 4,
    attempts: int = 2,
    straggler: int | None = None,
    *,
    seed: int = 0,
    name: str = "synth",
    checkpoint_interval: int | None = None,
    eval_interval: int | None = None,
    segment_bytes: int | None = None,
) -> Path:
    """Write a run directory under `root` and return its path (`root/<name>-run`). With `segment_bytes`, each
    attempt's timeline is left in compressed segments of that size, as the watch server leaves a long one."""
    if steps < 1 or ranks < 1 or attempts < 1:
        raise ValueError("steps, ranks and attempts must be at least 1")
    rng = np.random.default_rng(seed)
    interval = checkpoint_interval or max(10, steps // 100)
    evals = eval_interval or max(10, steps // 200)
    nodes = max(1, (ranks + GPUS_PER_NODE - 1) // GPUS_PER_NODE)
    hosts = [f"node{i + 1}" for i in range(nodes)]
    run_id = f"{name}-run"
    path = Path(root) / run_id
    path.mkdir(parents=True, exist_ok=True)
    plan = RunJson(name=name, run_id=run_id, nodes=nodes, gpus_per_node=GPUS_PER_NODE, world_size=ranks,
                   checkpoint=CheckpointRecord(interval=interval))
    (path / rundir.RUN_JSON).write_text(plan.to_json())
    (path / "spec.yaml").write_text(f"name: {name}\nsite: local\nnodes: {nodes}\ngpus_per_node: {GPUS_PER_NODE}\n")
    run = RunDir(path)
    run.write_state(backend="local", job_id=jobid.display("1", "local"), run_id=run_id, state="submitted")

    ranges = _ranges(steps, attempts, interval)
    clock = T0 + QUEUE_S
    job = 1
    for k, (first, last, committed) in enumerate(ranges, start=1):
        adir = run.attempt(k)
        adir.mkdir(exist_ok=True)
        started = clock
        history.append(run, history.EVENT_START, attempt=k, job_id=str(job), time=int(started), master="127.0.0.1:29500",
                       nodes=nodes)
        _dump(adir / rundir.ATTEMPT_JSON, {"job_id": str(job), "attempt": k, "hosts": hosts, "nodelist": f"node[1-{nodes}]",
                                           "started": int(started), "spares": 0, "master_addr": "127.0.0.1"})
        end_t = _write_attempt(adir, rng, first, last, started + STARTUP_S, ranks, hosts, straggler, interval, evals, steps)
        final = k == len(ranges)
        end = int(end_t) + 2
        if final:
            code, how, reason = 0, "stop", "every rank finished"
            verdict = Verdict(True, 0, f"all {ranks} ranks registered and checked", time=end)
        elif k == 1:
            culprit = straggler if straggler is not None else min(1, ranks - 1)
            host = hosts[culprit // GPUS_PER_NODE]
            if straggler is not None:
                code, why = 83, f"steps {STRAGGLER_FACTOR}x slower than the median rank"
            else:
                code, why = 84, "killed by a signal (Killed) before any peer failed"
            message = f"rank {culprit} on {host} failed: {why}"
            how, reason = "allocation", f"exit {code} ({message}); restarting in the allocation"
            verdict = Verdict(False, code, message, [{"rank": culprit, "host": host, "gpu": culprit % GPUS_PER_NODE,
                                                      "reason": why}], time=end)
        else:
            code, how, reason = 85, "continuation", "pre-timeout: checkpoint committed; continuing in a new job"
            verdict = Verdict(True, 85, "time limit near: saved and stopped", time=end)
        verdictfile.write(adir, verdict)
        history.append(run, history.EVENT_END, attempt=k, job_id=str(job), exit=code, srun_exit=code,
                       committed_step=committed, time=end)
        more = {"next_job": str(job + 1)} if how == "continuation" else {}
        history.append(run, history.EVENT_NEXT, how=how, attempt=k, job_id=str(job), exit=code, reason=reason,
                       committed_step=committed, time=end, **more)
        if how == "allocation":
            clock = end + RESTART_GAP_S
        elif how == "continuation":
            job += 1
            clock = end + CONTINUATION_QUEUE_S
        if segment_bytes:
            timeline.split(adir / rundir.TIMELINE, segment_bytes)
    run.checkpoints.mkdir(exist_ok=True)
    return path


def _write_attempt(
    adir: Path,
    rng: np.random.Generator,
    first: int,
    last: int,
    start: float,
    ranks: int,
    hosts: list[str],
    straggler: int | None,
    interval: int,
    evals: int,
    total: int,
) -> float:
    """metrics.jsonl and timeline.jsonl of one attempt; returns the wall time its last step ended."""
    n = last - first + 1
    step_s = BASE_STEP_S * (1.0 + np.abs(0.06 * rng.standard_normal((n, ranks))))
    warm = np.ones(n)
    w = min(n, len(WARMUP_SLOWDOWN))
    warm[:w] = WARMUP_SLOWDOWN[:w]
    step_s *= warm[:, None]
    if straggler is not None and 0 <= straggler < ranks:
        step_s[:, straggler] *= STRAGGLER_FACTOR
    hits = np.flatnonzero(rng.random(n) < 1.0 / OUTLIER_EVERY)
    step_s[hits, rng.integers(0, ranks, size=hits.size)] *= OUTLIER_FACTOR
    compute = step_s * 0.7
    steps_idx = np.arange(first, last + 1)
    saves = (steps_idx + 1) % interval == 0
    evaluates = (steps_idx + 1) % evals == 0
    wall = step_s.max(axis=1) + 0.002 + np.where(saves, SAVE_S, 0.0) + np.where(evaluates, EVAL_S, 0.0)
    begins = start + np.concatenate(([0.0], np.cumsum(wall)[:-1]))
    node_of = [hosts[min(r // GPUS_PER_NODE, len(hosts) - 1)] for r in range(ranks)]

    loss = 2.0 + 8.0 * np.exp(-steps_idx / max(1.0, total / 5)) + 0.05 * rng.standard_normal(n)
    train_s = np.cumsum(step_s[:, 0])
    with open(adir / "metrics.jsonl", "w", encoding="utf-8") as fh:
        lines = []
        for i in range(n):
            s0 = step_s[i, 0]
            line = '{"step": %d, "loss": %.6f, "step_s": %.6f, "compute_s": %.6f, "tokens_per_s": %.1f, "t": %.3f, "train_s": %.6f' % (
                steps_idx[i], loss[i], s0, compute[i, 0], TOKENS_PER_STEP / s0, begins[i] + s0, train_s[i])
            if evaluates[i]:
                line += ', "val_loss": %.6f' % (loss[i] + 0.03)
            lines.append(line + "}\n")
        fh.write("".join(lines))

    with open(adir / "timeline.jsonl", "w", encoding="utf-8", buffering=1 << 22) as fh:
        for i in range(n):
            b = float(begins[i])
            s = int(steps_idx[i])
            chunk = []
            for r in range(ranks):
                node = node_of[r]
                d = float(step_s[i, r])
                c = float(compute[i, r])
                done = b + d
                rx = done + 0.02  # the controller receives the aggregator's batch a little later
                chunk.append(_PHASE % (rx, r, node, s, "forward", b))
                chunk.append(_PHASE % (rx, r, node, s, "backward", b + 0.3 * c))
                chunk.append(_PHASE % (rx, r, node, s, "optimizer", b + 0.9 * c))
                chunk.append(_PHASE % (rx, r, node, s, "collective", b + c))
                chunk.append(_STEP % (rx, r, node, s, done, d, c))
                if evaluates[i]:
                    chunk.append(_PHASE % (rx, r, node, s, "eval", done + 0.0005))
                    done += EVAL_S
                chunk.append(_PHASE % (rx + (EVAL_S if evaluates[i] else 0.0), r, node, s, "idle", done + 0.001))
                if saves[i]:
                    chunk.append(_PHASE % (rx + 0.01, r, node, s, "save", done + 0.002))
                    chunk.append(_PHASE % (rx + SAVE_S, r, node, s, "idle", done + SAVE_S))
            fh.write("".join(chunk))
        end = float(begins[-1] + wall[-1])
        marks = []
        offset = fh.tell()
        for r in range(ranks):
            line = json.dumps({"t": end + 0.5, "kind": "gone", "rank": r, "node": node_of[r], "pid": 1000 + r, "at": end + 0.4}) + "\n"
            fh.write(line)
            marks.append(timeline.mark_line(offset, line))  # the marks file as the writer keeps it
            offset += len(line)
    (adir / rundir.TIMELINE_MARKS).write_text("".join(marks), encoding="utf-8")
    return end
