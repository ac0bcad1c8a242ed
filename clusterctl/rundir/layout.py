"""The run directory's layout: the one module that spells its names.

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
      .rank.env                in a container: the attempt's variables the wrapper sets again inside the image
                               (the token and secret_env among them), the owner's only (0600) whatever runs_mode
      checkpoint.key           the user's key that seals checkpoint generations (checkpoint/trust.py), the owner's only
      attempt-<N>/
        attempt.json           job id, attempt, master addr/port, nodes
        .token                 the attempt's secret, the owner's only (0600) whatever runs_mode
        manifest.json          every rank's registration
        timeline.jsonl         phase changes, step times, deaths, GPU samples as received (see runtime/controller/watchserver.py)
        timeline.<a>-<b>.jsonl.gz  its bytes a..b once closed past 128 MB, gzip members and their `.index` (rundir/timeline.py)
        timeline-marks.jsonl   its deaths, lost nodes and verdicts again, each with its byte offset there (rundir/timeline.py)
        verdict.json           the controller's verdict: culprits, victims, evidence
        srun.log               srun's own lines (task N: Killed, ...), the blame's evidence
        stacks/rank-<R>.txt    Python stacks a rank dumped when a hang was called
        metrics.jsonl          the trainer's per-step records (loss, step time, tokens/s, validation, wall clock t, train_s)
        checks.json            comm/compute check results, when asked for
        record.json            the run record's node-side part: what rank 0 of the trainer resumed from, seeds, data
        controller.json        the controller's ports, pid and host (the store, the watch server)
        drill.json             a fault `clusterctl drill` injected into this attempt
        logs/                  per-node logs (node-<slot>.log; attempt.json maps slots to hosts), lines prefixed
                               by rank; aggregators-srun.log: srun's own lines about the aggregators' step
      checkpoints/
      busy-rate.json           the reference trainer's busy-compute rate (--step-compute-s), measured once per run
      submitit/                a function submitted through the submitit executor: submitted.pkl (its
                               checkpoint after a pre-timeout stop), rank-<R>.result.pkl (value or traceback)
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.rundir.jsonio import read_json, write_json_atomic

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
TIMELINE_MARKS = "timeline-marks.jsonl"
VERDICT = "verdict.json"
LOGS = "logs"
SRUN_LOG = "srun.log"
STACKS = "stacks"
NCCL_TRACE_PREFIX = "nccl-trace-rank"  # + rank: the NCCL flight recorder's dump (torch names it)
NCCL_PIPE_PREFIX = "nccl-pipe-rank"  # + rank + .pipe: writing to it asks for that dump
CANCEL = "cancel.json"
REPORT_DIR = "report"  # `clusterctl report`'s default output, in the run directory
TRACE = "trace.json"  # `clusterctl trace`'s, beside it (trace-attempt-N.json for one attempt)
BATCH_LOG = "slurm-{job}.out"  # one per job of the run: the batch script's own lines (sbatch --output)
METRICS = "metrics.jsonl"  # per-step records of rank 0: step, loss, step time, tokens/s, validation
RECORD = "record.json"  # the run record's node-side part, per attempt (runrecord.py assembles the rest)
SUBMITIT = "submitit"  # the submitit executor's pickles (integrations/submitit/paths.py names them)
HOSTS = "hosts"  # attempt-N/hosts: the ranks' nodes, one per line in slot order (srun --nodelist reads it)
NODE_REGISTRATIONS = "registrations/node-{slot}"  # attempt-N/: a node leader's node's full registrations (manifest.json's)
CONTROLLER_JSON = "controller.json"  # attempt-N/: the controller's ports, pid, host and shared-fs marker
WARM_LOG = "warm-{job}.log"  # the warm process servers' own lines, one file per job (their children write to the attempt's logs)
RANK_ENV = ".rank.env"  # in a container: the attempt's rank environment, rewritten before each srun, the owner's only
CHECKPOINT_KEY = "checkpoint.key"  # the user's generation-sealing key (checkpoint/trust.py); in the user's state directory too
TOKEN_FILE = ".token"  # attempt-N/: the attempt's secret, the owner's only whatever runs_mode (attempt.json is the group's to read)
NODE_LOG = "node-{slot}.log"  # attempt-N/logs/: one node's ranks, lines labelled by rank (srun's node-%n.log)
AGGREGATOR_LOG = "aggregator-{slot}.log"  # attempt-N/logs/: one node's aggregator
AGGREGATOR_SRUN_LOG = "aggregators-srun.log"  # attempt-N/logs/: srun's own lines about the aggregators' step, off the batch log
DRILL = "drill.json"  # attempt-N/: a fault `clusterctl drill` injected (its culprits are suspects marked as drills)
TRAINER_SUMMARY = "trainer-summary.json"  # attempt-N/: the reference trainer's closing figures
PHASE_TIMES = "phase-times.json"  # attempt-N/: its measured checkpoint saves and load (phasetimes.py), the next attempts' bounds
BUSY_RATE = "busy-rate.json"  # the reference trainer's calibrated busy compute (--step-compute-s), reused by its restarts


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
        try:
            names = os.listdir(self.path)  # status reads a thousand runs: a listing, not a glob
        except OSError:
            return []
        cut = len(ATTEMPT_PREFIX)
        return sorted(int(n[cut:]) for n in names if n.startswith(ATTEMPT_PREFIX) and n[cut:].isdigit())

    @property
    def events_file(self) -> Path:
        """attempts.jsonl (rundir/history.py owns its format)."""
        return self.path / ATTEMPTS

    def read_state(self) -> dict[str, Any]:
        """state.json: what `submit` knew (job id, backend); {} before it is written."""
        return read_json(self.path / STATE) or {}

    def write_state(self, **fields: Any) -> None:
        """Merge fields into state.json atomically (write, fsync, rename)."""
        state = self.read_state()
        state.update(fields)
        write_json_atomic(self.path / STATE, state)


def node_log(attempt_dir: Path, slot: int) -> Path:
    """One node's log of an attempt: `node-%n.log`, %n the node's index in the step (its slot)."""
    return attempt_dir / LOGS / NODE_LOG.format(slot=slot)


def node_registrations(attempt_dir: Path, slot: int) -> Path:
    """The full registrations of a node of several ranks, as its first rank wrote them (registration.encode_node):
    the store carries only their summaries, what the controller judges."""
    return attempt_dir / NODE_REGISTRATIONS.format(slot=slot)


def node_log_slots(attempt_dir: Path) -> list[int]:
    """The slots whose node logs exist in an attempt (whether or not attempt.json names their nodes yet)."""
    head, tail = NODE_LOG.split("{slot}")
    slots = []
    for path in (attempt_dir / LOGS).glob(f"{head}*{tail}"):
        number = path.name[len(head) : len(path.name) - len(tail)]
        if number.isdigit():
            slots.append(int(number))
    return sorted(slots)


def read_hosts(attempt_dir: Path) -> list[str]:
    """attempt-N/hosts: the ranks' nodes in slot order ([] while it is missing)."""
    try:
        return (attempt_dir / HOSTS).read_text().split()
    except OSError:
        return []


def is_run(path: Path) -> bool:
    return (path / STATE).is_file() or (path / RUN_JSON).is_file()


def list_runs(*roots: Path) -> list[RunDir]:
    """The run directories under the runs roots, newest first (by run id's time stamp, then name), each once."""
    entries: dict[str, Path] = {}
    for root in roots:
        try:
            found = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and is_run(p)]
        except OSError:
            continue
        for p in found:
            entries.setdefault(os.path.realpath(p), p)
    return [RunDir(p) for p in sorted(entries.values(), key=_newest_key, reverse=True)]


def runs_named(name: str, runs: list[RunDir]) -> list[RunDir]:
    """The runs of the spec `name` (their ids are `<name>-<stamp>-<hex>`: new_run_id), in the order given."""
    pattern = re.compile(re.escape(name) + r"-\d{8}-\d{6}-[0-9a-f]{4}")
    return [r for r in runs if pattern.fullmatch(r.path.name)]


def _newest_key(path: Path) -> tuple[str, str]:
    stamp = "-".join(path.name.split("-")[-3:-1])  # <name>-YYYYmmdd-HHMMSS-<hex>
    return (stamp if len(stamp) == 15 else "", path.name)


def stack_file(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / STACKS / f"rank-{rank}.txt"
