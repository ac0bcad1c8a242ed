"""The batch script's recovery step: gather the facts, ask runtime/recovery/policy.py, carry it out.

    python -m clusterctl.runtime.recovery.nextattempt begin --run-dir D --nodes N
    python -m clusterctl.runtime.recovery.nextattempt after --run-dir D --nodes N --attempt A --code C
                                              [--srun-exit R] [--signal SIG] [--hosts-file F]

Both print shell assignments (values through shlex.quote) that the batch
script evals: ACTION (run, restart, requeue or exit), NEXT_HOSTS (the next attempt's nodes)
and EXIT (the batch script's own exit status). `begin` runs once per job,
before its first attempt: it stops a cancelled run, records the end of an
attempt whose batch host died, and picks nodes that avoid the run's culprits
(a requeued job may land on them). `after` runs after every attempt: it
records the end and how the run goes on (attempts.jsonl `next`), remembers
culprit nodes as suspects, and submits the continuation job or requeues.
A cancel is recorded as 89 (CANCELLED) in both, and in verdict.json where
the controller was killed before it could say so itself.
Standard library only, besides clusterctl itself: this runs on the batch host.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clusterctl import rundir
from clusterctl.exitcodes import ExitCode, meaning
from clusterctl.rundir import RunDir, history, runjson
from clusterctl.rundir import verdict as verdictfile
from clusterctl.rundir.verdict import FAULT_AMBIGUOUS, Verdict
from clusterctl.runtime.controller.keeper import VerdictKeeper
from clusterctl.runtime.recovery.policy import (
    Decision,
    Ended,
    Policy,
    Situation,
    SlurmEnd,
    decide,
    pick_hosts,
    place_in_domains,
)
from clusterctl.syntax import hostlist

SLURM_TIMEOUT_S = 20.0  # one sbatch / scontrol call
JOB_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_")
KEEP_ENV = ("SLURM_CONF",)  # the site's configuration, not the job's


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} clusterctl: {message}", file=sys.stderr, flush=True)


# --- facts -------------------------------------------------------------------------
def committed_step(run: RunDir, run_json: runjson.RunJson) -> int | None:
    try:
        from clusterctl.checkpoint.generations import latest_committed

        found = latest_committed(run_json.checkpoint_dir(run.path))
    except Exception:  # noqa: BLE001 - an unreadable directory is "no checkpoint" here, never a crash
        return None
    return found.step if found else None


def slurm_job(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as key=value pairs ({} when it fails)."""
    try:
        proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", proc.stdout)) if proc.returncode == 0 else {}


def slurm_end(job_id: str, signalled: bool, env: dict[str, str]) -> SlurmEnd:
    """How Slurm is ending the job. A requeue (preemption with PreemptMode=REQUEUE, scontrol requeue)
    has already raised Restarts past this run's SLURM_RESTART_COUNT; a scancel leaves it and shows
    COMPLETING (measured on Slurm 22.05); a signal while still RUNNING is the pre-timeout signal or a
    preemption's warning."""
    if not signalled or not job_id:
        return "running"
    job = slurm_job(job_id)
    if not job:
        return "running"
    with contextlib.suppress(ValueError):
        if int(job.get("Restarts", "0")) > int(env.get("SLURM_RESTART_COUNT") or 0):
            return "requeued"
    state = job.get("JobState", "")
    if state == "PREEMPTED":
        return "preempted"
    if state == "TIMEOUT" or job.get("Reason") == "TimeLimit":
        return "timeout"
    if state in ("COMPLETING", "CANCELLED"):
        return "cancelled"
    return "running"


# Slurm's own stops from outside (slurm_end): no cancel, the run goes on (the controller's words for them).
SLURM_STOPS: dict[str, str] = {
    "timeout": "Slurm stopped the job at its time limit",
    "preempted": "Slurm preempted the job",
    "requeued": "Slurm requeued the job",
    "running": "the job was stopped from outside while Slurm still runs it (a preemption's warning, say)",
}


