"""What scancel, scontrol and squeue do to and with jobs, shared with the local backend.

Answers follow Slurm 22.05 as measured on the test cluster: cancelling a
finished or unknown job succeeds silently; requeueing a pending job fails
("Job is pending execution"); ExcNodeList can be changed only while a job is
pending ("Job is no longer pending execution"), which includes the kill that
follows a requeue (JobState=COMPLETING, Restarts already incremented), but not
the kill that follows a cancel ("Job has already finished"); a finished job
can be requeued and runs again with its restart count incremented; a running
job's NodeList can be cut to some of its nodes, its batch host among them
(the others are the job's no more: 22.05 idles them at once).

Nodes: `scontrol update NodeName=X State=DOWN Reason=...` marks emulated nodes
DOWN (a reason is required) until `State=RESUME` (an error for a node that is
not down). Unlike the test cluster (ReturnToService=2, where a node whose
slurmd still answers is back within milliseconds), a DOWN emulated node stays
down: it stands for a node whose slurmd died.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from clusterctl.backends.local import REQUEUE_DELAY_S
from clusterctl.backends.local.batchopts import expand_pattern
from clusterctl.backends.local.formats import slurm_time, timestamp
from clusterctl.backends.local.records import (
    FINISHED,
    JobRecord,
    alive,
    resume_node,
    set_node_down,
    start_supervisor,
    write_json,
)
from clusterctl.syntax.hostlist import HostlistError, compress, expand


class ControlError(Exception):
    """Slurm's refusal, in Slurm's words."""


def find(root: Path, job_id: str | int) -> JobRecord:
    text = str(job_id)
    record = JobRecord(root, text) if text.isdigit() else None
    if record is None or not record.exists():
        raise ControlError("Invalid job id specified")
    return record


def cancel_job(root: Path, job_id: str | int) -> None:
    """scancel JOB: the supervisor kills the job (or drops it while pending) and records CANCELLED."""
    try:
        record = find(root, job_id)
    except ControlError:
        return  # scancel of an unknown job: exit 0, as measured
    if record.effective_state()["state"] in FINISHED:
        return
    record.post("cancel")


def signal_job(root: Path, job_id: str | int, sig: int, *, batch: bool = False, full: bool = False) -> None:
    """scancel --signal: to the steps (default), the batch shell (--batch) or both (--full)."""
    try:
        record = find(root, job_id)
    except ControlError:
        return
    state = record.effective_state()
    if state["state"] in FINISHED:
        return
    if state["state"] == "PENDING":
        raise ControlError("Job is pending execution")
    if batch or full:
        pid = state.get("batch_pid")
        if alive(pid, state.get("batch_start")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    if not batch or full:
        for step in record.steps():
            with contextlib.suppress(ProcessLookupError, PermissionError, KeyError, ValueError):
                os.killpg(int(step["pgid"]), sig)


def requeue_job(root: Path, job_id: str | int, env: dict[str, str] | None = None) -> None:
    """scontrol requeue: kill a running job and run it again; rerun a finished one."""
    record = find(root, job_id)
    state = record.effective_state()
    if state["state"] == "PENDING":
        raise ControlError("Job is pending execution")
    if not record.request.requeue:
        raise ControlError("Requested operation is presently disabled")
    if state["state"] == "RUNNING":
        record.post("requeue")
        return
    if state["state"] in ("COMPLETING", "REQUEUED"):
        raise ControlError("Job can not be altered now, try again later")
    # Finished: a new run under the same job id, as Slurm does for a job it still remembers.
    record.take_requests()  # stale ones, posted while it was ending
    delay = float(record.spec.get("requeue_delay", REQUEUE_DELAY_S))
    record.update(
        state="PENDING", reason="BeginTime", restarts=int(state.get("restarts", 0)) + 1,
        eligible_time=time.time() + delay, nodes=[], supervisor_pid=None, supervisor_start=None,
    )
    start_supervisor(record, record.spec["python"], dict(os.environ if env is None else env))


def update_job(root: Path, job_id: str | int, fields: dict[str, str]) -> None:
    """scontrol update jobid=X Key=Value...: ExcNodeList and StartTime=now are emulated, and NodeList of a running
    job (a shrink: some of its nodes given back)."""
    record = find(root, job_id)
    changes: dict[str, Any] = {}
    for key, value in fields.items():
        name = key.lower()
        if name == "nodelist":
            try:
                changes["nodes"] = expand(value)
            except HostlistError as exc:
                raise ControlError(f"Invalid node name specified ({exc})") from None
        elif name == "excnodelist":
            try:
                nodes = [] if value in ("", "(null)") else expand(value)
            except HostlistError as exc:
                raise ControlError(f"Invalid node name specified ({exc})") from None
            unknown = [n for n in nodes if n not in record.spec["inventory"]]
            if unknown:
                raise ControlError(f"Invalid node name specified: {','.join(unknown)}")
            changes["exc_nodes"] = nodes
        elif name == "starttime" and value.lower() == "now":
            changes["eligible_time"] = time.time()
        else:
            raise ControlError(f"Update of {key} is not emulated by the local backend (ExcNodeList, StartTime=now"
                               " and a running job's NodeList are)")
    with record.lock():
        state = record.state()
        if "nodes" in changes:
            _shrink(state, changes.pop("nodes"))
            state.update(changes)
            write_json(record.path / "state.json", state)
            return
        requeueing = state["state"] == "COMPLETING" and state.get("requeueing")
        if state["state"] in FINISHED or (state["state"] == "COMPLETING" and not requeueing):
            raise ControlError("Job has already finished")
        if (state["state"] != "PENDING" and not requeueing) or (
            state.get("supervisor_pid") and not record.supervisor_alive(state)
        ):
            raise ControlError("Job is no longer pending execution")
        state.update(changes)
        if "exc_nodes" in changes and state.get("reason") == "ReqNodeNotAvail":
            state["reason"] = "None"
        write_json(record.path / "state.json", state)


def _shrink(state: dict[str, Any], keep: list[str]) -> None:
    """A running job keeps `keep` of its nodes (its batch host among them) and gives the rest back."""
    if state["state"] != "RUNNING":
        raise ControlError("Job is not running: NodeList of a pending job is not emulated by the local backend")
    held = state.get("nodes") or []
    if not keep or any(n not in held for n in keep) or state.get("batch_host") not in keep:
        raise ControlError("Requested node configuration is not available")
    state["nodes"] = [n for n in held if n in keep]


def update_nodes(root: Path, nodes: str, fields: dict[str, str], inventory: list[str]) -> None:
    """scontrol update NodeName=X State=DOWN Reason=... | State=RESUME, on emulated nodes."""
    try:
        names = expand(nodes)
    except HostlistError:
        raise ControlError("slurm_update error: Invalid node name specified") from None
    if not names or any(n not in inventory for n in names):
        raise ControlError("slurm_update error: Invalid node name specified")
    lowered = {k.lower(): v for k, v in fields.items()}
    unknown = sorted(set(lowered) - {"state", "reason"})
    if unknown:
        raise ControlError(f"Update of node {unknown[0]} is not emulated by the local backend (State=DOWN|RESUME, Reason are)")
    state = lowered.get("state", "").upper()
    if state == "DOWN":
        reason = lowered.get("reason", "")
        if not reason:
            raise ControlError("You must specify a reason when DOWNING or DRAINING a node. Request denied")
        for name in names:
            set_node_down(root, name, reason)
    elif state == "RESUME":
        if not all([resume_node(root, name) for name in names]):
            raise ControlError("slurm_update error: Invalid node state specified")
    else:
        raise ControlError(f"Update of node State={lowered.get('state', '')} is not emulated by the local backend (DOWN and RESUME are)")


def describe(record: JobRecord) -> dict[str, Any]:
    """The values squeue and scontrol print about a job."""
    spec, req = record.spec, record.request
    state = record.effective_state()
    now = time.time()
    started = state.get("start_time") if state["state"] not in ("PENDING",) else None
    scale = float(spec["time_scale"])
    ended = state.get("end_time") if state["state"] in FINISHED else None
    run_time = ((ended or now) - started) / scale if started else 0
    expected_end = started + req.time_limit * scale if started and req.time_limit else None
    nodes = state.get("nodes") or []
    code, sig = state.get("exit_code", [0, 0])
    return {
        "job_id": record.job_id,
        "name": spec["name"],
        "user": spec["user"],
        "uid": spec["uid"],
        "gid": spec["gid"],
        "state": state["state"],
        "reason": state.get("reason") or "None",
        "dependency": ",".join(f"{k}:{d}" for k, d in req.dependency) or "(null)",
        "requeue": int(req.requeue),
        "restarts": int(state.get("restarts", 0)),
        "exit_code": f"{code}:{sig}",
        "run_time": run_time,
        "time_limit": slurm_time(req.time_limit),
        "submit_time": timestamp(spec["submit_time"]),
        "eligible_time": timestamp(state.get("eligible_time")),
        "start_time": timestamp(started),
        "end_time": timestamp(ended or expected_end),
        "partition": spec["partition"],
        "account": req.account or "(null)",
        "req_nodes": compress(req.nodelist) or "(null)",
        "exc_nodes": compress(state.get("exc_nodes") or []) or "(null)",
        "nodes": compress(nodes) or "(null)",
        "nodes_list": nodes,
        "batch_host": state.get("batch_host") if nodes else "(null)",
        "num_nodes": len(nodes) or req.nodes,
        "num_tasks": req.ntasks or (req.ntasks_per_node or 1) * req.nodes,
        "cpus_per_task": req.cpus_per_task or 1,
        "ntasks_per_node": req.ntasks_per_node or 0,
        "command": spec["script"],
        "workdir": spec["workdir"],
        "stdout": _output_path(record, req.output, state),
        "stderr": _output_path(record, req.error or req.output, state),
        "gres": req.gpu_option.replace(":", "=", 1) if req.gpu_option else "",
        "gpus_per_node": req.gpus_per_node,
    }


def _output_path(record: JobRecord, pattern: str | None, state: dict[str, Any]) -> str:
    spec = record.spec
    name = expand_pattern(
        pattern or "slurm-%j.out", job_id=record.job_id, name=spec["name"], user=spec["user"],
        node=state.get("batch_host") or "",
    )
    return str(Path(spec["workdir"]) / name)
