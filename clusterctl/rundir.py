"""The run directory: the one module that knows its layout.

    <runs root>/<run id>/
      spec.yaml, site.yaml     as submitted (resolved)
      run.json                 the static plan (small at any scale)
      job.sbatch, wrapper.sh   rendered scripts
      code/                    git revision + uncommitted diff of the submitting tree
      attempts.jsonl           attempt start/end events (written by the batch script)
      state.json               submission state: rendered, submitted (job id), failed (reason)
      attempt-<N>/
        attempt.json           job id, attempt, token, master addr/port, nodes
        manifest.json          every rank's registration
        timeline.jsonl         phase changes, step times, deaths, GPU samples as received (see runtime/watchserver.py)
        verdict.json           the controller's verdict: culprits, victims, evidence
        srun.log               srun's own lines (task N: Killed, ...), the blame's evidence
        stacks/rank-<R>.txt    Python stacks a rank dumped when a hang was called
        metrics.jsonl          the trainer's per-step records (loss, step time, tokens/s, validation)
        checks.json            comm/compute check results, when asked for
        logs/                  per-node logs (node-<slot>.log), lines prefixed by rank
      checkpoints/
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPEC = "spec.yaml"
SITE = "site.yaml"
RUN_JSON = "run.json"
SBATCH = "job.sbatch"
WRAPPER = "wrapper.sh"
CODE = "code"
ATTEMPTS = "attempts.jsonl"
STATE = "state.json"
CHECKPOINTS = "checkpoints"
ATTEMPT_PREFIX = "attempt-"
ATTEMPT_JSON = "attempt.json"
MANIFEST = "manifest.json"
TIMELINE = "timeline.jsonl"
VERDICT = "verdict.json"
LOGS = "logs"
SRUN_LOG = "srun.log"
STACKS = "stacks"
NCCL_TRACE_PREFIX = "nccl-trace-rank"  # + rank: the NCCL flight recorder's dump (torch names it)
NCCL_PIPE_PREFIX = "nccl-pipe-rank"  # + rank + .pipe: writing to it asks for that dump
METRICS = "metrics.jsonl"  # per-step records of rank 0: step, loss, step time, tokens/s, validation


def new_run_id(name: str, now: float | None = None) -> str:
    """`<name>-YYYYmmdd-HHMMSS-<4 hex>`: sortable, unique without coordination."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class RunDir:
    path: Path

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def run_json(self) -> Path:
        return self.path / RUN_JSON

    @property
    def sbatch(self) -> Path:
        return self.path / SBATCH

    @property
    def wrapper(self) -> Path:
        return self.path / WRAPPER

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def attempt(self, n: int) -> Path:
        return self.path / f"{ATTEMPT_PREFIX}{n}"

    def attempts(self) -> list[int]:
        """Attempt numbers present on disk, ascending."""
        found = []
        for entry in self.path.glob(f"{ATTEMPT_PREFIX}*"):
            suffix = entry.name[len(ATTEMPT_PREFIX) :]
            if suffix.isdigit():
                found.append(int(suffix))
        return sorted(found)

    def read_state(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / STATE).read_text())
        except FileNotFoundError:
            return {}

    def write_state(self, **fields: Any) -> None:
        """Merge fields into state.json atomically (write, fsync, rename)."""
        state = self.read_state()
        state.update(fields)
        write_json_atomic(self.path / STATE, state)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old or the new file, never a torn one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def stack_file(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / STACKS / f"rank-{rank}.txt"