def cancel_verdict(who: str, when: str = "") -> Verdict:
    """The verdict of an attempt a cancel stopped: 89, no culprit. The controller gives it; this step records it
    where the controller was killed first (a warm process server's step ends with the job and takes it along)."""
    return Verdict(False, int(ExitCode.CANCELLED),
                   f"cancelled by {who or history.SCANCEL}: the job was stopped from outside{when}; no node is blamed")


def cancelled_by(run: RunDir) -> str:
    """Who asked the whole run to stop (cancel.json, written by `clusterctl cancel` and held by `requeue`), or ""."""
    asked = history.read(run).cancel_asked
    return str(asked.get("by") or "clusterctl cancel") if asked is not None else ""


def allocation(env: dict[str, str]) -> list[str]:
    try:
        return hostlist.expand(env.get("SLURM_JOB_NODELIST", ""))
    except Exception:  # noqa: BLE001
        return []


def read_hosts(path: str | None) -> list[str]:
    if not path:
        return []
    try:
        return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    except OSError:
        return []


# --- carrying it out ---------------------------------------------------------------------
def clean_env(env: dict[str, str]) -> dict[str, str]:
    """The job's own SLURM_*/SBATCH_* variables would leak into the new job (its node list, its id)."""
    return {k: v for k, v in env.items() if k in KEEP_ENV or not k.startswith(JOB_ENV_PREFIXES)}


def submit_continuation(run: RunDir, job_id: str, exclude: list[str], env: dict[str, str]) -> str:
    """The next job of the run, submitted from this job's own working directory (the user's submit directory,
    or its --chdir), which sbatch hands on: the ranks' relative paths mean what they meant in the first job."""
    argv = ["sbatch", "--parsable", f"--dependency=afterany:{job_id}"]
    if exclude:
        argv.append(f"--exclude={hostlist.compress(exclude)}")
    argv.append(str(run.sbatch))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, check=False, env=clean_env(env),
                          cwd=os.getcwd())
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed: {(proc.stderr or proc.stdout).strip() or proc.returncode}")
    return proc.stdout.strip().split(";")[0]


def drilled_before(run: RunDir, told: history.History, ended: Ended) -> set[str]:
    """Nodes that only earlier attempts' `clusterctl drill` faults blamed (attempt-N/drill.json) since the run's
    last requeue by hand: healthy by construction. This attempt's culprits stay out of the next attempt, as the
    real fault's would (the drill rehearses that restart); an earlier drill's come back, as a spare of the
    allocation or in the next job, or a run drilled again and again would run out of nodes that nothing is
    wrong with (and a soak of drills would measure the queue instead of the restart)."""
    from clusterctl.rundir import layout

    drilled: set[str] = set()
    real: set[str] = set()
    for fault in told.faults:  # the faults that excluded nodes: the counted ones
        (drilled if (run.attempt(fault.attempt) / layout.DRILL).exists() else real).update(fault.hosts)
    return drilled - real - set(ended.culprit_hosts)


def remember(run: RunDir, decision: Decision, ended: Ended, attempt: int, given: Verdict | None) -> None:
    """Culprit nodes become suspects of the runs root (excluded by later submissions for a while).

    A fault `clusterctl drill` injected (attempt-N/drill.json) is marked so: listed, not avoided
    by default, and never handed to the site's drain hook.
    """
    if not decision.newly_excluded:
        return
    try:
        from clusterctl.rundir import layout, suspects

        drill = (run.attempt(attempt) / layout.DRILL).exists()
        drain = None if drill else _site_drain(run)
        evidence = evidence_by_node(given, ended)
        found = [suspects.Suspect(h, ended.reason or f"exit {ended.code}", ended.code, run.path.name, time.time(), drill,
                                  evidence.get(h, ""))
                 for h in decision.newly_excluded]
        for line in suspects.record(run.path.parent, found, drain):
            log(line)
    except Exception as exc:  # noqa: BLE001 - remembering suspects must never stop the run going on
        log(f"warning: could not record suspect nodes {', '.join(decision.newly_excluded)}: {exc}")


