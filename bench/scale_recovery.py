"""Recovery at 16k-100k ranks: the in-memory snapshots' restore agreement, measured with the real code.

    python bench/scale_recovery.py [--quick] [--sizes 1024,16384]

Each size runs a real torch TCPStore in a process of its own (as the
controller hosts it) and emulated ranks, a thread and a store client each,
in WORKERS processes; every one runs the project's own
`Snapshots._agree` (checkpoint/snapshots.py) with the inventory a node of
8 ranks holds after a lost node was replaced by a spare: its own KEEP
steps for its 8 ranks and the replicas of the previous node's, sealed with
the attempt's token. Node 1 is the spare (it holds nothing), so the plan
carries 8 transfers. Once every client is connected, one key releases
them all at once, as the next attempt's ranks all reach their restore.

Per size: `restore_agree_s`, from the release to the last rank holding
rank 0's plan; the store bytes each rank moved (keys and values, in and
out, counted by a wrapper around its client), for the most any rank but
rank 0 moved (`restore_bytes_per_rank`) and for rank 0, which alone reads
every node's inventory (`restore_leader_bytes`); and, as the peer, the
bytes each rank received from the whole-world all_gather_object this
replaces (every rank's inventory, pickled as torch pickles it: computed,
not run). The replica and restore transfers themselves are pairwise and
carry the state, the same bytes at any world size.

The watch path: the real controller, registrations preloaded as
controller_scale.py does, one stand-in aggregator per node on the real wire
(the greeting, then a batch a second with a row per rank as RankDigest
makes it: a 1 s step's report and, on the nodes the controller asks for
detail, three phase changes), 45 s of that (the straggler rule judges from
step 40), 20 s more over which the controller's cores are measured, then a
hang (one rank stopped and silent, every other waiting in its collective):
the verdict's time past the hang timeout, whether its culprit is exact,
the timeline's bytes a rank-hour.

Stand-ins, not torch processes: 1,024 processes do not fit 2 cores.
The next attempt's start (`reregister`): every rank registering at once,
live at 16,384 and the controller's part of it at 100,000. The ETTR
projection (`ettr`) adds a hang's timeout and verdict, the warm restart
measured at 4 ranks, the re-registration and the restore agreement at the
size (at 100,000 the agreement is 16,384's scaled by the nodes: rank 0
reads each node's inventory), and a step of work, at the published failure
rates. --quick: restore, watch and re-registration at 1,024 and 16,384 ranks.

Last line: {"restore_agree_s_1k", "restore_agree_s_16k", "restore_bytes_per_rank_1k",
"restore_bytes_per_rank_16k", "restore_bytes_ratio_16k_1k", "restore_leader_bytes_16k",
"allgather_bytes_per_rank_16k", "verdict_s_16k", "verdict_s_100k", "watch_cpu_16k", "watch_cpu_100k",
"reregister_s_16k", "reregister_s_100k", "timeline_mb_per_rank_hour", "ettr_projected_16k",
"ettr_projected_100k", "failure_cost_s_16k", "failure_cost_s_100k", "ettr_design_16k", "ettr_design_100k",
"failure_cost_design_s_16k", "failure_cost_design_s_100k", "all_ok", "simulated"}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from controller_scale import TOKEN as CONTROLLER_TOKEN  # noqa: E402
from controller_scale import Controller, in_namespace, make_run, preload, raise_nofile  # noqa: E402

GPN = 8
WORKERS = 4
TOKEN = "bench-token-" + "0" * 20
PREFIX = "clusterctl/snapshots/bench/1.0.0/"
RELEASE = "bench/release"
STEPS = (98, 99)  # KEEP snapshots per rank
# The projection's rates and the costs measured elsewhere (bench/README.md cites each):
FAILURES_PER_HOUR = {16384: 419 / (54 * 24), 100000: 60 / 18}  # Llama 3: 419 in 54 days on 16,384 GPUs; ~18 min at 100k
STEP_S = 1.0  # the stand-ins' step: the hang timeout is 5 of them, and one step is the work a failure costs
HANG_TIMEOUT_S = 5.0  # watchdog: 5 x the median step time (at least 3 s)
WARM_RESTART_S = 1.8  # bench/recovery.py, lab_warm_resume_s 1.77-1.89 s: the verdict to the first resumed step, 4 ranks


def ettr(world: int, verdict_s: float | None, storm_s: float | None, agree_s: float | None) -> dict[str, Any] | None:
    """Effective training time ratio from the measured costs and the published failure rate: 1 - (the time a failure
    costs) x (failures an hour) / 3600, every failure taken as the slowest to find (a hang: its timeout, then the
    verdict) and the warm restart's small-world cost plus the parts that grow with the world (every rank
    registering again, the restore agreement), and one step of work."""
    if verdict_s is None or storm_s is None or agree_s is None:
        return None
    cost = HANG_TIMEOUT_S + verdict_s + WARM_RESTART_S + storm_s + agree_s + STEP_S
    return {"failure_cost_s": round(cost, 2), "failures_per_hour": round(FAILURES_PER_HOUR[world], 3),
            "ettr": round(1 - cost * FAILURES_PER_HOUR[world] / 3600, 4)}
WARM_S = 45.0  # seconds of traffic (1 s steps) before the controller's CPU is measured: the straggler rule judges from step 40
STEADY_S = 20.0  # seconds of full traffic after that, before the hang (the controller's CPU is measured over them)
PHASES_PER_STEP = ("forward", "backward", "optimizer")  # each a phase message, then the step's report


class CountingStore:
    """A store client that counts the bytes of what it sends and receives (keys and values)."""

    def __init__(self, store: Any) -> None:
        self.store, self.bytes = store, 0

    def set(self, key: str, value: bytes) -> None:
        self.bytes += len(key) + len(value)
        self.store.set(key, value)

    def get(self, key: str) -> bytes:
        value = self.store.get(key)
        self.bytes += len(key) + len(value)
        return value

    def multi_get(self, keys: list[str]) -> list[bytes]:
        values = self.store.multi_get(keys)
        self.bytes += sum(map(len, keys)) + sum(map(len, values))
        return values

    def check(self, keys: list[str]) -> bool:
        self.bytes += sum(map(len, keys))
        return self.store.check(keys)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self.bytes += sum(map(len, keys))
        self.store.wait(keys, timeout)


def held_by(node: int, world: int) -> dict[int, dict[int, str]]:
    """What node `node` holds after node 1 was lost and replaced: its ranks' own steps and the previous node's."""
    if node == 1:
        return {}
    nodes = world // GPN
    before = (node - 1) % nodes
    ranks = [*range(node * GPN, node * GPN + GPN), *range(before * GPN, before * GPN + GPN)]
    return {r: {s: f"/dev/shm/clusterctl-0/run/node{node}/rank-{r}-of-{world}/step-{s:08d}.pt" for s in STEPS}
            for r in ranks}


def serve() -> None:
    """The store, as the controller hosts it: prints its port, then lives until stdin closes."""
    import torch.distributed as dist

    raise_nofile()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True,
                          timeout=timedelta(seconds=600))
    print(store.port, flush=True)
    sys.stdin.read()


def worker(port: int, world: int, first: int, last: int) -> None:
    """Emulated ranks first..last-1: connect, wait for the release, agree; prints their figures."""
    import torch.distributed as dist

    from clusterctl.checkpoint.snapshots import Snapshots

    raise_nofile()
    threading.stack_size(256 * 1024)
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    connected = threading.Barrier(last - first + 1)
    scratch = Path(tempfile.mkdtemp(prefix="scalerec-"))

    def rank(r: int) -> None:
        try:
            client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, use_libuv=True,
                                   timeout=timedelta(seconds=600))
        except Exception as exc:  # noqa: BLE001
            failed.append(f"rank {r}: {exc}"[:200])
            connected.abort()
            return
        connected.wait()
        try:
            client.wait([RELEASE], timedelta(seconds=600))
            woken = time.time()
            counted = CountingStore(client)
            snaps = Snapshots(scratch / "run" / f"node{r // GPN}", rank=r, world=world, interval=1, tag=str(world),
                              gpus_per_node=GPN, store=counted, prefix=PREFIX, token=TOKEN)
            plan = snaps._agree(held_by(r // GPN, world) if r % GPN == 0 else {}, [], None)
            rows.append({"rank": r, "t": time.time(), "woken": woken, "bytes": counted.bytes, "step": plan.step,
                         "transfers": len(plan.transfers)})
        except Exception as exc:  # noqa: BLE001
            failed.append(f"rank {r}: {exc}"[:200])

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(first, last)]
    for t in threads:
        t.start()
    connected.wait()
    print(json.dumps({"connected": True}), flush=True)
    for t in threads:
        t.join()
    others = [row for row in rows if row["rank"] != 0]
    leader = [row for row in rows if row["rank"] == 0]
    import resource

    cpu = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"last": max((row["t"] for row in rows), default=0), "ranks": len(rows), "failed": len(failed),
                      "first_holder": min((row["t"] for row in others), default=0),
                      "cpu_s": cpu.ru_utime + cpu.ru_stime,
                      "last_woken": max((row["woken"] for row in rows), default=0),
                      "leader_done": leader[0]["t"] if leader else None,
                      "first_failure": failed[:1], "max_bytes": max((row["bytes"] for row in others), default=0),
                      "leader_bytes": leader[0]["bytes"] if leader else None,
                      "steps": sorted({row["step"] for row in rows}, key=str),
                      "transfers": sorted({row["transfers"] for row in rows})}), flush=True)


def allgather_bytes(world: int) -> int:
    """What each rank received from the old all_gather_object: every rank's inventory, pickled."""
    total = 0
    for node in range(world // GPN):
        held = {r: sorted(s) for r, s in held_by(node, world).items()}
        total += GPN * len(pickle.dumps(held))  # every rank of the node reported the node's holdings
    return total


def one_size(world: int) -> dict[str, Any]:
    import torch.distributed as dist

    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=ROOT)
    port = int(server.stdout.readline())
    per = -(-world // WORKERS)
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(port), str(world), str(i * per),
                               str(min(world, (i + 1) * per))], stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for i in range(WORKERS)]
    for p in procs:
        json.loads(p.stdout.readline())  # every client of this worker connected
    control = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, use_libuv=True)
    released = time.time()
    control.set(RELEASE, b"go")
    reports = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    server.stdin.close()
    server.wait(30)
    failed = sum(r["failed"] for r in reports)
    if failed:
        print(f"  {world}: {failed} ranks failed, e.g. {[r['first_failure'] for r in reports if r['failed']][0]}",
              file=sys.stderr)
    steps = {s for r in reports for s in r["steps"]}
    leader = next(r["leader_bytes"] for r in reports if r["leader_bytes"] is not None)
    return {"ranks": world, "ok": not failed and steps == {max(STEPS)} and sum(r["ranks"] for r in reports) == world,
            "restore_agree_s": round(max(r["last"] for r in reports) - released, 3),
            # where it went: every stand-in woken by the release (a storm of the stand-ins' own), rank 0's plan
            # published (the nodes' inventories put and read), the last rank holding it
            "release_woken_s": round(max(r["last_woken"] for r in reports) - released, 3),
            "plan_published_s": round(next(r["leader_done"] for r in reports if r["leader_done"]) - released, 3),
            "first_holder_s": round(min(r["first_holder"] for r in reports if r["first_holder"]) - released, 3),
            "stand_in_cpu_ms_per_rank": round(sum(r["cpu_s"] for r in reports) / world * 1e3, 3),
            "restore_bytes_per_rank": max(r["max_bytes"] for r in reports), "restore_leader_bytes": leader,
            "allgather_bytes_per_rank": allgather_bytes(world),
            "transfers": sorted({t for r in reports for t in r["transfers"]})}


