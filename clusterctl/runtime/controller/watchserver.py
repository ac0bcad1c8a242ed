"""The controller's side of the heartbeat path: a transport that feeds the watchdog.

One thread serves every node aggregator's TCP connection (JSON lines, a
`hello` that answers the connection's challenge with the attempt token first,
runtime/wire/greeting.py: a stale aggregator or a stranger is turned away),
feeds the watchdog, appends what it learns to attempt-N/timeline.jsonl
(rundir/timeline.py has the records) and, once armed (the rendezvous
passed), asks the watchdog a few times a second whether a verdict is due.
The first finding goes to the controller's callback, once; the controller
records it (runtime/controller/keeper.py) and acts on it through `send_all`.

Whoever can reach the port cannot make the controller hold much or wait:
before its hello a connection may send PRE_HELLO_BYTES and take
HELLO_DEADLINE_S, and there are at most UNGREETED_PER_PEER such connections
from one address (UNGREETED_TOTAL in all); a greeted one's line is at most
MAX_LINE; one hello per node. Sends never block the thread: a command waits
in the connection's own buffer, and a connection that lets OUT_LIMIT pile
up (it stopped reading) is dropped (a node's aggregator: its node is lost,
after the watchdog's usual confirmation).

Nothing a peer sends can stop the thread: a line that cannot be parsed
(nested past any depth, not JSON) is skipped, and any error while serving
one connection drops that connection alone. Refusals are logged once per
peer address and reason and then counted, in one line per REFUSAL_SUMMARY_S, never
with more than SHOWN_CHARS of the peer's own text: a flood cannot fill the
batch log. Should the thread itself fail, it says so as the attempt's
verdict: detection is never off in silence.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from clusterctl import jsonfast
from clusterctl.exitcodes import BUG_REPORT_HINT, ExitCode
from clusterctl.rundir import timeline
from clusterctl.rundir.verdict import Verdict
from clusterctl.runtime.controller.watchdog import Watchdog
from clusterctl.runtime.wire import greeting
from clusterctl.runtime.wire import heartbeat as wire

CHECK_EVERY_S = 0.25
MAX_LINE = 1 << 22  # a greeted aggregator's one-second batch, however many steps it holds
PRE_HELLO_BYTES = 4096
HELLO_DEADLINE_S = 10.0
UNGREETED_PER_PEER = 32
UNGREETED_TOTAL = 256
OUT_LIMIT = 1 << 16  # commands are a few bytes: a backlog this size means the peer stopped reading
REFUSAL_SUMMARY_S = 60.0  # after a peer's first refusal is logged, its later ones are counted, one line this often
SHOWN_CHARS = 40  # of a peer's own text (the node a stranger's hello names) in a log line
DETAIL_RANKS = 1024  # a world this size or smaller has every rank's phases and steps in the timeline...
DETAIL_NODES = 64  # ...a larger one those of this many nodes, spread evenly (deaths, lost nodes, verdicts: all)


def detail_nodes(hosts: list[str], gpus_per_node: int) -> set[str] | None:
    """The nodes whose ranks' phases and steps the timeline records: every node of a small world; of a large one,
    DETAIL_NODES spread evenly from the first to the last (at 1 s steps a rank's records are 2.1 MB an hour: 100,000
    ranks' would be 210 GB, and one process cannot write them as fast as they come). None: every node."""
    if len(hosts) * gpus_per_node <= DETAIL_RANKS or len(hosts) <= DETAIL_NODES:
        return None
    return {hosts[round(i * (len(hosts) - 1) / (DETAIL_NODES - 1))] for i in range(DETAIL_NODES)}


def shown(value: Any) -> str:
    """A peer's value as a log line may show it: repr'd, at most SHOWN_CHARS."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


class RefusalLog:
    """Refused connections, logged at a bounded rate: each peer's first in full, the rest counted per period."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.counts: dict[str, int] = {}  # peer -> refusals not yet logged
        self.seen: set[tuple[str, str]] = set()  # (peer, kind) logged once
        self.last_summary = time.monotonic()

    def refused(self, peer: str, kind: str, why: str) -> None:
        """`kind`: the refusal's reason in a word or two (its first time from a peer is logged with `why`)."""
        if (peer, kind) not in self.seen:
            self.seen.add((peer, kind))
            self.log(f"turned away a connection: {why}")
            return
        self.counts[peer] = self.counts.get(peer, 0) + 1

    def summarize(self, now: float, force: bool = False) -> None:
        """One line per period for the peers refused again since the last one."""
        if not self.counts or (not force and now - self.last_summary < REFUSAL_SUMMARY_S):
            return
        self.last_summary = now
        busiest = sorted(self.counts.items(), key=lambda item: -item[1])
        said = ", ".join(f"{n} from {peer}" for peer, n in busiest[:5]) + (
            f" and {sum(n for _, n in busiest[5:])} from {len(busiest) - 5} more addresses" if len(busiest) > 5 else "")
        self.log(f"turned away {sum(self.counts.values())} more connections ({said}), logged once a minute")
        self.counts.clear()


class WatchServer:
    def __init__(
        self,
        listener: socket.socket,
        token: str,
        watchdog: Watchdog,
        timeline_path: Path,
        on_finding: Callable[[Verdict], None],
        log: Callable[[str], None] = print,
    ) -> None:
        self.listener = listener
        self.token = token
        self.watchdog = watchdog
        self.on_finding = on_finding
        self.log = log
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.selector = selectors.DefaultSelector()
        self.conns: dict[socket.socket, dict[str, Any]] = {}  # conn -> {node, buffer, greeted, nonce, peer, since, out}
        self.finding: Verdict | None = None
        self.armed = False
        self.closing = False
        self._timeline = timeline.TimelineWriter(timeline_path)
        self._detail = detail_nodes(watchdog.hosts, watchdog.gpn)  # None: every node
        self._cap = wire.welcome_cap(watchdog.world)
        self.refusals = RefusalLog(log)
        self._thread = threading.Thread(target=self._serve, name="clusterctl-watch", daemon=True)

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def start(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)
        self._thread.start()

    def arm(self) -> None:
        """The ranks are training: from now on the watchdog may give verdicts."""
        with self.lock:
            self.armed = True

    # --- commands to the nodes ---------------------------------------------------
    def send_all(self, command: str, nodes: set[str] | None = None) -> int:
        """Send a command to every connected aggregator (of `nodes`, when given); how many got it."""
        data = wire.command_line(command)
        sent = 0
        with self.lock:
            for conn, info in list(self.conns.items()):
                if info.get("greeted") and (nodes is None or info.get("node") in nodes):
                    info["out"] += data
                    sent += self._flush(conn, info)
        return sent

    def _flush(self, conn: socket.socket, info: dict[str, Any]) -> bool:
        """Send what waits for this connection without blocking (under the lock); whether all of it went."""
        try:
            while info["out"]:
                info["out"] = info["out"][conn.send(info["out"]):]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            info["stuck"] = True
        if len(info["out"]) > OUT_LIMIT:
            info["stuck"] = True
        return not info["out"]

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait (under the lock, woken by each message) until predicate() holds or the timeout passes."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True

    def close(self) -> None:
        with self.lock:
            self.closing = True
        self._thread.join(timeout=2)
        for conn in list(self.conns):
            try:
                conn.close()
            except OSError:
                pass
        try:
            self.listener.close()
        except OSError:
            pass
        self.refusals.summarize(time.monotonic(), force=True)
        self._timeline.close()

    # --- the thread -----------------------------------------------------------------
    def _serve(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - whatever it is, detection must not end unsaid
            self._died(exc)

    def _loop(self) -> None:
        next_check = time.monotonic() + CHECK_EVERY_S
        while True:
            with self.lock:
                if self.closing:
                    return
            for key, _ in self.selector.select(timeout=CHECK_EVERY_S):
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._serve_one(key.fileobj)  # type: ignore[arg-type]
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_EVERY_S
                self._tend()
                self._check()
                self.refusals.summarize(time.monotonic())

    def _serve_one(self, conn: socket.socket) -> None:
        """One connection's input; an error it causes is that connection's, never the thread's that serves every
        node: a stranger's connection is turned away, a node's keeps going without what raised (dropping it would
        call its node lost, a blame no node earned)."""
        try:
            self._read(conn)
        except Exception as exc:  # noqa: BLE001 - a peer's input, however odd, costs the thread nothing
            info = self.conns.get(conn)
            if info is None:
                return
            if info.get("greeted"):
                info["buffer"] = b""
                self.log(f"skipped input from node {shown(info['node'])}: serving it raised {type(exc).__name__}")
            else:
                with self.lock:
                    self._refuse(conn, f"serving a connection from {info['peer']} raised {type(exc).__name__}", "raised")

    def _died(self, exc: BaseException) -> None:
        """The serving thread failed: the attempt ends with a verdict that says detection stopped, not in silence."""
        why = f"{type(exc).__name__}: {exc}"[:200]
        self.log(f"the watch server stopped ({why}): hang and straggler detection is off, so the attempt ends")
        finding = Verdict(False, int(ExitCode.BUG), f"the watch server stopped ({why}): hang and straggler detection"
                          f" was off, so the attempt was ended; {BUG_REPORT_HINT}", [])
        with self.lock:
            if self.finding is not None:
                return
            self.finding = finding
        self.on_finding(finding)

    def _tend(self) -> None:
        """Send what waits; close connections that never greeted in time, drop those that stopped reading."""
        now = time.monotonic()
        with self.lock:
            for conn, info in list(self.conns.items()):
                if info["out"]:
                    self._flush(conn, info)
                if not info["greeted"] and now - info["since"] > HELLO_DEADLINE_S:
                    self._refuse(conn, f"no hello within {HELLO_DEADLINE_S:.0f} s from {info['peer']}", "late")
        for conn, info in [(c, i) for c, i in list(self.conns.items()) if i.get("stuck")]:
            self.log(f"dropped the connection of node {info['node']}: it stopped reading ({len(info['out'])} bytes waiting)")
            self._drop(conn, info)

    def _refuse(self, conn: socket.socket, why: str | None, kind: str = "") -> None:
        """Close a connection that never greeted (under the lock): nothing it sent counted. `why` is logged the
        first time a peer is refused for `kind`, and counted after (None: never one by one, a flood's oldest)."""
        try:
            self.selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        info = self.conns.pop(conn, None)
        if why:
            self.refusals.refused(info["peer"] if info else "?", kind, why)  # before the close, which the peer sees at once
        conn.close()

    def _accept(self) -> None:
        try:
            conn, address = self.listener.accept()
        except OSError:
            return
        peer = str(address[0]) if isinstance(address, tuple) else "?"
        with self.lock:
            # Over a cap, the oldest waiting connection (from this address, else any) makes room: a flood has to
            # keep churning, and a genuine aggregator, which greets at once, gets in between.
            waiting = sorted(((i["since"], c, i) for c, i in self.conns.items() if not i["greeted"]), key=lambda w: w[0])
            mine = [w for w in waiting if w[2]["peer"] == peer]
            if len(mine) >= UNGREETED_PER_PEER or len(waiting) >= UNGREETED_TOTAL:
                _, oldest, _ = (mine if len(mine) >= UNGREETED_PER_PEER else waiting)[0]
                self._refuse(oldest, None)
            conn.setblocking(False)
            nonce, line = greeting.challenge()
            info = {"node": None, "buffer": b"", "greeted": False, "nonce": nonce, "peer": peer,
                    "since": time.monotonic(), "out": line}
            self.conns[conn] = info
            self._flush(conn, info)
        self.selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        info = self.conns.get(conn)
        if info is None:
            return
        try:
            data = conn.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, info)
            return
        info["buffer"] += data
        if not info["greeted"] and len(info["buffer"]) > PRE_HELLO_BYTES:
            with self.lock:
                self._refuse(conn, f"{len(info['buffer'])} bytes before a hello from {info['peer']}", "bytes")
            return
        if len(info["buffer"]) > MAX_LINE:
            self._drop(conn, info)
            return
        now = time.time()
        lines = info["buffer"].split(b"\n")
        info["buffer"] = lines.pop()
        with self.changed:
            for line in lines:
                try:
                    msg = jsonfast.loads(line)
                except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
                    continue
                if not isinstance(msg, dict):
                    continue
                if not info["greeted"]:
                    node = msg.get("node")
                    if not greeting.verify(self.token, info["nonce"], msg):
                        self._refuse(conn, f"a hello without this attempt's secret from {info['peer']} (node {shown(node)})", "secret")
                        return
                    if any(i["greeted"] and i["node"] == node for i in self.conns.values()):
                        self._refuse(conn, f"a second hello for node {shown(node)} from {info['peer']}", "twin")
                        return
                    info["greeted"], info["node"] = True, node
                    info["out"] += greeting.welcome_line(self._cap, self._in_detail(node))  # it retries until it reads this
                    self._flush(conn, info)
                    continue
                try:
                    self._handle(info, msg, now)
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass  # a malformed record from a greeted peer: ignored, the connection and the server go on
            self.changed.notify_all()

    def _handle(self, info: dict[str, Any], msg: dict[str, Any], now: float) -> None:
        kind = msg.get("kind")
        node = info["node"]
        if kind == wire.BATCH:
            detail = self._in_detail(node)
            parse, observe = wire.parse_row, self.watchdog.observe_row  # 100,000 rows a second at 100,000 ranks
            for raw in msg.get("ranks") or []:
                row = parse(raw)
                if row is None:
                    continue
                observe(row, now)
                if detail:
                    self._record(row, node, now)
            gpus = msg.get("gpus")
            if isinstance(gpus, dict):
                self.watchdog.observe_gpus(node, gpus)
                self._timeline.write(timeline.GPU, now, node=node, gpus=gpus)
            for rank, status in (msg.get("procs") or {}).items():
                if str(rank).isdigit():
                    self.watchdog.observe_process(int(rank), status, now)
            self._timeline.flush()
        elif kind == wire.GONE:
            rank = int(msg.get("rank", -1))
            when = float(msg.get("t", now))
            self.watchdog.observe_process(rank, wire.GONE, when)
            self._timeline.write(timeline.GONE, now, rank=rank, node=node, pid=msg.get("pid"), at=when)
            self._timeline.flush()
        elif kind == wire.BYE:
            info["bye"] = True

    def _in_detail(self, node: Any) -> bool:
        return self._detail is None or node in self._detail

    def _record(self, row: tuple[Any, ...], node: str, now: float) -> None:
        """A row's phase changes and steps as the timeline's records, in the order the rank made them."""
        rank, changes, steps = row[0], row[9], row[10]
        i = j = 0
        while i < len(changes) or j < len(steps):
            # the earlier first; at the same time, a step reported in the phase just entered comes after the change
            if j == len(steps) or (i < len(changes) and (changes[i][2] < steps[j][2] or (
                    changes[i][2] == steps[j][2] and changes[i][0] == steps[j][1]))):
                phase, step, at = changes[i]
                self._timeline.write(timeline.PHASE, now, rank=rank, node=node, step=step, phase=phase, at=at)
                i += 1
            else:
                step, phase, at, step_s, compute_s = steps[j]
                self._timeline.write(timeline.STEP, now, rank=rank, node=node, step=step, phase=phase, at=at,
                                     step_s=step_s, compute_s=compute_s)
                j += 1

    def _drop(self, conn: socket.socket, info: dict[str, Any]) -> None:
        try:
            self.selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()
        with self.changed:
            self.conns.pop(conn, None)
            node = info.get("node")
            if info.get("greeted") and not info.get("bye") and not self.closing and node:
                self.watchdog.observe_node_lost(node, time.time())
                self._timeline.write(timeline.NODE_LOST, time.time(), node=node)
                self._timeline.flush()
                self.log(f"lost the aggregator of node {node}")
            self.changed.notify_all()

    def _check(self) -> None:
        now = time.time()
        with self.lock:
            if not self.armed or self.finding is not None:
                return
            finding = self.watchdog.verdict(now)
            if finding is None:
                return
            self.finding = finding
            self._timeline.write(timeline.VERDICT, now, code=finding.code, message=finding.message)
            self._timeline.flush()
        self.on_finding(finding)
