"""A fault drill: inject a real fault into a running job and check that it is detected.

The fault comes from outside, with real signals (clusterctl.qualify.faultsignal
run on the rank's node: qualify/injector.py); the program under test knows
nothing of the drill.
The drill then waits for the attempt's verdict and says whether the fault
was detected with the expected code, whether the right rank (or node) was
blamed, and how long detection took.

`clusterctl drill` (cli/drill_cmd.py) parses its options and prints the
report; the qualification ladder (qualify/jobs.py) calls `run_drill` in its
helper thread while the job it drills runs. Nothing here prints: progress
goes to `show`, warnings to `warn`.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from clusterctl import rundir
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.qualify.injector import Background, Injector, InjectorFailed, last_json
from clusterctl.rundir import RunDir, attemptjson, history, jobid, rankmanifest, runjson, timeline
from clusterctl.rundir import verdict as verdicts
from clusterctl.rundir.attemptjson import AttemptJson
from clusterctl.rundir.jsonio import write_json_atomic
from clusterctl.rundir.verdict import Verdict
from clusterctl.runtime.controller.response import DUMP_WAIT_S
from clusterctl.runtime.controller.watchdog import WARMUP_STEPS
from clusterctl.syntax.cpulist import format_cpulist

EXPECTED = {
    "hang": ExitCode.HANG,
    "slow": ExitCode.STRAGGLER,
    "kill": ExitCode.SCRIPT_FAILED,
    "node": ExitCode.NODE_LOST,
    "pre-timeout": ExitCode.PRE_TIMEOUT,
}
NEVER_RAN = {"rendered": "it was never submitted", "dry-run": "it was a dry run", "failed": "its submission failed"}
PROGRESS_EVERY_S = 5.0
POLL_S = 0.25
STACKS_MARGIN_S = 5.0  # beyond the controller's own wait for the survivors' stacks
STEP_WAIT_S = 120.0  # at most this long for the ranks to finish the watchdog's warm-up before injecting


# --- the run ----------------------------------------------------------------------


def end_event(run: RunDir, attempt: int) -> dict[str, Any] | None:
    """How an attempt ended ({exit, time}), once its history says it did."""
    found = history.read(run).attempt(attempt)
    if found is None or not found.ended:
        return None
    return {"exit": found.exit_code, "time": found.end}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Attempt:
    number: int
    path: Path
    info: AttemptJson
    manifest: dict[str, Any]

    @property
    def token(self) -> str:
        return attemptjson.token(self.path)

    @property
    def job_id(self) -> str:
        return jobid.native(self.info.job_id)

    @property
    def hosts(self) -> list[str]:
        return list(self.info.hosts) or [str(h) for h in self.manifest.get("hosts") or []]

    def ranks(self) -> dict[int, dict[str, Any]]:
        found = {}
        for record in self.manifest.get("ranks") or []:
            rank = _int(record.get("rank")) if isinstance(record, dict) else None
            if rank is not None and not record.get("missing") and _int(record.get("pid")):
                found[rank] = record
        return found


def _job_active(run: RunDir, backend_name: str, job_id: str) -> bool | None:
    """Does the scheduler still run or hold the job? None when it cannot say."""
    if not job_id:
        return None
    from clusterctl.backends import get_backend

    try:
        info = get_backend(backend_name).info(jobid.native(job_id))
    except ClusterctlError:
        return None
    return None if info is None else not info.finished


def wait_for_attempt(run: RunDir, backend: str, timeout: float, show: Callable[[str], None]) -> Attempt:
    """The current attempt once all its ranks registered (manifest.json), waiting up to `timeout`."""
    start = time.monotonic()
    shown_at = -PROGRESS_EVERY_S
    asked_at = -PROGRESS_EVERY_S
    active: bool | None = None
    while True:
        state = run.read_state()
        if state.get("state") in NEVER_RAN:
            reason = state.get("reason")
            raise ClusterctlError(
                f"run {run.path.name} is not running: {NEVER_RAN[state['state']]}" + (f" ({reason})" if reason else ""),
                ExitCode.BACKEND_UNAVAILABLE,
            )
        numbers = [n for n in run.attempts() if (run.attempt(n) / rundir.ATTEMPT_JSON).is_file()]
        told = history.read(run)
        elapsed = time.monotonic() - start
        if numbers:
            n = numbers[-1]
            info = attemptjson.read(run.attempt(n)) or AttemptJson()
            job_id = info.job_id or str(state.get("job_id") or "")
        else:
            n, info, job_id = 0, AttemptJson(), str(state.get("job_id") or "")
        end = end_event(run, n) if n else None
        went_on = told.attempt(n) if n else None
        if end is not None and went_on is not None and went_on.next_job:
            job_id = went_on.next_job  # a continuation carries the run on: pending in the queue is still going
        stopped = told.stopped
        if n and end is None and not stopped:
            manifest = rankmanifest.read(run.attempt(n) / rundir.MANIFEST)
            if manifest is not None:
                return Attempt(n, run.attempt(n), info, manifest)
            line = f"attempt {n}: waiting for the ranks to register ({elapsed:.0f} s)"
        else:
            if elapsed - asked_at >= PROGRESS_EVERY_S:
                active, asked_at = _job_active(run, backend, job_id), elapsed
            if stopped or (n and active is not True) or (not n and active is False):
                how = f"attempt {n} ended with exit {end.get('exit')}" if end else "no attempt started"
                if stopped:
                    how = "the run stopped"
                raise ClusterctlError(
                    f"run {run.path.name} is not running: {how}"
                    + (f" and job {job_id} is no longer active" if active is False else ""),
                    ExitCode.BACKEND_UNAVAILABLE,
                )
            line = (
                f"attempt {n} ended (exit {end.get('exit')}); waiting for the next attempt ({elapsed:.0f} s)"
                if n
                else f"waiting for the job to start ({elapsed:.0f} s)"
            )
        if elapsed >= timeout:
            raise ClusterctlError(
                f"run {run.path.name}: no attempt with registered ranks within {timeout:g} s ({line.rsplit(' (', 1)[0]})",
                ExitCode.BACKEND_UNAVAILABLE,
            )
        if elapsed - shown_at >= PROGRESS_EVERY_S:
            show(line)
            shown_at = elapsed
        time.sleep(POLL_S)


def node_python(run: RunDir) -> str:
    """The interpreter the ranks use: run.json's launcher command, else the controller's, else this one."""
    plan = runjson.read(run.path)
    argv = list(plan.argv) if plan is not None and isinstance(plan.argv, (list, tuple)) else []
    if len(argv) >= 3 and argv[1:3] == ["-m", "clusterctl.launch"]:
        return str(argv[0])
    with contextlib.suppress(OSError, ValueError):
        match = re.search(r"^CONTROLLER=\((.*)\)\s*$", run.sbatch.read_text(), re.M)
        if match:
            words = shlex.split(match.group(1))  # [python -m clusterctl.runtime.node.warm.client --] python -m ...controller
            for i in range(1, len(words) - 1):
                if words[i:i + 2] == ["-m", "clusterctl.runtime.controller"]:
                    return words[i - 1]
    return sys.executable


def signal_name(run: RunDir) -> str:
    """The job's pre-timeout signal (run.json, else spec.yaml `signal.name`), without SIG; USR2 by default."""
    plan = runjson.read(run.path)
    name = plan.signal.name if plan is not None else None
    if not name:
        with contextlib.suppress(OSError, ValueError, ImportError):
            import yaml

            spec = yaml.safe_load((run.path / rundir.SPEC).read_text()) or {}
            name = (spec.get("signal") or {}).get("name")
    name = str(name or "USR2").upper()
    return name[3:] if name.startswith("SIG") else name


