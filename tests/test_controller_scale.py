"""The controller where scale breaks it: the open-file limit, bounded collection, the manifest's layout.

The file-limit tests start the real controller as a process with a low
RLIMIT_NOFILE (set in the child before exec) and 256 stand-in ranks (torch
TCPStore clients, which is what the controller must hold open). The
collection tests use one in-process store; the manifest tests feed a file
the controller wrote to every reader in the repository.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

torch_distributed = pytest.importorskip("torch.distributed")

from clusterctl import rundir
from clusterctl.exitcodes import ExitCode  # noqa: E402
from clusterctl.rundir import rankmanifest  # noqa: E402
from clusterctl.runtime.controller import filelimit
from clusterctl.runtime.rank import rendezvous  # noqa: E402
from clusterctl.runtime.rank.rankinfo import RankInfo  # noqa: E402
from clusterctl.runtime.wire import registration
from clusterctl.runtime.wire.greeting import registration_proof  # noqa: E402
from clusterctl.store import collect

TOKEN = "scale-token"
WORLD = 256
GPN = 8
HOSTS = [f"n{i}" for i in range(WORLD // GPN)]


def make_run(tmp_path: Path, timeout_s: float = 30) -> Path:
    run_dir = tmp_path / "run"
    attempt = run_dir / "attempt-1"
    (attempt / "logs").mkdir(parents=True)
    (attempt / "hosts").write_text("\n".join(HOSTS) + "\n")
    (attempt / "attempt.json").write_text(json.dumps({"token": TOKEN, "hosts": HOSTS}))
    run = {
        "world_size": WORLD,
        "gpus_per_node": GPN,
        "parallel": {"tp": 8, "cp": 1, "ep": 1, "dp": WORLD // 8, "pp": 1},
        "rendezvous": {"timeout_s": timeout_s, "port_range": [20000, 29999]},
        "preflight": {"checks": []},
        "node_type": {"gpu_vendor": "emulated", "binding": []},
    }
    (run_dir / "run.json").write_text(json.dumps(run))
    return attempt


def start_controller(attempt: Path, nofile: tuple[int, int]) -> tuple[subprocess.Popen, int]:
    """The real controller with RLIMIT_NOFILE set in the child before it execs."""
    env = dict(os.environ, CLUSTERCTL_TOKEN=TOKEN, CLUSTERCTL_ATTEMPT="1", SLURMD_NODENAME="n0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "clusterctl.runtime.controller", "--attempt-dir", str(attempt),
         "--port", str(20000 + (os.getpid() * 7) % 9000)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile),
    )
    ready = attempt / "controller.json"
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["port"]


def stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGHUP)  # the batch script: the ranks are done
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out


def record(rank: int) -> dict:
    return {
        "rank": rank, "world_size": WORLD, "local_rank": rank % GPN, "host": HOSTS[rank // GPN], "pid": 1000 + rank,
        "proof": registration_proof(TOKEN, rank, HOSTS[rank // GPN], 1000 + rank), "gpu": rank % GPN, "cpus": str(rank % GPN), "numa": 0, "nics": ["lo"],
        "versions": {"torch": "2.13.0", "cuda": None, "nccl": None, "hip": None}, "fabric": None,
        "preflight": [{"name": "cpu", "ok": True, "skipped": False, "detail": "bound", "data": {"seen": "0"}}],
        "timings": {"started": 1.0 + rank, "torch_imported": 2.0 + rank},
    }


def info(attempt: Path, port: int, rank: int) -> RankInfo:
    return RankInfo.from_env({
        "CLUSTERCTL_RUN_DIR": str(attempt.parent), "CLUSTERCTL_ATTEMPT_DIR": str(attempt), "RANK": str(rank),
        "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })


def all_ranks(attempt: Path, port: int, threads: int = 32) -> dict[int, object]:
    """WORLD stand-in ranks, each holding its own connection until the verdict (a thread serves several)."""
    results: dict[int, object] = {}

    def serve(ranks: range) -> None:
        stores = []
        for r in ranks:
            try:
                store = rendezvous.connect(info(attempt, port, r), 60)
                rendezvous.register(store, r, record(r), TOKEN)
                stores.append((r, store))
            except Exception as exc:  # noqa: BLE001 - a refused rank is a result too
                results[r] = exc
        for r, store in stores:
            try:
                results[r] = rendezvous.await_verdict(store, 150, WORLD, TOKEN)
            except Exception as exc:  # noqa: BLE001
                results[r] = exc

    per = WORLD // threads
    workers = [threading.Thread(target=serve, args=(range(i * per, (i + 1) * per),)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(240)
    return results


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    """A controller started with a soft limit of 128 (hard: this host's) judging 256 ranks."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < filelimit.needed_files(WORLD, len(HOSTS)) + WORLD + 64:
        pytest.skip(f"this host's hard open-file limit ({hard}) cannot hold {WORLD} ranks and their clients")
    attempt = make_run(tmp_path_factory.mktemp("judged"), timeout_s=120)  # room for the clients on a loaded machine
    proc, port = start_controller(attempt, (128, hard))
    try:
        results = all_ranks(attempt, port)
    finally:
        code, out = stop(proc)
    return attempt, results, out + f"\nexit {code}"


def test_a_controller_started_with_a_soft_limit_of_128_judges_256_ranks(judged: tuple[Path, dict, str]) -> None:
    attempt, results, out = judged
    assert len(results) == WORLD and all(not isinstance(v, Exception) and v.ok for v in results.values()), out
    assert "open-file limit raised from 128 to" in out, out
    assert json.loads((attempt / "verdict.json").read_text())["ok"] is True
    assert "rendezvous timings" in out and "exit 0" in out, out


def test_a_hard_limit_below_the_world_refuses_at_once_and_says_what_to_ask_for(tmp_path: Path) -> None:
    attempt = make_run(tmp_path, timeout_s=120)
    proc, port = start_controller(attempt, (256, 256))
    try:
        verdict = json.loads((attempt / "verdict.json").read_text())  # written before the store started
        assert verdict["code"] == ExitCode.RENDEZVOUS_FAILED and verdict["verdict"] == "rendezvous_failed"
        message = verdict["message"]
        for part in ("at most 256 files", "RLIMIT_NOFILE", f"{WORLD} ranks on {len(HOSTS)} nodes",
                     f"need {filelimit.needed_files(WORLD, len(HOSTS))}", "Ask the cluster admin to raise the hard open-file limit"):
            assert part in message, message
        assert verdict["evidence"]["nofile_hard"] == 256 and verdict["evidence"]["world_size"] == WORLD
        started = time.monotonic()
        store = rendezvous.connect(info(attempt, port, 0), 20)  # a rank that gets in is told at once, not at the deadline
        rendezvous.register(store, 0, record(0), TOKEN)
        told = rendezvous.await_verdict(store, 120, WORLD, TOKEN)
        assert time.monotonic() - started < 10 and told.code == ExitCode.RENDEZVOUS_FAILED and "nofile" in told.message
    finally:
        code, out = stop(proc)
    assert code == ExitCode.RENDEZVOUS_FAILED, out
    assert "rendezvous refused" in out and not (attempt / "manifest.json").exists()


def test_the_manifest_reads_the_same_through_every_reader(judged: tuple[Path, dict, str]) -> None:
    from clusterctl.qualify.faultdrill import wait_for_attempt
    from clusterctl.views.chrometrace import build_trace
    from clusterctl.views.record import load

    attempt, _, out = judged
    path = attempt / rundir.MANIFEST
    lines = path.read_bytes().splitlines()
    assert len(lines) == WORLD + 2 and lines[0].endswith(b'"ranks":[') and lines[-1] == b"]}", out  # one rank per line
    whole = json.loads(path.read_bytes())  # still one JSON document for any reader
    assert rankmanifest.read(path) == whole
    assert list(rankmanifest.iter_ranks(path)) == whole["ranks"]
    header = rankmanifest.read_header(path)
    assert header == {k: v for k, v in whole.items() if k != "ranks"}
    assert header["world_size"] == WORLD and header["hosts"] == HOSTS and header["groups"]["tp"][1] == list(range(8, 16))
    for r, row in enumerate(whole["ranks"]):
        assert {k: v for k, v in row.items() if k != "groups"} == record(r)  # the rank's own record, unchanged
        assert row["groups"]["tp"] == r // 8 and row["groups"]["dp"] == r % 8

    run = rundir.RunDir(attempt.parent)
    nodes = load(run, 1)["environment"]["nodes"]
    assert [n["host"] for n in nodes] == HOSTS and nodes[1]["ranks"] == "8-15"
    trace = build_trace(run, 1)
    assert sorted(trace.attempts[0].ranks) == list(range(WORLD))
    drilled = wait_for_attempt(run, "local", 5, lambda _: None)
    assert len(drilled.ranks()) == WORLD and drilled.hosts == HOSTS


def test_the_older_indented_manifest_still_reads(tmp_path: Path) -> None:
    old = {"attempt": 1, "hosts": ["a"], "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "missing": True}], "world_size": 2}
    path = tmp_path / rundir.MANIFEST
    rundir.write_json_atomic(path, old)
    assert rankmanifest.read(path) == old
    assert list(rankmanifest.iter_ranks(path)) == old["ranks"]
    assert rankmanifest.read_header(path) == {"attempt": 1, "hosts": ["a"], "world_size": 2}
    assert rankmanifest.read(tmp_path / "absent.json") is None and list(rankmanifest.iter_ranks(tmp_path / "absent")) == []


@pytest.fixture(scope="module")
def store() -> object:
    master = torch_distributed.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False,
                                        timeout=timedelta(seconds=30), use_libuv=True)
    client = torch_distributed.TCPStore("127.0.0.1", master.port, 1, False, wait_for_workers=False,
                                        timeout=timedelta(seconds=30), use_libuv=True)
    yield client
    del client, master


def preload(store: object, prefix: str, values: dict[int, bytes]) -> None:
    items = sorted(values.items())
    for start in range(0, len(items), 2048):
        part = items[start : start + 2048]
        store.multi_set([f"{prefix}{r}" for r, _ in part], [v for _, v in part])


def test_chunked_collection_returns_what_one_key_at_a_time_does(store: object) -> None:
    """5,000 keys with gaps: the bounded requests find exactly the registrations a per-key read finds."""
    values = {r: registration.encode_registration(record(r % WORLD) | {"rank": r}) for r in range(5000) if r % 7 and r != 4999}
    preload(store, "gaps/", values)
    keys = [f"gaps/{r}" for r in range(5000)]
    naive = {r: store.get(k) for r, k in enumerate(keys) if store.check([k])}
    assert collect.fetch_present(store, keys) == naive == values
    assert collect.fetch_present(store, keys, size=333) == values
    full = keys[1:7]
    assert list(collect.fetch_all(store, full, size=4)) == [values[r] for r in range(1, 7)]


def test_a_200000_key_collect_does_not_fail(store: object) -> None:
    """One request of more than 131,072 keys is refused by the store; bounded ones are not."""
    n = 200_000
    preload(store, "big/", {r: b"%d" % r for r in range(n)})
    started = time.monotonic()
    found = collect.fetch_present(store, [f"big/{r}" for r in range(n)])
    assert len(found) == n and found[0] == b"0" and found[n - 1] == b"%d" % (n - 1)
    assert time.monotonic() - started < 20


def test_a_registration_is_judged_from_its_summary_and_kept_whole() -> None:
    full = record(3) | {"preflight": [{"name": "gpu", "ok": False, "detail": "ECC", "data": {}},
                                      {"name": "cpu", "ok": True, "detail": "ok", "data": {"x": 1}}]}
    head, row = registration.decode_registration(registration.encode_registration(full))
    assert json.loads(bytes(row)) == full and b"\n" not in bytes(row)
    assert head == {k: full[k] for k in registration.JUDGED} | {"preflight": [full["preflight"][0]]}
    plain, row = registration.decode_registration(json.dumps(full, indent=1).encode())  # written as plain JSON: decoded whole
    assert plain == head and json.loads(bytes(row)) == full
    garbled, row = registration.decode_registration(b"\x00not json")
    assert "proof" not in garbled and "undecodable" in json.loads(bytes(row))
    seen: dict = {}
    a = registration.share_values(registration.summary(record(1)), seen)
    b = registration.share_values(registration.summary(record(2)), seen)
    assert a["versions"] is b["versions"] and a["host"] is b["host"] and a == registration.summary(record(1))


def test_the_verdict_margin_grows_with_the_world() -> None:
    assert registration.verdict_margin_s(8) == pytest.approx(30, abs=0.01)
    assert registration.verdict_margin_s(100_000) == pytest.approx(50)
