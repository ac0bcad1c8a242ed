"""Asking Slurm about jobs and nodes, and telling it to requeue, signal or cancel: one interface, two ways.

`status` over many runs, the batch script's recovery step and `cancel` all ask
the scheduler; `cliquery.CliQuery` does it through squeue, scontrol and scancel
(every Slurm release has them, SSH needs nothing else), `pyslurmquery.PyslurmQuery`
through pyslurm's new API, in-process RPCs without a fork per question. Submitting
is not here: it stays `sbatch` (pyslurm 22.5's job description drops `--switches`
and `--signal=B:`).

`choose.choose_query()` picks one of the two (pyslurm where it works here, else
the CLI).

Both give the same answers. What differs between them underneath is normalised here:

- Node state: Slurm's MIXED (some CPUs of the node allocated) is reported as
  ALLOCATED. scontrol and sinfo compute MIXED on the client side from the
  allocated CPUs; pyslurm 22.5's `Node.state` does not and says ALLOCATED. For
  clusterctl a node with any job on it is busy either way. Flags (DRAIN,
  NOT_RESPONDING, ...) come apart from the base state: `NodeInfo.flags`.
- Node reason: scontrol appends ` [user@time]`; pyslurm gives the text alone, as here.
- Job reason: Slurm's "None" (and "(null)") is "". scontrol would turn spaces
  into underscores, so the CLI reads reasons from squeue, which keeps them.
- Exit status: `exit_code` is Slurm's first number (0 until the job ends; 0 when a
  signal ended it) and `exit_signal` the second (None for none). squeue gives the
  raw wait() status and pyslurm the pair; both land here the same way. One
  difference cannot be undone: pyslurm 22.5 reports an exit status of 128 or more
  as status − 128 (it assumes a shell's 128+signal), so `exit 130` reads 130 from
  the CLI and 2 from pyslurm. clusterctl's own codes are all below 128.
- Absent values: no nodes, no batch host ("n/a", "(null)", None) are "".
- Array tasks are asked for as `<array id>_<task>` or by their own job id; a task
  not started yet is answered from its array's pending record. An array's id
  alone answers for one of its records, whichever Slurm lists first.
- GRES in use are not reported: pyslurm 22.5 gives `{}` where scontrol says `gpu:2`.
- Cancelling a job that has ended or that Slurm has forgotten is not an error
  (scancel and pyslurm both let it pass); requeueing or signalling one is.
"""

from __future__ import annotations

import signal as _signal
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from clusterctl.backends.base import JobInfo
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

_ABSENT = ("", "None", "(null)", "n/a", "N/A")


@dataclass(frozen=True)
class NodeInfo:
    """One node as the scheduler sees it."""

    name: str
    state: str  # base state: IDLE, ALLOCATED (also for Slurm's MIXED), DOWN, FUTURE, UNKNOWN, ...
    flags: tuple[str, ...] = ()  # sorted: DRAIN, NOT_RESPONDING, COMPLETING, RESERVED, ...
    reason: str = ""  # why it is drained or down, without scontrol's [user@time]
    features: tuple[str, ...] = ()  # available features, as in the site's --constraint
    partitions: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        """Drained or draining: no new job will start there."""
        return "DRAIN" in self.flags


class SchedulerQuery(ABC):
    """The scheduler's answers about jobs and nodes, and the three things clusterctl asks it to do."""

    name: str

    def job(self, job_id: str) -> JobInfo | None:
        """The job, or None when slurmctld no longer knows it (MinJobAge passed, or never existed)."""
        return self.jobs([job_id])[job_id]

    @abstractmethod
    def jobs(self, job_ids: Sequence[str]) -> dict[str, JobInfo | None]:
        """Every job asked for, in one scheduler request: `status` shows many runs at once."""

    @abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """Every node, sorted by name."""

    @abstractmethod
    def requeue(self, job_id: str) -> None:
        """Put a running (or ended batch) job back in the queue; its requeue count rises."""

    @abstractmethod
    def signal(self, job_id: str, sig: str) -> None:
        """Send `sig` (USR2, TERM: no SIG prefix) to the job's batch shell only, as --signal=B: would."""

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """Cancel the job and all its steps; one that has already ended is left as it is."""


# --- normalisation, shared by both implementations --------------------------------------
def text(value: object) -> str:
    """Slurm's ways of saying "nothing" ("None", "(null)", "n/a", None) as ""."""
    if value is None:
        return ""
    value = str(value).strip()
    return "" if value in _ABSENT else value


def node_state(raw: str) -> tuple[str, tuple[str, ...]]:
    """`MIXED+DRAIN` into ("ALLOCATED", ("DRAIN",)): base state and sorted flags, MIXED read as ALLOCATED."""
    parts = [p for p in raw.strip().upper().split("+") if p]
    base = parts[0] if parts else "UNKNOWN"
    base = base.rstrip("*~#!%$@^-")  # sinfo-style suffixes, should any appear
    if base == "MIXED":
        base = "ALLOCATED"
    return base, tuple(sorted(set(parts[1:])))


def node_reason(raw: object) -> str:
    """A node's reason without the ` [user@time]` scontrol appends."""
    value = text(raw)
    if value.endswith("]") and " [" in value:
        value = value[: value.rindex(" [")]
    return value


def wait_status(status: int) -> tuple[int, int | None]:
    """A raw wait() status (squeue's exit_code) as Slurm's pair: (exit status, signal or None)."""
    if status & 0x7F:
        return 0, status & 0x7F
    return (status >> 8) & 0xFF, None


def signal_number(sig: str) -> int:
    """USR2, SIGUSR2 or 12 as a signal number; a name Python does not know is a usage error."""
    name = sig.strip().upper()
    if name.isdigit():
        return int(name)
    try:
        return int(_signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
    except KeyError:
        raise ClusterctlError(f"unknown signal {sig!r}; expected a name such as USR2 or TERM, or a number", ExitCode.USAGE) from None


def split_array_id(job_id: str) -> tuple[int, int | None] | None:
    """'123' → (123, None), '123_4' → (123, 4); None for anything else (a job id Slurm would refuse)."""
    head, _, task = job_id.strip().partition("_")
    if not head.isdigit() or (task and not task.isdigit()):
        return None
    return int(head), int(task) if task else None


def task_ranges(expr: str) -> set[int]:
    """An array's task list ('0-999', '1,3,5-7', '0-10:2', maybe with '%4') as the set of task ids."""
    found: set[int] = set()
    for part in expr.split("%")[0].split(","):
        rng, _, step = part.strip().partition(":")
        if not rng:
            continue
        lo, _, hi = rng.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()) and (not step or step.isdigit()):
            found.update(range(int(lo), int(hi or lo) + 1, int(step or 1) or 1))
    return found
