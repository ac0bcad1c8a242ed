"""The run directory: the one module that knows its layout.

    <runs root>/<run id>/
      spec.yaml, site.yaml     as submitted (resolved)
      run.json                 the static plan (small at any scale)
      job.sbatch, wrapper.sh   rendered scripts
      code/                    git revision + uncommitted diff of the submitting tree; code/tree/: the files
                               themselves when the run was shipped from another machine (the ranks' working directory)
      attempts.jsonl           the run's history, one event per line (EVENT_*): each attempt's start
                               and end, signals, and how the run went on after an attempt (`next`:
                               in the allocation, continuation job J, requeue, stop)
      state.json               submission state: rendered, submitted (job id), failed (reason)
      cancel.json              `clusterctl cancel` was asked: no attempt starts, nothing continues
      attempt-<N>/
        attempt.json           job id, attempt, token, master addr/port, nodes
        manifest.json          every rank's registration
        timeline.jsonl         phase changes, step times, deaths, GPU samples as received (see runtime/watchserver.py)
        verdict.json           the controller's verdict: culprits, victims, evidence
        srun.log               srun's own lines (task N: Killed, ...), the blame's evidence
        stacks/rank-<R>.txt    Python stacks a rank dumped when a hang was called
        metrics.jsonl          the trainer's per-step records (loss, step time, tokens/s, validation, wall clock t, train_s)
        checks.json            comm/compute check results, when asked for
        record.json            the run record's node-side part: what rank 0 of the trainer resumed from, seeds, data
        logs/                  per-node logs (node-<slot>.log), lines prefixed by rank
      checkpoints/
      submitit/                a function submitted through the submitit executor: submitted.pkl (its
                               checkpoint after a pre-timeout stop), rank-<R>.result.pkl (value or traceback)
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 1  # the run directory's layout version: a laptop and a login node must agree on it (remote use)
SPEC = "spec.yaml"
SITE = "site.yaml"
RUN_JSON = "run.json"
SBATCH = "job.sbatch"
WRAPPER = "wrapper.sh"
CODE = "code"
CODE_TREE = "code/tree"  # a shipped copy of the working tree (remote submissions): the ranks run in it
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
CANCEL = "cancel.json"
BATCH_LOG = "slurm-{job}.out"  # one per job of the run: the batch script's own lines (sbatch --output)
METRICS = "metrics.jsonl"  # per-step records of rank 0: step, loss, step time, tokens/s, validation
RECORD = "record.json"  # the run record's node-side part, per attempt (runrecord.py assembles the rest)
SUBMITIT = "submitit"  # the submitit executor's pickles (integrations/submitit/paths.py names them)


# attempts.jsonl events. The batch script writes start, end and signal; runtime/nextattempt.py
# writes end and next once it has decided (in the shell's place) and `clusterctl cancel`/`requeue`
# write theirs. `next` says how the run goes on after an attempt (NEXT_*).
EVENT_START = "start"
EVENT_END = "end"
EVENT_SIGNAL = "signal"
EVENT_NEXT = "next"
EVENT_CANCEL = "cancel"
EVENT_REQUEUE = "requeue"  # `clusterctl requeue` continued the run by hand
NEXT_ALLOCATION = "allocation"  # a new attempt inside the same allocation
NEXT_CONTINUATION = "continuation"  # a new job (next_job), submitted before this one ended
NEXT_REQUEUE = "requeue"  # scontrol requeue of this job
NEXT_SLURM = "slurm"  # Slurm requeued the job itself (preemption, scontrol requeue from outside)
NEXT_STOP = "stop"  # the run stops here (exit says why)


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

    def batch_log(self, job_id: str) -> Path:
        """The batch log of one of the run's jobs (Slurm's own job id, as SLURM_JOB_ID has it)."""
        return self.path / BATCH_LOG.format(job=job_id)

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

    @property
    def events_file(self) -> Path:
        return self.path / ATTEMPTS

    def events(self) -> list[dict[str, Any]]:
        """attempts.jsonl, oldest first; a torn or foreign line is skipped."""
        found: list[dict[str, Any]] = []
        try:
            text = self.events_file.read_text(errors="replace")
        except OSError:
            return found
        for line in text.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                found.append(event)
        return found

    def append_event(self, event: str, **fields: Any) -> dict[str, Any]:
        """One line, one write with O_APPEND: concurrent writers (the batch script too) never tear lines."""
        record = {"event": event, **fields}
        record.setdefault("time", int(time.time()))
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.events_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return record

    def checkpoint_dir(self, run_json: dict[str, Any]) -> Path:
        """Where the run's checkpoints live: the spec's checkpoint.dir, else <run>/checkpoints."""
        return Path((run_json.get("checkpoint") or {}).get("dir") or self.path / CHECKPOINTS)

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


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file, or None while it is missing, being written, or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
