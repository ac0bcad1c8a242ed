"""The scheduler query through Slurm's commands: squeue for jobs, scontrol for nodes and requeue, scancel.

The default, and what runs over SSH: every Slurm release has these commands.
Jobs are read with `squeue --Format` (one call for any number of jobs; reasons keep
their spaces, which `scontrol show job` turns into underscores), nodes with
`scontrol show node -o`. See query.py for what is normalised.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from clusterctl.backends.base import JobInfo
from clusterctl.backends.slurm.commands import failure_code, run, slurm_reason
from clusterctl.backends.slurm.query import (
    NodeInfo,
    SchedulerQuery,
    node_reason,
    node_state,
    signal_number,
    text,
    wait_status,
)
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

# Reason last: it is free text and the only field that could hold the separator.
SQUEUE_FIELDS = ("JobID", "JobArrayID", "State", "NodeList", "exit_code", "RestartCnt", "BatchHost", "Reason")
SQUEUE_FORMAT = ",".join(f"{field}:|" for field in SQUEUE_FIELDS)
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")
_FIELD = re.compile(r"(\w+)=(\S*)")
_INVALID_JOB = "Invalid job id"


class CliQuery(SchedulerQuery):
    name = "cli"

    def jobs(self, job_ids: Sequence[str]) -> dict[str, JobInfo | None]:
        """One squeue call; a job it does not list is None (slurmctld forgot it)."""
        found: dict[str, JobInfo | None] = {job_id: None for job_id in job_ids}
        if not job_ids:
            return found
        out = run(["squeue", "--noheader", "--states=all", "--array", f"--jobs={','.join(found)}", f"--Format={SQUEUE_FORMAT}"])
        if out.returncode != 0:
            if _INVALID_JOB in out.stderr:
                return found  # the one (or every one) asked for is forgotten
            raise ClusterctlError(f"squeue failed: {slurm_reason(out.stderr)}", failure_code(out.stderr))
        for line in out.stdout.splitlines():
            parsed = parse_squeue_line(line)
            if parsed is None:
                continue
            own_id, array_id, info = parsed
            for asked in (array_id, own_id):  # '12_3' as asked, or the task's own job id
                if asked in found and found[asked] is None:
                    found[asked] = _as(info, asked)
        return found

    def nodes(self) -> list[NodeInfo]:
        out = run(["scontrol", "show", "node", "-o"])
        if out.returncode != 0:
            raise ClusterctlError(f"scontrol show node failed: {slurm_reason(out.stderr)}", failure_code(out.stderr))
        return sorted((parse_scontrol_node(line) for line in out.stdout.splitlines() if line.strip()), key=lambda n: n.name)

    def requeue(self, job_id: str) -> None:
        out = run(["scontrol", "requeue", job_id])
        if out.returncode != 0:
            raise ClusterctlError(f"scontrol requeue {job_id} failed: {slurm_reason(out.stderr or out.stdout)}", ExitCode.BACKEND_UNAVAILABLE)

    def signal(self, job_id: str, sig: str) -> None:
        number = signal_number(sig)
        out = run(["scancel", f"--signal={number}", "--batch", job_id])
        if out.returncode != 0:
            raise ClusterctlError(
                f"scancel --signal={sig} --batch {job_id} failed: {slurm_reason(out.stderr)}", ExitCode.BACKEND_UNAVAILABLE
            )

    def cancel(self, job_id: str) -> None:
        out = run(["scancel", job_id])
        if out.returncode != 0 and "already completing or completed" not in out.stderr and _INVALID_JOB not in out.stderr:
            raise ClusterctlError(f"scancel {job_id} failed: {slurm_reason(out.stderr)}", ExitCode.BACKEND_UNAVAILABLE)


def _as(info: JobInfo, job_id: str) -> JobInfo:
    return info if info.job_id == job_id else replace(info, job_id=job_id)


def parse_squeue_line(line: str) -> tuple[str, str, JobInfo] | None:
    """One `squeue --Format=SQUEUE_FORMAT` line: (own job id, array form or own id, JobInfo)."""
    parts = line.rstrip("\n").split("|", len(SQUEUE_FIELDS) - 1)
    if len(parts) != len(SQUEUE_FIELDS):
        return None
    own_id, array_id, state, nodes, status, restarts, batch_host, reason = (p.strip() for p in parts)
    if not own_id.isdigit():
        return None
    code, sig = wait_status(int(status)) if status.isdigit() else (0, None)
    info = JobInfo(
        job_id=array_id or own_id,
        state=state or "UNKNOWN",
        reason=text(reason.removesuffix("|")),
        nodes=text(nodes),
        exit_code=code,
        exit_signal=sig,
        requeue_count=int(restarts) if restarts.isdigit() else 0,
        batch_host=text(batch_host),
    )
    return own_id, array_id or own_id, info


def scontrol_fields(line: str) -> dict[str, str]:
    """One `scontrol show ... -o` line as Key → value; values may hold spaces (a node's Reason)."""
    line = line.strip()
    keys = list(_KEY.finditer(line))
    return {m.group(1): line[m.end() : (keys[i + 1].start() if i + 1 < len(keys) else len(line))].strip() for i, m in enumerate(keys)}


def parse_scontrol_node(line: str) -> NodeInfo:
    """One `scontrol show node -o` line into a NodeInfo (MIXED read as ALLOCATED)."""
    fields = scontrol_fields(line)
    state, flags = node_state(fields.get("State", ""))
    return NodeInfo(
        name=fields.get("NodeName", ""),
        state=state,
        flags=flags,
        reason=node_reason(fields.get("Reason")),
        features=tuple(f for f in text(fields.get("AvailableFeatures")).split(",") if f),
        partitions=tuple(p for p in text(fields.get("Partitions")).split(",") if p),
    )


def parse_scontrol_job(text_: str) -> JobInfo | None:
    """One `scontrol show job -o` line into a JobInfo: what the batch host asks (batchhost.job), and what the local
    backend's scontrol shim is checked against. Reasons keep scontrol's underscores."""
    line = text_.strip().splitlines()[0] if text_.strip() else ""
    fields = dict(_FIELD.findall(line))
    if "JobId" not in fields:
        return None
    exit_code = None
    if ":" in fields.get("ExitCode", ""):
        exit_code = int(fields["ExitCode"].split(":")[0])
    restarts = fields.get("Restarts", "")
    return JobInfo(
        job_id=fields["JobId"],
        state=fields.get("JobState", "UNKNOWN"),
        reason=text(fields.get("Reason")),
        nodes=text(fields.get("NodeList")),
        exit_code=exit_code,
        requeue_count=int(restarts) if restarts.isdigit() else 0,
        batch_host=text(fields.get("BatchHost")),
    )