# --- the watch path: stand-in aggregators on the real wire, the real controller ------------------------------
def node_batch(node: str, first_rank: int, step: int, now: float, hung: bool, culprit: int | None, detail: bool,
               first: bool, hang_begins: bool) -> bytes:
    """One second of a node's aggregator, as RankDigest would make it: a row per rank, its 1 s step's report and,
    where the controller asked for detail, its three phase changes (the pid, GPU and process states in a node's
    first batch, then the changes).

    Hung: the culprit says nothing at all (a SIGSTOPped process), every other rank waits in the collective
    (its liveness beats only, after the change into it), as a real hang looks from the aggregator.
    """
    from clusterctl.runtime.wire import heartbeat as wire

    rows, procs = [], {}
    for r in range(first_rank, first_rank + GPN):
        if first or (hang_begins and r == culprit):  # the aggregator says each state once, then its changes
            procs[str(r)] = "stopped" if hung and r == culprit else "running"
        if hung and r == culprit:
            continue
        pid, gpu = (10000 + r, r % GPN) if first else (None, None)
        if hung:  # into the collective in the hang's first second (a change of phase), then beats only
            changes = [["collective", step, now]] if hang_begins and detail else []
            rows.append([r, pid, gpu, "collective", step, now, hang_begins, False, 0, changes, []])
            continue
        changes = [[phase, step, now] for phase in PHASES_PER_STEP] if detail else []
        rows.append([r, pid, gpu, "optimizer", step, now, True, False, 1, changes, [[step, "optimizer", now, 1.0, 0.9]]])
    return (json.dumps(wire.batch(node, now, rows, procs)) + "\n").encode()


