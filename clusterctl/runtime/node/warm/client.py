"""Ask this node's warm process server to run a command in a forked child; stand in for that child until it ends.

    python -m clusterctl.runtime.node.warm.client -- python -m MODULE ARGS...

The client is the process srun (or the batch script) started: it stays the
task, passes on every signal it can catch (TERM, INT, HUP, QUIT, USR1,
USR2, ALRM, CONT) and exits as its child did: with its code, or killed by
the same signal. Its standard streams are the child's (sent as
descriptors), so srun's labels and the node's log see the child's lines.

Where the warm path cannot run (no server named, none listening on this
node, or one that answers `cold`), the command starts cold and says why in
CLUSTERCTL_START: `clusterctl.launch` continues in this very process, any
other command is exec'd. Standard library only, and little of it: this is
on the path of every rank of every attempt.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time

from clusterctl import envnames
from clusterctl.procfs import process_state, zombie_status
from clusterctl.runtime.node.warm import protocol, title
from clusterctl.runtime.node.warm.protocol import node

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGALRM, signal.SIGCONT)
START_WINDOW_S = 20.0  # after the servers were (re)started: a refused connection may only mean "not listening yet"
IMPORT_WINDOW_S = 300.0  # after the servers were (re)started: they answer once their imports are done
ANSWER_S = 15.0  # later, a server that does not answer this fast is stopped or stuck: start cold
RETRY_S = 0.05
CHILD_END_GRACE_S = 1.0  # the child has ended: its server says how within this, else /proc does


def since() -> float:
    """When this job's servers were last (re)started (epoch seconds; 0 when unknown)."""
    text = os.environ.get(envnames.WARM_SINCE, "")
    try:
        return float(text)
    except ValueError:
        return 0.0


def connect(prefix: str) -> socket.socket | str:
    """A connection to this node's server, or why there is none."""
    name = protocol.socket_name(prefix, node())
    deadline = since() + START_WINDOW_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(name)
            if why := protocol.not_mine(sock):
                sock.close()
                return f"the warm process server's socket on {node()} is not to be trusted: {why}"
            return sock
        except OSError as exc:
            sock.close()
            ended = server_ended(prefix)
            if ended or time.time() >= deadline:
                return ended or f"no warm process server on {node()} ({exc.strerror or exc})"
        time.sleep(RETRY_S)


def server_ended(prefix: str) -> str:
    """Why this node's server is known to be gone ('' when it may only not be listening yet)."""
    try:
        with open(protocol.pid_file(prefix, node())) as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        return ""
    if process_state(pid) in ("", "Z"):  # a server dead and not yet reaped holds no socket either
        return f"the warm process server on {node()} (pid {pid}) has ended"
    return ""


def ask(message: dict, fds: list[int] | None = None, failed: str = "did not answer") -> tuple[socket.socket, dict] | str:
    """Send this node's server one request and read its first answer, waiting as long as its imports may take
    (it answers only once they are done): the open connection and the answer, or why there is none."""
    prefix = os.environ.get(envnames.WARM, "")
    if not prefix:
        return "no warm process servers in this job"
    sock = connect(prefix)
    if isinstance(sock, str):
        return sock
    wait_s = max(ANSWER_S, since() + IMPORT_WINDOW_S - time.time())
    try:
        sock.settimeout(wait_s)  # a child forked after we gave up is killed by the server: our connection is closed
        protocol.send(sock, message, fds)
        answer, _ = protocol.receive(sock)
        sock.settimeout(None)
    except TimeoutError:
        sock.close()
        return f"the warm process server on {node()} did not answer within {wait_s:.0f} s"
    except (OSError, protocol.ProtocolError) as exc:
        sock.close()
        return f"the warm process server on {node()} {failed}: {exc}"
    return sock, answer


def wait_ready() -> str:
    """'' once this node's server has imported, else why not: none in this job, gone, or still importing when
    the import window closes. An elastic run's full-size job asks it before it stops the shrunk job, so that the
    hand-over's pause is not spent importing torch. Any answer will do: a server from before `ready` answers it
    as a request it will not run."""
    asked = ask({"op": "ready"})
    if isinstance(asked, str):
        return asked
    asked[0].close()
    return ""


