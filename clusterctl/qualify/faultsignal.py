"""Inject a fault into a running rank from outside, with real signals.

    python -m clusterctl.qualify.faultsignal --pid P --token T --hang      SIGSTOP (left stopped)
    python -m clusterctl.qualify.faultsignal --pid P --token T --resume    SIGCONT
    python -m clusterctl.qualify.faultsignal --pid P --token T --kill      SIGKILL
    python -m clusterctl.qualify.faultsignal --pid P --token T --slow F [--period 0.1] [--for S]
    python -m clusterctl.qualify.faultsignal --node NODE --job JOBID       SIGKILL the job's processes on NODE

`clusterctl drill` runs this on the rank's node (through `srun --overlap` on
Slurm, as a plain subprocess on the local backend); the program under test
knows nothing about it.

--slow F stops and continues the process in a duty cycle so that it runs 1/F
of the wall time: stopped (1 - 1/F) x period, then running period/F, until S
seconds have passed, the process is gone, this injector receives SIGTERM or
SIGINT, or (with --stop-on-eof) its standard input closes. Whichever ends
it, the process is left continued (SIGCONT). The drill uses --stop-on-eof:
srun passes the end of its input on to the task, where a SIGTERM to srun
would end the step at once, and a drill that dies closes the pipe too.

--node kills every process on this machine whose environment holds
SLURM_JOB_ID=JOBID and SLURMD_NODENAME=NODE, except this injector and its
ancestors: emulated nodes (the local backend, the Slurm test cluster) share
one host and differ only by SLURMD_NODENAME; on a real cluster this runs on
NODE itself.

A pid is signalled only when its environment holds CLUSTERCTL_TOKEN=T, the
attempt's token, so that a pid reused by another process is never touched;
where the kernel offers pidfds the process is pinned before its environment
is read, so the check and the signal reach the same process.

Output: one JSON line on stdout saying what was done ({"ok": true, "action":
..., "pid": ..., "time": epoch seconds of the signal, ...}); --slow prints
two, one when the duty cycle starts ("state": "started") and one when it ends
("state": "ended"). A refusal prints {"ok": false, "error": ..., "reason":
"token" | "gone" | "permission" | ...} and the message on stderr, and exits 1;
command-line mistakes exit 2. Standard library only: this runs on compute
nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from clusterctl import envnames
from clusterctl.procfs import process_state

EXIT_REFUSED = 1


class Refused(Exception):
    """The injector will not (or cannot) signal the process; `reason` is one word for machines."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Interrupted(Exception):
    """SIGTERM or SIGINT reached the injector during --slow."""


def read_environ(pid: int) -> dict[str, str]:
    """A process's environment from /proc (as it was at exec, which is where the batch script put the token)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise Refused(f"no process {pid}: it has exited", "gone") from None
    except PermissionError:
        raise Refused(
            f"cannot read the environment of pid {pid}: permission denied (run as the job's user)", "permission"
        ) from None
    except ProcessLookupError:
        raise Refused(f"no process {pid}: it has exited", "gone") from None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def warm_child_holds(pid: int, token: str, env: dict[str, str]) -> bool:
    """A rank forked from its node's warm server shows the server's environment in /proc: its server knows its token."""
    prefix = env.get(envnames.WARM)
    if not prefix:
        return False
    from clusterctl.runtime.node.warm.protocol import owns

    return owns(prefix, env.get("SLURMD_NODENAME") or os.uname().nodename, pid, token)


class Target:
    """One process, pinned (a pidfd where the kernel has them) and checked against the attempt's token."""

    def __init__(self, pid: int, token: str | None) -> None:
        self.pid = pid
        self.fd: int | None = None
        self.env: dict[str, str] = {}
        if pid <= 0:
            raise Refused(f"pid {pid} is not a process id", "usage")
        if pid == os.getpid():
            raise Refused(f"pid {pid} is this injector", "usage")
        try:
            self.fd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise Refused(f"no process {pid}: it has exited", "gone") from None
        except (AttributeError, OSError):
            self.fd = None  # no pidfds (old kernel or Python): check, then signal by pid
        try:
            env = self.env = read_environ(pid)
            if self.exited():
                raise Refused(f"no process {pid}: it has exited", "gone")
            if token is not None and env.get(envnames.TOKEN) != token and not warm_child_holds(pid, token, env):
                held = envnames.TOKEN in env
                raise Refused(
                    f"pid {pid} does not hold this attempt's token ({envnames.TOKEN}"
                    + (" differs" if held else " is not in its environment")
                    + "): it is not the rank, or the pid was reused; not signalled",
                    "token",
                )
        except BaseException:
            self.close()
            raise

    def exited(self) -> bool:
        """Has the pinned process ended? (Zombies count as ended.)"""
        if self.fd is not None:
            return bool(select.select([self.fd], [], [], 0)[0])
        return process_state(self.pid) in ("", "Z", "X")

    def send(self, sig: int) -> None:
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            raise Refused(f"no process {self.pid}: it has exited", "gone") from None
        except PermissionError:
            raise Refused(f"cannot signal pid {self.pid}: permission denied (run as the job's user)", "permission") from None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def signal_once(pid: int, token: str, action: str) -> dict[str, Any]:
    sig = {"hang": signal.SIGSTOP, "resume": signal.SIGCONT, "kill": signal.SIGKILL}[action]
    target = Target(pid, token)
    try:
        sent = time.time()
        target.send(sig)
    finally:
        target.close()
    return {"ok": True, "action": action, "pid": pid, "signal": sig.name, "time": sent, "host": _node()}


