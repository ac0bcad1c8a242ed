"""The in-memory snapshots' restore agreement and transfers: nothing that spans the world.

Each node puts one inventory in the store, rank 0 alone reads them and
publishes the plan, and a rank whose node lost its state receives it over a
two-rank link. Ranks here are threads of one process with their own store
clients (what the agreement sees is the same), except that the links are
real gloo pairs.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from clusterctl.checkpoint.restoreplan import RestorePlan, decode_inventory, encode_held, newest_whole, plan_restore

TOKEN = "t" * 32


# --- the plan (pure) -----------------------------------------------------------------------------------
def test_the_newest_whole_step_is_one_every_ranks_state_is_held_for_never_a_mix() -> None:
    # node A (ranks 0, 1) holds rank 0's 14 and 15 and a replica of rank 1's 13 and 14; rank 1's 15 was in flight
    node_a = {0: [14, 15], 1: [13, 14]}
    assert newest_whole([node_a, node_a], 2) == 14
    # a spare (rank 1's new node) holds nothing: the peer's replica still makes 14 whole
    assert newest_whole([{0: [14, 15]}, {}, {1: [14]}], 2) == 14
    assert newest_whole([{0: [15]}, {1: [14]}], 2) is None  # no common step: the durable checkpoint decides
    assert newest_whole([{}, {}], 2) is None


def test_a_spares_ranks_get_their_state_from_the_replicas_holder_at_their_own_local_rank() -> None:
    # 3 nodes x 2: node 1 was replaced by a spare; its ranks' replicas are on node 2 (the next node)
    nodes = {0: {0: [8, 9], 1: [8, 9], 4: [8, 9], 5: [8, 9]}, 1: {}, 2: {4: [8, 9], 5: [8, 9], 2: [8], 3: [8, 9]}}
    plan = plan_restore(nodes, world=6, gpus_per_node=2, durable_step=None)
    assert plan.step == 8  # rank 2's 9 was in flight when its node went
    assert plan.transfers == ((4, 2), (5, 3))  # node 2's ranks at local ranks 0 and 1: nobody sends twice
    # where the holder lacks it, another node that has it sends
    nodes[2] = {4: [8], 5: [8]}
    nodes[0].update({2: [8], 3: [8]})
    assert plan_restore(nodes, world=6, gpus_per_node=2, durable_step=None).transfers == ((0, 2), (1, 3))


def test_a_newer_durable_checkpoint_or_no_whole_step_leaves_the_restore_to_the_durable_one_and_says_why() -> None:
    nodes = {0: {0: [4], 1: [4]}}
    newer = plan_restore(nodes, world=2, gpus_per_node=2, durable_step=6)
    assert newer.step is None and "durable checkpoint of step 6" in newer.why
    assert plan_restore({0: {0: [4]}}, world=2, gpus_per_node=2, durable_step=None).step is None


def test_a_rings_links_are_made_in_rounds_both_ends_agree_on_and_no_node_makes_two_in_one() -> None:
    from clusterctl.checkpoint.pairlink import ring_colour

    for nodes in range(2, 9):
        rounds = [ring_colour(i, nodes) for i in range(nodes)]  # link i: node i to node i+1
        assert set(rounds) <= {0, 1, 2}
        assert all(rounds[i] != rounds[i - 1] for i in range(nodes)), (nodes, rounds)  # a node's two links differ


def test_the_plan_and_inventories_survive_the_wire_and_junk_is_refused() -> None:
    plan = RestorePlan(7, ((4, 2),), "")
    assert RestorePlan.from_json(plan.to_json()) == plan
    assert decode_inventory(encode_held({3: {9: "a", 8: "b"}})).held == {3: (8, 9)}
    for junk in (b"", b"[]", b'{"step": "7", "transfers": []}', b'{"step": 1, "transfers": [[1]]}', b"\xff"):
        with pytest.raises(ValueError):
            RestorePlan.from_json(junk)
    with pytest.raises(ValueError):
        decode_inventory(b'{"0": [1, "x"]}')


# --- the exchange: ranks as threads, each with its own store client ---------------------------------------
def _store_server() -> Any:
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)


def _snapshots(root: Path, port: int, rank: int, *, world: int, g: int, prefix: str, token: str = TOKEN,
               agree_timeout_s: float = 20.0) -> Any:
    import torch.distributed as dist

    from clusterctl.checkpoint.snapshots import Snapshots

    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, use_libuv=True)
    return Snapshots(root / "run" / f"node{rank // g}", rank=rank, world=world, interval=1, tag=str(world),
                     gpus_per_node=g, store=client, prefix=prefix, token=token, agree_timeout_s=agree_timeout_s)


def _on_every_rank(ranks: list[int], work: Any) -> dict[int, Any]:
    out: dict[int, Any] = {}

    def one(r: int) -> None:
        try:
            out[r] = work(r)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out[r] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_a_replaced_nodes_ranks_restore_from_their_peers_replicas_over_links_of_their_own(tmp_path: Path) -> None:
    import torch
    import torch.distributed as dist

    server = _store_server()
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)

    def train(r: int) -> None:  # three nodes of two: an odd ring, whose links take three rounds
        snaps = _snapshots(root, server.port, r, world=6, g=2, prefix="a/")
        snaps.connect()
        for step in range(3):
            snaps.take(step, {"w": torch.tensor([100.0 * r + step])}, {"rank": r})
            snaps.wait()
        assert snaps.error is None, snaps.error

    assert _on_every_rank(list(range(6)), train) == dict.fromkeys(range(6))
    shutil.rmtree(root / "run" / "node1")  # node 1 lost: a spare with empty host memory takes its place

    from clusterctl.checkpoint.snapshots import Snapshots

    waited: list[int] = []  # the ranks that waited on the store for the plan
    on_store = Snapshots._await_plan

    def restore(r: int) -> Any:
        snaps = _snapshots(root, server.port, r, world=6, g=2, prefix="b/")
        snaps._await_plan = lambda *a: (waited.append(r), on_store(snaps, *a))[1]
        return snaps.restore(None)

    restored = _on_every_rank(list(range(6)), restore)
    for r in range(6):
        assert not isinstance(restored[r], Exception), restored[r]
        assert restored[r].step == 2 and restored[r].state["w"].item() == 100.0 * r + 2
        assert restored[r].extra == {"rank": r}
        assert restored[r].served == {2: 4, 3: 5}  # node 2 held node 1's replicas and sent them
    assert not dist.is_initialized()  # no world group was ever made: pairs and the store only
    # the store woke a rank a node for the plan (rank 0 made it): the others took it from their node's leader
    assert sorted(waited) == [2, 4]


def test_a_ranks_leader_hands_it_the_plan_and_a_leader_that_never_does_leaves_it_the_durable_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    from clusterctl.checkpoint import snapshots
    from clusterctl.store import sealed

    server = _store_server()
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    follower = _snapshots(root, server.port, 3, world=4, g=2, prefix="f/", agree_timeout_s=0.5)
    path = follower._relay_file("f/plan")
    path.parent.mkdir(parents=True)
    path.write_bytes(RestorePlan(99, ((0, 3),)).to_json().encode())  # not sealed with the attempt's token: waited past
    real = RestorePlan(None, why="no step's snapshot is held for every rank")
    later = threading.Timer(0.3, lambda: path.write_bytes(sealed.seal(TOKEN, "f/plan", real.to_json())))
    later.start()
    assert follower._agree({}, [], None) == real
    later.join()
    monkeypatch.setattr(snapshots, "PLAN_MARGIN_S", 0.0)
    lone = _snapshots(root, server.port, 5, world=6, g=2, prefix="g/", agree_timeout_s=0.5)
    assert lone.restore(None) is None  # its leader, rank 4, never reached the restore
    assert "no restore plan came from this node's first rank (rank 4) within 0.5 s" in capfd.readouterr().err


def test_a_node_whose_inventory_never_comes_leaves_the_restore_to_the_durable_checkpoint_and_is_named(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    server = _store_server()
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    # node 1's rank never reaches its restore (hung, or gone): rank 0 waits its stated timeout
    snaps = _snapshots(root, server.port, 0, world=2, g=1, prefix="c/", agree_timeout_s=1.0)
    assert snaps.restore(None) is None
    err = capfd.readouterr().err
    assert "node 1's snapshot inventory (ranks 1-1; 1 node(s) in all) did not come within 1 s" in err
    assert "resuming from the durable checkpoint" in err


def test_an_inventory_or_plan_a_stranger_put_in_the_store_is_not_acted_on(tmp_path: Path) -> None:
    server = _store_server()
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    # a stranger, who can reach the store but has no token, claims node 1 holds everything
    server.set("d/inventory/1", encode_held({0: [99], 1: [99]}).encode())
    snaps = _snapshots(root, server.port, 0, world=2, g=1, prefix="d/", agree_timeout_s=1.0)
    assert snaps.restore(None) is None  # node 1's real inventory never came: the forged one was not taken for it
    # and a forged plan is not followed: the rank waits past it for rank 0's sealed one
    from clusterctl.store import sealed

    server.set("e/plan", RestorePlan(99, ((0, 1),)).to_json().encode())
    real = RestorePlan(None, why="no step's snapshot is held for every rank")
    later = threading.Timer(0.5, lambda: server.set("e/plan", sealed.seal(TOKEN, "e/plan", real.to_json())))
    later.start()
    other = _snapshots(root, server.port, 1, world=2, g=1, prefix="e/")
    assert other._agree({}, [], None) == real
    later.join()


def test_a_shrunk_width_takes_each_ranks_state_from_the_old_widths_snapshot_and_replica_on_the_survivors() -> None:
    """3 nodes of 1 rank (dp 3), n2 lost, 2 left (dp 2): n1 holds old rank 0 (and 2's replica), n3 old rank 2 (and 1's
    replica). New rank 1 on n3 takes old rank 1 from the replica there: nothing travels."""
    from clusterctl.checkpoint.restoreplan import Inventory, Width, decode_inventory, plan_remapped

    old = Width("3-aaaa", 3, {"tp": 1, "cp": 1, "dp": 3, "pp": 1}, replicated=True)
    nodes = {0: Inventory({}, ((old, {0: (14, 15), 2: (14, 15)}),)), 1: Inventory({}, ((old, {2: (14, 15), 1: (14,)}),))}
    plan = plan_remapped(nodes, world=2, gpus_per_node=1, layout={"tp": 1, "cp": 1, "dp": 2, "pp": 1}, durable_step=10)
    assert (plan.step, plan.transfers, plan.source) == (14, (), old)  # 15 is not whole: old rank 1's replica lacks it
    assert RestorePlan.from_json(plan.to_json()) == plan
    assert decode_inventory(encode_held({}, [(old, {0: {14: "f"}})])) == Inventory({}, ((old, {0: (14,)}),))
    # Where the survivors lack a mapped rank's state on its own node, one of them sends it.
    swapped = {0: nodes[1], 1: nodes[0]}
    assert plan_remapped(swapped, world=2, gpus_per_node=1, layout={"dp": 2}, durable_step=None).transfers == ((1, 0), (0, 1))
    # A state sharded over dp, or another model-parallel layout, is never remapped: the durable checkpoint decides.
    sharded = Width("3-bbbb", 3, old.layout, replicated=False)
    refused = plan_remapped({0: Inventory({}, ((sharded, {0: (14,), 1: (14,), 2: (14,)}),))}, world=2, gpus_per_node=2,
                            layout={"dp": 2}, durable_step=None)
    assert refused.step is None and "sharded over dp" in refused.why
    other_tp = plan_remapped(nodes, world=2, gpus_per_node=1, layout={"tp": 2, "dp": 1}, durable_step=None)
    assert other_tp.step is None and "another model-parallel layout (tp)" in other_tp.why
    newer_durable = plan_remapped(nodes, world=2, gpus_per_node=1, layout={"dp": 2}, durable_step=19)
    assert newer_durable.step is None and "durable checkpoint of step 19 is newer" in newer_durable.why
