"""`clusterctl drill RUN`: inject a real fault into a running job and check that it is detected.

The fault comes from outside, with real signals (clusterctl.runtime.inject
run on the rank's node); the program under test knows nothing of the drill.
The drill then waits for the attempt's verdict and says whether the fault
was detected with the expected code, whether the right rank (or node) was
blamed, and how long detection took.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from clusterctl.rundir import rankmanifest
from clusterctl import rundir
from clusterctl.cli.app import err_console, out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.syntax.cpulist import format_cpulist
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, read_json as load_json
from clusterctl.cli.runarg import resolve_run
from clusterctl.runtime.watchdog import WARMUP_STEPS
from clusterctl.runtime.response import DUMP_WAIT_S
from clusterctl.rundir import history

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
INJECT_TIMEOUT_S = 60.0  # one injector run, srun's start-up included
LOCAL_PREFIX = "local-"  # the local backend shows job N as local-N


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


def native_job_id(job_id: Any) -> str:
    """The scheduler's own id: `local-N` -> `N` (SLURM_JOB_ID inside a local job)."""
    return str(job_id).strip().removeprefix(LOCAL_PREFIX)


@dataclass(frozen=True)
class Attempt:
    number: int
    path: Path
    info: dict[str, Any]  # attempt.json
    manifest: dict[str, Any]

    @property
    def token(self) -> str:
        return str(self.info.get("token") or "")

    @property
    def job_id(self) -> str:
        return native_job_id(self.info.get("job_id", ""))

    @property
    def hosts(self) -> list[str]:
        return [str(h) for h in (self.info.get("hosts") or self.manifest.get("hosts") or [])]

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
        info = get_backend(backend_name).info(native_job_id(job_id))
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
            info = load_json(run.attempt(n) / rundir.ATTEMPT_JSON) or {}
            job_id = str(info.get("job_id") or state.get("job_id") or "")
        else:
            n, info, job_id = 0, {}, str(state.get("job_id") or "")
        end = end_event(run, n) if n else None
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
                f"run {run.path.name}: no attempt with registered ranks within {timeout:g} s ({line.split(' (')[0]})",
                ExitCode.BACKEND_UNAVAILABLE,
            )
        if elapsed - shown_at >= PROGRESS_EVERY_S:
            show(line)
            shown_at = elapsed
        time.sleep(POLL_S)


def node_python(run: RunDir) -> str:
    """The interpreter the ranks use: run.json's launcher command, else the controller's, else this one."""
    data = load_json(run.run_json) or {}
    argv = data.get("argv") or []
    if len(argv) >= 3 and argv[1:3] == ["-m", "clusterctl.launch"]:
        return str(argv[0])
    with contextlib.suppress(OSError, ValueError):
        match = re.search(r"^CONTROLLER=\((.*)\)\s*$", run.sbatch.read_text(), re.M)
        if match:
            words = shlex.split(match.group(1))
            if len(words) >= 3 and words[1:3] == ["-m", "clusterctl.runtime.controller"]:
                return words[0]
    return sys.executable


def signal_name(run: RunDir) -> str:
    """The job's pre-timeout signal (run.json, else spec.yaml `signal.name`), without SIG; USR2 by default."""
    name = ((load_json(run.run_json) or {}).get("signal") or {}).get("name")
    if not name:
        with contextlib.suppress(OSError, ValueError, ImportError):
            import yaml

            spec = yaml.safe_load((run.path / rundir.SPEC).read_text()) or {}
            name = (spec.get("signal") or {}).get("name")
    name = str(name or "USR2").upper()
    return name[3:] if name.startswith("SIG") else name


# --- the injector -----------------------------------------------------------------


def injector_argv(backend: str, job_id: str, host: str, python: str, args: list[str]) -> list[str]:
    """How the drill runs clusterctl.runtime.inject on `host`.

    local: here, with this interpreter (every emulated node is this machine).
    slurm: a one-task step on `host` inside the job's allocation, sharing its
    resources (--overlap), with the interpreter the ranks use.
    """
    inject = ["-m", "clusterctl.runtime.inject", *args]
    if backend == "local":
        return [sys.executable, *inject]
    return [
        "srun", "--overlap", f"--jobid={native_job_id(job_id)}", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
        "--quiet", python, "-u", *inject,
    ]


def injector_env(backend: str) -> dict[str, str]:
    """This environment, without the variables of an allocation the drill itself may run in (SLURM_CONF kept)."""
    env = dict(os.environ)
    if backend == "slurm":
        for key in list(env):
            if key.startswith(("SLURM_", "SRUN_", "SALLOC_", "SBATCH_")) and key != "SLURM_CONF":
                del env[key]
    return env