def request(argv: list[str]) -> dict:
    return {
        "op": "run",
        "argv": argv,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "umask": current_umask(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "python": sys.executable,
    }


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def start(argv: list[str]) -> tuple[socket.socket, int] | str:
    """The connection and the child's pid, or why the command must start cold."""
    asked = ask(request(argv), [0, 1, 2], failed="did not fork")
    if isinstance(asked, str):
        return asked
    sock, answer = asked
    if "pid" not in answer:
        sock.close()
        return str(answer.get("cold") or f"the warm process server on {node()} answered {answer}")
    return sock, int(answer["pid"])


def stand_in(sock: socket.socket, pid: int, argv: list[str]) -> None:
    """Forward signals to the child until it ends, then end the same way; `ps` calls this process a stand-in.

    The server says how the child ended; the child's own end is watched too
    (a pidfd), so a server that never says (stopped, stuck) cannot keep a
    finished rank's task alive: its wait status is then read from /proc."""

    def forward(signum: int, _frame: object) -> None:
        try:
            protocol.send(sock, {"signal": signum})
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    title.set_names(*title.stand_in_names(argv, os.environ.get("RANK", ""), pid, node()))
    child = watch_child(pid)
    answer = wait_for_end(sock, pid, child)
    if "killed" in answer:
        sig = int(answer["killed"])
        for caught in FORWARDED:
            signal.signal(caught, signal.SIG_DFL)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # ended by the same signal, as srun and the batch script would see the child
        time.sleep(1)
    sys.stdout.flush()
    os._exit(int(answer.get("exit", 1)) & 0xFF)


def watch_child(pid: int) -> int | None:
    """A pidfd of the forked child (readable once it has ended), or None where the kernel offers none."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def wait_for_end(sock: socket.socket, pid: int, child: int | None) -> dict:
    """The server's word on how the child ended; or, once the child has ended and the server stays silent
    for CHILD_END_GRACE_S, the child's own wait status."""
    ended_at: float | None = None
    while True:
        watched = [sock] if child is None or ended_at is not None else [sock, child]
        timeout = None if ended_at is None else max(0.0, ended_at + CHILD_END_GRACE_S - time.monotonic())
        try:
            ready, _, _ = select.select(watched, [], [], timeout)
        except InterruptedError:
            continue
        if sock in ready:
            try:
                return protocol.receive(sock)[0]
            except InterruptedError:
                continue
            except (OSError, protocol.ProtocolError):
                print(f"clusterctl: the warm process server on {node()} ended while its child (pid {pid}) ran",
                      file=sys.stderr, flush=True)
                return {"killed": signal.SIGKILL}
        if child is not None and child in ready:
            ended_at = time.monotonic()
        elif ended_at is not None and time.monotonic() >= ended_at + CHILD_END_GRACE_S:
            return child_end(pid)


def child_end(pid: int) -> dict:
    """How the child ended, from /proc while it is a zombie its silent server has not reaped."""
    print(f"clusterctl: the warm process server on {node()} did not report the end of its child (pid {pid})"
          f" within {CHILD_END_GRACE_S:g} s: ending as the child did", file=sys.stderr, flush=True)
    status = zombie_status(pid)
    if status is None:
        return {"exit": 1}
    if os.WIFSIGNALED(status):
        return {"killed": os.WTERMSIG(status)}
    return {"exit": os.WEXITSTATUS(status)}


def run_warm(argv: list[str]) -> str:
    """Run argv warm, never returning once the child exists; else return why it must start cold (set in START)."""
    if os.environ.get(envnames.START):  # already the forked child (or a cold start said so): do not ask again
        return os.environ[envnames.START]
    started = start(argv)
    if isinstance(started, str):
        os.environ[envnames.START] = f"cold: {started}"
        return started
    stand_in(*started, argv)
    return ""  # not reached


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise SystemExit("usage: python -m clusterctl.runtime.node.warm.client -- COMMAND ...")
    run_warm(args)
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
