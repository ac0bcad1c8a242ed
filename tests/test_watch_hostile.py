"""The controller's watch port against whoever can reach it: strangers cannot greet, flood, stall or fool it.

A real WatchServer with its watchdog, on 127.0.0.1, and real sockets: the
connections a stranger would open (no secret, a replayed greeting, a flood,
bytes without end, a client that stops reading, garbage after a valid hello)
next to a genuine aggregator's. What must hold: nothing they send is
counted, no verdict comes of them, the server's memory and the sends to the
genuine aggregator are bounded, and the genuine one is heard throughout.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from clusterctl.rundir.runjson import WatchdogRecord as Settings
from clusterctl.runtime.controller import watchserver
from clusterctl.runtime.controller.watchdog import Watchdog
from clusterctl.runtime.controller.watchserver import WatchServer
from clusterctl.runtime.wire import greeting
from clusterctl.runtime.wire import heartbeat as wire

TOKEN = "the-attempt-secret"
FAST = Settings(hang_timeout=30, save_timeout=8, straggler_factor=1.25, window=10)


class Server:
    def __init__(self, tmp: Path) -> None:
        self.logged: list[str] = []
        self.findings: list[object] = []
        self.watchdog = Watchdog(2, ["n1", "n2"], 1, FAST)
        self.server = WatchServer(socket.create_server(("127.0.0.1", 0)), TOKEN, self.watchdog, tmp / "t.jsonl",
                                  self.findings.append, self.logged.append)
        self.server.start()
        self.server.arm()

    def connect(self) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", self.server.port), timeout=5)
        return conn

    def greet(self, node: str, token: str = TOKEN) -> socket.socket:
        """A genuine aggregator's greeting: the challenge read, the hello sent."""
        conn = self.connect()
        nonce = read_challenge(conn)
        conn.sendall(greeting.hello(token, nonce, node, os.getpid()))
        return conn

    def beat(self, conn: socket.socket, rank: int, step: int) -> None:
        conn.sendall(batch_line([{"kind": "phase", "rank": rank, "step": step, "phase": "forward", "pid": 1}]))


def batch_line(messages: list[dict[str, object]], procs: dict[str, str] | None = None) -> bytes:
    """A batch that carries these rank messages, as an aggregator sends it."""
    return (json.dumps(wire.batch("n?", time.time(), wire.rows_of(messages), procs or {})) + "\n").encode()


def read_challenge(conn: socket.socket) -> str:
    data = b""
    while b"\n" not in data:
        data += conn.recv(4096)
    msg = json.loads(data.split(b"\n")[0])
    assert msg["kind"] == "challenge"
    return msg["nonce"]


def closed_by_server(conn: socket.socket) -> bool:
    conn.settimeout(15)
    try:
        while True:
            if conn.recv(4096) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    yield s
    s.server.close()


def test_only_a_greeting_made_with_the_secret_is_heard_and_no_greeting_crosses_to_another_connection(srv: Server) -> None:
    # The old greeting (the token itself on the wire) and a wrong secret are refused; nothing they send counts.
    old = srv.connect()
    read_challenge(old)
    old.sendall((json.dumps({"kind": "hello", "token": TOKEN, "node": "n1"}) + "\n").encode())
    assert closed_by_server(old)
    wrong = srv.greet("n1", token="a-guess")
    srv.beat(wrong, 0, 7)
    assert closed_by_server(wrong)
    # A greeting that was valid on one connection, replayed on another, answers the wrong challenge.
    first = srv.connect()
    nonce = read_challenge(first)
    captured = greeting.hello(TOKEN, nonce, "n1", 1)
    replay = srv.connect()
    read_challenge(replay)
    replay.sendall(captured)
    assert closed_by_server(replay)
    assert srv.watchdog.ranks[0].step == -1 and not srv.watchdog.lost_nodes
    # The genuine one is heard; a second hello for its node is refused; a stranger who left never reads as a lost node.
    first.sendall(captured)
    srv.beat(first, 0, 3)
    assert srv.server.wait_until(lambda: srv.watchdog.ranks[0].step == 3, 5)
    twin = srv.greet("n1")
    assert closed_by_server(twin)
    time.sleep(watchserver.CHECK_EVERY_S * 2)
    assert not srv.watchdog.lost_nodes and srv.findings == []
    # Logged once for this address (then counted: a flood would fill the batch log), and the second hello once.
    assert sum("without this attempt's secret" in line for line in srv.logged) == 1, srv.logged
    assert any("a second hello for node 'n1'" in line for line in srv.logged)
    first.sendall(b'{"kind": "bye"}\n')
    srv.server.close()
    assert any(line.startswith("turned away 2 more connections (2 from 127.0.0.1)") for line in srv.logged), srv.logged


