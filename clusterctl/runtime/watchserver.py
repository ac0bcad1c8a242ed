"""The controller's side of the heartbeat path: a transport that feeds the watchdog.

One thread serves every node aggregator's TCP connection (JSON lines, a
`hello` with the attempt token first: a stale aggregator is turned away),
feeds the watchdog, appends what it learns to attempt-N/timeline.jsonl
(rundir/timeline.py has the records) and, once armed (the rendezvous
passed), asks the watchdog a few times a second whether a verdict is due.
The first finding goes to the controller's callback, once; the controller
records it (runtime/verdicts.py) and acts on it through `send_all`.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from clusterctl.rundir import timeline
from clusterctl.rundir.verdict import Verdict
from clusterctl.runtime.watchdog import Watchdog

CHECK_EVERY_S = 0.25
MAX_LINE = 1 << 24


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
        self.conns: dict[socket.socket, dict[str, Any]] = {}  # conn -> {node, buffer, greeted}
        self.finding: Verdict | None = None
        self.armed = False
        self.closing = False
        self._timeline = timeline.TimelineWriter(timeline_path)
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
    def send_all(self, command: str) -> int:
        """Send a command to every connected aggregator; how many got it."""
        data = (json.dumps({"cmd": command}) + "\n").encode()
        sent = 0
        with self.lock:
            for conn, info in list(self.conns.items()):
                if not info.get("greeted"):
                    continue
                try:
                    conn.setblocking(True)
                    conn.sendall(data)
                    conn.setblocking(False)
                    sent += 1
                except OSError:
                    pass
        return sent

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
        self._timeline.close()

    # --- the thread -----------------------------------------------------------------
    def _serve(self) -> None:
        next_check = time.monotonic() + CHECK_EVERY_S
        while True:
            with self.lock:
                if self.closing:
                    return
            for key, _ in self.selector.select(timeout=CHECK_EVERY_S):
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_EVERY_S
                self._check()

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ)
        with self.lock:
            self.conns[conn] = {"node": None, "buffer": b"", "greeted": False}

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
        if len(info["buffer"]) > MAX_LINE:
            self._drop(conn, info)
            return
        now = time.time()
        lines = info["buffer"].split(b"\n")
        info["buffer"] = lines.pop()
        with self.changed:
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if not info["greeted"]:
                    if msg.get("kind") != "hello" or msg.get("token") != self.token:
                        self.log(f"turned away an aggregator with a stale or missing attempt token ({msg.get('node')})")
                        self.selector.unregister(conn)
                        del self.conns[conn]
                        conn.close()
                        return
                    info["greeted"], info["node"] = True, str(msg.get("node", "?"))
                    continue
                self._handle(info, msg, now)
            self.changed.notify_all()

    def _handle(self, info: dict[str, Any], msg: dict[str, Any], now: float) -> None:
        kind = msg.get("kind")
        node = info["node"]
        if kind == "batch":
            for beat in msg.get("beats", []):
                if beat.get("kind") == "gpu":
                    self.watchdog.observe_gpus(node, beat.get("gpus", {}))
                    self._timeline.write(timeline.GPU, now, node=node, gpus=beat.get("gpus", {}))
                    continue
                self.watchdog.observe(beat, now)
                if beat.get("kind") in (timeline.PHASE, timeline.STEP):
                    self._timeline.write(beat["kind"], now, rank=beat.get("rank"), node=node, step=beat.get("step"),
                                         phase=beat.get("phase"), at=beat.get("t"), step_s=beat.get("step_s"),
                                         compute_s=beat.get("compute_s"))
            for rank, status in (msg.get("procs") or {}).items():
                if str(rank).isdigit():
                    self.watchdog.observe_process(int(rank), status, now)
            self._timeline.flush()
        elif kind == "gone":
            rank = int(msg.get("rank", -1))
            when = float(msg.get("t", now))
            self.watchdog.observe_process(rank, "gone", when)
            self._timeline.write(timeline.GONE, now, rank=rank, node=node, pid=msg.get("pid"), at=when)
            self._timeline.flush()
        elif kind == "bye":
            info["bye"] = True

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
