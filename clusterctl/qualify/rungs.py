"""The rungs of the ladder: each states its criterion, runs its jobs, measures, and is judged.

A rung's `passed` is False when the run itself failed or a criterion that
is judged here was missed; performance criteria are measured but not judged
on sites whose emulated GPUs share CPUs (`judged: false` in the report).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from clusterctl import rundir
from clusterctl.checkpoint import names
from clusterctl.qualify.definition import Definition
from clusterctl.qualify.jobs import JobRun, Runner, drill, past_step
from clusterctl.rundir import rankmanifest, runjson


@dataclass
class Rung:
    name: str
    criterion: str
    passed: bool = False
    measured: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    judged: bool = True  # False: performance measured, not judged (emulated GPUs)
    runs: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "criterion": self.criterion, "measured": self.measured,
                "reason": self.reason, "judged": self.judged, "runs": self.runs}


@dataclass
class Context:
    """What the rungs share: the runner, the definition, and what earlier rungs measured."""

    runner: Runner
    d: Definition
    out: Path
    judge_performance: bool
    by_nodes: dict[int, JobRun] = field(default_factory=dict)  # runs of the definition at N nodes (scaling reuses them)
    worker_tps: float | None = None
    started_at: str | None = None  # the first rung run, when the ladder did not start at the bottom (--from)
    scaling: list[dict[str, Any]] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)
    step_p50: float | None = None


def _failed(rung: Rung, job: JobRun) -> Rung:
    rung.passed, rung.reason = False, job.why()
    return rung


def _losses(job: JobRun) -> dict[int, str]:
    """Step -> loss as its exact bits (loss_hex), over the run's attempts, the later attempt winning."""
    return {int(r["step"]): str(r.get("loss_hex") or float(r["loss"]).hex()) for r in job.metrics()}


def _tps(job: JobRun) -> float | None:
    values = [r["tokens_per_s"] for r in job.metrics() if isinstance(r.get("tokens_per_s"), (int, float))]
    steady = values[5:] or values
    return statistics.median(steady) if steady else None


def _step_times(job: JobRun) -> dict[str, float | None]:
    values = sorted(float(r["step_s"]) for r in job.metrics()[5:] if isinstance(r.get("step_s"), (int, float)))
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    pick = lambda q: values[min(len(values) - 1, int(q * (len(values) - 1)))]  # noqa: E731
    return {"p50": round(pick(0.5), 5), "p90": round(pick(0.9), 5), "p99": round(pick(0.99), 5), "max": round(values[-1], 5)}


def _per_rank_p50(job: JobRun) -> dict[str, float]:
    from clusterctl.views.report import collect  # noqa: PLC0415 - numpy: only when measured

    head = collect(job.run).headline
    return {rank: v["p50"] for rank, v in head.get("step_time_s", {}).items() if v.get("p50")}


def _manifest(run: Any, attempt: int = 1) -> dict[str, Any]:
    return rankmanifest.read(run.attempt(attempt) / rundir.MANIFEST) or {}