# --- the outcome ------------------------------------------------------------------


@dataclass
class Outcome:
    verdict: Verdict | None = None
    end: dict[str, Any] | None = None
    note: str = ""


def verdict_time(verdict: Verdict, path: Path) -> float:
    """When the verdict was given: its `time`, else (older controllers wrote none: 0) the file's mtime."""
    if verdict.time:
        return verdict.time
    with contextlib.suppress(OSError):
        return path.stat().st_mtime
    return 0.0


def _fresh_verdict(attempt_dir: Path, since: float) -> Verdict | None:
    """The attempt's failing verdict when it was given at or after `since` (an older one is not the drill's)."""
    verdict = verdicts.read(attempt_dir)
    if verdict is None or verdict.ok or verdict_time(verdict, verdicts.path(attempt_dir)) < since:
        return None
    return verdict


def await_outcome(
    run: RunDir, attempt: Attempt, fault: str, since: float, timeout: float, show: Callable[[str], None]
) -> Outcome:
    """Wait for a verdict given after the injection, the attempt's end, or the timeout."""
    start = time.monotonic()
    shown_at = 0.0
    while True:
        verdict = _fresh_verdict(attempt.path, since)
        if verdict is not None:
            if fault == "hang" and verdict.code == int(ExitCode.HANG):
                verdict = wait_for_stacks(attempt.path, since, verdict)
            end = end_event(run, attempt.number) if fault == "pre-timeout" else None
            return Outcome(verdict, end)
        end = end_event(run, attempt.number)
        newer = [n for n in run.attempts() if n > attempt.number and (run.attempt(n) / rundir.ATTEMPT_JSON).is_file()]
        if end is not None or newer:
            verdict = _fresh_verdict(attempt.path, since)  # written just before the batch script recorded the end
            note = "" if verdict else (
                f"attempt {attempt.number} ended with exit {end.get('exit')} and no verdict after the injection"
                if end else f"attempt {newer[0]} started with no verdict for attempt {attempt.number}"
            )
            return Outcome(verdict, end, note)
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            return Outcome(note=f"no verdict within {timeout:g} s")
        if elapsed - shown_at >= PROGRESS_EVERY_S:
            show(f"{elapsed:.0f} s after the injection: no verdict yet")
            shown_at = elapsed
        time.sleep(POLL_S)