def test_a_flood_of_strangers_is_bounded_and_the_genuine_aggregator_still_gets_in(srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    flood = []
    for _ in range(300):  # more than the caps: the oldest waiting ones make room
        conn = srv.connect()
        conn.sendall(b"x" * 1000)  # under the pre-hello limit: they wait for their deadline
        flood.append(conn)
    with srv.server.lock:
        waiting = sum(1 for i in srv.server.conns.values() if not i["greeted"])
    assert waiting <= watchserver.UNGREETED_PER_PEER
    genuine = srv.greet("n2")
    srv.beat(genuine, 1, 5)
    assert srv.server.wait_until(lambda: srv.watchdog.ranks[1].step == 5, 5)
    # Bytes without end before a hello: cut off at the limit, not buffered.
    endless = srv.connect()
    read_challenge(endless)
    try:
        endless.sendall(b"y" * (watchserver.PRE_HELLO_BYTES * 4))
    except OSError:
        pass
    assert closed_by_server(endless)
    for conn in flood:
        conn.close()
    assert srv.findings == [] and not srv.watchdog.lost_nodes


def test_a_connection_that_never_greets_is_closed_at_its_deadline(srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchserver, "HELLO_DEADLINE_S", 0.5)
    silent = srv.connect()
    read_challenge(silent)
    assert closed_by_server(silent)
    assert any("no hello within" in line for line in srv.logged)


def test_sends_never_block_and_a_peer_that_stops_reading_is_dropped_as_its_node(srv: Server) -> None:
    stuck = srv.greet("n1")
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and it never reads
    srv.beat(stuck, 0, 2)
    assert srv.server.wait_until(lambda: srv.watchdog.ranks[0].step == 2, 5)
    sent = threading.Event()

    def commands() -> None:  # until the kernel's buffers are full and the server's own backlog passes its limit
        for _ in range(1_000_000):
            if srv.server.send_all("dump") == 0 and "n1" in srv.watchdog.lost_nodes:
                break
        sent.set()

    worker = threading.Thread(target=commands, daemon=True)
    worker.start()
    worker.join(60)
    assert sent.is_set()  # however full the peer's socket, send_all returned every time
    assert srv.server.wait_until(lambda: "n1" in srv.watchdog.lost_nodes, 10)  # dropped: its node is lost
    assert any("stopped reading" in line for line in srv.logged)


def test_garbage_after_a_valid_hello_is_ignored_and_the_server_stays_up(srv: Server) -> None:
    conn = srv.greet("n1")
    for junk in (b"[1, 2]\n", b"null\n", b"{not json\n", b'{"kind": "gone", "rank": "x"}\n',
                 b'{"kind": "batch", "ranks": 7}\n', b'{"kind": "batch", "ranks": [1, "a", [0]], "procs": [3]}\n',
                 b'{"kind": "batch", "ranks": [[0, 1, null, "nowhere", 3, 0, true, false, 0, [], []]]}\n',
                 b'{"kind": "batch", "ranks": [[0, 1, null, "idle", 3, 0, true, false, 0, [[1]], [[2, "x"]]]]}\n',
                 b'{"kind": "gone", "rank": 0, "t": "soon"}\n'):
        conn.sendall(junk)
    srv.beat(conn, 0, 9)
    assert srv.server.wait_until(lambda: srv.watchdog.ranks[0].step == 9, 5)
    assert srv.server._thread.is_alive()
    conn.sendall(b'{"kind": "bye"}\n')


def test_a_line_nested_past_the_parsers_depth_costs_nothing_and_a_stopped_rank_is_still_named(tmp_path: Path) -> None:
    """3,001 bytes of `[` killed the watch thread (RecursionError): new connections got no challenge, and a rank
    stopped afterwards got no verdict. Now the line is skipped, before a hello and after one."""
    srv = Server(tmp_path)
    try:
        stranger = srv.connect()
        read_challenge(stranger)
        stranger.sendall(b"[" * 3001 + b"\n")
        n1, n2 = srv.greet("n1"), srv.greet("n2")  # the thread still greets
        n1.sendall(b"[" * 100_000 + b"\n")  # a greeted peer's line may be longer: skipped too
        for step in range(8):  # past the warm-up: the step's timeout is the 3 s floor
            for conn, rank in ((n1, 0), (n2, 1)):
                beat = {"kind": "step", "rank": rank, "step": step, "phase": "forward", "pid": 1, "step_s": 0.1}
                conn.sendall(batch_line([beat]))
        assert srv.server.wait_until(lambda: srv.watchdog.ranks[1].step == 7, 5)
        n2.sendall(batch_line([], {"1": "stopped"}))
        deadline = time.monotonic() + 15
        while not srv.findings and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv.server._thread.is_alive()
        assert srv.findings and srv.findings[0].code == 82 and [c["rank"] for c in srv.findings[0].culprits] == [1]
    finally:
        srv.server.close()


def test_a_flood_of_refused_hellos_logs_a_few_short_lines(srv: Server) -> None:
    """22,244 refused hellos in 10 s, each naming a 4 KB node, added 80.8 MB to the batch log."""
    for _ in range(200):
        conn = srv.connect()
        nonce = read_challenge(conn)
        conn.sendall(greeting.hello("a-guess", nonce, "n" * 3000, 1))
        assert closed_by_server(conn)
    srv.server.close()
    assert len(srv.logged) <= 3 and all(len(line) < 300 for line in srv.logged), srv.logged
    assert any("199 more connections" in line for line in srv.logged), srv.logged


def test_a_watch_thread_that_fails_ends_the_attempt_with_a_verdict_that_says_so(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    srv = Server(tmp_path)
    try:
        def broken(now: float) -> None:
            raise RuntimeError("a bug in a rule")

        monkeypatch.setattr(srv.watchdog, "verdict", broken)
        deadline = time.monotonic() + 5
        while not srv.findings and time.monotonic() < deadline:
            time.sleep(0.05)
        (finding,) = srv.findings
        assert finding.code == 1 and not finding.culprits and "detection was off" in finding.message, finding
        assert "RuntimeError: a bug in a rule" in finding.message
        assert any("the watch server stopped" in line for line in srv.logged)
    finally:
        srv.server.close()


def test_the_aggregator_drops_malformed_datagrams_and_keeps_the_good_ones(tmp_path: Path) -> None:
    from clusterctl.runtime.node.aggregator import Aggregator

    agg = Aggregator("n1", TOKEN, ("127.0.0.1", 1), str(tmp_path / "agg.sock"), None)
    inbound = agg.open_socket()
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        good = {"kind": "step", "rank": 0, "step": 4, "phase": "idle", "pid": os.getpid()}
        for data in (b"", b"\x00\xff", b"[1]", b"null", b"{}", b'{"rank": "x"}', b'{"rank": 0, "pid": "y"}',
                     b'{"rank": -4, "kind": "step"}', b'{"rank": {}}', b"{" * 10_000, b"9" * 60_000, json.dumps(good).encode()):
            sender.sendto(data, str(tmp_path / "agg.sock"))  # one at a time: a datagram socket's queue is short
            agg.receive(inbound)
    finally:
        sender.close()
        inbound.close()
    assert [(row[0], row[4]) for row in (d.row() for d in agg.digests.values())] == [(0, 4)]
    assert agg.pids == {0: os.getpid()}


def test_an_aggregator_crowded_out_before_its_hello_was_heard_tries_again_and_gets_in(
        srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger on the aggregator's own node (same address) churns connections at attempt start: each new one
    evicts the oldest waiting one from that address, the aggregator's among them. It used to read the close as "the
    controller is done" and exit, leaving its node unwatched; now it is in only once welcomed, and retries."""
    from clusterctl.runtime.node.aggregator import Aggregator

    monkeypatch.setattr(watchserver, "UNGREETED_PER_PEER", 2)  # a crowd of two is enough to evict anyone
    answer, answers = greeting.hello, []

    def slow_first_answer(*args: object) -> bytes:  # a loaded node: its first hello comes after the crowd moved in
        answers.append(args)
        if len(answers) == 1:
            time.sleep(0.5)
        return answer(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(greeting, "hello", slow_first_answer)
    stop = threading.Event()
    evicted = []

    def churn() -> None:
        while not stop.is_set():
            try:
                evicted.append(srv.connect())
            except OSError:
                pass
            time.sleep(0.001)

    crowd = threading.Thread(target=churn, daemon=True)
    crowd.start()
    try:
        agg = Aggregator("n2", TOKEN, ("127.0.0.1", srv.server.port), "/unused", None)
        conn = agg.connect()
    finally:
        stop.set()
        crowd.join()
        for c in evicted:
            c.close()
    try:
        assert len(answers) >= 2  # the first connection was crowded out, and it tried again
        with srv.server.lock:
            assert [i["node"] for i in srv.server.conns.values() if i["greeted"]] == ["n2"]
        agg.out = conn
        agg.digests[1] = wire.RankDigest(1, agg.cap)
        agg.digests[1].take({"kind": "phase", "rank": 1, "step": 9, "phase": "forward", "pid": 1})
        agg.send_batch()
        assert srv.server.wait_until(lambda: srv.watchdog.ranks[1].step == 9, 5)
    finally:
        conn.close()
