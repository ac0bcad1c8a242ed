"""The watch path at scale: a rank's messages as one row a batch, the straggler's columns, the sampled timeline.

The rows and columns are how 100,000 ranks fit one controller
(bench/scale_recovery.py measures it); these tests pin that nothing the
watchdog judges is lost on the way: the same verdicts as from the messages
one by one, steps every rank reported kept past the cap, every rank watched
even where the timeline records a sample.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from pathlib import Path

import numpy as np

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import timeline
from clusterctl.rundir.runjson import WatchdogRecord as Settings
from clusterctl.runtime.controller import straggler, watchserver
from clusterctl.runtime.controller.stepcolumns import StepColumns
from clusterctl.runtime.controller.watchdog import Watchdog
from clusterctl.runtime.controller.watchserver import WatchServer
from clusterctl.runtime.wire import greeting
from clusterctl.runtime.wire import heartbeat as wire

TOKEN = "rows-token-0123456789"


def msg(kind: str, rank: int, step: int, phase: str, t: float, **extra: object) -> dict[str, object]:
    return {"kind": kind, "rank": rank, "step": step, "phase": phase, "t": t, "pid": 100 + rank, **extra}


def cycle(rank: int, step: int, t: float, compute: float = 0.4) -> list[dict[str, object]]:
    """One step of a rank as its messages: three phases, the step's report, a liveness beat."""
    return [msg(wire.PHASE, rank, step, "forward", t), msg(wire.PHASE, rank, step, "backward", t + 0.1),
            msg(wire.PHASE, rank, step, "collective", t + 0.2),
            msg(wire.STEP, rank, step, "collective", t + 0.3, step_s=0.5, compute_s=compute),
            msg(wire.ALIVE, rank, step, "collective", t + 0.35)]


def test_a_batch_row_says_what_its_messages_said() -> None:
    digest = wire.RankDigest(3)
    for m in cycle(3, 7, 10.0) + cycle(3, 8, 10.5):
        digest.take(m)
    row = wire.parse_row(digest.row())
    assert row is not None
    rank, pid, _, phase, step, sent, moved, closed, done, changes, steps = row
    assert (rank, pid, phase, step, moved, closed, done) == (3, 103, "collective", 8, True, False, 2)
    assert [c[0] for c in changes] == ["forward", "backward", "collective"] * 2
    assert [(s[0], s[4]) for s in steps] == [(7, 0.4), (8, 0.4)] and sent == 10.8
    digest.take(msg(wire.ALIVE, 3, 8, "collective", 11.0))
    again = digest.row()
    assert again is not None and again[1] is None and again[6] is False  # the pid is said once; a beat is no progress
    assert digest.row() is None  # nothing heard since


def test_a_beat_carries_a_lost_phase_message_and_an_older_one_does_not() -> None:
    digest = wire.RankDigest(0)
    digest.take(msg(wire.PHASE, 0, 4, "forward", 5.0))
    digest.row()
    digest.take(msg(wire.ALIVE, 0, 4, "collective", 4.0))  # older than the news applied: batches reorder
    assert digest.row()[6] is False
    digest.take(msg(wire.ALIVE, 0, 5, "forward", 6.0))  # newer, another step: the step's messages were lost
    row = digest.row()
    assert row[6] is True and row[4] == 5


def test_past_the_cap_nodes_at_one_pace_keep_the_same_steps_and_the_timed_phases() -> None:
    cap = 8
    nodes = [[wire.RankDigest(r, cap, detail=False) for r in range(2)], [wire.RankDigest(2, cap, detail=False)]]
    kept: list[list[int]] = []
    step = 0
    for _ in range(3):  # three one-second batches of 100 steps each, a save among the last
        for _ in range(100):
            for digests in nodes:
                for d in digests:
                    d.take(msg(wire.PHASE, d.rank, step, "forward", step * 0.01))
                    if step == 250:
                        d.take(msg(wire.PHASE, d.rank, step, "save", step * 0.01 + 0.001))
                    d.take(msg(wire.STEP, d.rank, step, "forward", step * 0.01 + 0.002, step_s=0.01, compute_s=0.008))
            step += 1
        rows = [d.row() for digests in nodes for d in digests]
        kept = [[s[0] for s in row[10]] for row in rows]
        assert all(row[8] == 100 for row in rows)  # every step counted, if not every one kept
        assert all(len(k) <= cap for k in kept)
    assert kept[0] == kept[1] == kept[2] and kept[0] and all(s % 16 == 0 for s in kept[0])
    assert all([c[0] for c in row[9]] == ["save", "forward"] for row in rows)  # only into and out of a timed phase