def worker(c: Context) -> Rung:
    q, half = c.d.q, max(2, c.d.q.steps // 2)
    rung = Rung("worker", f"one rank trains {q.steps} steps to the end and its loss falls; a checkpoint saved at step"
                f" {half - 1} and restored in a fresh run gives the same loss, bit for bit, at every step after it")
    sizes = ["gpus_per_node=1", f"checkpoint.interval={half}", "restart.mode=none"]
    first = c.runner.run("worker", c.d.overrides(1, c.d.trainer()) + sizes)
    rung.runs.append(str(first.run.path))
    if not first.completed:
        return _failed(rung, first)
    records = first.metrics()
    base = _losses(first)
    rung.measured["loss_first"], rung.measured["loss_last"] = records[0]["loss"], records[-1]["loss"]
    c.worker_tps = _tps(first)
    rung.measured["tokens_per_s"] = c.worker_tps
    if not records[-1]["loss"] < records[0]["loss"]:
        rung.reason = f"the loss did not fall: {records[0]['loss']:.4f} at step 0, {records[-1]['loss']:.4f} at the end"
        return rung
    generation = runjson.load(first.run.path).checkpoint_dir(first.run.path) / names.committed(half - 1)
    restore = c.out / "worker-restore-checkpoints"
    shutil.rmtree(restore, ignore_errors=True)
    restore.mkdir(parents=True)
    shutil.copytree(generation, restore / generation.name)
    second = c.runner.run("worker-restore", c.d.overrides(1, c.d.trainer()) + sizes + [f"checkpoint.dir={json.dumps(str(restore))}"])
    rung.runs.append(str(second.run.path))
    if not second.completed:
        return _failed(rung, second)
    again = _losses(second)
    compared = sorted(s for s in again if s >= half)
    differ = [s for s in compared if again[s] != base.get(s)]
    rung.measured.update(restored_from_step=half - 1, steps_compared=len(compared), steps_differing=len(differ))
    if not compared or min(again) != half:
        rung.reason = f"the restored run began at step {min(again) if again else None}, not {half}"
    elif differ:
        rung.reason = f"{len(differ)} of {len(compared)} steps differ after the restore, the first at step {differ[0]}"
    else:
        rung.passed = True
    return rung


def node(c: Context) -> Rung:
    gpn, q = c.d.gpus_per_node, c.d.q
    rung = Rung("node", f"every GPU of one node ({gpn}) trains, each rank bound as the site's rail map says (checked"
                f" from inside each rank at the rendezvous); slowest rank's median step time at most {q.balance}x the"
                f" fastest's; throughput per GPU at least {q.efficiency:.0%} of one worker's (weak scaling)",
                judged=c.judge_performance)
    job = c.runner.run("node", c.d.overrides(1, c.d.trainer()) + ["restart.mode=none"])
    rung.runs.append(str(job.run.path))
    if not job.completed:
        return _failed(rung, job)
    c.by_nodes[1] = job
    p50 = _per_rank_p50(job)
    ranks = _manifest(job.run).get("ranks") or []
    rung.measured["binding"] = [{k: r.get(k) for k in ("rank", "host", "gpu", "cpus", "numa", "nics")} for r in ranks]
    balance = max(p50.values()) / min(p50.values()) if p50 else None
    tps = _tps(job)
    efficiency = (tps / gpn) / c.worker_tps if tps and c.worker_tps else None
    rung.measured.update(step_p50_per_rank=p50, balance=round(balance, 3) if balance else None,
                         tokens_per_s=tps, efficiency=round(efficiency, 3) if efficiency else None)
    misses = []
    if balance is not None and balance > q.balance:
        misses.append(f"step-time balance {balance:.2f}x > {q.balance}x")
    if efficiency is not None and efficiency < q.efficiency:
        misses.append(f"efficiency {efficiency:.0%} < {q.efficiency:.0%}")
    if misses and c.judge_performance:
        rung.reason = "; ".join(misses)
        return rung
    rung.passed = True
    rung.reason = ("measured, not judged (emulated GPUs share CPUs): " + "; ".join(misses)) if misses else ""
    return rung


def comm(c: Context) -> Rung:
    nodes = c.d.max_nodes
    expected = c.runner.load(c.d.overrides(nodes, c.d.trainer(2))).site.expected.busbw_gbs
    rung = Rung("comm", "all-reduce, all-gather and reduce-scatter per group kind at the message sizes each kind carries"
                " in training, on the exact nodes and rails a job gets; a group much slower than its kind's others has its"
                " node pairs measured alone, naming the bad link"
                + (f"; all-reduce busbw at least the site's expected {expected} GB/s" if expected else "; the site states no expected figures"),
                judged=c.judge_performance and bool(expected))
    argv = ["python3", "-m", "clusterctl.qualify.commbench"]
    job = c.runner.run("comm", c.d.overrides(nodes, argv) + ["restart.mode=none"])
    rung.runs.append(str(job.run.path))
    if not job.completed:
        return _failed(rung, job)
    try:
        report = json.loads((job.run.attempt(1) / "commbench.json").read_text())
    except (OSError, ValueError):
        rung.reason = f"no results in {job.run.attempt(1) / 'commbench.json'}"
        return rung
    rows = [r for r in report.get("results", []) if "busbw_gbs" in r]
    rung.measured.update(backend=report.get("backend"), results=report.get("results", []), links=report.get("links", []))
    best: dict[str, float] = {}
    for r in rows:
        if r["op"] == "all_reduce":
            best[r["kind"]] = max(best.get(r["kind"], 0.0), r["busbw_gbs"])
    rung.measured["busbw_gbs"] = best
    if not rows:
        rung.reason = "no collective was measured (every group kind has one rank)"
        rung.passed, rung.judged = True, False
        return rung
    low = {kind: (best.get(kind), want) for kind, want in expected.items() if kind in best and best[kind] < want}
    slow_links = [link for link in report.get("links", [])][:1]
    if low and rung.judged:
        rung.reason = "; ".join(f"{kind} all-reduce busbw {got:.2f} GB/s < expected {want} GB/s" for kind, (got, want) in low.items())
        if slow_links:
            rung.reason += f"; slowest link {' - '.join(slow_links[0]['nodes'])} at {slow_links[0]['busbw_gbs']} GB/s"
        return rung
    rung.passed = True
    return rung


def nvlink(c: Context) -> Rung:
    """A tp group across two trays of one multi-node NVLink domain (an NVL72 rack), where the site has such domains."""
    probe = c.runner.load(c.d.overrides(2, c.d.trainer(2)))
    site, node_type, per = probe.site, probe.plan.node_type, probe.plan.gpus_per_node
    want = site.expected.busbw_gbs.get("mnnvl")
    rung = Rung("nvlink", "a tp group spanning two trays of one NVLink domain starts (the start-up check finds one NVLink"
                " fabric and an IMEX channel) and all-reduces over it"
                + (f" at busbw {want} GB/s or more" if want else "; the site states no expected figure (expected.busbw_gbs.mnnvl)"),
                judged=c.judge_performance and bool(want))
    if site.topology.kind != "block" or node_type.nvlink_domain <= len(node_type.gpus):
        rung.reason = (f"site {site.name} has no NVLink domain spanning nodes (node type {probe.plan.node_type_name}:"
                       f" {node_type.nvlink_domain} GPUs per domain, {len(node_type.gpus)} per node"
                       f"{'' if site.topology.kind == 'block' else ', no block topology'}): nothing to measure")
        rung.passed, rung.judged = True, False
        return rung
    if c.d.max_nodes < 2:
        rung.reason = "the partition offers the ladder one node: no group can span two trays"
        rung.passed, rung.judged = True, False
        return rung
    job = c.runner.run("nvlink", c.d.overrides(2, ["python3", "-m", "clusterctl.qualify.commbench"])
                       + [f"parallel.tp={2 * per}", "restart.mode=none"])
    rung.runs.append(str(job.run.path))
    if not job.completed:
        return _failed(rung, job)
    segments = job.job.plan.segments
    rung.measured["segment"] = segments.as_dict() if segments else None
    try:
        report = json.loads((job.run.attempt(1) / "commbench.json").read_text())
    except (OSError, ValueError):
        rung.reason = f"no results in {job.run.attempt(1) / 'commbench.json'}"
        return rung
    got = max((r["busbw_gbs"] for r in report.get("results", []) if r.get("kind") in ("tp", "world")  # the job is one tp group
               and r.get("op") == "all_reduce" and "busbw_gbs" in r), default=None)
    rung.measured.update(backend=report.get("backend"), tp_busbw_gbs=got)
    if want and rung.judged and (got is None or got < want):
        rung.reason = f"tp all-reduce busbw {got} GB/s across two trays < expected {want} GB/s (expected.busbw_gbs.mnnvl)"
        return rung
    rung.passed = True
    return rung


def boundary(c: Context) -> Rung:
    nodes = c.d.max_nodes
    rung = Rung("boundary", f"the same training on {nodes} nodes completes; which groups cross nodes and which"
                " adapter each rank uses, as each rank registered them, and each rank's phase breakdown are recorded")
    if nodes < 2:
        rung.reason = "the partition offers one node: there is no node boundary to cross"
        rung.passed, rung.judged = True, False
        return rung
    topo = c.out / "nccl-topology.xml"  # NCCL's own view of the node (written on GPUs, where NCCL runs)
    job = c.runner.run("boundary", c.d.overrides(nodes, c.d.trainer()) + ["restart.mode=none",
                                                                          f"env.NCCL_TOPO_DUMP_FILE={json.dumps(str(topo))}"])
    rung.runs.append(str(job.run.path))
    if not job.completed:
        return _failed(rung, job)
    c.by_nodes[nodes] = job
    rung.measured["nccl_topology"] = str(topo) if topo.exists() else "not written (no NCCL here: CPU ranks use gloo)"
    traffic = job.job.plan.traffic
    rung.measured["crossing_groups"] = {k: {"size": t.size, "count": t.count, "cross_node": t.cross_node}
                                        for k, t in traffic.items() if t.cross_node}
    ranks = _manifest(job.run).get("ranks") or []
    rung.measured["adapters"] = {str(r.get("rank")): {"host": r.get("host"), "nics": r.get("nics")} for r in ranks}
    try:
        from clusterctl.views.record import load as load_record  # noqa: PLC0415

        env = load_record(job.run).get("environment", {})
        rung.measured["nccl_env"] = env.get("common_env") or env.get("env") or {}
    except Exception as exc:  # noqa: BLE001 - the record is evidence, not the rung's criterion
        rung.measured["nccl_env"] = f"not read: {exc}"
    from clusterctl.views.report import collect  # noqa: PLC0415

    rung.measured["phases_s"] = collect(job.run).headline.get("phases_s", {})
    c.step_p50 = _step_times(job)["p50"]
    rung.passed = True
    return rung


def scaling(c: Context, counts: list[int]) -> Rung:
    q = c.d.q
    rung = Rung("scaling", f"the same definition at {', '.join(map(str, counts))} node(s): throughput, step-time"
                f" distribution, scaling efficiency (speedup / nodes, weak scaling: the batch per rank is fixed) at least"
                f" {q.efficiency:.0%}, communication fraction, memory headroom", judged=c.judge_performance)
    base_tps = None
    for n in counts:
        job = c.by_nodes.get(n) or c.runner.run(f"scale-{n}", c.d.overrides(n, c.d.trainer()) + ["restart.mode=none"])
        c.by_nodes[n] = job
        rung.runs.append(str(job.run.path))
        if not job.completed:
            return _failed(rung, job)
        tps = _tps(job)
        base_tps = base_tps or tps
        times = _step_times(job)
        phases = _phase_fraction(job)
        memory = job.job.plan.memory
        c.scaling.append({"nodes": n, "throughput": tps, "efficiency": round(tps / (n * base_tps), 3) if tps and base_tps else None,
                          "step_time_p50": times["p50"], "step_time_p90": times["p90"], "communication_fraction": phases,
                          "memory_headroom_bytes": memory.headroom if memory else None})
    rung.measured["points"] = c.scaling
    worst = min((p["efficiency"] for p in c.scaling if p["efficiency"] is not None), default=None)
    if worst is not None and worst < q.efficiency and c.judge_performance:
        rung.reason = f"scaling efficiency {worst:.0%} < {q.efficiency:.0%}"
        return rung
    rung.passed = True
    if worst is not None and worst < q.efficiency:
        rung.reason = f"measured, not judged (emulated GPUs share CPUs): efficiency {worst:.0%}"
    return rung


def _phase_fraction(job: JobRun) -> float | None:
    from clusterctl.views.report import collect  # noqa: PLC0415

    phases = collect(job.run).headline.get("phases_s", {})
    total = sum(sum(v for v in p.values() if v) for p in phases.values())
    comm_s = sum((p.get("collective") or 0) for p in phases.values())
    return round(comm_s / total, 3) if total else None


def data(c: Context) -> Rung:
    q, nodes = c.d.q, min(2, c.d.max_nodes)
    plan = c.runner.load(c.d.overrides(nodes, c.d.trainer())).plan
    per_step = plan.batch.micro * plan.batch.grad_accum * plan.dims.layout.dp
    steps = math.ceil(q.data_samples / per_step) + 10
    rung = Rung("data", f"the trainer reads a file-backed token dataset ({q.data_samples} samples in memory-mapped"
                f" shards) cold, then warm; it crosses an epoch boundary within {steps} steps; every sample of an"
                " epoch is used exactly once across the ranks and the next epoch is shuffled; the input wait is measured")
    shards = c.out / "data-shards"
    argv = c.d.trainer(steps, "--data-dir", str(shards), "--data-samples", str(q.data_samples), "--data-cold", "--record-samples")
    job = c.runner.run("data", c.d.overrides(nodes, argv) + ["restart.mode=none"])
    rung.runs.append(str(job.run.path))
    if not job.completed:
        return _failed(rung, job)
    records = job.metrics()
    waits = {e: [r["data_s"] for r in records if r.get("epoch") == e and "data_s" in r] for e in (0, 1)}
    rung.measured["input_wait_s"] = {("cold" if e == 0 else "warm"): round(statistics.median(w), 6) if w else None
                                     for e, w in waits.items()}
    rung.measured["input_wait_fraction"] = round(sum(r.get("data_s", 0) for r in records) / sum(r["step_s"] for r in records), 4)
    per_rank = []
    for path in sorted(job.run.attempt(1).glob("samples-rank*.jsonl")):
        ids = [i for line in path.read_text().splitlines() for i in json.loads(line)["ids"]]
        per_rank.append(ids)
    epoch_len = q.data_samples // plan.dims.layout.dp
    first = [i for ids in per_rank for i in ids[:epoch_len]]
    seconds = [ids[epoch_len : 2 * epoch_len] for ids in per_rank]  # as much of the next epoch as was trained
    second = [i for part in seconds for i in part]
    unique = len(first) == len(set(first)) == epoch_len * plan.dims.layout.dp and len(second) == len(set(second))
    crossed = bool(waits[1]) and all(seconds)
    shuffled = crossed and set(second) <= set(first) and any(part != ids[: len(part)] for part, ids in zip(seconds, per_rank))
    rung.measured.update(ranks=len(per_rank), epoch_samples=len(first), unique=unique, epoch_crossed=crossed, shuffled=shuffled)
    if not (unique and crossed and shuffled):
        rung.reason = ("samples repeated within an epoch" if not unique else "no epoch boundary crossed" if not crossed
                       else "the second epoch used the same order (no shuffle) or other samples")
        return rung
    rung.passed = True
    return rung


def restart(c: Context) -> Rung:
    q, nodes = c.d.q, c.d.max_nodes
    interval = max(2, q.steps // 4)
    rung = Rung("restart", f"training on {nodes} node(s) stopped by the pre-timeout signal after step {interval}: the"
                " checkpoint commits, the run continues in a new job from it; the save pause, restart time and repeated"
                " steps are measured, and the resumed loss continues the uninterrupted run's "
                + ("bit for bit" if q.loss_tolerance == 0 else f"within {q.loss_tolerance}"))
    baseline = c.by_nodes.get(nodes)

    def stop(run: Any) -> dict[str, Any]:
        return drill(run, pre_timeout=True) if past_step(run, interval) else {"error": "training never passed the checkpoint"}

    job = c.runner.run("restart", c.d.overrides(nodes, c.d.trainer(None, *_paced(c))) + [f"checkpoint.interval={interval}"], during=stop)
    rung.runs.append(str(job.run.path))
    if not job.completed:
        return _failed(rung, job)
    attempts = job.state.attempts
    if len(attempts) < 2:
        rung.reason = f"the run was never stopped and continued: {job.during}"
        return rung
    one, two = attempts[0], attempts[1]
    rung.measured.update(stopped_with=one.exit_code, continued_as=two.job_id, resumed_at=two.first_step,
                         repeated_steps=(one.last_step or 0) - (two.first_step or 0) + 1,
                         restart_s=round(_first_step_time(job, two.attempt) - one.end, 2) if one.end and _first_step_time(job, two.attempt) else None,
                         save_pause_s=_save_pause(job))
    if baseline is not None:
        base, again = _losses(baseline), _losses(job)
        resumed = [s for s in sorted(again) if s >= (two.first_step or 0) and s in base]
        worst = max((abs(float.fromhex(again[s]) - float.fromhex(base[s])) for s in resumed), default=0.0)
        rung.measured.update(steps_compared=len(resumed), max_loss_difference=worst)
        if not resumed or (q.loss_tolerance == 0 and worst != 0) or worst > q.loss_tolerance:
            rung.reason = f"the resumed loss departs from the uninterrupted run by {worst:.3g} (allowed {q.loss_tolerance})"
            return rung
    rung.passed = True
    return rung


def _first_step_time(job: JobRun, attempt: int) -> float | None:
    records = job.metrics(attempt)
    if not records or "t" not in records[0]:
        return None
    return float(records[0]["t"]) - float(records[0]["step_s"])


def _save_pause(job: JobRun) -> float | None:
    from clusterctl.views.report import collect  # noqa: PLC0415

    saves = [s for attempt in collect(job.run).figures.saves for _, s in attempt]
    return round(statistics.median(saves), 3) if saves else None


MIN_STEP_S = 0.1  # a fault from outside needs the run to be mid-training when it lands


def _paced(c: Context) -> list[str]:
    """Trainer arguments that make a step last at least MIN_STEP_S (busy compute; the numerics are unchanged),
    so that a signal or a kill lands while the run trains rather than after a short run ended."""
    pad = MIN_STEP_S - (c.step_p50 or 0.0)
    return ["--step-compute-s", f"{pad:.3f}"] if pad > 0.01 else []


def failure(c: Context) -> Rung:
    q, nodes = c.d.q, c.d.max_nodes
    interval = max(2, q.steps // 4)
    rung = Rung("failure", f"a rank (1) killed with SIGKILL after step {interval}: the verdict names it and its node,"
                f" the run restarts from the last committed checkpoint and trains again within {q.recovery_s:.0f} s,"
                " and completes")

    def kill(run: Any) -> dict[str, Any]:
        return drill(run, kill=1) if past_step(run, interval) else {"error": "training never passed the checkpoint"}

    job = c.runner.run("failure", c.d.overrides(nodes, c.d.trainer(None, *_paced(c))) + [f"checkpoint.interval={interval}"], during=kill)
    rung.runs.append(str(job.run.path))
    report = job.during
    rung.measured["drill"] = {k: report.get(k) for k in ("code", "detected", "culprit_right", "seconds", "message", "exit", "error")
                              if k in report}
    if not job.completed:
        return _failed(rung, job)
    attempts = job.state.attempts
    if len(attempts) < 2 or not report.get("culprit_right"):
        rung.reason = f"the drill did not pass: {report.get('message') or report.get('error') or report}"
        return rung
    one, two = attempts[0], attempts[1]
    back = _first_step_time(job, two.attempt)
    recovery = round(back - one.end, 2) if back and one.end else None
    rung.measured.update(recovery_s=recovery, resumed_at=two.first_step, repeated_steps=(one.last_step or 0) - (two.first_step or 0) + 1)
    if recovery is None or recovery > q.recovery_s:
        rung.reason = f"training resumed {recovery} s after the failure (allowed {q.recovery_s:.0f} s)"
        return rung
    rung.passed = True
    return rung


def long(c: Context) -> Rung:
    q, nodes = c.d.q, c.d.max_nodes
    per_step = c.step_p50 or 0.1
    steps = max(q.steps, int(q.long_s / per_step))
    rung = Rung("long", f"steady training for about {q.long_s} s ({steps} steps at the measured {per_step:.3g} s per step)"
                " with checkpoints: completes; the tail of the step-time distribution is reported"
                + (f"; quality: validation loss {q.target_loss} reached" if q.target_loss is not None else ""))
    job = c.runner.run("long", c.d.overrides(nodes, c.d.trainer(steps)) + ["restart.mode=none"])
    rung.runs.append(str(job.run.path))
    if not job.completed:
        return _failed(rung, job)
    rung.measured.update(steps=steps, wall_s=round(job.wall_s, 1), step_time_s=_step_times(job))
    c.quality = quality(job, q.target_loss)
    rung.measured["quality"] = c.quality
    if q.target_loss is not None and not c.quality.get("reached"):
        rung.reason = f"validation loss {q.target_loss} not reached in {steps} steps (best {c.quality.get('best_val_loss')})"
        return rung
    rung.passed = True
    return rung


def quality(job: JobRun, target: float | None) -> dict[str, Any]:
    """The headline: whether and when the quality target was reached (never throughput alone)."""
    records = job.metrics()
    vals = [r["val_loss"] for r in records if isinstance(r.get("val_loss"), (int, float))]
    reached = next((r["target_reached"] for r in records if isinstance(r.get("target_reached"), dict)), None)
    return {"target": target, "reached": reached is not None, "time_to_target_s": reached.get("seconds") if reached else None,
            "step": reached.get("step") if reached else None, "best_val_loss": min(vals) if vals else None, "run": str(job.run.path)}


SHORT: dict[str, Callable[[Context], Rung]] = {"worker": worker, "node": node, "comm": comm, "nvlink": nvlink,
                                               "boundary": boundary,
                                               "data": data, "restart": restart, "failure": failure, "long": long}