def _eof_event() -> threading.Event:
    """Set once standard input reaches its end."""
    closed = threading.Event()

    def read() -> None:
        try:
            while sys.stdin.buffer.read1(4096):
                pass
        except (OSError, ValueError):
            pass
        closed.set()

    threading.Thread(target=read, daemon=True).start()
    return closed


def slow(
    pid: int, token: str, factor: float, period: float, duration: float | None, stop_on_eof: bool = False
) -> dict[str, Any]:
    """Duty-cycle SIGSTOP/SIGCONT; always leaves the process continued."""
    target = Target(pid, token)
    closed = _eof_event() if stop_on_eof else threading.Event()
    stopped_s = period * (1.0 - 1.0 / factor)
    running_s = period / factor

    def interrupt(signum: int, _frame: Any) -> None:
        raise _Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    start = time.time()
    t0 = time.monotonic()
    cycles = 0
    ended = "duration"
    try:
        emit(
            {
                "ok": True, "action": "slow", "state": "started", "pid": pid, "factor": factor, "period": period,
                "for": duration, "time": start, "host": _node(),
            }
        )
        while True:
            if duration is not None and time.monotonic() - t0 >= duration:
                break
            if target.exited():
                ended = "gone"
                break
            if closed.is_set():
                ended = "eof"
                break
            try:
                target.send(signal.SIGSTOP)
                closed.wait(stopped_s)
                target.send(signal.SIGCONT)
            except Refused:
                ended = "gone"
                break
            cycles += 1
            closed.wait(running_s)
    except _Interrupted as exc:
        ended = str(exc)
    finally:
        for s in previous:  # a second SIGTERM must not cut the clean-up short
            signal.signal(s, signal.SIG_IGN)
        try:
            target.send(signal.SIGCONT)
        except Refused:
            pass
        target.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return {
        "ok": True, "action": "slow", "state": "ended", "pid": pid, "factor": factor, "period": period,
        "time": start, "seconds": round(time.time() - start, 3), "cycles": cycles, "ended": ended,
        "continued": process_state(pid) not in ("T", "t"), "host": _node(),
    }


def _ancestors() -> set[int]:
    """This process and every process above it."""
    found = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                text = fh.read().decode(errors="replace")
            pid = int(text[text.rfind(")") + 2 :].split(" ")[1])
        except (OSError, ValueError, IndexError):
            break
        found.add(pid)
    return found


def _job_pids(node: str, job: str, spare: set[int]) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spare:
            continue
        try:
            env = read_environ(int(entry))
        except Refused:
            continue  # gone, or another user's
        if env.get("SLURM_JOB_ID") == job and env.get("SLURMD_NODENAME") == node:
            pids.append(int(entry))
    return sorted(pids)