def evidence_by_node(given: Verdict | None, ended: Ended) -> dict[str, str]:
    """What pointed at each culprit node: its first culprit's evidence word, or `repeated` where the node was blamed
    for failing again (an ambiguous failure that followed it, a second 84 on node evidence: recovery.blamed)."""
    again = ended.fault == FAULT_AMBIGUOUS or ended.code == ExitCode.SCRIPT_FAILED
    found: dict[str, str] = {}
    for c in given.culprits if given is not None else []:
        host = c.get("host")
        if isinstance(host, str) and host not in found:
            found[host] = "repeated" if again else str(c.get("evidence") or "")
    return found


def vindicate(run: RunDir, hosts: list[str], attempt: int, code: int) -> None:
    """An attempt that ended well (0, or 85 with its checkpoint) on a suspect node is that node's evidence of health:
    its blames are forgiven, so later submissions may use it again. Drill blames are left (never avoided anyway)."""
    if code not in (ExitCode.OK, ExitCode.PRE_TIMEOUT) or not hosts:
        return
    try:
        from clusterctl.rundir import suspects

        root = run.path.parent
        healthy = [h for h, rec in suspects.nodes(root).items() if h in hosts and rec.cleared is None and not rec.latest.drill]
        if healthy:
            suspects.clear(root, healthy, by=f"run {run.path.name} attempt {attempt} ran on it and ended with exit {code}")
            log(f"suspect {', '.join(healthy)} cleared: attempt {attempt} ran on it and ended with exit {code}")
    except Exception as exc:  # noqa: BLE001 - forgiving suspects must never stop the run going on
        log(f"warning: could not clear suspect nodes {', '.join(hosts)}: {exc}")


def _site_drain(run: RunDir) -> list[str] | None:
    try:
        import yaml

        site = yaml.safe_load((run.path / rundir.SITE).read_text()) or {}
    except Exception:  # noqa: BLE001
        return None
    drain = (site.get("reliability") or {}).get("drain_command")
    return [str(a) for a in drain] if isinstance(drain, list) else None


def emit(**values: Any) -> None:
    """Shell assignments for the batch script's eval: arrays for lists, everything quoted."""
    for key, value in values.items():
        if isinstance(value, (list, tuple)):
            print(f"{key}=({' '.join(shlex.quote(str(v)) for v in value)})")
        else:
            print(f"{key}={shlex.quote(str(value))}")


def begin(run: RunDir, nodes: int, env: dict[str, str]) -> int:
    run_json = runjson.read(run.path) or runjson.RunJson()
    job_id = env.get("SLURM_JOB_ID", "")
    told = history.read(run)
    who = str(told.cancel_asked.get("by") or "clusterctl cancel") if told.cancel_asked is not None else ""
    if who:
        history.append(run, history.EVENT_NEXT, attempt=0, job_id=job_id, how=history.NEXT_STOP, exit=int(ExitCode.CANCELLED),
                       cancelled_by=who, reason=f"stopped by {who} before this job started")
        log(f"the run was stopped by {who}: not starting")
        emit(ACTION="exit", EXIT=int(ExitCode.CANCELLED))
        return 0
    _close_open_attempt(run, told, job_id)
    exclude = told.avoided(run_json.exclude)
    alloc = allocation(env)
    domain = runjson.host_domains(run_json)
    first = alloc[:nodes]
    if domain and run_json.segment_nodes and alloc:
        placed = place_in_domains(tuple(alloc), nodes, domain, run_json.segment_nodes, run_json.segment_spares)
        if placed is None:
            log(f"the allocation does not hold whole segments of {run_json.segment_nodes} nodes in its blocks:"
                f" ranks go on its first {nodes} nodes, and a group that spans two NVLink domains is refused at start")
        first = placed or first
    picked = pick_hosts(tuple(first), tuple(alloc), set(exclude), nodes, domain) if alloc else None
    if picked is None and alloc:
        bad = sorted(set(alloc) & set(exclude))
        why = f"this job's nodes include {', '.join(bad)}, which the run avoids, and too few spares are left"
        return _carry_out(run, Decision("continue", 0, 0, why, exclude=exclude), Ended(0), 0, job_id, env, None)
    hosts, replaced = picked if picked else (alloc[:nodes], {})
    if replaced:
        log("avoiding " + ", ".join(f"{a} (spare {b} takes its place)" for a, b in replaced.items()))
    emit(ACTION="run", NEXT_HOSTS=hosts)
    return 0