def wait_for_stacks(attempt_dir: Path, since: float, verdict: Verdict) -> Verdict:
    """The hang verdict once the controller has collected the survivors' stacks (it rewrites the file).

    Continuing the stopped rank earlier would let it answer the dump request still pending for it,
    and a drilled hang would then look like a rank that was never stuck.
    """
    deadline = time.monotonic() + DUMP_WAIT_S + STACKS_MARGIN_S
    while "stacks" not in verdict.evidence and time.monotonic() < deadline:
        time.sleep(POLL_S)
        verdict = _fresh_verdict(attempt_dir, since) or verdict
    return verdict


def judge(fault: str, target: Any, outcome: Outcome, injected_at: float, attempt: Attempt) -> dict[str, Any]:
    expected = int(EXPECTED[fault])
    verdict = outcome.verdict
    end = outcome.end or {}
    code = verdict.code if verdict else _int(end.get("exit")) if end else None
    culprits = verdict.culprits if verdict else []
    victims = verdict.victims if verdict else []
    seconds = None
    if verdict:
        seconds = verdict_time(verdict, verdicts.path(attempt.path)) - injected_at
    elif end and _int(end.get("time")) is not None:
        seconds = float(end["time"]) - injected_at
    if fault == "pre-timeout":
        detected = _int(end.get("exit")) == expected or (bool(verdict) and code == expected)
        if end and _int(end.get("exit")) == expected and (not verdict or code != expected):
            code = expected
            seconds = float(end["time"]) - injected_at if _int(end.get("time")) is not None else seconds
        culprit_right = None
    else:
        detected = bool(verdict) and code == expected
        if fault == "node":
            culprit_right = bool(culprits) and all(str(c.get("host")) == target for c in culprits)
        else:
            culprit_right = bool(culprits) and _int(culprits[0].get("rank")) == target
    message = str((verdict.message if verdict else "") or end.get("reason") or "")
    return {
        "fault": fault,
        "target": target,
        "attempt": attempt.number,
        "injected_at": injected_at,
        "detected": detected,
        "culprit_right": culprit_right,
        "seconds": None if seconds is None else round(seconds, 2),
        "code": code,
        "expected_code": expected,
        "verdict": verdict.name if verdict else None,
        "message": message,
        "culprits": culprits,
        "victims": victims,
        "note": outcome.note,
    }


def passed(report: dict[str, Any]) -> bool:
    """The expected code came and, where blame is judged, it fell on the target (`clusterctl drill` exits 0)."""
    return bool(report["detected"]) and report["culprit_right"] is not False


# --- the drill --------------------------------------------------------------------


SLOW_PERIOD_S = 0.1  # the injector's default cycle: a steady slowdown on every step of 0.1 s or longer


