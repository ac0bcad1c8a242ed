"""The node aggregator: one per node per attempt, its own srun step, standard library only.

    python -m clusterctl.runtime.node.aggregator

The batch script starts it on every node (`srun --overlap`, one task per
node) before the ranks, so a dead rank cannot take its node's heartbeats
with it. It

* receives the ranks' heartbeat datagrams on a Unix socket named from the
  attempt token and the node (wire/heartbeat.py, which defines every message here);
* watches each rank's process (a pidfd, so a death is seen the moment it
  happens; /proc for stopped processes);
* samples the node's GPUs through NVML every few seconds where pynvml
  imports (throttle reasons, clocks, temperature, ECC counters);
* sends the controller one JSON line per interval over TCP — a row per rank
  that digests its messages (wire/heartbeat.RankDigest), process states and
  the latest GPU sample — after a `hello` that answers the controller's
  challenge with the attempt token (runtime/wire/greeting.py), and a `gone`
  line at once when a rank's process ends;
* obeys the controller's commands: `dump` (SIGURG to every rank, on which
  faulthandler writes its stacks, and a write to each NCCL flight recorder
  pipe) and `kill` (SIGKILL to every rank of the node).

It exits when the controller closes the connection or on SIGTERM.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from clusterctl import envnames, rundir
from clusterctl.procfs import process_state
from clusterctl.runtime.node import leftovers
from clusterctl.runtime.node.gpusample import GpuSampler
from clusterctl.runtime.wire import greeting
from clusterctl.runtime.wire import heartbeat as wire
from clusterctl.runtime.wire.heartbeat import socket_path
from clusterctl.runtime.wire.stacks import DUMP_SIGNAL

INTERVAL_S = 1.0
GPU_EVERY_S = 5.0
CONNECT_TIMEOUT_S = 60.0


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} clusterctl aggregator: {message}", flush=True)


_STATES = {"R": "running", "S": "sleeping", "D": "sleeping", "T": "stopped", "t": "stopped", "Z": "gone", "X": "gone", "": "gone"}


def rank_state(pid: int) -> str:
    """running, sleeping, stopped or gone."""
    return _STATES.get(process_state(pid), "running")


class Aggregator:
    def __init__(self, node: str, token: str, controller: tuple[str, int], sock_path: str, attempt_dir: Path | None) -> None:
        self.node = node
        self.token = token
        self.controller = controller
        self.sock_path = sock_path
        self.attempt_dir = attempt_dir
        self.digests: dict[int, wire.RankDigest] = {}  # rank -> what it said since the last batch
        self.cap, self.detail = wire.MIN_CAP, True  # what a rank's row may carry: the controller's welcome says
        self.gpu_sample: dict[str, Any] | None = None  # taken since the last batch
        self.said_states: dict[str, str] = {}  # rank -> the process state the controller was last told
        self.pids: dict[int, int] = {}  # rank -> pid
        self.pidfds: dict[int, int] = {}  # pidfd -> rank
        self.reported: dict[int, str] = {}  # rank -> process state last sent
        self.stop = False
        self.gpus = GpuSampler()
        self.out: socket.socket | None = None
        self.inbox = b""

    # --- set-up -------------------------------------------------------------------
    def open_socket(self) -> socket.socket:
        try:
            os.unlink(self.sock_path)
        except FileNotFoundError:
            pass
        own_job = os.environ.get(envnames.WARM, "")
        leftovers.sweep(os.path.dirname(self.sock_path) or ".", keep=self.sock_path, job=own_job)  # killed jobs' sockets, pid files
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(self.sock_path)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.setblocking(False)
        return sock

    def connect(self) -> socket.socket:
        """A connection the controller welcomed. One closed before the welcome (a stranger's flood crowded it out
        at attempt start, the controller still starting) is tried again until the window ends: an aggregator that
        took that close for "the controller is done" would leave its node unwatched, in silence."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        last: OSError | None = None
        while time.monotonic() < deadline and not self.stop:
            conn = None
            try:
                conn = socket.create_connection(self.controller, timeout=5)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                challenge, rest = self.line(conn, b"")
                if challenge.get("kind") != greeting.CHALLENGE or not isinstance(challenge.get("nonce"), str):
                    raise OSError("the controller's first line is not a challenge")
                conn.sendall(greeting.hello(self.token, challenge["nonce"], self.node, os.getpid()))
                welcome, self.inbox = self.line(conn, rest)
                if welcome.get("kind") != greeting.WELCOME:
                    raise OSError("the controller did not welcome the hello")
                if isinstance(welcome.get("cap"), int) and welcome["cap"] > 0:
                    self.cap = welcome["cap"]
                self.detail = welcome.get("detail") is not False
                conn.setblocking(False)
                return conn
            except OSError as exc:
                last = exc
                if conn is not None:
                    conn.close()
                time.sleep(0.2)
        raise OSError(f"cannot reach the controller at {self.controller[0]}:{self.controller[1]}: {last}")

    @staticmethod
    def line(conn: socket.socket, data: bytes) -> tuple[dict[str, Any], bytes]:
        """The controller's next line as a JSON object (after `data`, already read), and what came after it."""
        while b"\n" not in data:
            chunk = conn.recv(4096)
            if not chunk or len(data) > 4096:
                raise OSError("the controller closed the connection before its greeting ended")
            data += chunk
        first, rest = data.split(b"\n", 1)
        try:
            msg = json.loads(first)
        except ValueError:
            msg = None
        return (msg if isinstance(msg, dict) else {}), rest

    # --- the loop -----------------------------------------------------------------------
    def run(self) -> int:
        inbound = self.open_socket()
        try:
            self.out = self.connect()
        except OSError as exc:
            log(str(exc))
            return 1
        log(f"node {self.node}: heartbeats on {self.sock_path}, batches to {self.controller[0]}:{self.controller[1]}")
        next_batch = time.monotonic() + INTERVAL_S
        next_gpu = time.monotonic()
        try:
            while not self.stop:
                timeout = max(0.0, next_batch - time.monotonic())
                readers = [inbound, self.out, *self.pidfds]
                ready, _, _ = select.select(readers, [], [], timeout)
                for item in ready:
                    if item is inbound:
                        self.receive(inbound)
                    elif item is self.out:
                        if not self.commands():
                            return 0  # the controller is done with this attempt
                    else:
                        self.rank_ended(item)
                now = time.monotonic()
                if now >= next_gpu:
                    self.sample_gpus()
                    next_gpu = now + GPU_EVERY_S
                if now >= next_batch:
                    self.send_batch()
                    next_batch = now + INTERVAL_S
        except (BrokenPipeError, ConnectionError):
            return 0
        finally:
            try:
                self.send({"kind": wire.BYE, "node": self.node})
            except BrokenPipeError:
                pass
            inbound.close()
            for fd in list(self.pidfds):
                os.close(fd)
            try:
                os.unlink(self.sock_path)
            except OSError:
                pass
        return 0

    def receive(self, inbound: socket.socket) -> None:
        while True:
            try:
                data = inbound.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            msg = wire.parse_rank_message(data)
            if msg is None:
                continue
            rank, pid = msg["rank"], msg.get("pid") or 0
            if pid and rank not in self.pids:
                self.watch(rank, pid)
            digest = self.digests.get(rank)
            if digest is None:
                digest = self.digests[rank] = wire.RankDigest(rank, self.cap, self.detail)
            digest.take(msg)
            if msg["kind"] == wire.CLOSED:
                self.send_batch()  # the rank's loop is done: its last steps go now, not at the next batch

    def watch(self, rank: int, pid: int) -> None:
        self.pids[rank] = pid
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            return  # gone already, or no pidfd here: /proc is polled at each batch instead
        self.pidfds[fd] = rank

    def rank_ended(self, fd: int) -> None:
        """The rank's process ended: what it said last goes first (the attempt may end before the next batch)."""
        rank = self.pidfds.pop(fd)
        os.close(fd)
        if any(d.heard for d in self.digests.values()):
            self.send_batch()
        if self.reported.get(rank) != "gone":
            self.reported[rank] = "gone"
            self.send({"kind": wire.GONE, "node": self.node, "rank": rank, "pid": self.pids.get(rank), "t": time.time()})

    def processes(self) -> dict[str, str]:
        states = {}
        for rank, pid in self.pids.items():
            state = "gone" if self.reported.get(rank) == "gone" else rank_state(pid)
            states[str(rank)] = state
            if state == "gone" and self.reported.get(rank) != "gone":
                self.reported[rank] = "gone"
                self.send({"kind": wire.GONE, "node": self.node, "rank": rank, "pid": pid, "t": time.time()})
        return states

    def sample_gpus(self) -> None:
        sample = self.gpus.sample()
        if sample:
            self.gpu_sample = sample

    def send_batch(self) -> None:
        rows = [row for row in (d.row() for d in self.digests.values()) if row is not None]
        gpus, self.gpu_sample = self.gpu_sample, None
        states = self.processes()
        changed = {rank: state for rank, state in states.items() if self.said_states.get(rank) != state}
        self.said_states = states  # each state once, then its changes: 100,000 ranks' every second cost the controller
        self.send(wire.batch(self.node, time.time(), rows, changed, gpus))

    def send(self, message: dict[str, Any]) -> None:
        if self.out is None:
            return
        data = (json.dumps(message) + "\n").encode()
        self.out.setblocking(True)
        try:
            self.out.sendall(data)
        except OSError:
            self.out = None
            raise BrokenPipeError("the controller went away") from None
        finally:
            if self.out is not None:
                self.out.setblocking(False)

    def commands(self) -> bool:
        """Read the controller's commands; False when it closed the connection."""
        assert self.out is not None
        try:
            data = self.out.recv(65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        self.inbox += data
        while b"\n" in self.inbox:
            line, self.inbox = self.inbox.split(b"\n", 1)
            command = wire.command(line)
            if command == wire.DUMP:
                self.dump()
            elif command == wire.KILL:
                self.kill()
        return True

    def dump(self) -> None:
        """Ask every live rank for its stacks (faulthandler) and its NCCL flight recorder."""
        for rank, pid in sorted(self.pids.items()):
            try:
                os.kill(pid, DUMP_SIGNAL)
            except OSError:
                continue
            if self.attempt_dir is not None:
                pipe = self.attempt_dir / f"{rundir.NCCL_PIPE_PREFIX}{rank}.pipe"
                try:  # non-blocking: a pipe nobody reads (no NCCL here) must not stall the aggregator
                    fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:
                    continue
                try:
                    os.write(fd, b"1")
                except OSError:
                    pass
                finally:
                    os.close(fd)
        log(f"asked {len(self.pids)} rank(s) on {self.node} for their stacks")

    def kill(self) -> None:
        for pid in self.pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        log(f"stopped {len(self.pids)} rank(s) on {self.node} on the controller's verdict")


def main() -> int:
    env = os.environ
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    token = env.get(envnames.TOKEN, "")
    host, _, port = env.get(envnames.WATCH_ADDR, "").rpartition(":")
    directory = env.get(envnames.HEARTBEAT_DIR)
    if not (token and port.isdigit() and directory):
        log(f"needs {envnames.TOKEN}, {envnames.WATCH_ADDR} and {envnames.HEARTBEAT_DIR} (set by the batch script)")
        return 2
    attempt_dir = Path(env[envnames.ATTEMPT_DIR]) if env.get(envnames.ATTEMPT_DIR) else None
    agg = Aggregator(node, token, (host.strip("[]"), int(port)), socket_path(directory, token, node), attempt_dir)

    def stop(*_: Any) -> None:
        agg.stop = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return agg.run()


if __name__ == "__main__":
    sys.exit(main())
