"""The Slurm backend: sbatch, squeue/scontrol and scancel through their CLIs.

The CLIs are the one interface every Slurm release has; `scontrol show job -o`
is parsed (key=value, stable since long before 22.05) rather than squeue's
JSON, which changed shape between releases. Every call has a timeout: a hung
slurmctld must not hang the user.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from clusterctl.backends.base import Backend, JobInfo, Submission
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

TIMEOUT_S = 60
# Messages that mean "slurmctld is not there", as opposed to "it said no".
UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted|Connection refused"
    r"|Could not establish a configuration source|Communication connection failure",
    re.I,
)


def _run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which(args[0]) is None:
        raise ClusterctlError(
            f"{args[0]} is not on PATH: this machine is not a Slurm login node"
            " (use --backend local, or submit from a login node)",
            ExitCode.BACKEND_UNAVAILABLE,
        )
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd, check=False)
    except subprocess.TimeoutExpired:
        raise ClusterctlError(
            f"{args[0]} did not answer within {TIMEOUT_S} s: the Slurm controller is unreachable or overloaded",
            ExitCode.BACKEND_UNAVAILABLE,
        ) from None


def slurm_reason(stderr: str) -> str:
    """Slurm's own words, without the `sbatch: error:` prefixes."""
    lines = [re.sub(r"^\w+: error: ", "", line).strip() for line in stderr.strip().splitlines()]
    return "; ".join(line for line in lines if line) or "no reason given"


class SlurmBackend(Backend):
    name = "slurm"

    def check(self) -> None:
        for tool in ("sbatch", "scontrol"):
            if shutil.which(tool) is None:
                _run([tool])  # raises the clear message

    def submit(self, script: Path, workdir: Path, options: list[str] | None = None) -> Submission:
        out = _run(["sbatch", "--parsable", *(options or []), str(script)], cwd=workdir)
        if out.returncode != 0:
            reason = slurm_reason(out.stderr)
            code = ExitCode.BACKEND_UNAVAILABLE if UNREACHABLE.search(out.stderr) else ExitCode.BAD_CONFIG
            raise ClusterctlError(f"Slurm rejected the job: {reason}", code)
        job_id = out.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise ClusterctlError(f"sbatch answered {out.stdout.strip()!r}, expected a job id", ExitCode.BUG)
        return Submission(job_id=job_id, backend=self.name)

    def info(self, job_id: str) -> JobInfo | None:
        out = _run(["scontrol", "show", "job", "-o", job_id])
        if out.returncode != 0:
            if "Invalid job id" in out.stderr:
                return None
            code = ExitCode.BACKEND_UNAVAILABLE if UNREACHABLE.search(out.stderr) else ExitCode.BUG
            raise ClusterctlError(f"scontrol show job {job_id} failed: {slurm_reason(out.stderr)}", code)
        return parse_scontrol_job(out.stdout)

    def info_many(self, job_ids: Sequence[str]) -> dict[str, JobInfo | None]:
        """One squeue call for all of them; a job squeue no longer shows is None (slurmctld forgot it)."""
        found: dict[str, JobInfo | None] = {job_id: None for job_id in job_ids}
        if not job_ids:
            return found
        out = _run(["squeue", "--noheader", "--states=all", f"--jobs={','.join(job_ids)}", f"--format={_SQUEUE_FORMAT}"])
        if out.returncode != 0:
            if "Invalid job id" in out.stderr:
                return found  # every one of them forgotten
            code = ExitCode.BACKEND_UNAVAILABLE if UNREACHABLE.search(out.stderr) else ExitCode.BUG
            raise ClusterctlError(f"squeue failed: {slurm_reason(out.stderr)}", code)
        for line in out.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 4 or parts[0] not in found:
                continue
            job_id, state, reason, nodes = parts
            found[job_id] = JobInfo(job_id, state, "" if reason in ("None", "(null)") else reason, nodes)
        return found

    def cancel(self, job_id: str) -> None:
        out = _run(["scancel", job_id])
        if out.returncode != 0:
            raise ClusterctlError(f"scancel {job_id} failed: {slurm_reason(out.stderr)}", ExitCode.BACKEND_UNAVAILABLE)

    def signal(self, job_id: str, sig: str) -> None:
        out = _run(["scancel", f"--signal={sig}", "--batch", job_id])
        if out.returncode != 0:
            raise ClusterctlError(
                f"scancel --signal={sig} --batch {job_id} failed: {slurm_reason(out.stderr)}", ExitCode.BACKEND_UNAVAILABLE
            )


_SQUEUE_FORMAT = "%i|%T|%r|%N"  # job id, state (long form), reason, nodes
_FIELD = re.compile(r"(\w+)=(\S*)")


def parse_scontrol_job(text: str) -> JobInfo | None:
    """One `scontrol show job -o` line into a JobInfo."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    fields = dict(_FIELD.findall(line))
    if "JobId" not in fields:
        return None
    exit_code = None
    if ":" in fields.get("ExitCode", ""):
        exit_code = int(fields["ExitCode"].split(":")[0])
    nodes = fields.get("NodeList", "")
    return JobInfo(
        job_id=fields["JobId"],
        state=fields.get("JobState", "UNKNOWN"),
        reason=fields.get("Reason", ""),
        nodes="" if nodes == "(null)" else nodes,
        exit_code=exit_code,
    )