class InjectorFailed(ClusterctlError):
    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message, ExitCode.BACKEND_UNAVAILABLE)
        self.reason = reason


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            data = json.loads(line)
            if isinstance(data, dict):
                return data
    return None


def _failure(where: str, result: dict[str, Any] | None, rc: int | None, stderr: str) -> InjectorFailed:
    if result is not None and result.get("error"):
        return InjectorFailed(f"the injector on {where} refused: {result['error']}", str(result.get("reason", "")))
    tail = " | ".join(stderr.strip().splitlines()[-3:]) or "no output"
    return InjectorFailed(f"could not run the injector on {where} (exit {rc}): {tail}")


@dataclass
class Injector:
    backend: str
    job_id: str
    python: str

    def argv(self, host: str, args: list[str]) -> list[str]:
        return injector_argv(self.backend, self.job_id, host, self.python, args)

    def check(self) -> None:
        if self.backend == "slurm" and shutil.which("srun") is None:
            raise ClusterctlError("srun is not on PATH: the drill injects through srun --overlap", ExitCode.BACKEND_UNAVAILABLE)

    def once(self, host: str, args: list[str]) -> dict[str, Any]:
        """Run the injector to completion; its JSON report (ok true) or InjectorFailed."""
        try:
            proc = subprocess.run(
                self.argv(host, args), env=injector_env(self.backend), stdin=subprocess.DEVNULL,
                capture_output=True, text=True, timeout=INJECT_TIMEOUT_S, check=False,
            )
        except subprocess.TimeoutExpired:
            raise InjectorFailed(f"the injector on {host} did not finish within {INJECT_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise InjectorFailed(f"could not run the injector on {host}: {exc}") from None
        result = _last_json(proc.stdout)
        if proc.returncode != 0 or result is None or not result.get("ok"):
            raise _failure(host, result, proc.returncode, proc.stderr)
        return result

    def start(self, host: str, args: list[str]) -> Background:
        """Start a long-running injector (--slow); returns once it reported that it started."""
        try:
            proc = subprocess.Popen(
                self.argv(host, args), env=injector_env(self.backend), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
        except OSError as exc:
            raise InjectorFailed(f"could not run the injector on {host}: {exc}") from None
        bg = Background(proc, host)
        first = bg.first_line(INJECT_TIMEOUT_S)
        if first is None or not first.get("ok"):
            bg.stop()
            raise _failure(host, first or _last_json("\n".join(bg.lines)), proc.returncode, bg.stderr())
        return bg


@dataclass
class Background:
    proc: subprocess.Popen
    host: str
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._queue), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    @staticmethod
    def _pump(stream: Any, out: queue.Queue) -> None:
        for line in stream:
            out.put(line)
        out.put(None)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._err.append(line)

    def stderr(self) -> str:
        return "".join(self._err)

    def first_line(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
                return None
            self.lines.append(line)
            data = _last_json(line)
            if data is not None:
                return data
        return None

    def stop(self) -> dict[str, Any] | None:
        """Close the injector's input (srun passes the end on; the injector continues its process and exits).

        SIGTERM, then SIGKILL, only when it does not end: a SIGTERM to srun ends
        the step at once, so the caller continues the rank afterwards in any case.
        """
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        while True:
            try:
                line = self._queue.get(timeout=2)
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
        return _last_json("".join(self.lines))


# --- the outcome ------------------------------------------------------------------


@dataclass
class Outcome:
    verdict: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    note: str = ""


def verdict_time(verdict: dict[str, Any], path: Path) -> float:
    """When the verdict was given: its `time`, else (older controllers) the file's mtime."""
    value = verdict.get("time")
    if isinstance(value, (int, float)):
        return float(value)
    with contextlib.suppress(OSError):
        return path.stat().st_mtime
    return 0.0


def _fresh_verdict(path: Path, since: float) -> dict[str, Any] | None:
    verdict = load_json(path)
    if verdict is None or verdict.get("ok", True) or verdict_time(verdict, path) < since:
        return None
    return verdict


def await_outcome(
    run: RunDir, attempt: Attempt, fault: str, since: float, timeout: float, show: Callable[[str], None]
) -> Outcome:
    """Wait for a verdict given after the injection, the attempt's end, or the timeout."""
    path = attempt.path / rundir.VERDICT
    start = time.monotonic()
    shown_at = 0.0
    while True:
        verdict = _fresh_verdict(path, since)
        if verdict is not None:
            if fault == "hang" and _int(verdict.get("code")) == int(ExitCode.HANG):
                verdict = wait_for_stacks(path, since, verdict)
            end = end_event(run, attempt.number) if fault == "pre-timeout" else None
            return Outcome(verdict, end)
        end = end_event(run, attempt.number)
        newer = [n for n in run.attempts() if n > attempt.number and (run.attempt(n) / rundir.ATTEMPT_JSON).is_file()]
        if end is not None or newer:
            verdict = _fresh_verdict(path, since)  # written just before the batch script recorded the end
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


def wait_for_stacks(path: Path, since: float, verdict: dict[str, Any]) -> dict[str, Any]:
    """The hang verdict once the controller has collected the survivors' stacks (it rewrites the file).

    Continuing the stopped rank earlier would let it answer the dump request still pending for it,
    and a drilled hang would then look like a rank that was never stuck.
    """
    deadline = time.monotonic() + DUMP_WAIT_S + STACKS_MARGIN_S
    while "stacks" not in (verdict.get("evidence") or {}) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        verdict = _fresh_verdict(path, since) or verdict
    return verdict


def judge(fault: str, target: Any, outcome: Outcome, injected_at: float, attempt: Attempt) -> dict[str, Any]:
    expected = int(EXPECTED[fault])
    verdict = outcome.verdict or {}
    end = outcome.end or {}
    code = _int(verdict.get("code")) if verdict else _int(end.get("exit")) if end else None
    culprits = [c for c in verdict.get("culprits") or [] if isinstance(c, dict)]
    victims = verdict.get("victims") or []
    seconds = None
    if verdict:
        seconds = verdict_time(verdict, attempt.path / rundir.VERDICT) - injected_at
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
    message = str(verdict.get("message") or end.get("reason") or "")
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
        "verdict": verdict.get("verdict"),
        "message": message,
        "culprits": culprits,
        "victims": victims,
        "note": outcome.note,
    }


def passed(report: dict[str, Any]) -> bool:
    return bool(report["detected"]) and report["culprit_right"] is not False


def describe_culprit(c: dict[str, Any]) -> str:
    text = f"rank {c.get('rank')} on {c.get('host')}" if c.get("rank") is not None else f"{c.get('host')}"
    return text + (f" ({c['reason']})" if c.get("reason") else "")


def print_report(report: dict[str, Any], what: str) -> None:
    console = out_console()
    when = time.strftime("%H:%M:%S", time.localtime(report["injected_at"]))
    console.print(f"fault: {what}, injected at {when} (attempt {report['attempt']})")
    expected = report["expected_code"]
    if report["detected"]:
        name = report["verdict"] or ExitCode(expected).name.lower()
        after = f" after {report['seconds']:.1f} s" if report["seconds"] is not None else ""
        console.print(f"detected: yes, {name} ({report['code']}){after}")
    elif report["code"] is not None:
        after = f" after {report['seconds']:.1f} s" if report["seconds"] is not None else ""
        console.print(f"detected: no, code {report['code']}{after}; expected {expected}")
    else:
        console.print(f"detected: no, {report['note'] or 'no verdict'}; expected {expected}")
    if report["culprit_right"] is not None:
        blamed = "; ".join(describe_culprit(c) for c in report["culprits"][:4]) or "nobody"
        if len(report["culprits"]) > 4:
            blamed += f"; and {len(report['culprits']) - 4} more"
        console.print(f"culprit: {'right' if report['culprit_right'] else 'wrong'}, blamed {blamed}")
    console.print(f"victims: {len(report['victims'])}")
    if report["message"]:
        console.print(f"message: {report['message']}")
    console.print("drill passed" if passed(report) else "drill missed")


# --- the command ------------------------------------------------------------------


def parse_slow(text: str) -> tuple[int, float]:
    rank, sep, factor = text.partition(":")
    try:
        r, f = int(rank), float(factor)
    except ValueError:
        r, f = -1, 0.0
    if not sep or r < 0 or not f > 1.0 or f != f or f == float("inf"):
        raise ClusterctlError(
            f"--slow takes RANK:FACTOR with a factor above 1 (e.g. --slow 3:2 runs rank 3 at half speed), got {text!r}",
            ExitCode.USAGE,
        )
    return r, f


def choose_fault(
    hang: int | None, slow: str | None, kill: int | None, node: str | None, pre_timeout: bool
) -> tuple[str, Any, float | None]:
    given = [(n, v) for n, v in (("hang", hang), ("slow", slow), ("kill", kill), ("node", node)) if v is not None]
    if pre_timeout:
        given.append(("pre-timeout", None))
    if len(given) != 1:
        raise ClusterctlError(
            "give exactly one fault: --hang RANK, --slow RANK:FACTOR, --kill RANK, --node NODE or --pre-timeout",
            ExitCode.USAGE,
        )
    fault, value = given[0]
    if fault == "slow":
        rank, factor = parse_slow(str(value))
        return fault, rank, factor
    if fault in ("hang", "kill") and int(value) < 0:
        raise ClusterctlError(f"--{fault} takes a rank (0 or more), got {value}", ExitCode.USAGE)
    return fault, value, None


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


@contextlib.contextmanager
def _sigterm_interrupts() -> Any:
    """A SIGTERM to the drill ends it like Ctrl-C does: through the clean-up (no frozen rank left behind)."""
    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


STEP_WAIT_S = 120.0


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
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except OSError:
            chunk = b""
        complete = chunk[: chunk.rfind(b"\n") + 1]
        offset += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("kind") == "step" and isinstance(record.get("rank"), int):
                steps[record["rank"]] += 1
        if ready() >= world:
            return
        if time.monotonic() >= next_note:
            show(f"waiting for the ranks to finish {WARMUP_STEPS} training steps ({ready()} of {world} have)")
            next_note = time.monotonic() + 5
        time.sleep(0.5)
    show(f"{world - ready()} rank(s) not past {WARMUP_STEPS} training steps after {timeout:g} s: injecting all the same")


def run_drill(
    run: RunDir, fault: str, target: Any, factor: float | None, timeout: float, show: Callable[[str], None]
) -> dict[str, Any]:
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
    injector = Injector(backend, attempt.job_id or native_job_id(state.get("job_id", "")), node_python(run))
    injector.check()
    background: Background | None = None
    victim: tuple[str, list[str]] | None = None  # host and --pid/--token of a rank to continue at the end
    try:
        if fault in ("hang", "slow", "kill"):
            record = _rank_record(attempt, int(target), run)
            host, pid = str(record.get("host") or ""), int(record["pid"])
            who = ["--pid", str(pid), "--token", attempt.token]
            what = f"{fault} rank {target} (pid {pid} on {host})"
            if fault == "slow":
                what = f"slow rank {target} by {factor:g}x (pid {pid} on {host})"
                background = injector.start(
                    host, [*who, "--slow", str(factor), "--for", str(timeout + 60), "--stop-on-eof"]
                )
                injected_at = float(_last_json(background.lines[-1])["time"])  # type: ignore[index]
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
            if target == attempt.info.get("batch_host") or target == attempt.info.get("master_host"):
                err_console.print(
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
        cleanup(injector, background, victim, show, ended=lambda: _job_active(run, backend, injector.job_id) is False)
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
                err_console.print(f"warning: could not continue the rank on {host}: {exc.message}")


def send_pre_timeout(backend: str, job_id: str, sig: str) -> None:
    """The job's pre-timeout signal to its batch shell, as Slurm's --signal=B: would send it."""
    from clusterctl.backends import get_backend

    get_backend(backend).signal(job_id, sig)


def register(app: typer.Typer) -> None:
    @app.command("drill")
    def drill(
        run: Annotated[str, typer.Argument(help="run directory, a run id under ./runs, or a job id of the run", show_default=False)],
        hang: Annotated[Optional[int], typer.Option("--hang", metavar="RANK", help="SIGSTOP a rank")] = None,
        slow: Annotated[
            Optional[str], typer.Option("--slow", metavar="RANK:FACTOR", help="run a rank FACTOR times slower")
        ] = None,
        kill: Annotated[Optional[int], typer.Option("--kill", metavar="RANK", help="SIGKILL a rank")] = None,
        node: Annotated[
            Optional[str], typer.Option("--node", metavar="NODE", help="kill every process of the job on a node")
        ] = None,
        pre_timeout: Annotated[
            bool, typer.Option("--pre-timeout", help="send the job's pre-timeout signal to its batch script")
        ] = False,
        timeout: Annotated[
            float, typer.Option("--timeout", metavar="S", help="seconds to wait for the ranks, then for the verdict")
        ] = 300.0,
        as_json: JsonOpt = False,
    ) -> None:
        """Inject a fault into a running job and check that it is detected, blamed right, and how fast.

        Exits 0 when the expected verdict names the right rank or node, 3 when it does not.
        """
        fault, target, factor = choose_fault(hang, slow, kill, node, pre_timeout)
        if not timeout > 0:
            raise ClusterctlError(f"--timeout must be positive, got {timeout:g}", ExitCode.USAGE)
        path = resolve_run(run)
        console = out_console()
        show: Callable[[str], None] = (lambda _line: None) if as_json else (lambda line: console.print(line))
        with _sigterm_interrupts():
            report = run_drill(path, fault, target, factor, timeout, show)
        if as_json:
            typer.echo(json.dumps({k: v for k, v in report.items() if k != "what"}))
        else:
            print_report(report, report["what"])
        if not passed(report):
            raise typer.Exit(int(ExitCode.DRILL_MISSED))