def test_the_watchdog_judges_rows_as_it_judges_the_messages_one_by_one() -> None:
    """A 1.5x straggler and then a hang, fed once message by message and once as one row a rank a batch."""
    rng = random.Random(4)
    hosts = ["n1", "n2"]
    by_message, by_row = (Watchdog(4, hosts, 2, Settings(window=10)) for _ in range(2))
    digests = [wire.RankDigest(r) for r in range(4)]
    found: list[tuple[int, str] | None] = [None, None]
    t = 100.0
    for step in range(80):
        for r in range(4):
            for m in cycle(r, step, t, compute=0.4 * (1.5 if r == 3 and step > 40 else 1.0) * rng.uniform(0.98, 1.02)):
                by_message.observe(m, t + 0.4)
                digests[r].take(m)
        if step % 2:
            for d in digests:
                by_row.observe_row(wire.parse_row(d.row()), t + 0.4)
            for i, wd in enumerate((by_message, by_row)):
                verdict = wd.verdict(t + 0.5)
                if verdict is not None and found[i] is None:
                    found[i] = (verdict.code, verdict.culprits[0]["rank"])
        t += 0.5
    assert found[0] == found[1] == (int(ExitCode.STRAGGLER), 3)


def test_the_columns_ring_holds_the_newest_steps_as_the_rule_would_compute_them() -> None:
    rng = random.Random(2)
    world, keep, skip = 5, 6, 3
    columns = StepColumns(world, keep, skip)
    compute: list[dict[int, float]] = [{} for _ in range(world)]
    for step in range(20):
        for r in rng.sample(range(world), world):
            if (step, r) == (9, 2):
                continue  # a step one rank never reported: no column
            value = rng.uniform(0.1, 0.2)
            compute[r][step] = value
            columns.add(r, step, value)
            columns.add(r, step, 9.9)  # reported twice: counted once
    assert list(columns.steps) == [13, 14, 15, 16, 17, 18, 19][-keep:]
    table = columns.table(4)
    expected = straggler.excesses(compute, [16, 17, 18, 19])
    assert table.steps == expected.steps
    assert np.array_equal(table.excess, expected.excess) and np.array_equal(table.base, expected.base)
    assert columns.made == 20 - skip - 1


def test_a_large_world_records_a_sample_of_nodes_and_watches_every_rank(tmp_path: Path) -> None:
    gpn = 8
    hosts = [f"node{i:03d}" for i in range(200)]
    detail = watchserver.detail_nodes(hosts, gpn)
    assert detail is not None and len(detail) == watchserver.DETAIL_NODES and {hosts[0], hosts[-1]} <= detail
    quiet = next(h for h in hosts if h not in detail)
    loud = sorted(detail)[1]
    wd = Watchdog(len(hosts) * gpn, hosts, gpn, Settings())
    server = WatchServer(socket.create_server(("127.0.0.1", 0)), TOKEN, wd, tmp_path / "timeline.jsonl",
                         lambda _: None, log=lambda _: None)
    server.start()
    conns = {}
    try:
        for node in (quiet, loud):
            conn = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            nonce = json.loads(conn.recv(4096).split(b"\n")[0])["nonce"]
            conn.sendall(greeting.hello(TOKEN, nonce, node, 1))
            welcome = json.loads(conn.recv(4096).split(b"\n")[0])
            assert welcome["detail"] is (node == loud) and welcome["cap"] == wire.welcome_cap(len(hosts) * gpn)
            conns[node] = conn
        for node, conn in conns.items():
            first = hosts.index(node) * gpn
            rows = wire.rows_of([m for r in range(first, first + gpn) for m in cycle(r, 3, time.time())])
            conn.sendall((json.dumps(wire.batch(node, time.time(), rows, {})) + "\n").encode())
            conn.sendall((json.dumps({"kind": wire.GONE, "node": node, "rank": first, "pid": 1, "t": 1.0}) + "\n").encode())
        quiet_rank = hosts.index(quiet) * gpn
        assert server.wait_until(lambda: wd.ranks[quiet_rank].step == 3 and wd.ranks[quiet_rank].process == wire.GONE, 5)
    finally:
        server.close()
        for conn in conns.values():
            conn.close()
    records = list(timeline.read(tmp_path / "timeline.jsonl"))
    progress = {r["node"] for r in records if r["kind"] in (timeline.PHASE, timeline.STEP)}
    assert progress == {loud}
    assert {r["node"] for r in records if r["kind"] == timeline.GONE} == {quiet, loud}  # deaths: whole


