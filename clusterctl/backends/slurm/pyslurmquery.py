"""The scheduler query through pyslurm's new API: in-process RPCs to slurmctld, no fork per question.

Only `Job.load`, `Jobs.load`, `Nodes.load` and `Job(id).requeue/send_signal/cancel`,
whose signatures are the same from pyslurm 22.5.2 to 25.11 (the old `pyslurm.job()`
API is gone in 25.x). pyslurm is GPL-2.0 and an optional extra: it is imported
here, lazily, and only after pyslurmprobe has found it safe (see there). See
query.py for what is normalised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple
from typing import Any

from clusterctl.backends.base import JobInfo
from clusterctl.backends.slurm import pyslurmprobe
from clusterctl.backends.slurm.commands import UNREACHABLE
from clusterctl.backends.slurm.query import (
    NodeInfo,
    SchedulerQuery,
    node_reason,
    node_state,
    signal_number,
    split_array_id,
    task_ranges,
    text,
)
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

_INVALID_JOB = "Invalid job id"


def _pyslurm() -> Any:
    """The pyslurm module, imported once pyslurmprobe says it is safe; exit 69 otherwise."""
    problem = pyslurmprobe.problem()
    if problem is not None:
        raise ClusterctlError(f"pyslurm cannot be used here: {problem}", ExitCode.BACKEND_UNAVAILABLE)
    try:
        import pyslurm
    except ImportError as exc:
        raise ClusterctlError(f"pyslurm cannot be used here: import pyslurm failed: {exc}", ExitCode.BACKEND_UNAVAILABLE) from None
    if pyslurmprobe.loaded_conf is None:
        pyslurmprobe.loaded_conf = str(pyslurmprobe.slurm_conf())
    return pyslurm


def _failed(what: str, exc: Exception) -> ClusterctlError:
    message = str(exc) or type(exc).__name__
    code = ExitCode.BACKEND_UNAVAILABLE if UNREACHABLE.search(message) else ExitCode.BUG
    return ClusterctlError(f"{what} failed: {message}", code)


class PyslurmQuery(SchedulerQuery):
    name = "pyslurm"

    def __init__(self) -> None:
        self._ps = _pyslurm()

    def job(self, job_id: str) -> JobInfo | None:
        """Job.load for a plain job id (one small RPC); an array task asked as N_K goes through jobs()."""
        parsed = split_array_id(job_id)
        if parsed is None or parsed[1] is not None:
            return self.jobs([job_id])[job_id]
        try:
            job = self._ps.Job.load(parsed[0])
        except self._ps.RPCError as exc:
            if _INVALID_JOB in str(exc):
                return None
            raise _failed(f"pyslurm Job.load({job_id})", exc) from None
        return job_info(job, job_id)

    def jobs(self, job_ids: Sequence[str]) -> dict[str, JobInfo | None]:
        """Jobs.load once, then each id looked up: by job id, as N_K, or in its array's pending record."""
        found: dict[str, JobInfo | None] = {job_id: None for job_id in job_ids}
        if not job_ids:
            return found
        try:
            loaded = self._ps.Jobs.load()
        except self._ps.RPCError as exc:
            raise _failed("pyslurm Jobs.load()", exc) from None
        by_id: dict[str, Any] = {}
        pending_tasks: dict[int, list[Any]] = {}  # array id → its records still holding unstarted tasks
        for job in loaded.values():
            by_id[str(job.id)] = job
            if job.array_id is not None and job.array_task_id is not None:
                by_id[f"{job.array_id}_{job.array_task_id}"] = job
            elif job.array_id is not None and job.array_tasks_waiting:
                pending_tasks.setdefault(int(job.array_id), []).append(job)
        waiting: dict[int, set[int]] = {}  # per pending record, its task ids (parsed once)
        answers: dict[int, tuple[Any, ...]] = {}  # per record, its answer bar the id (one may answer for 1,000 tasks)
        for job_id in found:
            job = by_id.get(job_id)
            if job is None:
                parsed = split_array_id(job_id)
                if parsed is None or parsed[1] is None:
                    continue
                for record in pending_tasks.get(parsed[0], []):
                    if id(record) not in waiting:
                        waiting[id(record)] = task_ranges(record.array_tasks_waiting)
                    if parsed[1] in waiting[id(record)]:
                        job = record
                        break
            if job is not None:
                if id(job) not in answers:
                    answers[id(job)] = astuple(job_info(job, job_id))[1:]
                found[job_id] = JobInfo(job_id, *answers[id(job)])
        return found

    def nodes(self) -> list[NodeInfo]:
        try:
            loaded = self._ps.Nodes.load()
        except self._ps.RPCError as exc:
            raise _failed("pyslurm Nodes.load()", exc) from None
        return sorted((node_info(node) for node in loaded.values()), key=lambda n: n.name)

    def requeue(self, job_id: str) -> None:
        self._act(job_id, "requeue", lambda job: job.requeue())

    def signal(self, job_id: str, sig: str) -> None:
        number = signal_number(sig)
        self._act(job_id, f"signal {sig}", lambda job: job.send_signal(number, steps="batch"))

    def cancel(self, job_id: str) -> None:
        """pyslurm's cancel is SIGKILL to all steps and lets an ended or forgotten job pass, as scancel does."""
        self._act(job_id, "cancel", lambda job: job.cancel())

    def _act(self, job_id: str, what: str, action: Any) -> None:
        own = self._own_id(job_id, what)
        if own is None:
            if what == "cancel":
                return  # forgotten: nothing left to cancel
            raise ClusterctlError(f"{what} {job_id} failed: Invalid job id specified", ExitCode.BACKEND_UNAVAILABLE)
        try:
            action(self._ps.Job(own))
        except self._ps.RPCError as exc:
            raise ClusterctlError(f"{what} {job_id} failed: {exc}", ExitCode.BACKEND_UNAVAILABLE) from None

    def _own_id(self, job_id: str, what: str) -> int | None:
        """The job id pyslurm acts on: the id itself, or an array task's own id once it has one."""
        parsed = split_array_id(job_id)
        if parsed is None:
            raise ClusterctlError(f"{what} {job_id}: not a Slurm job id", ExitCode.USAGE)
        if parsed[1] is None:
            return parsed[0]
        try:
            loaded = self._ps.Jobs.load()
        except self._ps.RPCError as exc:
            raise _failed("pyslurm Jobs.load()", exc) from None
        for job in loaded.values():
            if job.array_id == parsed[0] and job.array_task_id == parsed[1]:
                return int(job.id)
            if job.array_id == parsed[0] and job.array_tasks_waiting and parsed[1] in task_ranges(job.array_tasks_waiting):
                raise ClusterctlError(
                    f"{what} {job_id}: the task has not started, and pyslurm acts on whole job ids only;"
                    f" use CLUSTERCTL_SLURM_QUERY=cli or act on the array ({parsed[0]})",
                    ExitCode.USAGE,
                )
        return None


def job_info(job: Any, job_id: str) -> JobInfo:
    """A pyslurm Job as the JobInfo both implementations give (see query.py)."""
    code = job.exit_code if job.exit_code is not None else 0
    sig = job.exit_code_signal or None
    return JobInfo(
        job_id=job_id,
        state=text(job.state) or "UNKNOWN",
        reason=text(job.state_reason),
        nodes=text(job.allocated_nodes),
        exit_code=int(code),
        exit_signal=int(sig) if sig else None,
        requeue_count=int(job.requeue_count or 0),
        batch_host=text(job.batch_host),
    )


def node_info(node: Any) -> NodeInfo:
    """A pyslurm Node as the NodeInfo both implementations give (see query.py)."""
    state, flags = node_state(node.state or "")
    return NodeInfo(
        name=str(node.name),
        state=state,
        flags=flags,
        reason=node_reason(node.reason),
        features=tuple(node.available_features or ()),
        partitions=tuple(node.partitions or ()),
    )
