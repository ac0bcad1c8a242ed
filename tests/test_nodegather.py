"""A node's ranks registering through its first rank, against the real controller process (ranks in threads).

What a user checks: the verdict, who it blames (only the rank at fault,
never the healthy ranks of the leader's node), manifest.json, and how many
store round trips the node's other ranks paid (none before the process
group's init).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from test_controller import HOSTS, TOKEN, Controller, make_run, rank_record, wait_for_manifest  # noqa: E402

from clusterctl.exitcodes import ExitCode  # noqa: E402
from clusterctl.runtime.rank import launch, nodegather, rendezvous  # noqa: E402
from clusterctl.runtime.wire import registration  # noqa: E402


@pytest.fixture(autouse=True)
def private_tmpfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_SNAPSHOTS", str(tmp_path / "shm"))


def info(ctl: Controller, rank: int):  # noqa: ANN201
    return dataclasses.replace(ctl.info(rank), token=TOKEN, host=HOSTS[rank // 2], local_rank=rank % 2)


def join(ctl: Controller, rank: int, results: dict, **changes: object) -> threading.Thread:
    """A rank as clusterctl.launch registers it, in a thread: results[(rank, pid)] = (its store, the verdict)."""
    record = rank_record(rank, **{"cwd": f"/work/{rank}", **changes})  # cwd: in the full record, not its summary

    def run() -> None:
        results[(rank, record["pid"])] = launch._join(info(ctl, rank), record, 20)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def joined(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_nodes_other_ranks_register_through_its_first_rank_without_a_store_connection(tmp_path: Path) -> None:
    ctl = Controller(make_run(tmp_path))
    results: dict = {}
    joined([join(ctl, r, results) for r in range(4)])
    assert sorted(results) == [(r, 100 + r) for r in range(4)]
    assert all(verdict.ok for _, verdict in results.values()), results
    for rank in (1, 3):  # told by their leader: no connection yet, so the process group's init opens the only one
        store = results[(rank, 100 + rank)][0]
        assert isinstance(store, rendezvous.LazyStore) and store._client is None
    probe = rendezvous.connect(ctl.info(0), 20)
    assert probe.check([registration.node_key(0), registration.node_key(1)])
    assert not any(probe.check([registration.reg_key(r)]) for r in range(4))  # one value a node, none a rank
    manifest = wait_for_manifest(ctl.attempt)  # the full records, from the nodes' files (the store has summaries)
    assert [(row["rank"], row["pid"], row["host"], row["cwd"]) for row in manifest["ranks"]] == [
        (r, 100 + r, HOSTS[r // 2], f"/work/{r}") for r in range(4)]
    assert len(probe.get(registration.node_key(0))) < sum(
        len(registration.sealed_registration(TOKEN, r, 1, rank_record(r, cwd=f"/work/{r}"))) for r in (0, 1))
    code, _ = ctl.stop()
    assert code == 0


def test_a_leader_that_dies_holding_its_nodes_records_is_the_only_rank_blamed(tmp_path: Path) -> None:
    """Node n1's first rank takes rank 1's record and dies before registering: rank 1 sees it gone and registers
    on its own; the verdict names rank 0 alone."""
    ctl = Controller(make_run(tmp_path, timeout_s=4))
    results: dict = {}
    threads = [join(ctl, r, results) for r in (1, 2, 3)]
    folder = nodegather.folder(info(ctl, 0))
    deadline = time.monotonic() + 30
    while not (folder / "rank-1").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.rename(folder / "rank-1", folder / "taken-1")  # what the leader's gather does
    (folder / "leader").write_text(f"{dead_pid()}\n")
    joined(threads)
    verdict = results[(1, 101)][1]
    assert verdict.code == ExitCode.RENDEZVOUS_FAILED and "rank 0 on n1" in verdict.message, verdict.message
    code, _ = ctl.stop()
    written = json.loads((ctl.attempt / "verdict.json").read_text())
    assert [(c["rank"], c["reason"]) for c in written["culprits"]] == [(0, "never arrived")], written


def test_a_rank_later_than_its_leader_registers_on_its_own_and_the_rendezvous_completes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodegather, "GATHER_S", 0.3)
    ctl = Controller(make_run(tmp_path))
    results: dict = {}
    threads = [join(ctl, r, results) for r in (0, 2, 3)]
    folder = nodegather.folder(info(ctl, 0))
    deadline = time.monotonic() + 30
    while (nodegather._leader(folder) or (0, None))[1] is None:  # until n1's leader registered its node without rank 1
        assert time.monotonic() < deadline
        time.sleep(0.01)
    joined(threads + [join(ctl, 1, results)])
    assert all(verdict.ok for _, verdict in results.values()), results
    probe = rendezvous.connect(ctl.info(0), 20)
    assert probe.check([registration.reg_key(1)]) and not probe.check([registration.reg_key(3)])
    assert [row["cwd"] for row in wait_for_manifest(ctl.attempt)["ranks"]] == [f"/work/{r}" for r in range(4)]
    assert ctl.stop()[0] == 0


def test_a_second_process_of_a_rank_on_its_node_is_named_a_duplicate(tmp_path: Path) -> None:
    ctl = Controller(make_run(tmp_path))
    results: dict = {}
    threads = [join(ctl, 1, results)]
    folder = nodegather.folder(info(ctl, 0))
    deadline = time.monotonic() + 30
    while not (folder / "claim-1").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    threads += [join(ctl, 1, results, pid=999)] + [join(ctl, r, results) for r in (0, 2, 3)]
    joined(threads)
    verdict = results[(0, 100)][1]
    assert verdict.code == ExitCode.RENDEZVOUS_FAILED, verdict
    assert "rank 1 registered 2 times: pid 101 on n1, pid 999 on n1" in verdict.message, verdict.message
    ctl.stop()
    written = json.loads((ctl.attempt / "verdict.json").read_text())
    assert [(c["rank"], c["reason"]) for c in written["culprits"]] == [(1, "duplicate rank")], written


def test_a_strangers_value_under_a_nodes_key_leaves_its_ranks_to_register_one_by_one(tmp_path: Path) -> None:
    ctl = Controller(make_run(tmp_path))
    stranger = rendezvous.connect(ctl.info(0), 20)
    stranger.set(registration.node_key(0), b'[[0,5],[1,5]]\nhello')
    stranger.set(registration.node_key(1), b"not a node's value")
    results: dict = {}
    joined([join(ctl, r, results) for r in range(4)])
    assert all(verdict.ok for _, verdict in results.values()), results
    assert [row["pid"] for row in wait_for_manifest(ctl.attempt)["ranks"]] == [100, 101, 102, 103]
    assert ctl.stop()[0] == 0


def test_a_nodes_value_is_read_only_in_its_own_form() -> None:
    payloads = {4: b"four\x1fseal", 5: b"five"}
    raw = registration.encode_node(payloads)
    assert registration.decode_node(raw) == payloads
    for junk in (b"", b"\n", b"[[4,4]]\nfou", b"[[4,3]]\nfour", b'{"4":1}\nx', b"[[4,-1]]\n", b"[[true,1]]\nx"):
        assert registration.decode_node(junk) == {}, junk
