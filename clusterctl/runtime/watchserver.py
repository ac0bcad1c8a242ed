"""The controller's side of the heartbeat path: aggregators' batches in, verdicts out.

One thread serves every node aggregator's TCP connection (JSON lines, a
`hello` with the attempt token first: a stale aggregator is turned away),
feeds the watchdog, appends what it learns to attempt-N/timeline.jsonl and,
once armed (the rendezvous passed), asks the watchdog for a verdict a few
times a second. A verdict is handed to the controller's callback once.

timeline.jsonl, one JSON object per line, `t` the controller's receive time:
  {"t", "kind": "phase", "rank", "node", "step", "phase", "at"}     a rank entered a phase (`at`: the rank's clock)
  {"t", "kind": "step", "rank", "node", "step", "phase", "at", "step_s", "compute_s"}  a rank finished a step
  {"t", "kind": "gone", "rank", "node", "pid"}         the rank's process ended
  {"t", "kind": "gpu", "node", "gpus": {index: facts}} an NVML sample
  {"t", "kind": "node_lost", "node"}                   its aggregator vanished
  {"t", "kind": "verdict", "code", "message"}          the watchdog's verdict
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from clusterctl import rundir
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import write_json_atomic
from clusterctl.runtime import registry
from clusterctl.runtime.blame import Facts, TaskEnd, judge_end, lost_node_verdict, node_failures, parse_srun_lines
from clusterctl.runtime.watchdog import Watchdog

CHECK_EVERY_S = 0.25
MAX_LINE = 1 << 24
DUMP_WAIT_S = 3.0  # how long the survivors get to write their stacks before they are stopped
NODE_LOST_CONFIRM_S = 3.0  # an aggregator gone without goodbye this long: its node is lost (not an attempt ending)
SETTLE_S = 2.0  # how long the end-of-attempt judgement waits for the aggregators' last words


def _task_ends(srun_log: Path) -> list[TaskEnd]:
    try:
        return parse_srun_lines(srun_log.read_text(errors="replace").splitlines())
    except OSError:
        return []


def _node_failures(srun_log: Path) -> set[str]:
    try:
        return node_failures(srun_log.read_text(errors="replace").splitlines())
    except OSError:
        return set()


def _written(attempt_dir: Path, rank: int) -> bool:
    try:
        return rundir.stack_file(attempt_dir, rank).stat().st_size > 0
    except OSError:
        return False


class WatchServer:
    def __init__(
        self,
        listener: socket.socket,
        token: str,
        watchdog: Watchdog,
        timeline: Path,
        on_finding: Callable[[registry.Verdict], None],
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
        self.lost_nodes: dict[str, float] = {}
        self.finding: registry.Verdict | None = None
        self.armed = False
        self.closing = False
        self._timeline: TextIO = open(timeline, "a", encoding="utf-8")
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

    # --- acting on a verdict, judging the end ----------------------------------------
    def respond(self, verdict: registry.Verdict, attempt_dir: Path) -> registry.Verdict:
        """Write the verdict; on a hang, collect the survivors' stacks first; then stop every rank."""
        write_json_atomic(attempt_dir / rundir.VERDICT, verdict.as_dict())
        self.log(verdict.message)
        if verdict.code == ExitCode.HANG:
            self.send_all("dump")
            waiting = [v["rank"] for v in verdict.victims]
            deadline = time.monotonic() + DUMP_WAIT_S
            while time.monotonic() < deadline and not all(_written(attempt_dir, r) for r in waiting):
                time.sleep(0.1)
            stacks = {str(r): str(rundir.stack_file(attempt_dir, r).relative_to(attempt_dir)) for r in waiting if _written(attempt_dir, r)}
            traces = sorted(p.name for p in attempt_dir.glob(f"{rundir.NCCL_TRACE_PREFIX}*"))
            verdict.evidence["stacks"] = stacks
            if traces:
                verdict.evidence["nccl_flight_recorder"] = traces
            write_json_atomic(attempt_dir / rundir.VERDICT, verdict.as_dict())
        self.send_all("kill")
        return verdict

    def judge_end(self, errors: dict[int, str], srun_log: Path, gpus: dict[int, Any]) -> registry.Verdict | None:
        """The attempt ended: culprits apart from victims, from srun's task lines, the ranks' errors,
        and what the aggregators saw (when each process ended, which nodes vanished)."""
        if not errors and not self.lost_nodes and not any(e.signalled or e.exit_code for e in _task_ends(srun_log)):
            return None  # every rank ended well (or on request): nothing to judge
        states = self.watchdog.ranks

        def accounted() -> bool:  # each rank's end seen, or never to be seen
            return all(r.process == "gone" or r.pid is None or r.node in self.lost_nodes for r in states)

        self.wait_until(accounted, SETTLE_S)
        with self.lock:
            deaths = {r.rank: r.gone_at for r in states if r.gone_at is not None}
            lost = dict(self.lost_nodes)
        wd = self.watchdog
        facts = Facts(wd.world, wd.hosts, wd.gpn, gpus, errors, _task_ends(srun_log), deaths, lost, _node_failures(srun_log))
        return judge_end(facts)

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
                    self._write({"t": now, "kind": "gpu", "node": node, "gpus": beat.get("gpus", {})})
                    continue
                self.watchdog.observe(beat, now)
                if beat.get("kind") in ("phase", "step"):
                    record = {"t": now, "kind": beat["kind"], "rank": beat.get("rank"), "node": node}
                    record.update(step=beat.get("step"), phase=beat.get("phase"), at=beat.get("t"))
                    if beat["kind"] == "step":
                        record.update(step_s=beat.get("step_s"), compute_s=beat.get("compute_s"))
                    self._write(record)
            for rank, status in (msg.get("procs") or {}).items():
                if str(rank).isdigit():
                    self.watchdog.observe_process(int(rank), status, now)
            self._timeline.flush()
        elif kind == "gone":
            rank = int(msg.get("rank", -1))
            when = float(msg.get("t", now))
            self.watchdog.observe_process(rank, "gone", when)
            self._write({"t": now, "kind": "gone", "rank": rank, "node": node, "pid": msg.get("pid"), "at": when})
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
                self.lost_nodes.setdefault(node, time.time())
                self._write({"t": time.time(), "kind": "node_lost", "node": node})
                self._timeline.flush()
                self.log(f"lost the aggregator of node {node}")
            self.changed.notify_all()

    def _check(self) -> None:
        now = time.time()
        with self.lock:
            if not self.armed or self.finding is not None:
                return
            if self.lost_nodes:
                finding = self._node_lost(now)
            elif any(r.process == "gone" or r.closed for r in self.watchdog.ranks):
                return  # ranks are ending: the end-of-attempt judgement decides, not the hang clock
            else:
                finding = self.watchdog.check(now)
            if finding is None:
                return
            self.finding = finding
            self._write({"t": now, "kind": "verdict", "code": finding.code, "message": finding.message})
            self._timeline.flush()
        self.on_finding(finding)

    def _node_lost(self, now: float) -> registry.Verdict | None:
        """An aggregator gone without goodbye for NODE_LOST_CONFIRM_S: its node is lost, said now rather
        than when srun ends, which on a dead node waits until Slurm declares it down (SlurmdTimeout)."""
        node, when = min(self.lost_nodes.items(), key=lambda item: item[1])
        if now - when < NODE_LOST_CONFIRM_S:
            return None
        wd = self.watchdog
        deaths = {r.rank: r.gone_at for r in wd.ranks if r.gone_at is not None}
        return lost_node_verdict(Facts(wd.world, wd.hosts, wd.gpn, deaths=deaths, lost_nodes=dict(self.lost_nodes)), node, when)

    def _write(self, record: dict[str, Any]) -> None:
        self._timeline.write(json.dumps(record) + "\n")
