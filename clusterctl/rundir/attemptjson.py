"""attempt-N/attempt.json: one launch of all ranks — who, where and how to meet.

The batch script writes it (templates/job.sbatch.j2, FIELDS in this order)
before any rank starts, renamed into place; the controller, the drill and
every view read it through `read`. A file that lacks a key (older layouts)
reads with the default.

    format      this layout's version (absent before it was recorded)
    job_id      the scheduler's own id (SLURM_JOB_ID)
    attempt     the attempt's number
    token       the attempt token: ranks and aggregators of another attempt are turned away
    master_host, master_addr, master_port   the rendezvous store (the controller's)
    nodelist    the allocation as Slurm names it (spares included)
    hosts       the nodes the ranks run on, in slot order
    spares      how many spare nodes the allocation holds
    batch_host  the node the batch script runs on
    started     when the attempt began (seconds since the epoch)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from clusterctl.rundir.jsonio import read_json
from clusterctl.rundir.layout import ATTEMPT_JSON

FORMAT = 2  # 1: before the format was recorded (same keys)


@dataclass(frozen=True)
class AttemptJson:
    format: int = 1
    job_id: str = ""
    attempt: int = 0
    token: str = ""
    master_host: str = ""
    master_addr: str = ""
    master_port: int = 0
    nodelist: str = ""
    hosts: tuple[str, ...] = ()
    spares: int = 0
    batch_host: str = ""
    started: float | None = None

    def host(self, slot: int) -> str:
        """The node of a slot (`node-K` when the slot is not listed)."""
        return self.hosts[slot] if 0 <= slot < len(self.hosts) else f"node-{slot}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AttemptJson":
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = data.get(f.name)
            if value is None:
                continue
            if f.name == "hosts":
                values[f.name] = tuple(str(h) for h in value) if isinstance(value, list) else ()
            elif f.name in ("job_id", "token", "master_host", "master_addr", "nodelist", "batch_host"):
                values[f.name] = str(value)
            elif f.name == "started":
                values[f.name] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            elif isinstance(value, int) and not isinstance(value, bool):
                values[f.name] = value
        return cls(**values)


def read(attempt_dir: Path) -> AttemptJson | None:
    """The attempt's attempt.json; None while it is missing (the batch script has not written it yet)."""
    data = read_json(Path(attempt_dir) / ATTEMPT_JSON)
    return AttemptJson.from_dict(data) if data is not None else None