def _close_open_attempt(run: RunDir, told: history.History, job_id: str) -> None:
    """An attempt that started and never ended lost its batch host (or its job was killed hard): say so."""
    for old in told.open_attempts():
        slurm = slurm_job(old.job_id) if old.job_id and old.job_id != job_id else {}
        said = f" (Slurm: {slurm.get('JobState')}, reason {slurm.get('Reason')})" if slurm.get("JobState") else ""
        history.append(
            run, history.EVENT_END, attempt=old.number, job_id=old.job_id, exit=None, recorded_by=job_id,
            slurm_state=slurm.get("JobState"), slurm_reason=slurm.get("Reason"),
            reason=f"no end was recorded: the batch script of job {old.job_id or '?'} died with it{said}"
            " (its node lost, or the job killed without warning)",
        )


def ended_from(code: int, failure: Verdict | None, step: int | None) -> Ended:
    """The ended attempt as the policy reads it: its code, and its failing verdict's culprits and fault."""
    if failure is None:
        return Ended(code, (), step)
    ranks = tuple(c["rank"] for c in failure.culprits if isinstance(c.get("rank"), int) and not isinstance(c["rank"], bool))
    return Ended(code, tuple(failure.culprit_hosts()), step, failure.message, failure.fault, ranks,
                 str(failure.evidence.get("signature") or ""))


def after(run: RunDir, args: argparse.Namespace, env: dict[str, str]) -> int:
    run_json = runjson.read(run.path) or runjson.RunJson()
    job_id = env.get("SLURM_JOB_ID", "")
    given = verdictfile.read(run.attempt(args.attempt))
    failure = given if given is not None and not given.ok else None
    ended = ended_from(args.code, failure, committed_step(run, run_json))
    told = history.read(run)
    back = drilled_before(run, told, ended) - set(run_json.exclude)  # in this allocation as in the next job
    situation = Situation(
        job_id, tuple(allocation(env)), tuple(read_hosts(args.hosts_file)), args.nodes, told.faults,
        tuple(h for h in told.avoided(run_json.exclude) if h not in back), slurm_end(job_id, bool(args.signal), env),
        cancelled_by(run), runjson.host_domains(run_json),
    )
    decision = unless_cancelled(run, decide(ended, situation, Policy.from_run(run_json)))
    said = ended.reason
    if decision.cancelled_by and (recorded := record_cancel(run.attempt(args.attempt), given, decision.cancelled_by)):
        said = recorded.message
    history.append(run, history.EVENT_END, attempt=args.attempt, job_id=job_id, exit=decision.record_code, srun_exit=args.srun_exit,
                     committed_step=ended.committed_step, **({"verdict": said} if said else {}))
    if decision.record_code != args.code:  # the batch log's "exit C" above is not what the run's history says
        log(f"attempt {args.attempt} is recorded as exit {decision.record_code} ({meaning(decision.record_code)})")
    vindicate(run, read_hosts(args.hosts_file), args.attempt, decision.record_code)
    return _carry_out(run, decision, ended, args.attempt, job_id, env, args.signal, failure)


def record_cancel(attempt_dir: Path, given: Verdict | None, who: str) -> Verdict | None:
    """The cancel's verdict in verdict.json where the controller could not give it (killed before it could, or a
    cancel that came after it named Slurm's stop), so that verdict and history agree; never over one naming culprits."""
    if given is not None and (given.code == ExitCode.CANCELLED or (not given.ok and given.culprits)):
        return None
    if not attempt_dir.is_dir():
        return None
    return VerdictKeeper(attempt_dir, log).give(cancel_verdict(who))


