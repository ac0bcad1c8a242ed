"""The ladder: rungs in order, stop at the first failure, and a report however far it got.

report.json is rewritten after every rung (an interrupted ladder still has
one); index.html is written at the end, and on any exit.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clusterctl import __version__
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import BUG_REPORT_HINT, ExitCode
from clusterctl.plan.job import PlannedJob, load_job
from clusterctl.qualify import RUNGS
from clusterctl.qualify.definition import Definition
from clusterctl.qualify.jobs import Runner
from clusterctl.qualify.page import write_page
from clusterctl.qualify.rungs import SHORT, Context, Rung, scaling
from clusterctl.rundir import write_json_atomic

REPORT_JSON = "report.json"
STACK_ENV = ("NCCL_", "UCX_", "CUDA_", "TORCH_", "OMP_", "NVIDIA_")  # the environment the report shows per node
INDEX = "index.html"


def node_counts(asked: list[int] | None, d: Definition) -> list[int]:
    """The scaling rung's node counts: as asked, else 1, 2, 4, ... up to what the ladder may use."""
    if asked:
        return sorted(set(asked))
    counts, n = [], 1
    while n <= d.max_nodes:
        counts.append(n)
        n *= 2
    return counts if counts[-1] == d.max_nodes else [*counts, d.max_nodes]


def _stack(job_runs: list[str]) -> dict[str, Any]:
    """Software and hardware as the last run's record saw them (torch/CUDA/NCCL/driver per node)."""
    from clusterctl.rundir import RunDir

    for path in reversed(job_runs):
        try:
            from clusterctl.views.record import load  # noqa: PLC0415

            env = load(RunDir(Path(path))).get("environment") or {}
            nodes = [{"host": n.get("host"), "versions": n.get("versions"), "driver": n.get("driver"),
                      "env": {k: v for k, v in (n.get("env") or {}).items() if k.startswith(STACK_ENV)}}
                     for n in env.get("nodes") or [] if isinstance(n, dict)]
            return {"nodes": nodes, "allocation": env.get("allocation")}
        except Exception:  # noqa: BLE001 - a record that cannot be read is reported as such
            continue
    return {}


def qualify(spec: Path, site: str | None, backend: str | None, out: Path, up_to: str | None, nodes: list[int] | None,
            show: Callable[[str], None], sets: list[str] | None = None, start: str | None = None) -> dict[str, Any]:
    """Run the ladder from `start` (the first rung by default) up to `up_to` (the last); the report as a dict (also
    in out/report.json). `sets` are --set overrides of the spec, for every rung's job. A ladder started past the
    first rung (after fixing what stopped an earlier run at that rung, on a cluster where the ladder takes hours)
    runs no rung before it: the report says where it started, and the rungs that need an earlier one's figure
    (the node rung's efficiency against the worker's throughput) go without it."""
    job: PlannedJob = load_job(spec, sets or [], site)
    d = Definition.of(job)
    counts = node_counts(nodes or d.q.nodes, d)
    if max(counts) > d.max_nodes:
        raise ClusterctlError(f"--node-counts {','.join(map(str, counts))}: partition {job.plan.partition} offers the ladder"
                              f" {d.max_nodes} node(s)", 65)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(Runner(spec, site, backend, out / "runs", show, sets or []), d, out, judge_performance=not job.site.oversubscribe)
    first, last = RUNGS.index(start) if start else 0, RUNGS.index(up_to) if up_to else len(RUNGS) - 1
    if first > last:
        raise ClusterctlError(f"--from {start} comes after --up-to {up_to} in the ladder: {', '.join(RUNGS)}", ExitCode.USAGE)
    ctx.started_at = RUNGS[first] if first else None
    began = time.time()
    results: list[Rung] = []
    report = _report(job, d, results, ctx, began, stopped=None, complete=False)
    for name in RUNGS[first : last + 1]:
        if name == "report":  # the last rung: written below, once the others have run
            continue
        show(f"rung {name}")
        try:
            rung = scaling(ctx, counts) if name == "scaling" else SHORT[name](ctx)
        except ClusterctlError as exc:
            rung = Rung(name, "the rung's jobs are accepted", passed=False, reason=exc.message)
        except Exception as exc:  # noqa: BLE001 - the report is written however far the ladder got
            rung = Rung(name, "the rung runs", passed=False, reason=f"internal error: {type(exc).__name__}: {exc} ({BUG_REPORT_HINT})")
        results.append(rung)
        show(f"rung {name}: {'passed' if rung.passed else 'FAILED'}" + (f" ({rung.reason})" if rung.reason else ""))
        report = _report(job, d, results, ctx, began, stopped=None if rung.passed else name, complete=False)
        write_json_atomic(out / REPORT_JSON, report)
        if not rung.passed:
            break
    else:
        if last == len(RUNGS) - 1:
            results.append(Rung("report", "report.json and index.html hold every rung's criterion and measurements",
                                passed=True, measured={"report": str(out / REPORT_JSON), "page": str(out / INDEX)}))
    stopped = next((r.name for r in results if not r.passed), None)
    report = _report(job, d, results, ctx, began, stopped=stopped, complete=stopped is None)
    write_json_atomic(out / REPORT_JSON, report)
    write_page(out, report)
    return report


def _report(job: PlannedJob, d: Definition, results: list[Rung], ctx: Context, began: float, stopped: str | None,
            complete: bool) -> dict[str, Any]:
    runs = [p for r in results for p in r.runs]
    spec = job.spec
    return {
        "passed": complete,
        "started_at": ctx.started_at,
        "stopped_at": stopped,
        "rungs": [r.as_dict() for r in results],
        "scaling": ctx.scaling,
        "quality": ctx.quality or {"target": d.q.target_loss, "reached": False, "time_to_target_s": None},
        "definition": d.as_dict(job),
        "site": {"name": job.site.name, "partition": job.plan.partition, "node_type": job.plan.node_type_name,
                 "gpu": job.plan.node_type.gpu_model, "gpus_per_node": d.gpus_per_node, "oversubscribe": job.site.oversubscribe,
                 "expected": job.site.expected.model_dump()},
        "topology": {"kind": job.site.topology.kind, "max_nodes": d.max_nodes, "exclude": list(spec.topology.exclude)},
        "parallel": {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": "nodes x gpus_per_node"},
        "software": {"clusterctl": __version__, "python": platform.python_version(), **_stack(runs)},
        "failures": [{"rung": r.name, "reason": r.reason} for r in results if not r.passed],
        "started": began,
        "seconds": round(time.time() - began, 1),
        "runs_root": str(ctx.runner.runs_root),
    }


def load_report(out: Path) -> dict[str, Any]:
    return json.loads((out / REPORT_JSON).read_text())
