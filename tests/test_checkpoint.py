"""The checkpoint commit protocol: round trips, retention, latest, verify, async, resharding.

Multi-rank tests fork their ranks from this process (torch already imported)
and join them with a gloo group, so a 4-rank world starts in ~0.1 s.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from clusterctl.checkpoint import (
    Checkpointer,
    CheckpointError,
    latest_committed,
    list_generations,
    names,
    phases,
    reshard,
    verify,
)
from clusterctl.testing.localworld import RankFailed, fork_ranks

REPO = Path(__file__).resolve().parents[1]


def model_state(seed: int, width: int = 64) -> dict[str, Any]:
    """A small model and Adam state after one step: what a DDP trainer saves."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 8))
    optim = torch.optim.Adam(model.parameters())
    model(torch.randn(4, width)).sum().backward()
    optim.step()
    return {"model": model.state_dict(), "optim": optim.state_dict()}


def blank_like(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {k: blank_like(v) for k, v in state.items()}
    if isinstance(state, list):
        return [blank_like(v) for v in state]
    return state


def bitwise_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool(
            torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(bitwise_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(bitwise_equal(x, y) for x, y in zip(a, b))
    return a == b


def clone(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return {k: clone(v) for k, v in state.items()}
    if isinstance(state, list):
        return [clone(v) for v in state]
    return state


def tensors(state: Any) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in tensors(v)]
    if isinstance(state, list):
        return [t for v in state for t in tensors(v)]
    return []


# --- round trips ------------------------------------------------------------------------


def _round_trip(rank: int, world: int, directory: str) -> dict[str, Any]:
    ck = Checkpointer(directory, keep=3, rank=rank, world_size=world, spec_hash="abc", layout={"dp": world})
    state = model_state(seed=1)
    sync = ck.save(1, state, {"rank": rank, "epoch": 0, "data_position": 16})
    g1 = sync.wait()
    state = model_state(seed=2)
    at_step_2 = clone(state)
    handle = ck.save(2, state, {"rank": rank, "epoch": 0, "data_position": 32}, asynchronous=True)
    for t in tensors(state):  # training goes on
        t.add_(1.0)
    g2 = handle.wait()
    latest = ck.latest()
    target = blank_like(at_step_2)
    extra = ck.load(latest, target)
    target1 = blank_like(at_step_2)
    extra1 = ck.load(g1, target1)
    ck.close()
    return {
        "steps": (g1.step, g2.step, latest.step),
        "equal_2": bitwise_equal(target, at_step_2),
        "equal_1": bitwise_equal(target1, model_state(seed=1)),
        "extras": (extra, extra1),
        "modes": (g1.manifest["mode"], g2.manifest["mode"]),
        "sync_timings": sync.timings,
    }


def test_sync_and_async_round_trip_on_two_ranks(tmp_path: Path) -> None:
    out = fork_ranks(2, _round_trip, str(tmp_path))
    for rank, result in enumerate(out):
        assert result["steps"] == (1, 2, 2)
        assert result["equal_2"], "the async generation is not the state at its step"
        assert result["equal_1"]
        assert result["extras"][0] == {"rank": rank, "epoch": 0, "data_position": 32}
        assert result["extras"][1]["data_position"] == 16
        assert result["modes"] == ("sync", "async")
    assert out[0]["sync_timings"].commit > 0, "the coordinator (rank 0) commits"
    gen = latest_committed(tmp_path)
    assert gen is not None and gen.path.name == "step-00000002"
    m = gen.manifest
    assert (m["step"], m["epoch"], m["data_position"], m["world_size"]) == (2, 0, 32, 2)
    assert m["spec_hash"] == "abc" and m["layout"] == {"dp": 2}
    assert m["state_keys"] == ["model", "optim"]
    assert [r["rank"] for r in m["ranks"]] == [0, 1]
    writers = {entry["rank"] for entry in m["shards"].values()}
    assert writers == {0, 1}, "both ranks write a shard (DCP spreads replicated state)"
    assert all(e["checksum"].startswith("crc32:") for e in m["shards"].values())
    assert verify(gen) == []


def test_single_process_needs_no_process_group(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    state = model_state(seed=3)
    gen = ck.save(7, state, {"epoch": 1}).wait()
    assert gen.path == tmp_path / "step-00000007"
    target = blank_like(state)
    assert ck.load(ck.latest(), target) == {"epoch": 1}
    assert bitwise_equal(target, state)
    assert ck.wait() is None
    ck.close()
    with pytest.raises(CheckpointError, match="closed"):
        ck.save(8, state, {})


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="keep"):
        Checkpointer(tmp_path, keep=0, rank=0, world_size=1)
    with pytest.raises(CheckpointError, match="rank 2 outside"):
        Checkpointer(tmp_path, rank=2, world_size=2)
    with pytest.raises(CheckpointError, match="torch.distributed"):
        Checkpointer(tmp_path, rank=0, world_size=2)
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    with pytest.raises(CheckpointError, match="JSON"):
        ck.save(1, model_state(seed=0), {"bad": object()})
    with pytest.raises(CheckpointError, match="survive JSON unchanged"):
        ck.save(1, model_state(seed=0), {"position": (3, 4)}, asynchronous=True).wait()
    assert latest_committed(tmp_path) is None
    assert [i.kind for i in list_generations(tmp_path)] == [], "a refused save leaves nothing behind"


# --- retention --------------------------------------------------------------------------


def test_retention_keeps_the_newest_k(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=2, rank=0, world_size=1)
    for step in range(1, 6):
        ck.save(step * 10, model_state(seed=step), {"step": step}, asynchronous=step % 2 == 0)
    ck.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000040", "step-00000050"]
    assert [i.step for i in list_generations(tmp_path)] == [50, 40]


def test_retention_counts_only_whole_generations_and_leaves_torn_ones(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=2, rank=0, world_size=1)
    for step in (1, 2, 3):
        ck.save(step, model_state(seed=step), {})
    (tmp_path / "step-00000003" / "__0_0.distcp").unlink()  # damaged after its commit
    ck.save(4, model_state(seed=4), {})
    kinds = [(i.step, i.kind) for i in list_generations(tmp_path)]
    assert kinds == [(4, "committed"), (3, "torn"), (2, "committed")], "2 is kept: 3 does not count"


class Boom(Exception):
    pass


def _fail_at(phase: str, rank: int | None = None, my_rank: int = 0):
    def hook(name: str, step: int) -> None:
        if name == phase and step == 2 and (rank is None or rank == my_rank):
            raise Boom(f"injected failure at {phase}")

    return hook


@pytest.mark.parametrize("phase", [phases.SHARD_WRITE, phases.MANIFEST_WRITE, phases.RENAME])
def test_a_failed_save_deletes_nothing(tmp_path: Path, phase: str) -> None:
    ck = Checkpointer(tmp_path, keep=1, rank=0, world_size=1)
    ck.save(1, model_state(seed=1), {"step": 1})
    previous = phases.set_hook(_fail_at(phase))
    try:
        with pytest.raises(CheckpointError, match="injected failure"):
            ck.save(2, model_state(seed=2), {"step": 2})
    finally:
        phases.set_hook(previous)
    gen = latest_committed(tmp_path)
    assert gen is not None and gen.step == 1, "keep=1 must not delete the newest committed on a failed save"
    assert verify(gen) == []
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000001"], "the failed temporary is cleaned up"
    ck.save(3, model_state(seed=3), {"step": 3})
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000003"]


def _one_rank_fails(rank: int, world: int, directory: str) -> str:
    ck = Checkpointer(directory, keep=1, rank=rank, world_size=world)
    ck.save(1, model_state(seed=1), {"rank": rank})
    phases.set_hook(_fail_at(phases.SHARD_WRITE, rank=1, my_rank=rank))
    try:
        ck.save(2, model_state(seed=2), {"rank": rank}, asynchronous=True).wait()
    except CheckpointError as exc:
        message = str(exc)
    else:
        message = "no error"
    phases.set_hook(None)
    latest = ck.latest()
    ck.close()
    return f"{latest.step if latest else None}|{message}"


def test_one_rank_failing_fails_the_save_on_every_rank(tmp_path: Path) -> None:
    out = fork_ranks(2, _one_rank_fails, str(tmp_path), timeout=60)
    for result in out:
        step, message = result.split("|", 1)
        assert step == "1"
        assert "step 2 not committed" in message and "injected failure" in message
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000001"]


def _staging_fails_on_one_rank(rank: int, world: int, directory: str) -> str:
    ck = Checkpointer(directory, rank=rank, world_size=world)
    state = model_state(seed=1)
    if rank == 1:
        state["odd"] = threading.Lock()  # cannot be copied
    try:
        ck.save(1, state, {}, asynchronous=True)
    except CheckpointError as exc:
        message = str(exc)
    else:
        message = "no error"
    ck.save(2, model_state(seed=2), {})  # the checkpointer is still usable, on every rank
    ck.close()
    return message


def test_an_async_save_whose_staging_fails_on_one_rank_fails_on_all(tmp_path: Path) -> None:
    out = fork_ranks(2, _staging_fails_on_one_rank, str(tmp_path), timeout=60)
    assert "rank 1: staging failed" in out[1] and "not started" in out[0]
    assert [g.step for g in list_generations(tmp_path)] == [2]


def test_stale_temporaries_are_cleaned_only_when_they_cannot_be_in_flight(tmp_path: Path) -> None:
    old = tmp_path / names.temporary(5, "dead0001-3")
    fresh = tmp_path / names.temporary(6, "busy0002-1")
    leftover_trash = tmp_path / names.trash(1, "dead0001-2")
    for d in (old, fresh, leftover_trash):
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"partial")
    past = time.time() - 3600
    os.utime(old / "__0_0.distcp", (past, past))
    os.utime(old, (past, past))
    ck = Checkpointer(tmp_path, rank=0, world_size=1, stale_after=600)
    handle = ck.save(9, model_state(seed=1), {})
    assert sorted(handle.timings.removed) == sorted([old.name, leftover_trash.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, "step-00000009"])


def test_saving_an_earlier_step_sets_the_abandoned_future_aside(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=3, rank=0, world_size=1)
    for step in (10, 20, 30):
        ck.save(step, model_state(seed=step), {"step": step})
    ck.save(20, model_state(seed=99), {"step": "again"})  # a run rewound to 10 reaches 20 again
    assert latest_committed(tmp_path).manifest["ranks"] == [{"step": "again"}]
    kinds = {(i.step, i.kind) for i in list_generations(tmp_path)}
    assert kinds == {(10, "committed"), (20, "committed"), (20, "superseded"), (30, "superseded")}


# --- latest and listing -----------------------------------------------------------------


def test_latest_ignores_temporaries_and_torn_generations(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=5, rank=0, world_size=1)
    for step in (1, 2, 3):
        ck.save(step, model_state(seed=step), {"step": step})
    # A save that crashed before its rename: never resumed from.
    tmp = tmp_path / names.temporary(9, "cafe0001-1")
    tmp.mkdir()
    (tmp / "__0_0.distcp").write_bytes(b"half")
    # Damaged after the commit: no manifest, and a lost shard.
    (tmp_path / "step-00000005").mkdir()
    (tmp_path / "step-00000003" / "__0_0.distcp").unlink()
    gen = latest_committed(tmp_path)
    assert gen is not None and gen.step == 2
    assert ck.latest() == gen
    listing = [(i.name, i.kind) for i in list_generations(tmp_path)]
    assert listing == [
        (tmp.name, "temporary"),
        ("step-00000005", "torn"),
        ("step-00000003", "torn"),
        ("step-00000002", "committed"),
        ("step-00000001", "committed"),
    ]
    torn = {i.name: i.problem for i in list_generations(tmp_path) if i.kind == "torn"}
    assert "no manifest" in torn["step-00000005"]
    assert "__0_0.distcp (rank 0) is missing" in torn["step-00000003"]
    assert latest_committed(tmp_path / "nowhere") is None


def test_listing_and_latest_import_no_torch() -> None:
    code = (
        "import sys, clusterctl.checkpoint as c\n"
        "c.latest_committed('.'); c.list_generations('.'); c.verify('.')\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


# --- verification -----------------------------------------------------------------------


def _save_two_ranks(rank: int, world: int, directory: str) -> None:
    ck = Checkpointer(directory, rank=rank, world_size=world)
    ck.save(4, model_state(seed=4, width=128), {"rank": rank})
    ck.close()


def test_verify_names_the_corrupt_and_the_missing_shard(tmp_path: Path) -> None:
    fork_ranks(2, _save_two_ranks, str(tmp_path))
    gen = latest_committed(tmp_path)
    assert gen is not None and verify(gen) == []
    shard = gen.path / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit
    shard.write_bytes(bytes(data))
    problems = verify(gen)
    assert len(problems) == 1
    assert "__1_0.distcp (rank 1) is corrupt" in problems[0] and "checksum crc32:" in problems[0]
    (gen.path / "__0_0.distcp").unlink()
    problems = verify(gen.path)
    assert any("__0_0.distcp (rank 0) is missing" in p for p in problems)
    assert any("__1_0.distcp (rank 1) is corrupt" in p for p in problems)
    assert latest_committed(tmp_path) is None, "a generation with a missing shard is not resumed from"
    (gen.path / names.MANIFEST).write_text("{")
    assert "unreadable manifest" in verify(gen)[0]


# --- async ------------------------------------------------------------------------------


def _async_bitwise(rank: int, world: int, directory: str) -> dict[str, Any]:
    """The background write is held until training has mutated the tensors: the save must not see it."""
    ck = Checkpointer(directory, keep=2, rank=rank, world_size=world)
    state = model_state(seed=5, width=512)
    mutated = threading.Event()

    def hold(phase: str, step: int) -> None:
        if phase == phases.SHARD_WRITE:
            mutated.wait(30)

    snapshot = clone(state)
    phases.set_hook(hold)
    handle = ck.save(11, state, {"rank": rank}, asynchronous=True)
    in_flight_at_return = not handle.done()
    for t in tensors(state):
        t.mul_(-3.0).add_(7.0)
    mutated.set()
    generation = handle.wait()
    phases.set_hook(None)
    target = blank_like(snapshot)
    ck.load(generation, target)
    second = ck.save(12, state, {"rank": rank}, asynchronous=True)
    third = ck.save(13, state, {"rank": rank}, asynchronous=True)
    second_done_first = second.done()  # only one save in flight: save 13 waited for save 12
    ck.wait()
    ck.close()
    return {
        "in_flight": in_flight_at_return,
        "equal": bitwise_equal(target, snapshot),
        "mutated": not bitwise_equal(state, snapshot),
        "serial": second_done_first and third.done(),
    }


def test_async_generation_is_the_state_at_its_step_bit_for_bit(tmp_path: Path) -> None:
    for result in fork_ranks(2, _async_bitwise, str(tmp_path)):
        assert result == {"in_flight": True, "equal": True, "mutated": True, "serial": True}
    assert [g.step for g in list_generations(tmp_path)] == [13, 12]


def _pause(rank: int, world: int, directory: str, numel: int) -> dict[str, float]:
    ck = Checkpointer(directory, keep=1, rank=rank, world_size=world)
    state = {"model": {f"w{i}": torch.randn(numel // 4) for i in range(4)}}
    ck.save(1, state, {}, asynchronous=True).wait()  # allocates the staging buffers
    t0 = time.perf_counter()
    ck.save(2, state, {})
    sync_s = time.perf_counter() - t0
    snapshot = clone(state)
    t0 = time.perf_counter()
    handle = ck.save(3, state, {}, asynchronous=True)
    pause_s = time.perf_counter() - t0
    for t in tensors(state):
        t.add_(1.0)
    handle.wait()
    target = blank_like(snapshot)
    ck.load(ck.latest(), target)
    ck.close()
    return {"sync_s": sync_s, "pause_s": pause_s, "equal": bitwise_equal(target, snapshot)}


def test_async_pause_against_sync_save_is_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = fork_ranks(2, _pause, str(tmp_path), 8 << 20)  # 32 MiB of float32 per rank
    assert all(r["equal"] for r in out)
    sync_s = max(r["sync_s"] for r in out)
    pause_s = max(r["pause_s"] for r in out)
    with capsys.disabled():
        print(f"\n  32 MiB x 2 ranks: sync save {sync_s:.3f} s, async pause {pause_s:.3f} s ({pause_s / sync_s:.0%})")


# --- resharding -------------------------------------------------------------------------


def _save_replicated(rank: int, world: int, directory: str) -> None:
    ck = Checkpointer(directory, rank=rank, world_size=world, layout={"tp": 1, "pp": 1, "dp": world})
    ck.save(20, model_state(seed=20), {"rank": rank, "data_position": 640, "rng": [rank, 20]})
    ck.close()


def _load_replicated(rank: int, world: int, directory: str) -> dict[str, Any]:
    ck = Checkpointer(directory, rank=rank, world_size=world, layout={"tp": 1, "pp": 1, "dp": world})
    target = blank_like(model_state(seed=0))
    extra = ck.load(ck.latest(), target)
    ck.close()
    return {"equal": bitwise_equal(target, model_state(seed=20)), "extra": extra}


@pytest.mark.parametrize("new_world", [1, 4])
def test_replicated_state_saved_by_two_ranks_loads_on_another_world_size(tmp_path: Path, new_world: int) -> None:
    fork_ranks(2, _save_replicated, str(tmp_path))
    if new_world == 1:
        out = [_load_replicated(0, 1, str(tmp_path))]
    else:
        out = fork_ranks(new_world, _load_replicated, str(tmp_path))
    for rank, result in enumerate(out):
        assert result["equal"]
        assert result["extra"]["rank"] == rank % 2, "rank r takes saved dp rank r % saved_dp"
        assert result["extra"]["data_position"] == 640


def _dtensor_state(world: int, rows: int = 10) -> tuple[Any, torch.Tensor]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    full = torch.arange(rows * 6, dtype=torch.float32).reshape(rows, 6)
    mesh = init_device_mesh("cpu", (world,))
    rank = torch.distributed.get_rank()
    local = full.chunk(world)[rank].clone()
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=full.shape, stride=full.stride()), full


def _save_dtensor(rank: int, world: int, directory: str, asynchronous: bool) -> None:
    weight, _ = _dtensor_state(world)
    ck = Checkpointer(directory, rank=rank, world_size=world)
    ck.save(30, {"model": {"weight": weight}}, {"rank": rank}, asynchronous=asynchronous).wait()
    ck.close()


def _load_dtensor(rank: int, world: int, directory: str) -> bool:
    weight, full = _dtensor_state(world)
    weight.to_local().zero_()
    ck = Checkpointer(directory, rank=rank, world_size=world)
    ck.load(ck.latest(), {"model": {"weight": weight}})
    ck.close()
    return bool(torch.equal(weight.to_local(), full.chunk(world)[rank]))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_dtensor_state_reshards_from_two_ranks_to_four_and_to_one(tmp_path: Path, asynchronous: bool) -> None:
    fork_ranks(2, _save_dtensor, str(tmp_path), asynchronous)
    shards = latest_committed(tmp_path).manifest["shards"]
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(shards)
    assert fork_ranks(4, _load_dtensor, str(tmp_path)) == [True] * 4
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    plain = {"model": {"weight": torch.zeros(10, 6)}}
    ck.load(ck.latest(), plain)
    assert torch.equal(plain["model"]["weight"], torch.arange(60, dtype=torch.float32).reshape(10, 6))


def test_extras_follow_the_documented_mapping() -> None:
    src = reshard.source_rank
    assert [src(r, 4, None, 2, None) for r in range(4)] == [0, 1, 0, 1]
    assert [src(r, 1, None, 2, None) for r in range(1)] == [0]
    assert [src(r, 2, {"dp": 2}, 2, {"dp": 2}) for r in range(2)] == [0, 1]
    # tp=2 kept, dp 2 -> 4: each rank keeps its tp coordinate and takes dp % 2.
    now, then = {"tp": 2, "dp": 4, "pp": 1}, {"tp": 2, "dp": 2, "pp": 1}
    assert [src(r, 8, now, 4, then) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    # pp=2 outermost: ranks of stage 1 map to stage 1 of the saved world.
    now, then = {"tp": 1, "dp": 1, "pp": 2}, {"tp": 1, "dp": 2, "pp": 2}
    assert [src(r, 2, now, 4, then) for r in range(2)] == [0, 2]
    manifest = {"world_size": 2, "layout": {}, "ranks": [{"r": 0}, {"r": 1}]}
    assert reshard.map_extra(manifest, 3, 4, None) == {"r": 1}


def test_manifest_is_plain_json_with_the_documented_fields(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=1, spec_hash="h", layout={"dp": 1})
    extra = {"sampler": {"epoch": 3, "position": 96, "dp_size": 1}, "rng": {"torch": "AAAA"}}
    gen = ck.save(5, model_state(seed=5), extra).wait()
    on_disk = json.loads((gen.path / names.MANIFEST).read_text())
    assert on_disk == gen.manifest
    assert (on_disk["epoch"], on_disk["data_position"]) == (3, 96), "taken from a nested sampler state"
    assert set(on_disk) >= {"format", "step", "world_size", "layout", "spec_hash", "shards", "ranks", "state_keys"}
    assert set(on_disk["shards"]) == {".metadata", "__0_0.distcp"}


def test_a_rank_that_raises_is_reported_with_its_traceback(tmp_path: Path) -> None:
    def broken(rank: int, world: int) -> None:
        if rank == 1:
            raise ValueError("rank one is broken")

    with pytest.raises(RankFailed, match="(?s)rank 1:.*rank one is broken"):
        fork_ranks(2, broken, timeout=30)


def _sockets() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def _sockets_a_checkpoint_opens(rank: int, world: int, directory: str) -> int:
    before = _sockets()
    ck = Checkpointer(directory, rank=rank, world_size=world)
    ck.save(1, model_state(seed=rank), {"rank": rank}, asynchronous=True).wait()
    ck.save(2, model_state(seed=rank), {"rank": rank})
    ck.load(ck.latest(), blank_like(model_state(seed=0)))
    opened = len(_sockets() - before)
    ck.close()
    return opened


def test_a_checkpoints_ranks_connect_to_a_few_peers_and_the_coordinator_not_to_the_world(tmp_path: Path) -> None:
    """Saves, a load and the agreement before a background save: a rank other than the coordinator opens about
    log2(world) connections, gloo's halving-doubling partners (measured 4, 6, 7, 7 at 4, 8, 16, 24 ranks), where
    a full mesh made eagerly would be one a peer on every rank, each attempt."""
    world = 16
    opened = fork_ranks(world, _sockets_a_checkpoint_opens, str(tmp_path))
    assert opened[0] <= world, opened  # the coordinator gathers from every rank
    assert max(opened[1:]) <= math.log2(world) + 4 < world - 1, opened  # partners, the coordinator, the store