def parse_slow(text: str) -> tuple[int, float, float]:
    """RANK:FACTOR[:PERIOD]: the rank runs 1/FACTOR of each PERIOD seconds (0.1 by default: a steady slowdown;
    longer, stalls: 1.5:0.3 stops it 0.1 s of every 0.3 s, which on 20 ms steps stalls one step in ten)."""
    parts = text.split(":")
    try:
        r, f = int(parts[0]), float(parts[1])
        period = float(parts[2]) if len(parts) == 3 else SLOW_PERIOD_S
    except (ValueError, IndexError):
        r, f, period = -1, 0.0, 0.0
    if len(parts) not in (2, 3) or r < 0 or not 1.0 < f < float("inf") or not 0.0 < period <= 3600.0:
        raise ClusterctlError(
            "--slow takes RANK:FACTOR[:PERIOD] with a factor above 1 and a period of seconds in (0, 3600]"
            f" (e.g. --slow 3:2 runs rank 3 at half speed, --slow 3:1.5:0.3 stops it 0.1 s of every 0.3 s), got {text!r}",
            ExitCode.USAGE,
        )
    return r, f, period


def choose_fault(
    hang: int | None = None, slow: str | None = None, kill: int | None = None, node: str | None = None,
    pre_timeout: bool = False,
) -> tuple[str, Any, float | None, float | None]:
    """The one fault asked for, as (fault, target, factor, period): `run_drill`'s arguments, checked before anything
    is done."""
    given = [(n, v) for n, v in (("hang", hang), ("slow", slow), ("kill", kill), ("node", node)) if v is not None]
    if pre_timeout:
        given.append(("pre-timeout", None))
    if len(given) != 1:
        raise ClusterctlError(
            "give exactly one fault: --hang RANK, --slow RANK:FACTOR[:PERIOD], --kill RANK, --node NODE or --pre-timeout",
            ExitCode.USAGE,
        )
    fault, value = given[0]
    if fault == "slow":
        return (fault, *parse_slow(str(value)))
    if fault in ("hang", "kill") and int(value) < 0:
        raise ClusterctlError(f"--{fault} takes a rank (0 or more), got {value}", ExitCode.USAGE)
    return fault, value, None, None


def _rank_record(attempt: Attempt, rank: int, run: RunDir) -> dict[str, Any]:
    ranks = attempt.ranks()
    if rank not in ranks:
        world = _int(attempt.manifest.get("world_size")) or len(attempt.manifest.get("ranks") or [])
        valid = format_cpulist(sorted(ranks)) if ranks else "none"
        raise ClusterctlError(
            f"rank {rank} is not in attempt {attempt.number} of run {run.path.name}: valid ranks are {valid}"
            f" (world size {world})",
            ExitCode.USAGE,
        )
    return ranks[rank]


def wait_for_training(attempt: Attempt, timeout: float, show: Callable[[str], None]) -> None:
    """Until every rank is past the watchdog's warm-up (timeline.jsonl), so the fault lands in training.

    A script that reports no steps (no heartbeat phases) is drilled after `timeout` all the same.
    """
    path = attempt.path / rundir.TIMELINE
    if not path.exists():
        return  # not watched (standalone scripts): nothing tells when training runs
    world = len(attempt.ranks()) or 1
    steps: Counter[int] = Counter()
    offset = 0
    deadline = time.monotonic() + timeout
    next_note = time.monotonic() + 5

    def ready() -> int:
        return sum(1 for r in range(world) if steps[r] >= WARMUP_STEPS)

    while time.monotonic() < deadline:
        records, offset = timeline.tail(path, offset)
        for record in records:
            if record.get("kind") == timeline.STEP and isinstance(record.get("rank"), int):
                steps[record["rank"]] += 1
        if ready() >= world:
            return
        if time.monotonic() >= next_note:
            show(f"waiting for the ranks to finish {WARMUP_STEPS} training steps ({ready()} of {world} have)")
            next_note = time.monotonic() + 5
        time.sleep(0.5)
    show(f"{world - ready()} rank(s) not past {WARMUP_STEPS} training steps after {timeout:g} s: injecting all the same")


