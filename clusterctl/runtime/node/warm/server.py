"""The warm process server: one per node for the whole job, forking each attempt's processes pre-imported.

    python -m clusterctl.runtime.node.warm.server [--import MODULE ...]

Started by the batch script once per allocation, as its own srun step on
every node (spares included), before the first attempt. It listens on its
node's abstract socket (protocol.py), then imports torch, torch.distributed,
its checkpointing and DDP/FSDP modules, clusterctl's node side and the
spec's `restart.preimport` modules, before any thread of its own or CUDA
context exists; a rank, or the controller, then costs a fork instead of an
interpreter and ~2 s of CPU of imports, in every attempt.

One thread, one loop: the listening socket, one connection per child and
SIGCHLD (through a wake-up pipe). A request that this interpreter cannot
serve faithfully (another Python, or an interpreter setting the server's
environment fixed at start-up differs) is answered `cold`, naming why, and
the client starts cold. A connection that closes kills its child: the
client is the task srun tracks, and a task that srun has ended must leave
nothing behind.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from clusterctl import envnames
from clusterctl.procfs import exited_children, process_state
from clusterctl.runtime.node import leftovers
from clusterctl.runtime.node.warm import protocol
from clusterctl.runtime.node.warm.protocol import node

# What every rank and controller imports: torch and its distributed and checkpointing parts, clusterctl's node side.
IMPORTS = (
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.nn.parallel",
    "torch.distributed.fsdp",
    "torch._dynamo",  # torch.compile, and torch.use_deterministic_algorithms: 1.7 s of imports on first use
    "numpy",
    "clusterctl.runtime.rank.launch",
    "clusterctl.runtime.rank.rendezvous",
    "clusterctl.runtime.rank.preflight",
    "clusterctl.runtime.controller.admission",
    "clusterctl.runtime.controller.watchserver",
    "clusterctl.trainer.loop",
)  # never a module that is run as __main__ (clusterctl.launch, the controller): runpy runs those afresh
# Read once, when the interpreter or torch starts: a request whose value differs gets a cold start.
FIXED_AT_START = (
    "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONUTF8", "PYTHONIOENCODING",
    "PYTHONWARNINGS", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONINTMAXSTRDIGITS",
    "TORCH_CPP_LOG_LEVEL", "TORCH_LOGS", "TORCH_SHOW_CPP_STACKTRACES", "LD_PRELOAD", "LD_LIBRARY_PATH",
)
STOP_POLL_S = 0.25  # how often a child's stand-in is looked at: stopped, or continued


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} clusterctl warm server on {node()}: {message}", file=sys.stderr,
          flush=True)


def preimport(names: list[str]) -> dict[str, str]:
    """Import each module; those that fail are left to the child (which imports them as a cold rank would)."""
    failed = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a module missing here is the command's business, not ours
            failed[name] = f"{type(exc).__name__}: {exc}"
    return failed


@dataclass
class Child:
    conn: socket.socket
    pid: int = 0
    token: str = ""
    client: int = 0  # the stand-in's pid: the process srun tracks, which a user may stop thinking it is the rank
    stopped: bool = False  # stopped because its stand-in is
    reader: protocol.Reader = field(default_factory=lambda: protocol.Reader())


@dataclass
class Server:
    listener: socket.socket
    start_env: dict[str, str]
    forked: int = 0
    children: dict[int, Child] = field(default_factory=dict)  # by pid
    conns: dict[int, Child] = field(default_factory=dict)  # by the connection's fd
    ending: bool = False  # the job's SIGTERM came: serve the children until the last has ended, then go

    def __post_init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self.listener, selectors.EVENT_READ, "listen")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")

    def why_cold(self, request: dict[str, Any]) -> str:
        """'' when this server can run the request as a cold start would, else why not."""
        if os.path.realpath(str(request.get("python", ""))) != os.path.realpath(sys.executable):
            return f"the command runs {request.get('python')}, the warm process server {sys.executable}"
        env = request.get("env") or {}
        for name in FIXED_AT_START:
            if env.get(name) != self.start_env.get(name):
                return f"{name} differs from the warm process server's ({env.get(name)!r}, not {self.start_env.get(name)!r})"
        return ""

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            client, uid = protocol.peer(conn)
            if uid != os.getuid():
                conn.close()  # another user's process: never fork for it
                return
            conn.settimeout(10)
            request, fds = protocol.receive(conn, with_fds=True)
        except (OSError, protocol.ProtocolError) as exc:
            log(f"a request could not be read: {exc}")
            conn.close()
            return
        try:
            if request.get("op") == "owns":
                child = self.children.get(int(request.get("pid", 0)))
                protocol.send(conn, {"ok": bool(child and child.token and child.token == request.get("token"))})
                return
            if request.get("op") == "ready":  # serving at all means the imports are done
                protocol.send(conn, {"ok": True})
                return
            why = self.why_cold(request) if len(fds) == protocol.FDS else f"{len(fds)} descriptors, not {protocol.FDS}"
            if self.ending:
                why = "the job is ending (the warm process server got its SIGTERM)"
            if why:
                protocol.send(conn, {"cold": why})
                return
            self.fork(conn, request, fds, client)
            conn = None  # kept: the child's connection
        except OSError as exc:
            log(f"a request failed: {exc}")
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if conn is not None:
                conn.close()

    def fork(self, conn: socket.socket, request: dict[str, Any], fds: list[int], client: int) -> None:
        self.forked += 1
        started = f"warm: forked by pid {os.getpid()} on {node()} (its child {self.forked})"
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            self.close_in_child(conn)
            from clusterctl.runtime.node.warm.child import become

            become(request, fds, started)  # never returns
        child = Child(conn, pid, str((request.get("env") or {}).get(envnames.TOKEN, "")), client)
        self.children[pid] = child
        self.conns[conn.fileno()] = child
        conn.settimeout(None)  # blocking: it is read only when the selector says so, and what it is sent is small
        self.selector.register(conn, selectors.EVENT_READ, "child")
        with contextlib.suppress(OSError):
            protocol.send(conn, {"pid": pid})

    def close_in_child(self, keep: socket.socket) -> None:
        self.selector.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        self.listener.close()
        for child in self.conns.values():
            child.conn.close()
        keep.close()

    def on_message(self, child: Child) -> None:
        try:
            data = child.conn.recv(65536)
        except OSError:
            data = b""
        try:
            messages = child.reader.feed(data) if data else None
        except protocol.ProtocolError as exc:
            log(f"the client of child {child.pid} sent {exc}: it is ended")
            messages = None
        if messages is None:  # the client is gone (or beyond understanding): so is the task srun tracks
            self.drop(child)
            if child.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
            return
        for message in messages:
            sig = message.get("signal")
            if isinstance(sig, int) and child.pid:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(child.pid, sig)

    def drop(self, child: Child) -> None:
        fd = child.conn.fileno()
        if fd >= 0 and self.conns.pop(fd, None) is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(child.conn)
        child.conn.close()

    def reap(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self.wake_r, 512):
                pass
        for pid, status in exited_children():
            child = self.children.pop(pid, None)
            if child is None:
                continue
            if os.WIFSIGNALED(status):
                message = {"killed": os.WTERMSIG(status)}
            else:
                message = {"exit": os.waitstatus_to_exitcode(status)}
            if child.conn.fileno() >= 0:
                with contextlib.suppress(OSError):
                    protocol.send(child.conn, message)
                self.drop(child)

    def follow_stops(self) -> None:
        """A stand-in stopped (SIGSTOP, SIGTSTP: no handler of its own can pass those on) stops its child, and
        one continued continues it: a stop sent to what `ps` shows as the script reaches the rank, whose
        watchdog then judges what it is (a hang), instead of a finished rank's task stopped with nothing to see."""
        for child in self.children.values():
            if not child.client:
                continue
            stopped = process_state(child.client) == "T"
            if stopped != child.stopped:
                child.stopped = stopped
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGSTOP if stopped else signal.SIGCONT)
                log(f"the stand-in (pid {child.client}) of child {child.pid} was {'stopped' if stopped else 'continued'}:"
                    f" so is the child")

    def end(self) -> None:
        """The job's SIGTERM (scancel, a preemption, the time limit): stay until every child has ended.

        Slurm signals this step with the ranks' and the controller's, and
        those were forked from here: their PR_SET_PDEATHSIG would kill them
        the moment this server exits, in the middle of the save their own
        SIGTERM asked for. So the server goes on forwarding signals and
        reaping, and leaves after its last child (or with Slurm's SIGKILL once
        KillWait is over, which ends the children with it).
        """
        self.ending = True  # a signal handler: the loop says so (serve)

    def serve(self) -> None:
        """Until the job's SIGTERM has come and no child is left."""
        told = False
        while not (self.ending and not self.children):
            if self.ending and not told:
                told = True
                log(f"the job's SIGTERM: serving {len(self.children)} child(ren) until they end")
            for key, _ in self.selector.select(STOP_POLL_S if self.children else None):
                if key.data == "listen":
                    self.accept()
                elif key.data == "wake":
                    self.reap()
                else:
                    child = self.conns.get(key.fd)
                    if child is not None:
                        self.on_message(child)
            self.follow_stops()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusterctl.runtime.node.warm.server")
    parser.add_argument("--import", dest="imports", action="append", default=[], help="a module to pre-import")
    parser.add_argument("--only", action="store_true", help="import only the --import modules (tests: no torch)")
    parser.add_argument("--run-dir", default="", help="the run: its in-memory snapshots on this node go when the job ends")
    args = parser.parse_args(argv)
    prefix = os.environ.get(envnames.WARM, "")
    if not prefix:
        log(f"{envnames.WARM} is not set: nothing to serve")
        return 2
    start_env = dict(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(protocol.socket_name(prefix, node()))
    except OSError as exc:
        log(f"cannot listen: {exc}")
        return 1
    listener.listen(256)  # clients wait in the backlog while the imports run
    marker = protocol.pid_file(prefix, node())
    with contextlib.suppress(OSError):  # never through a name someone else put there first (TMPDIR may be /tmp)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{os.getpid()}\n")
    leftovers.sweep(leftovers.tmpdir(), keep=marker, job=prefix)  # what killed jobs' servers and aggregators left on this node
    began = time.monotonic()
    failed = preimport([*([] if args.only else IMPORTS), *args.imports])
    import gc

    gc.collect()
    gc.freeze()  # what the imports made stays shared with every child, never copied by a collection
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    log(json.dumps({"ready_s": round(time.monotonic() - began, 2), "threads": threads, "not_imported": failed}))
    server = Server(listener, start_env)
    signal.signal(signal.SIGTERM, lambda *_: server.end())
    server.serve()
    with contextlib.suppress(OSError):  # the job ends: this node's in-memory snapshots go
        os.unlink(marker)
    if args.run_dir:
        from clusterctl.checkpoint import snapshots

        snapshots.remove_node(snapshots.default_root(), os.path.basename(args.run_dir.rstrip("/")), node())
    return 0


if __name__ == "__main__":
    sys.exit(main())