def test_a_hang_in_a_large_world_names_its_culprit_and_a_few_victims_and_counts_the_rest() -> None:
    world, gpn = 4096, 8
    hosts = [f"node{i:03d}" for i in range(world // gpn)]
    wd = Watchdog(world, hosts, gpn, Settings(window=5))
    t = 100.0
    for step in range(8):
        for r in range(world):
            wd.observe_row((r, 100 + r, r % gpn, "collective", step, t, True, False, 1, [],
                            [[step, "collective", t, 0.5, 0.4]]), t)
        t += 0.5
    culprit = 1234
    wd.observe_process(culprit, "stopped", t)
    for r in range(world):
        if r != culprit:
            wd.observe_row((r, None, None, "collective", 8, t + 1, True, False, 0, [], []), t + 1)
    verdict = wd.verdict(t + 10)
    assert verdict is not None and verdict.code == ExitCode.HANG
    assert [c["rank"] for c in verdict.culprits] == [culprit]
    named = [v["rank"] for v in verdict.victims]
    assert len(named) <= 32 and set(range(1232, 1240)) - {culprit} <= set(named)  # its node's other ranks first
    assert verdict.evidence["victims"]["count"] == world - 1
    assert sum(verdict.evidence["victims"]["doing"].values()) == world - 1
    assert len(json.dumps(verdict.as_dict())) < 20_000  # every victim named made 4.9 MB at 16,384 ranks


def test_a_lost_node_in_a_large_world_blames_its_ranks_and_counts_the_rest() -> None:
    world, gpn = 4096, 8
    hosts = [f"node{i:03d}" for i in range(world // gpn)]
    wd = Watchdog(world, hosts, gpn, Settings(window=5))
    for r in range(world):
        wd.observe_row((r, 100 + r, r % gpn, "forward", 1, 100.0, True, False, 1, [], []), 100.0)
    wd.observe_node_lost("node200", 101.0)
    assert wd.verdict(102.0) is None  # not yet confirmed
    verdict = wd.verdict(101.0 + 10)
    assert verdict is not None and verdict.code == ExitCode.NODE_LOST
    assert [c["rank"] for c in verdict.culprits] == list(range(1600, 1608))
    assert len(verdict.victims) <= 32 and verdict.evidence["victims"]["count"] == world - gpn
    assert not {v["rank"] for v in verdict.victims} & set(range(1600, 1608))
    assert "4088 rank(s) elsewhere" in verdict.message
    assert len(json.dumps(verdict.as_dict())) < 20_000  # every other rank named: 99,992 entries at 100,000


def test_an_aggregator_says_each_process_state_once_then_its_changes(tmp_path: Path) -> None:
    from clusterctl.runtime.node.aggregator import Aggregator

    agg = Aggregator("n1", TOKEN, ("127.0.0.1", 1), str(tmp_path / "agg.sock"), None)
    ours, theirs = socket.socketpair()
    agg.out = ours
    try:
        agg.pids = {0: os.getpid(), 1: 2**22 + 12345}  # this process, and one that does not exist
        agg.reported[1] = wire.GONE
        for _ in range(2):
            agg.send_batch()
        theirs.settimeout(5)
        data = b""
        while data.count(b"\n") < 2:
            data += theirs.recv(65536)
        first, second = (json.loads(line) for line in data.splitlines()[:2])
        assert first["procs"] == {"0": "running", "1": "gone"} and second["procs"] == {}
    finally:
        ours.close()
        theirs.close()


def test_a_line_only_the_standard_decoder_reads_is_applied_and_garbage_is_skipped(tmp_path: Path) -> None:
    """The watch server decodes with orjson for speed; a line with NaN (json.dumps writes one for a NaN step
    time) still reads, as before, and a line neither decoder reads costs nothing but itself."""
    hosts, gpn = ["n1"], 2
    wd = Watchdog(gpn, hosts, gpn, Settings())
    server = WatchServer(socket.create_server(("127.0.0.1", 0)), TOKEN, wd, tmp_path / "timeline.jsonl",
                         lambda _: None, log=lambda _: None)
    server.start()
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        nonce = json.loads(conn.recv(4096).split(b"\n")[0])["nonce"]
        conn.sendall(greeting.hello(TOKEN, nonce, "n1", 1))
        conn.recv(4096)
        rows = wire.rows_of([m for r in range(gpn) for m in cycle(r, 3, time.time(), compute=float("nan"))])
        nan_line = json.dumps(wire.batch("n1", time.time(), rows, {})) + "\n"
        assert "NaN" in nan_line
        conn.sendall(b'{"kind": "batch", "ranks": [[0, \n' + nan_line.encode())
        assert server.wait_until(lambda: all(r.step == 3 for r in wd.ranks), 5)
        rows = wire.rows_of([m for r in range(gpn) for m in cycle(r, 4, time.time())])
        conn.sendall(b"\xff\xfe not json\n" + (json.dumps(wire.batch("n1", time.time(), rows, {})) + "\n").encode())
        assert server.wait_until(lambda: all(r.step == 4 for r in wd.ranks), 5)
        assert server.conns and all(i["greeted"] for i in server.conns.values())  # the connection kept
    finally:
        conn.close()
        server.close()