def kill_node(node: str, job: str) -> dict[str, Any]:
    """SIGKILL every process of `job` on `node` at once, as a node that dies takes them all; a few passes so that
    children forked meanwhile go too.

    Each pass pins every process first and only then signals them, back to back: signalled one by one with
    /proc reads in between, the node's other ranks saw the first one die and were already exiting, so the
    fault looked like one rank's death. A process that ended before its signal is reported as `gone`.
    """
    spare = _ancestors()
    killed: list[int] = []
    gone: list[int] = []
    first: float | None = None
    for _ in range(5):
        fresh = [p for p in _job_pids(node, job, spare) if p not in killed and p not in gone]
        if not fresh:
            break
        pinned: list[Target] = []
        for pid in fresh:
            try:
                target = Target(pid, None)
            except Refused:
                continue
            if target.env.get("SLURM_JOB_ID") == job and target.env.get("SLURMD_NODENAME") == node:
                pinned.append(target)  # checked after pinning: the process about to be signalled
            else:
                target.close()
        now = time.time()
        for target in pinned:
            try:
                target.send(signal.SIGKILL)
                killed.append(target.pid)
                first = first if first is not None else now
            except Refused as exc:
                if exc.reason == "gone":
                    gone.append(target.pid)
            finally:
                target.close()
        time.sleep(0.05)
    return {
        "ok": True, "action": "node", "node": node, "job": job, "killed": sorted(killed), "gone": sorted(gone),
        "time": first if first is not None else time.time(), "host": _node(),
    }


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m clusterctl.qualify.faultsignal",
        description="Inject a fault into a rank (by pid, checked against the attempt's token) or a node.",
    )
    parser.add_argument("--pid", type=int, help="the rank's process id")
    parser.add_argument("--token", help=f"the attempt's token ({envnames.TOKEN} in the rank's environment); default:"
                        f" ${envnames.INJECT_TOKEN}, which keeps it off the command line")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--hang", action="store_true", help="SIGSTOP the process (left stopped)")
    what.add_argument("--resume", action="store_true", help="SIGCONT the process")
    what.add_argument("--kill", action="store_true", help="SIGKILL the process")
    what.add_argument("--slow", type=float, metavar="F", help="run the process at 1/F of its speed (F > 1)")
    what.add_argument("--node", metavar="NODE", help="SIGKILL every process of --job on NODE")
    parser.add_argument("--job", metavar="JOBID", help="with --node: the Slurm job id (SLURM_JOB_ID)")
    parser.add_argument("--period", type=float, default=0.1, help="--slow: seconds per stop/continue cycle")
    parser.add_argument("--for", dest="duration", type=float, help="--slow: stop after this many seconds")
    parser.add_argument("--stop-on-eof", action="store_true", help="--slow: stop when standard input closes")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.node is not None:
        if not args.job:
            parser.error("--node needs --job JOBID")
        if args.pid is not None:
            parser.error("--node takes no --pid")
    else:
        args.token = args.token if args.token is not None else os.environ.get(envnames.INJECT_TOKEN)
        if args.pid is None or args.token is None:
            parser.error(f"--pid and the attempt's token (${envnames.INJECT_TOKEN} or --token) are required (except with --node)")
        if not args.token:
            parser.error("--token must not be empty")
    if args.slow is not None:
        if not args.slow > 1.0:
            parser.error(f"--slow takes a factor above 1, got {args.slow:g}")
        if not args.period > 0:
            parser.error(f"--period must be positive, got {args.period:g}")
        if args.duration is not None and args.duration <= 0:
            parser.error(f"--for must be positive, got {args.duration:g}")
    try:
        if args.node is not None:
            emit(kill_node(args.node, args.job))
        elif args.slow is not None:
            emit(slow(args.pid, args.token, args.slow, args.period, args.duration, args.stop_on_eof))
        else:
            action = "hang" if args.hang else "resume" if args.resume else "kill"
            emit(signal_once(args.pid, args.token, action))
    except Refused as exc:
        emit({"ok": False, "error": str(exc), "reason": exc.reason, "pid": args.pid, "host": _node()})
        print(f"inject: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
