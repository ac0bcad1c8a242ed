"""attempt-N/attempt.json: one launch of all ranks — who, where and how to meet.

The batch script writes it (templates/job.sbatch.j2, FIELDS in this order)
before any rank starts, renamed into place; the controller, the drill and
every view read it through `read`. A file that lacks a key (older layouts)
reads with the default.

    format      this layout's version (absent before it was recorded)
    job_id      the scheduler's own id (SLURM_JOB_ID)
    attempt     the attempt's number
    master_host, master_addr, master_port   the rendezvous store (the controller's)
    nodelist    the allocation as Slurm names it (spares included)
    hosts       the nodes the ranks run on, in slot order
    spares      how many spare nodes the allocation holds
    batch_host  the node the batch script runs on
    started     when the attempt began (seconds since the epoch)

The attempt's secret token is not in it: a sharing group reads attempt.json
(status, logs), and whoever holds the token can speak for the attempt's
aggregators. The batch script writes it to attempt-N/.token, owner-only
whatever the run's access; `token` reads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.rundir.jsonio import read_json
from clusterctl.rundir.layout import ATTEMPT_JSON, TOKEN_FILE

FORMAT = 3  # 1: before the format was recorded; 2: with the token (3: in .token instead)


@dataclass(frozen=True)
class AttemptJson:
    format: int = 1  # the file's layout version
    job_id: str = ""  # Slurm's job id (the local backend's on this machine)
    attempt: int = 0  # the attempt's number, from 1
    master_host: str = ""  # the node the controller and the TCPStore run on
    master_addr: str = ""  # the rendezvous address the ranks connect to (MASTER_ADDR)
    master_port: int = 0  # the planned rendezvous port (controller.json has the one it bound)
    nodelist: str = ""  # the attempt's nodes as a Slurm hostlist
    hosts: tuple[str, ...] = ()  # the nodes in slot order: node slot K runs on hosts[K]
    spares: int = 0  # spare nodes of the allocation this attempt does not use
    batch_host: str = ""  # the node the batch script runs on
    started: float | None = None  # when the batch script started the attempt (seconds since the epoch)

    def host(self, slot: int) -> str:
        """The node of a slot (`node-K` when the slot is not listed)."""
        return self.hosts[slot] if 0 <= slot < len(self.hosts) else f"node-{slot}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AttemptJson":
        hosts = data.get("hosts")
        started = data.get("started")

        def number(key: str, default: int) -> int:
            value = data.get(key)
            return value if value.__class__ is int else default

        return cls(
            format=number("format", 1),
            job_id=str(data.get("job_id") or ""),
            attempt=number("attempt", 0),
            master_host=str(data.get("master_host") or ""),
            master_addr=str(data.get("master_addr") or ""),
            master_port=number("master_port", 0),
            nodelist=str(data.get("nodelist") or ""),
            hosts=tuple(str(h) for h in hosts) if isinstance(hosts, list) else (),
            spares=number("spares", 0),
            batch_host=str(data.get("batch_host") or ""),
            started=float(started) if started.__class__ in (int, float) else None,
        )


def token(attempt_dir: Path) -> str:
    """The attempt's secret: a rank, aggregator or injector without it is turned away. "" when this user
    cannot read it (a member of the run's group) or the attempt has none yet; a format-2 attempt kept it in
    attempt.json."""
    try:
        return Path(attempt_dir, TOKEN_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        data = read_json(os.path.join(attempt_dir, ATTEMPT_JSON))
        return str(data.get("token") or "") if data is not None else ""


def read(attempt_dir: Path) -> AttemptJson | None:
    """The attempt's attempt.json; None while it is missing (the batch script has not written it yet)."""
    data = read_json(os.path.join(attempt_dir, ATTEMPT_JSON))
    return AttemptJson.from_dict(data) if data is not None else None
