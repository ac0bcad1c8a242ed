"""The batch script's recovery step: gather the facts, ask runtime/recovery/policy.py, carry it out.

    python -m clusterctl.runtime.recovery.nextattempt begin --run-dir D --nodes N
    python -m clusterctl.runtime.recovery.nextattempt take-over --run-dir D --nodes N --job J
    python -m clusterctl.runtime.recovery.nextattempt after --run-dir D --nodes N --attempt A --code C
                                              [--controller-exit E] [--srun-exit R] [--signal SIG] [--hosts-file F]

Each prints shell assignments (values through shlex.quote) that the batch
script evals: ACTION (run, restart, take-over or exit), NEXT_HOSTS (the next
attempt's nodes), HOSTS (the allocation's, from `begin`), TAKE_OVER and EXIT
(the batch script's own exit status). `begin` runs once per job, before
anything starts on the nodes: it stops a cancelled run, records the end of
an attempt whose batch host died, and picks nodes that avoid the run's
culprits (a requeued job may land on them). `take-over` runs instead in an
elastic run's full-size job (queued when the run shrank:
CLUSTERCTL_TAKES_OVER) once its warm servers are starting: when they have
imported, it asks the shrunk job to save and stop, waits for the hand-over, then picks the nodes
as `begin` does. `after` runs after every attempt: it takes the attempt's code
(the controller's exit, else its verdict.json, else srun's: attempt_code),
records the end and how the run goes on (attempts.jsonl `next`), remembers
culprit nodes as suspects, and carries the decision out: the continuation
job or the requeue is done here, through backends/slurm/batchhost.py (the
batch host's one Slurm client), and the shell only exits. A cancel is
recorded as 89 (CANCELLED) in both, and in verdict.json where the
controller was killed before it could say so itself. One decision folds the
history once; cancel.json alone is asked again just before it is carried
out. Standard library only, besides clusterctl itself: this runs on the
batch host.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from clusterctl import envnames, rundir
from clusterctl.backends.slurm import batchhost
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import PASSTHROUGH, ExitCode, meaning
from clusterctl.rundir import RunDir, history, runjson
from clusterctl.rundir import verdict as verdictfile
from clusterctl.rundir.verdict import FAULT_AMBIGUOUS, Verdict
from clusterctl.runtime.controller.keeper import VerdictKeeper
from clusterctl.runtime.node.warm import client as warmclient
from clusterctl.runtime.recovery.policy import Decision, Ended, Policy, Situation, decide, pick_hosts, place_in_domains
from clusterctl.syntax import hostlist

TAKE_OVER_MARGIN_S = 120.0  # past the save timeout: the shrunk job's recovery step and exit
TAKE_OVER_POLL_S = 0.2
PROGRESS_EVERY_S = 10.0


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


def attempt_code(srun_code: int, controller_exit: int | None, given: Verdict | None) -> tuple[int, str]:
    """The attempt's code and where it came from. The controller's exit decides, 0 included (srun's 137 after a
    cancel is no failure). A controller that went without a code of ours (killed with a warm server's step, say)
    leaves its verdict.json's failing code, else srun's (`srun_code`: the batch script's mapping of srun's exit).
    `controller_exit` None: no controller ran, or an older run directory's batch script decided the code itself."""
    if controller_exit is None:
        return srun_code, ""
    if controller_exit == 0 or controller_exit in PASSTHROUGH:
        return controller_exit, ""
    if given is not None and not given.ok:
        return given.code, f"its verdict.json: the controller exited with {controller_exit}, not a code of ours"
    return srun_code, f"srun: the controller exited with {controller_exit}, not a code of ours"


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
    told = history.read(run, run_json.standalone)
    alloc = allocation(env)
    if who := told.cancel_by:
        history.append(run, history.EVENT_NEXT, attempt=0, job_id=job_id, how=history.NEXT_STOP, exit=int(ExitCode.CANCELLED),
                       cancelled_by=who, reason=f"stopped by {who} before this job started")
        log(f"the run was stopped by {who}: not starting")
        emit(ACTION="exit", EXIT=int(ExitCode.CANCELLED), HOSTS=alloc)
        return 0
    other = env.get(envnames.TAKES_OVER, "")
    if other and other != job_id and ((info := batchhost.job(other)) is None or not info.finished):
        # An elastic run's full-size job while the shrunk one still trains: the batch script starts this job's warm
        # servers, then asks `take-over`, which stops the shrunk job and picks the nodes.
        emit(ACTION="take-over", TAKE_OVER=other, HOSTS=alloc)
        return 0
    return start_here(run, run_json, told, nodes, job_id, alloc, env)


def taking_over(run: RunDir, nodes: int, other: str, env: dict[str, str]) -> int:
    """The `take-over` step: the shrunk job stops and hands the run on (take_over), then this job starts it."""
    run_json = runjson.read(run.path) or runjson.RunJson()
    job_id = env.get("SLURM_JOB_ID", "")
    alloc = allocation(env)
    told = take_over(run, run_json, other, env)
    if who := told.cancel_by:
        log(f"the run was stopped by {who} meanwhile: not starting")
        emit(ACTION="exit", EXIT=int(ExitCode.CANCELLED))
        return 0
    if told.stopped:
        log(f"the run stopped in job {other} meanwhile ({told.reason}): nothing to grow into")
        emit(ACTION="exit", EXIT=0)
        return 0
    return start_here(run, run_json, told, nodes, job_id, alloc, env)


def start_here(run: RunDir, run_json: runjson.RunJson, told: history.History, nodes: int, job_id: str,
               alloc: list[str], env: dict[str, str]) -> int:
    """The first attempt of this job: an attempt whose batch host died is recorded, and the nodes avoid the run's
    culprits (a requeued or continued job may land on them)."""
    _close_open_attempt(run, told, job_id)
    exclude = avoided_now(run, run_json, told)
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
        return _carry_out(run, Decision("continue", 0, 0, why, exclude=exclude), Ended(0), 0, job_id, env, None,
                          HOSTS=alloc)
    hosts, replaced = picked if picked else (alloc[:nodes], {})
    if replaced:
        log("avoiding " + ", ".join(f"{a} (spare {b} takes its place)" for a, b in replaced.items()))
    emit(ACTION="run", NEXT_HOSTS=hosts, HOSTS=alloc)
    return 0


def avoided_now(run: RunDir, run_json: runjson.RunJson, told: history.History) -> list[str]:
    """The nodes the run avoids, less those cleared since it began to avoid them: a node repaired and cleared may
    take its place again, in this job or the next."""
    try:
        from clusterctl.rundir import suspects

        back = suspects.forgiven(run.path.parent, told.excluded_since) - set(run_json.exclude)
    except Exception as exc:  # noqa: BLE001 - a suspects file that cannot be read forgives nothing
        log(f"warning: could not read the suspects file: {exc}")
        back = set()
    if back:
        log(f"{', '.join(sorted(back))} cleared since the run began to avoid it: usable again")
    return told.avoided(run_json.exclude, back)


def _close_open_attempt(run: RunDir, told: history.History, job_id: str) -> None:
    """An attempt that started and never ended lost its batch host (or its job was killed hard): say so."""
    for old in told.open_attempts():
        slurm = batchhost.job(old.job_id) if old.job_id and old.job_id != job_id else None
        said = f" (Slurm: {slurm.state}{f', reason {slurm.reason}' if slurm.reason else ''})" if slurm is not None else ""
        history.append(
            run, history.EVENT_END, attempt=old.number, job_id=old.job_id, exit=None, recorded_by=job_id,
            slurm_state=slurm.state if slurm else None, slurm_reason=(slurm.reason or None) if slurm else None,
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
    code, source = attempt_code(args.code, args.controller_exit, given)
    if args.controller_exit is not None:  # the batch script leaves the attempt's last line to this step
        log(f"attempt {args.attempt} ended: srun exit {args.srun_exit}, exit {code}" + (f" (from {source})" if source else ""))
    failure = given if given is not None and not given.ok else None
    ended = ended_from(code, failure, committed_step(run, run_json))
    told = history.read(run, run_json.standalone)  # the one fold of the history this decision reads
    back = drilled_before(run, told, ended) - set(run_json.exclude)  # in this allocation as in the next job
    end = batchhost.ending(job_id, batchhost.restart_count(env)) if args.signal and job_id else "running"
    situation = Situation(
        job_id, tuple(allocation(env)), tuple(read_hosts(args.hosts_file)), args.nodes, told.faults,
        tuple(h for h in avoided_now(run, run_json, told) if h not in back), end, told.cancel_by,
        runjson.host_domains(run_json), () if told.unelastic else tuple(w.nodes for w in run_json.elastic.widths),
        group_nodes(run_json),
    )
    decision = unless_cancelled(run, decide(ended, situation, Policy.from_run(run_json)))
    said = ended.reason
    if decision.cancelled_by and (recorded := record_cancel(run.attempt(args.attempt), given, decision.cancelled_by)):
        said = recorded.message
    history.append(run, history.EVENT_END, attempt=args.attempt, job_id=job_id, exit=decision.record_code, srun_exit=args.srun_exit,
                     committed_step=ended.committed_step, **({"verdict": said} if said else {}))
    if decision.record_code != code:  # the attempt's "exit C" above is not what the run's history says
        log(f"attempt {args.attempt} is recorded as exit {decision.record_code} ({meaning(decision.record_code)})")
    vindicate(run, read_hosts(args.hosts_file), args.attempt, decision.record_code)
    width = width_change(run_json, *decision.shrunk) if decision.shrunk else None
    return _carry_out(run, decision, ended, args.attempt, job_id, env, args.signal, failure, width=width,
                      grow_job=pending_grow(told))


def pending_grow(told: history.History) -> str:
    """The elastic run's full-size job that is queued and has not begun, "" when none (or Slurm has ended it)."""
    if not told.grow_job:
        return ""
    info = batchhost.job(told.grow_job)
    return "" if info is not None and info.finished else told.grow_job


def group_nodes(run_json: runjson.RunJson) -> int:
    """Nodes one model-parallel group (tp*cp*pp ranks) spans: a shrink keeps each in one NVLink domain."""
    p = run_json.parallel
    return max(1, -(-(p.tp * p.cp * p.pp) // max(1, run_json.gpus_per_node)))


def width_change(run_json: runjson.RunJson, before: int, after: int) -> dict[str, Any]:
    """An elastic shrink as attempts.jsonl records it: nodes, dp and the batch arithmetic, before and after."""
    try:
        old, new = run_json.at_width(before), run_json.at_width(after)
    except ValueError as exc:  # a width the plan lacks: the batch script's ranks would refuse it too
        return {"nodes": [before, after], "error": str(exc)}
    return {"nodes": [old.nodes, new.nodes], "world_size": [old.world_size, new.world_size],
            "dp": [old.parallel.dp, new.parallel.dp], "grad_accum": [old.batch.grad_accum, new.batch.grad_accum],
            "global_batch": [old.batch.global_, new.batch.global_], "micro": new.batch.micro, "batch": run_json.elastic.batch}


def record_cancel(attempt_dir: Path, given: Verdict | None, who: str) -> Verdict | None:
    """The cancel's verdict in verdict.json where the controller could not give it (killed before it could, or a
    cancel that came after it named Slurm's stop), so that verdict and history agree; never over one naming culprits."""
    if given is not None and (given.code == ExitCode.CANCELLED or (not given.ok and given.culprits)):
        return None
    if not attempt_dir.is_dir():
        return None
    return VerdictKeeper(attempt_dir, log).give(verdictfile.stopped_from_outside("cancelled", who))


def unless_cancelled(run: RunDir, d: Decision) -> Decision:
    """A cancel that came while this step decided stops the run instead of a continuation: recorded as one (89).
    Asked of cancel.json alone: the history was read once, for the decision."""
    who = history.cancel_asked_by(run) if d.action == "continue" else ""
    if who:
        d.action, d.reason, d.cancelled_by = "stop", f"stopped: by {who}", who
        d.exit_code = d.record_code = int(ExitCode.CANCELLED)
    return d


def _carry_out(run: RunDir, d: Decision, ended: Ended, attempt: int, job_id: str, env: dict[str, str], signal: str | None,
               failure: Verdict | None = None, width: dict[str, Any] | None = None, grow_job: str = "",
               **shell: Any) -> int:
    """Record how the run goes on and do it, the one place that does (a restart in the allocation, a continuation
    job, a requeue, the end); `failure` is the ended attempt's failing verdict (its culprits' evidence), `width` an
    elastic shrink's change (width_change), `grow_job` an elastic run's queued full-size job (pending_grow): the
    continuation where the run leaves this job, withdrawn where it stops; `shell` more assignments for the batch script."""
    d = unless_cancelled(run, d)  # once more just before submitting: the cancel may have come meanwhile
    common: dict[str, Any] = {
        "attempt": attempt, "job_id": job_id, "exit": d.record_code, "reason": d.reason, "exclude": d.exclude,
        "counted": d.counted, "culprit_hosts": list(ended.culprit_hosts), "committed_step": ended.committed_step,
        "culprit_ranks": list(ended.culprit_ranks), "fault": ended.fault, "signature": ended.signature,
        **({"cancelled_by": d.cancelled_by} if d.cancelled_by else {}),
        **({"width": width} if width else {}),
        **({"unelastic": True} if d.unelastic else {}),
    }
    remember(run, d, ended, attempt, failure)
    log(d.reason)
    if d.action == "restart":
        if d.shrunk and job_id:
            released, variables = release_lost(job_id, d, env)
            common.update({"released": released} if released else {})
            shell.update(variables)
        history.append(run, history.EVENT_NEXT, how=history.NEXT_ALLOCATION, hosts=d.hosts, replaced=d.replaced, **common)
        if d.grow and not grow_job:
            queue_grow(run, d, attempt, job_id, env)
        emit(ACTION="restart", NEXT_HOSTS=d.hosts, EXIT=d.exit_code, **shell)
        return 0
    if d.action == "continue" and grow_job:  # the full-size job queued at the shrink is the continuation
        history.append(run, history.EVENT_NEXT, how=history.NEXT_CONTINUATION, next_job=grow_job, **common)
        log(f"job {grow_job}, queued at full size when the run shrank, continues the run")
        emit(ACTION="exit", EXIT=d.exit_code, **shell)
        return 0
    if grow_job:  # the run stops, or goes on in this job again (a requeue): nothing to grow into
        batchhost.cancel(grow_job, env)
        common["grow_withdrawn"] = grow_job
        log(f"job {grow_job}, queued at full size when the run shrank, withdrawn")
    if d.action in ("continue", "requeue"):
        try:
            if d.action == "continue":
                next_job = batchhost.submit_after(run.sbatch, job_id, d.exclude, env)
            else:
                log(f"requeueing job {job_id}" + (f" without {hostlist.compress(d.exclude)}" if d.exclude else ""))
                if warning := batchhost.requeue_self(job_id, d.exclude):
                    log(f"warning: {warning}")
        except ClusterctlError as exc:
            reason = f"{d.reason}, but the {'continuation could not be submitted' if d.action == 'continue' else 'requeue failed'}: {exc}"
            log(reason)
            history.append(run, history.EVENT_NEXT, how=history.NEXT_STOP, **{**common, "reason": reason})
            emit(ACTION="exit", EXIT=d.record_code or int(ExitCode.BACKEND_UNAVAILABLE), **shell)
            return 0
        if d.action == "requeue":
            history.append(run, history.EVENT_NEXT, how=history.NEXT_REQUEUE, **common)
            emit(ACTION="exit", EXIT=d.exit_code, **shell)
            return 0
        history.append(run, history.EVENT_NEXT, how=history.NEXT_CONTINUATION, next_job=next_job, **common)
        log(f"continuation job {next_job} submitted (after this job ends)")
        if signal and batchhost.ending(job_id, batchhost.restart_count(env)) == "requeued":  # a preemption's requeue came meanwhile
            _withdraw(run, next_job, env, common)
        emit(ACTION="exit", EXIT=d.exit_code, **shell)
        return 0
    history.append(run, history.EVENT_NEXT, how=history.NEXT_SLURM if d.action == "slurm" else history.NEXT_STOP, **common)
    emit(ACTION="exit", EXIT=d.exit_code, **shell)
    return 0


def release_lost(job_id: str, d: Decision, env: dict[str, str]) -> tuple[list[str], dict[str, Any]]:
    """An elastic shrink gives the nodes it leaves (the avoided ones) back to Slurm (batchhost.release): an admin can
    repair them, and once cleared the run's full-size job can have them. The nodes given back, and the batch
    script's Slurm node variables for what the job keeps (the next decisions read its allocation there)."""
    alloc = allocation(env)
    gone = [h for h in alloc if h not in d.hosts and h in d.exclude]
    if not gone:
        return [], {}
    keep = [h for h in alloc if h not in gone]
    why, variables = batchhost.release(job_id, keep, env)
    if why:
        log(f"warning: could not give {hostlist.compress(gone)} back to Slurm ({why}): they stay in this job, unused")
        return [], {}
    log(f"gave {hostlist.compress(gone)} back to Slurm: this job keeps {hostlist.compress(keep)}")
    return gone, variables


def queue_grow(run: RunDir, d: Decision, attempt: int, job_id: str, env: dict[str, str]) -> None:
    """elastic.grow: the run's full-size job, queued now without the avoided nodes; when Slurm starts it, its
    `begin` asks this job to save and stop and takes over (take_over). A refusal leaves the run shrunk, recorded
    (a grow event with `refused`) so that a clear of a node it avoids queues it (actions/forgive.py)."""
    try:
        grow_job = batchhost.submit_after(run.sbatch, "", d.exclude, env, {envnames.TAKES_OVER: job_id})
    except ClusterctlError as exc:
        history.append(run, history.EVENT_GROW, attempt=attempt, job_id=job_id, next_job="", exclude=d.exclude,
                       refused=str(exc), reason=f"shrunk to {len(d.hosts)} nodes: the full-size job could not be queued")
        log(f"warning: the full-size job to grow back into could not be queued ({exc}): the run goes on shrunk,"
            " and queues it if a node it avoids is cleared (clusterctl suspects --clear)")
        return
    history.append(run, history.EVENT_GROW, attempt=attempt, job_id=job_id, next_job=grow_job, exclude=d.exclude,
                   reason=f"shrunk to {len(d.hosts)} nodes: job {grow_job} queued at full size, to take over when it starts")
    log(f"job {grow_job} queued at full size: the run grows back into it when Slurm starts it")


def take_over(run: RunDir, run_json: runjson.RunJson, other: str, env: dict[str, str]) -> history.History:
    """This job is an elastic run's full-size job, queued by job `other` when the run shrank there: once this job's
    warm servers have imported (the batch host's answers for them: they start together), ask that job's
    batch shell to stop (the pre-timeout signal: its ranks save, commit and exit 85; between two attempts the
    next one stops at its first step) and wait until its recovery step has handed the run on, so that this job
    resumes at the committed step + 1. Past the save timeout the other job is cancelled and this one resumes from
    what is committed. The history read afterwards."""
    info = batchhost.job(other)
    if info is not None and info.finished:
        log(f"growing back: job {other}, where the run shrank, has ended ({info.state})")
        return history.read(run, run_json.standalone)
    if env.get(envnames.WARM):  # the shrunk job trains on meanwhile: the pause is not spent importing
        log(f"growing back: job {other}, where the run shrank, trains on while this job's warm servers import")
        began = time.monotonic()
        if why := warmclient.wait_ready():
            log(f"warning: {why}: taking over anyway")
        else:
            log(f"this job's warm servers are ready ({time.monotonic() - began:.1f} s)")
    why = batchhost.signal_batch(other, run_json.signal.name, env)
    if why:
        log(f"warning: could not ask job {other} to stop ({why}): waiting for it anyway")
    log(f"growing back: asked job {other}, where the run shrank, to save and stop")
    began = time.monotonic()
    limit = float(run_json.watchdog.save_timeout) + TAKE_OVER_MARGIN_S
    shown = 0.0
    while True:
        told = history.read(run, run_json.standalone)
        waited = time.monotonic() - began
        if told.position in (history.CONTINUED, history.STOPPED):  # its recovery step handed the run on
            log(f"job {other} stopped in {waited:.1f} s (committed step {told.committed_step})")
            return told
        info = batchhost.job(other)
        if info is not None and info.finished:
            log(f"job {other} ended ({info.state}) after {waited:.1f} s without handing the run on")
            return told
        if waited > limit:
            log(f"job {other} did not stop within {limit:.0f} s: cancelling it; resuming from the committed checkpoint")
            batchhost.cancel(other, env)
            return told
        if waited - shown >= PROGRESS_EVERY_S:
            log(f"waiting for job {other} to save and stop ({waited:.0f} s)")
            shown = waited
        time.sleep(TAKE_OVER_POLL_S)


def _withdraw(run: RunDir, next_job: str, env: dict[str, str], common: dict[str, Any]) -> None:
    """Slurm requeued this job while the continuation was being submitted: one job per run, so cancel ours."""
    batchhost.cancel(next_job, env)
    history.append(run, history.EVENT_NEXT, how=history.NEXT_SLURM, **{**common, "reason": f"Slurm requeued the job: continuation {next_job} withdrawn"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusterctl.runtime.recovery.nextattempt")
    parser.add_argument("step", choices=["begin", "take-over", "after"])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--code", type=int, default=0, help="the attempt's code as the batch script has it (from srun's exit)")
    parser.add_argument("--controller-exit", type=int, default=None, help="the controller's exit status, which decides")
    parser.add_argument("--srun-exit", type=int, default=None)
    parser.add_argument("--signal", default="")
    parser.add_argument("--hosts-file", default=None)
    parser.add_argument("--job", default="", help="take-over: the job where the run shrank")
    args = parser.parse_args(argv)
    run = RunDir(Path(args.run_dir))
    env = dict(os.environ)
    if args.step == "begin":
        return begin(run, args.nodes, env)
    if args.step == "take-over":
        return taking_over(run, args.nodes, args.job, env)
    return after(run, args, env)


if __name__ == "__main__":
    sys.exit(main())