def run_drill(
    run: RunDir,
    fault: str,
    target: Any,
    factor: float | None,
    timeout: float,
    show: Callable[[str], None],
    warn: Callable[[str], None],
    period: float | None = None,
) -> dict[str, Any]:
    """Drill one fault (from `choose_fault`) into the run's current attempt and judge the outcome.

    Waits up to `timeout` for an attempt whose ranks registered, then (a little) for training, injects,
    waits up to `timeout` for the verdict, and always cleans up: a stopped rank is continued, a --slow
    injector stopped. Returns the report `clusterctl drill --json` prints (`passed` judges it), plus `what`,
    the fault in words for people. Raises ClusterctlError when the drill cannot be run.
    """
    state = run.read_state()
    backend = str(state.get("backend") or "")
    if backend not in ("local", "slurm"):
        raise ClusterctlError(
            f"run {run.path.name} has backend {backend or 'none'!r} in {rundir.STATE}: drills run on the local and"
            " slurm backends",
            ExitCode.BACKEND_UNAVAILABLE,
        )
    attempt = wait_for_attempt(run, backend, timeout, show)
    if fault != "pre-timeout":
        wait_for_training(attempt, min(timeout, STEP_WAIT_S), show)
    injector = Injector(backend, attempt.job_id or jobid.native(state.get("job_id")), node_python(run), attempt.token)
    injector.check()
    # Said before the fault lands: the recovery step marks this attempt's culprits as a drill's suspects.
    write_json_atomic(attempt.path / rundir.DRILL, {"fault": fault, "target": target, "factor": factor, "period": period,
                                                     "time": time.time()})
    background: Background | None = None
    victim: tuple[str, list[str]] | None = None  # host and --pid of a rank to continue at the end
    try:
        if fault in ("hang", "slow", "kill"):
            record = _rank_record(attempt, int(target), run)
            host, pid = str(record.get("host") or ""), int(record["pid"])
            who = ["--pid", str(pid)]  # the token goes in the injector's environment, out of `ps`
            what = f"{fault} rank {target} (pid {pid} on {host})"
            if fault == "slow":
                cycle = period or SLOW_PERIOD_S
                stalls = f", stopped {cycle * (1 - 1 / factor):.3g} s of every {cycle:g} s" if period else ""
                what = f"slow rank {target} by {factor:g}x{stalls} (pid {pid} on {host})"
                background = injector.start(
                    host, [*who, "--slow", str(factor), "--period", str(cycle), "--for", str(timeout + 60),
                           "--stop-on-eof"]
                )
                injected_at = float(last_json(background.lines[-1])["time"])  # type: ignore[index]
                victim = (host, who)
            else:
                if fault == "hang":
                    victim = (host, who)
                injected_at = float(injector.once(host, [*who, f"--{fault}"])["time"])
        elif fault == "node":
            if target not in attempt.hosts:
                raise ClusterctlError(
                    f"node {target!r} is not in attempt {attempt.number} of run {run.path.name}: its nodes are"
                    f" {', '.join(attempt.hosts) or 'unknown'}",
                    ExitCode.USAGE,
                )
            if target == attempt.info.batch_host or target == attempt.info.master_host:
                warn(
                    f"warning: {target} also runs the batch script and the controller; losing it may end the job"
                    " before any verdict is written"
                )
            result = injector.once(str(target), ["--node", str(target), "--job", injector.job_id])
            injected_at = float(result["time"])
            what = f"lose node {target} (killed {len(result.get('killed') or [])} processes of job {injector.job_id})"
        else:
            sig = signal_name(run)
            what = f"pre-timeout SIG{sig} to the batch script of job {injector.job_id}"
            injected_at = time.time()
            send_pre_timeout(backend, injector.job_id, sig)
        show(f"injected {what}; waiting up to {timeout:g} s for a verdict")
        outcome = await_outcome(run, attempt, fault, injected_at, timeout, show)
    finally:
        cleanup(injector, background, victim, show, warn, ended=lambda: _job_active(run, backend, injector.job_id) is False)
    report = judge(fault, target, outcome, injected_at, attempt)
    if factor is not None:
        report["factor"] = factor
    report["what"] = what
    return report


def cleanup(
    injector: Injector,
    background: Background | None,
    victim: tuple[str, list[str]] | None,
    show: Callable[[str], None],
    warn: Callable[[str], None],
    ended: Callable[[], bool] = lambda: False,
) -> None:
    """Stop a --slow injector and continue a stopped rank: a drill never leaves a frozen job behind."""
    if background is not None:
        background.stop()
    if victim is not None:
        host, who = victim
        try:
            injector.once(host, [*who, "--resume"])
            show(f"continued the rank on {host} (SIGCONT)")
        except InjectorFailed as exc:
            # ended, its pid now belongs to another process, or the verdict ended the whole job: nothing to continue
            if exc.reason not in ("gone", "token") and not ended():
                warn(f"warning: could not continue the rank on {host}: {exc.message}")


def send_pre_timeout(backend: str, job_id: str, sig: str) -> None:
    """The job's pre-timeout signal to its batch shell, as Slurm's --signal=B: would send it."""
    from clusterctl.backends import get_backend

    get_backend(backend).signal(job_id, sig)