def watch_worker(port: int, world: int, first_node: int, last_node: int, start_at: float, hang_at: float,
                 culprit: int) -> None:
    """Aggregators of nodes first..last-1: greet, then a batch a second each; a hang from hang_at; prints send lag."""
    import selectors
    import socket

    from clusterctl.runtime.wire import greeting
    from clusterctl.runtime.wire import heartbeat as wire

    raise_nofile()
    conns: dict[int, socket.socket] = {}
    detailed: dict[int, bool] = {}  # node -> the controller asked for every phase change (the welcome)
    for i in range(first_node, last_node):
        node = f"node{i:05d}"
        conn = socket.create_connection(("127.0.0.1", port), timeout=60)
        data = b""
        while b"\n" not in data:
            data += conn.recv(4096)
        nonce = json.loads(data.split(b"\n")[0])["nonce"]
        conn.sendall(greeting.hello(CONTROLLER_TOKEN, nonce, node, 20000 + i))
        data = data.split(b"\n", 1)[1]
        while b"\n" not in data:
            data += conn.recv(4096)
        detailed[i] = json.loads(data.split(b"\n")[0]).get("detail") is not False
        conns[i] = conn
    print(json.dumps({"connected": len(conns)}), flush=True)
    selector = selectors.DefaultSelector()
    for conn in conns.values():
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ)
    lags: list[float] = []
    killed: set[int] = set()
    tick = last_step = 0
    hang_tick: int | None = None
    while time.time() < hang_at + 60 and len(killed) < len(conns):
        due = start_at + tick
        while (left := due - time.time()) > 0:  # the controller's commands (dump, kill) are read as they come
            for key, _ in selector.select(left):
                try:
                    got = key.fileobj.recv(65536)
                except OSError:
                    got = b""
                for i, conn in conns.items():
                    if conn is key.fileobj and i not in killed and (not got or b'"kill"' in got):
                        killed.add(i)  # a node told to kill its ranks: their processes are gone
                        gone = [{"kind": wire.GONE, "node": f"node{i:05d}", "rank": r, "pid": 10000 + r, "t": time.time()}
                                for r in range(i * GPN, i * GPN + GPN)]
                        with contextlib.suppress(OSError):
                            conn.setblocking(True)
                            conn.sendall(b"".join((json.dumps(g) + "\n").encode() for g in gone))
                        selector.unregister(conn)
        now = time.time()
        lags.append(now - due)
        for i, conn in conns.items():
            if i in killed:
                continue
            hung = now >= hang_at
            if not hung:
                last_step = tick  # a hang holds every rank at the step it began in
            begins = hung and hang_tick in (None, tick)
            line = node_batch(f"node{i:05d}", i * GPN, last_step, now, hung, culprit, detailed[i], tick == 0, begins)
            conn.setblocking(True)
            try:
                conn.sendall(line)
            except OSError:
                killed.add(i)
            conn.setblocking(False)
        if now >= hang_at and hang_tick is None:
            hang_tick = tick
        tick += 1
    print(json.dumps({"lag_p99_s": sorted(lags)[int(0.99 * (len(lags) - 1))] if lags else None,
                      "lag_max_s": max(lags, default=None), "killed": len(killed)}), flush=True)