def unless_cancelled(run: RunDir, d: Decision) -> Decision:
    """A cancel that came while this step decided stops the run instead of a continuation: recorded as one (89)."""
    who = cancelled_by(run) if d.action == "continue" else ""
    if who:
        d.action, d.reason, d.cancelled_by = "stop", f"stopped: by {who}", who
        d.exit_code = d.record_code = int(ExitCode.CANCELLED)
    return d


def _carry_out(run: RunDir, d: Decision, ended: Ended, attempt: int, job_id: str, env: dict[str, str], signal: str | None,
               failure: Verdict | None = None) -> int:
    """Record how the run goes on and do it; `failure` is the ended attempt's failing verdict (its culprits' evidence)."""
    d = unless_cancelled(run, d)  # once more just before submitting: the cancel may have come meanwhile
    common: dict[str, Any] = {
        "attempt": attempt, "job_id": job_id, "exit": d.record_code, "reason": d.reason, "exclude": d.exclude,
        "counted": d.counted, "culprit_hosts": list(ended.culprit_hosts), "committed_step": ended.committed_step,
        "culprit_ranks": list(ended.culprit_ranks), "fault": ended.fault, "signature": ended.signature,
        **({"cancelled_by": d.cancelled_by} if d.cancelled_by else {}),
    }
    remember(run, d, ended, attempt, failure)
    log(d.reason)
    if d.action == "restart":
        history.append(run, history.EVENT_NEXT, how=history.NEXT_ALLOCATION, hosts=d.hosts, replaced=d.replaced, **common)
        emit(ACTION="restart", NEXT_HOSTS=d.hosts, EXIT=d.exit_code)
        return 0
    if d.action == "continue":
        try:
            next_job = submit_continuation(run, job_id, d.exclude, env)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            reason = f"{d.reason}, but the continuation could not be submitted: {exc}"
            log(reason)
            history.append(run, history.EVENT_NEXT, how=history.NEXT_STOP, **{**common, "reason": reason})
            emit(ACTION="exit", EXIT=d.record_code or int(ExitCode.BACKEND_UNAVAILABLE))
            return 0
        history.append(run, history.EVENT_NEXT, how=history.NEXT_CONTINUATION, next_job=next_job, **common)
        log(f"continuation job {next_job} submitted (after this job ends)")
        if signal and slurm_end(job_id, True, env) == "requeued":  # a preemption's requeue came meanwhile
            _withdraw(run, next_job, env, common)
        emit(ACTION="exit", EXIT=d.exit_code)
        return 0
    if d.action == "requeue":
        history.append(run, history.EVENT_NEXT, how=history.NEXT_REQUEUE, **common)
        emit(ACTION="requeue", EXIT=d.exit_code)
        return 0
    history.append(run, history.EVENT_NEXT, how=history.NEXT_SLURM if d.action == "slurm" else history.NEXT_STOP, **common)
    emit(ACTION="exit", EXIT=d.exit_code)
    return 0


def _withdraw(run: RunDir, next_job: str, env: dict[str, str], common: dict[str, Any]) -> None:
    """Slurm requeued this job while the continuation was being submitted: one job per run, so cancel ours."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["scancel", next_job], env=clean_env(env), capture_output=True, timeout=SLURM_TIMEOUT_S, check=False)
    history.append(run, history.EVENT_NEXT, how=history.NEXT_SLURM, **{**common, "reason": f"Slurm requeued the job: continuation {next_job} withdrawn"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusterctl.runtime.recovery.nextattempt")
    parser.add_argument("step", choices=["begin", "after"])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--code", type=int, default=0)
    parser.add_argument("--srun-exit", type=int, default=None)
    parser.add_argument("--signal", default="")
    parser.add_argument("--hosts-file", default=None)
    args = parser.parse_args(argv)
    run = RunDir(Path(args.run_dir))
    env = dict(os.environ)
    if args.step == "begin":
        return begin(run, args.nodes, env)
    return after(run, args, env)


if __name__ == "__main__":
    sys.exit(main())