# --- the next attempt's start: its controller up, then every rank registering at once ---------------------------
LIVE_MAX = 16384  # ranks as threads with a store client each, as far as this machine's threads and files go


def reregister(root: Path, world: int) -> dict[str, Any]:
    """From the release of every rank at once (forked warm, they wait for the store) to the last one holding the
    rendezvous' verdict (`storm_s`, the key reregister_s): connect, register, the arrival count, the verdict, as
    controller_scale.py's live ranks do. Past LIVE_MAX the registrations are preloaded and `storm_s` is the
    controller's own part, from the last arrival. Also a cold controller's spawn to its store answering (a warm
    restart forks it: 0.3 s on the lab, bench/README.md)."""
    from controller_scale import watch_verdict

    attempt, hosts = make_run(root, world)
    spawned = time.time()
    ctl = Controller(attempt, preloaded=world > LIVE_MAX)
    store = ctl.wait_store()
    store_up = time.time()
    failed = 0
    if world <= LIVE_MAX:
        per = -(-world // WORKERS)
        procs = [subprocess.Popen([sys.executable, str(ROOT / "bench" / "controller_scale.py"), "--worker", str(ctl.port),
                                   str(world), str(i * per), str(min(world, (i + 1) * per)), str(attempt.parent),
                                   "--gated"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
                 for i in range(WORKERS)]
        for p in procs:
            json.loads(p.stdout.readline())  # every thread started, none connected
        released = time.time()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        storm = max(r["last_told"] for r in reports) - released
        own = min(r["first_told"] for r in reports) - max(r["last_arrival"] for r in reports)
        failed = sum(r["failed"] for r in reports)
        mode = "live"
    else:
        seen: dict[str, float] = {}
        waiter = watch_verdict(ctl.wait_store(), seen)
        last = preload(store, world, hosts, str(attempt.parent))
        waiter.join(600)
        storm = own = seen["verdict"] - last
        mode = "preloaded: the controller's part"
    usage = ctl.stop()
    ok = bool(json.loads((attempt / "verdict.json").read_text()).get("ok")) and not failed
    shutil.rmtree(attempt.parent, ignore_errors=True)
    return {"ranks": world, "mode": mode, "ok": ok, "cold_controller_start_s": round(store_up - spawned, 3),
            "storm_s": round(storm, 3), "controller_part_s": round(own, 3), "controller_cpu_s": round(usage["cpu_s"], 2)}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def watch_size(root: Path, world: int) -> dict[str, Any]:
    """A hang in full traffic: the verdict's time past the hang timeout, and the controller's cores meanwhile."""
    attempt, hosts = make_run(root, world)
    ctl = Controller(attempt, preloaded=True)
    store = ctl.wait_store()
    preload(store, world, hosts, str(attempt.parent))
    verdict_file = attempt / "verdict.json"
    deadline = time.monotonic() + 300
    while not verdict_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not json.loads(verdict_file.read_text()).get("ok"):
        raise RuntimeError(f"the rendezvous of {world} stand-in ranks failed: {verdict_file.read_text()[:300]}")
    print(f"  {world}: rendezvous judged; {world // GPN} aggregators connecting", file=sys.stderr, flush=True)
    watch_port = json.loads((attempt / "controller.json").read_text())["watch_port"]
    nodes = world // GPN
    culprit = (nodes // 2) * GPN + 3
    per = -(-nodes // WORKERS)
    start_at = time.time() + 5 + nodes / 2000  # the connections first
    hang_at = start_at + WARM_S + STEADY_S
    procs = [subprocess.Popen([sys.executable, __file__, "--watch-worker", str(watch_port), str(world), str(i * per),
                               str(min(nodes, (i + 1) * per)), repr(start_at), repr(hang_at), str(culprit)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT) for i in range(WORKERS)]
    for p in procs:
        json.loads(p.stdout.readline())
    print(f"  {world}: connected; {WARM_S + STEADY_S:g} s of traffic, then a hang", file=sys.stderr, flush=True)
    if time.time() > start_at:
        print(f"  {world}: the aggregators connected {time.time() - start_at:.1f} s late", file=sys.stderr)
    time.sleep(max(0.0, start_at + WARM_S - time.time()))  # the watchdog past its warm-up, the straggler rule judging
    cpu0, wall0 = cpu_seconds(ctl.proc.pid), time.time()
    time.sleep(max(0.0, hang_at - time.time()))
    cores = (cpu_seconds(ctl.proc.pid) - cpu0) / (time.time() - wall0)
    found = None
    while time.time() < hang_at + 120:
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(verdict_file.read_text())
            if record.get("code") == 82:
                found = (verdict_file.stat().st_mtime, record)
                break
        time.sleep(0.05)
    reports = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    from clusterctl.rundir import timeline

    try:  # the timeline's bytes: a long traffic's segments (compressed as the watch server closes them) and the live file
        timeline_mb = timeline.size(attempt / "timeline.jsonl") / 1e6
    except OSError:
        timeline_mb = 0.0
    ctl.stop()
    row: dict[str, Any] = {"ranks": world, "nodes": nodes, "watch_cpu": round(cores, 3),
                           "send_lag_p99_s": max(r["lag_p99_s"] or 0 for r in reports), "timeline_mb": round(timeline_mb, 1)}
    if found is None:
        row.update(ok=False, verdict_s=None)
    else:
        when, record = found
        timeout = float(record["evidence"]["hang_timeout_s"])
        blamed = [c.get("rank") for c in record.get("culprits", [])]
        row.update(ok=blamed == [culprit], verdict_s=round(when - (hang_at + timeout), 3), hang_timeout_s=timeout,
                   culprits=blamed[:3], verdict_mb=round(verdict_file.stat().st_size / 1e6, 2))
    hours = (hang_at - start_at) / 3600
    row["timeline_mb_per_rank_hour"] = round(timeline_mb / world / hours, 4)  # the file's growth over the world's ranks
    row["timeline_mb_per_hour"] = round(timeline_mb / hours)
    if row["ok"]:
        shutil.rmtree(attempt.parent, ignore_errors=True)
    else:
        kept = Path(tempfile.mkdtemp(prefix="scalewatch-kept-"))
        shutil.move(str(attempt.parent), kept)
        print(f"  {world}: no right verdict; the run is kept in {kept}", file=sys.stderr, flush=True)
    return row


def main() -> None:
    if "--serve" in sys.argv:
        serve()
        return
    if "--worker" in sys.argv:
        i = sys.argv.index("--worker")
        worker(*(int(x) for x in sys.argv[i + 1:i + 5]))
        return
    if "--watch-worker" in sys.argv:
        a = sys.argv[sys.argv.index("--watch-worker") + 1:]
        watch_worker(int(a[0]), int(a[1]), int(a[2]), int(a[3]), float(a[4]), float(a[5]), int(a[6]))
        return
    in_namespace()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the watch path at 1,024 and 16,384 ranks only")
    parser.add_argument("--sizes", default="1024,16384", help="the restore agreement's sizes")
    parser.add_argument("--watch", default="1024,16384,100000", help="the watch path's sizes")
    parser.add_argument("--reregister", default="16384,100000", help="the next attempt's start's sizes")
    parser.add_argument("--no-namespace", action="store_true", help="leave name resolution alone")
    args = parser.parse_args()
    raise_nofile(70000)
    rows = {}
    for world in (int(x) for x in args.sizes.split(",") if x):
        rows[world] = one_size(world)
        print(json.dumps(rows[world]), flush=True)
    watched: dict[int, dict[str, Any]] = {}
    root = Path(tempfile.mkdtemp(prefix="scalewatch-"))
    starts: dict[int, dict[str, Any]] = {}
    for world in (int(x) for x in ("1024,16384" if args.quick else args.reregister).split(",") if x):
        starts[world] = reregister(root, world)
        print(json.dumps(starts[world]), flush=True)
    for world in [1024, 16384] if args.quick else [int(x) for x in args.watch.split(",") if x]:
        watched[world] = watch_size(root, world)
        print(json.dumps(watched[world]), flush=True)
    shutil.rmtree(root, ignore_errors=True)
    small, large = rows.get(1024), rows.get(16384)
    w16, w100 = watched.get(16384), watched.get(100000)
    last: dict[str, Any] = {
        "restore_agree_s_1k": small and small["restore_agree_s"],
        "restore_agree_s_16k": large and large["restore_agree_s"],
        "restore_bytes_per_rank_1k": small and small["restore_bytes_per_rank"],
        "restore_bytes_per_rank_16k": large and large["restore_bytes_per_rank"],
        "restore_bytes_ratio_16k_1k": (round(large["restore_bytes_per_rank"] / small["restore_bytes_per_rank"], 3)
                                       if small and large else None),
        "restore_leader_bytes_16k": large and large["restore_leader_bytes"],
        "allgather_bytes_per_rank_16k": large and large["allgather_bytes_per_rank"],
        "verdict_s_16k": w16 and w16["verdict_s"], "verdict_s_100k": w100 and w100["verdict_s"],
        "watch_cpu_16k": w16 and w16["watch_cpu"], "watch_cpu_100k": w100 and w100["watch_cpu"],
        "timeline_mb_per_rank_hour": w16 and w16["timeline_mb_per_rank_hour"],
        "reregister_s_16k": starts.get(16384, {}).get("storm_s"),
        "reregister_s_100k": starts.get(100000, {}).get("storm_s"),
        "all_ok": all(row["ok"] for row in [*rows.values(), *watched.values(), *starts.values()]),
    }
    # Two projections: the walls measured here (16,384 Python threads on 2 cores: each rank's own milliseconds are
    # served one after another) and the design's own parts (the controller's and rank 0's time, and one rank's
    # CPU, which on a cluster every rank spends at once on its own core).
    nodes = {16384: 16384 // GPN, 100000: 100000 // GPN}
    for world, key in ((16384, "16k"), (100000, "100k")):
        start = starts.get(world, {})
        scale = nodes[world] / nodes[16384]  # rank 0 reads every node's inventory: linear in the nodes
        walls = ettr(world, last[f"verdict_s_{key}"], start.get("storm_s"), large and large["restore_agree_s"] * scale)
        own = large and (large["first_holder_s"] - large["release_woken_s"]) * scale + large["stand_in_cpu_ms_per_rank"] / 1e3
        design = ettr(world, last[f"verdict_s_{key}"], start.get("controller_part_s"), own)
        last[f"ettr_projected_{key}"] = walls and walls["ettr"]
        last[f"failure_cost_s_{key}"] = walls and walls["failure_cost_s"]
        last[f"ettr_design_{key}"] = design and design["ettr"]
        last[f"failure_cost_design_s_{key}"] = design and design["failure_cost_s"]
    last["simulated"] = "ranks are threads with real store clients running the real agreement; not torch processes"
    print(json.dumps(last))


if __name__ == "__main__":
    main()
