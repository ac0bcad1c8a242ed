"""The controller at scale: from the last rank's arrival to the verdict, up to 150,000 ranks.

    python bench/controller_scale.py [--quick] [--live 1024,16384] [--preloaded 1024,...,100000] [--stress 150000]

The real controller (`python -m clusterctl.runtime.controller`) runs as its
own process with a synthetic run directory (8 ranks per node, tp=8).

* live sizes: emulated ranks, torch TCPStore clients, a thread each, in a few
  worker processes; each calls the project's own `rendezvous.connect`,
  `register` and `await_verdict` with a realistic ~1.7 KB record (the shape
  a rank registers: preflight results, versions, timings).
* preloaded sizes: beyond what one machine's threads and file limit allow,
  one client stores every rank's registration (the same bytes a rank stores)
  and then bumps the arrival count to N: the controller's own work.

Per size: last arrival -> verdict published (seen by a client waiting on
the verdict key), the controller's collect / judge / manifest seconds and
its CPU for them (its own log line), its CPU overall and peak RSS (wait4),
and the manifest's size. A preloaded size above this machine's hard
open-file limit runs the controller with its file-limit check told that
two connections will do (the only change). Under root with `unshare` the whole bench runs in
a private mount namespace whose /etc/hosts answers torch's reverse lookup
of `::ffff:127.0.0.1` (one per client connect) locally; --no-namespace
leaves name resolution alone.

Targets: last arrival -> verdict <= 1 s at 16,384 and <= 5 s at 100,000;
controller CPU per rank at the largest target size within 1.5x of 1,024's;
peak RSS <= 1 GB at 100,000; no failure at 150,000.
--quick: 1,024 and 16,384 preloaded (under a minute).

Last line: {"ranks", "verdict_s", "us_per_rank_1k", "us_per_rank_max",
"peak_rss_mb", "manifest_mb"} for the preloaded sizes (the controller's own
work, like with like: 1,024 against the largest, 100,000; 16,384 with
--quick), plus "verdict_s_16k" (live and preloaded), "all_ok" and "stress"
(each stress size: ok and its figures).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
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

from clusterctl.runtime.wire import greeting, registration  # noqa: E402

GPN = 8
WORKERS = 4  # processes of emulated ranks
PRELOAD_BATCH = 64  # registrations per multi_set: ~110 KB requests (the store re-parses partial requests)
TIMINGS = re.compile(r"rendezvous timings (\{.*\})")
NAMESPACE_FLAG = "CLUSTERCTL_BENCH_NAMESPACE"
TOKEN = "bench-token"


def raise_nofile(needed: int = 0) -> int:
    """Soft limit to the hard one; as root, the hard one up to `needed` too (children inherit both)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if needed > hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
            return needed
        except (ValueError, OSError):
            pass
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def rank_record(rank: int, world: int, hosts: list[str], run_dir: str) -> dict[str, Any]:
    """What a rank of an emulated node registers (the shape of clusterctl.launch's record, ~1.7 KB)."""
    host = hosts[rank // GPN]
    local = rank % GPN
    ckpt = f"{run_dir}/checkpoints"
    return {
        "rank": rank, "world_size": world, "local_rank": local, "host": host, "pid": 10000 + rank,
        "proof": greeting.registration_proof(TOKEN, rank, host, 10000 + rank),  # as a rank proves it, never the token
        "attempt": 1, "gpu": local, "cpus": f"{local * 8}-{local * 8 + 7}", "numa": local // 4, "nics": [f"mlx5_{local}"],
        "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None, "hip": None, "nccl": None},
        "preflight": [
            {"name": "gpu", "ok": True, "skipped": True, "detail": "emulated GPU: no hardware to check", "data": {}},
            {"name": "nic", "ok": True, "skipped": False, "detail": f"NICs on {host}: mlx5_{local} up",
             "data": {"nics": [{"kind": "infiniband", "name": f"mlx5_{local}", "path": f"/sys/class/net/ib{local}", "state": "up"}]}},
            {"name": "cpu", "ok": True, "skipped": False, "detail": f"rank {rank} on {host} bound to CPUs {local * 8}-{local * 8 + 7}",
             "data": {"expected": f"{local * 8}-{local * 8 + 7}", "seen": f"{local * 8}-{local * 8 + 7}"}},
            {"name": "memory", "ok": True, "skipped": False, "detail": f"{host}: 1843.2 GiB available (need 1.0 GiB)",
             "data": {"mem_available_bytes": 1979120929996, "mem_total_bytes": 2164663517184, "min_free_bytes": 1073741824, "source": "MemAvailable"}},
            {"name": "dirs", "ok": True, "skipped": False, "detail": f"3 directories writable on {host}",
             "data": {"dirs": [{"ok": True, "path": "/tmp"}, {"ok": True, "path": ckpt}, {"ok": True, "path": f"{run_dir}/attempt-1"}]}},
            {"name": "shared_fs", "ok": True, "skipped": False, "detail": f"marker {ckpt}/.clusterctl-shared-{TOKEN} on {host} holds this attempt's token",
             "data": {"found": True, "marker": f"{ckpt}/.clusterctl-shared-{TOKEN}", "token_checked": True, "token_matches": True}},
        ],
        "timings": {"started": 1796097852.5668297 + rank * 1e-4, "preflight_done": 1796097852.5831895, "torch_imported": 1796097857.977626},
    }


def make_run(root: Path, world: int) -> tuple[Path, list[str]]:
    run_dir = root / f"run-{world}"
    attempt = run_dir / "attempt-1"
    (attempt / "logs").mkdir(parents=True)
    hosts = [f"node{i:05d}" for i in range(world // GPN)]
    (attempt / "hosts").write_text("\n".join(hosts) + "\n")
    run = {
        "world_size": world, "gpus_per_node": GPN,
        "parallel": {"tp": GPN, "cp": 1, "ep": 1, "dp": world // GPN, "pp": 1},
        "rendezvous": {"timeout_s": 900, "port_range": [20000, 29999]},
        "preflight": {"checks": []},
        "node_type": {"gpu_vendor": "emulated", "binding": []},
    }
    (run_dir / "run.json").write_text(json.dumps(run))
    return attempt, hosts


# A preloaded store holds two client connections whatever its size: where this machine's hard
# open-file limit is below the world size (and cannot be raised), the controller is told so, and
# everything else it does is the real controller's.
PRELOADED_CONTROLLER = (
    "import sys; from clusterctl.runtime.controller import filelimit, main as controller; "
    "filelimit.needed_files = lambda world, nodes: 2 + filelimit.RESERVE; "
    "sys.exit(controller.main(sys.argv[1:]))"
)


class Controller:
    running: list[Controller] = []  # started and not yet stopped: stop_all() ends them when a bench fails

    def __init__(self, attempt: Path, preloaded: bool) -> None:
        self.stopped: dict[str, float] = {}
        env = dict(os.environ, CLUSTERCTL_TOKEN=TOKEN, CLUSTERCTL_ATTEMPT="1", SLURMD_NODENAME="node00000")
        self.out = attempt.parent / "controller.out"
        self.fh = open(self.out, "w")
        world = int(json.loads((attempt.parent / "run.json").read_text())["world_size"])
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        from clusterctl.runtime.controller.filelimit import needed_files

        entry = ["-c", PRELOADED_CONTROLLER] if preloaded and needed_files(world, world // GPN) > hard else ["-m", "clusterctl.runtime.controller"]
        self.proc = subprocess.Popen(
            [sys.executable, *entry, "--attempt-dir", str(attempt), "--port", "20000"],
            env=env, stdout=self.fh, stderr=subprocess.STDOUT, cwd=ROOT,
        )
        Controller.running.append(self)
        ready = attempt / "controller.json"
        deadline = time.monotonic() + 120
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"controller did not start: {self.out.read_text()}")
            time.sleep(0.02)
        self.port = json.loads(ready.read_text())["port"]
        self.attempt = attempt

    def wait_store(self) -> Any:
        """A client of the controller's store (the controller is still importing torch: retry)."""
        from torch.distributed import TCPStore

        deadline = time.monotonic() + 120
        while True:
            try:
                return TCPStore("127.0.0.1", self.port, 1, False, timeout=timedelta(seconds=900),
                                use_libuv=True, wait_for_workers=False)
            except Exception:  # noqa: BLE001
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def timings(self, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.out.read_text(errors="replace")
            found = TIMINGS.search(text)
            if found:
                return json.loads(found.group(1))
            refused = re.search(r"rendezvous refused: .*", text)
            if refused:
                raise RuntimeError(refused.group(0))
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"no timings from the controller: {self.out.read_text()[-3000:]}")

    def stop(self) -> dict[str, float]:
        """SIGTERM, then its code and resource use; a second call returns the first's (stop_all may come after:
        three controllers that failed benches left behind held the store's port for the runs after)."""
        if self.proc.returncode is not None:
            return self.stopped
        self.proc.send_signal(signal.SIGTERM)
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.fh.close()
        self.stopped = {"code": self.proc.returncode, "peak_rss_mb": usage.ru_maxrss / 1024,
                        "cpu_s": usage.ru_utime + usage.ru_stime}
        Controller.running.remove(self)
        return self.stopped


def stop_all() -> None:
    """Every controller a bench started and did not stop (it failed on the way)."""
    for ctl in list(Controller.running):
        ctl.stop()


def watch_verdict(store: Any, seen: dict[str, float]) -> threading.Thread:
    def wait() -> None:
        store.wait([registration.VERDICT])
        seen["verdict"] = time.time()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def preload(store: Any, world: int, hosts: list[str], run_dir: str) -> float:
    """Every rank's registration as a rank stores it, then the arrival count: the last arrival's time."""
    for start in range(0, world, PRELOAD_BATCH):
        ranks = range(start, min(world, start + PRELOAD_BATCH))
        store.multi_set([registration.reg_key(r) for r in ranks],
                        [registration.sealed_registration(TOKEN, r, 1, rank_record(r, world, hosts, run_dir)) for r in ranks])
    store.add(registration.ARRIVED, world)
    return time.time()


def worker(port: int, world: int, first: int, last: int, run_dir: str, gated: bool = False) -> None:
    """Emulated ranks first..last-1, a thread each; prints their last arrival and verdict times. `gated`: the
    threads start, print that they are ready, and wait for a line on stdin before any connects (a restart's ranks,
    forked before the store is up, all reach it at once)."""
    from clusterctl.runtime.rank import rendezvous
    from clusterctl.runtime.rank.rankinfo import RankInfo

    raise_nofile()
    threading.stack_size(256 * 1024)
    hosts = (Path(run_dir) / "attempt-1" / "hosts").read_text().split()
    arrived: list[float] = []
    told: list[float] = []
    failed: list[str] = []
    go = threading.Event()
    if not gated:
        go.set()

    def rank(r: int) -> None:
        go.wait()
        try:
            env = {"CLUSTERCTL_RUN_DIR": run_dir, "CLUSTERCTL_ATTEMPT_DIR": f"{run_dir}/attempt-1", "RANK": str(r),
                   "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            store = rendezvous.connect(RankInfo.from_env(env), 600)
            rendezvous.register(store, r, rank_record(r, world, hosts, run_dir), TOKEN)
            arrived.append(time.time())
            verdict = rendezvous.await_verdict(store, 600, world, TOKEN)
            told.append(time.time())
            if not verdict.ok:
                failed.append(verdict.message[:200])
        except Exception as exc:  # noqa: BLE001
            failed.append(f"rank {r}: {exc}"[:200])

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(first, last)]
    for t in threads:
        t.start()
    if gated:
        print(json.dumps({"ready": len(threads)}), flush=True)
        sys.stdin.readline()
        go.set()
    for t in threads:
        t.join()
    print(json.dumps({"last_arrival": max(arrived, default=0), "first_told": min(told, default=0),
                      "last_told": max(told, default=0), "failed": len(failed), "first_failure": failed[:1]}), flush=True)


def one_size(root: Path, world: int, live: bool) -> dict[str, Any]:
    attempt, hosts = make_run(root, world)
    started = time.time()
    ctl = Controller(attempt, preloaded=not live)
    seen: dict[str, float] = {}
    watcher = watch_verdict(ctl.wait_store(), seen)  # a client of its own: one client is not for two threads
    failures = 0
    if live:
        per = -(-world // WORKERS)
        procs = [
            subprocess.Popen([sys.executable, __file__, "--worker", str(ctl.port), str(world), str(i * per),
                              str(min(world, (i + 1) * per)), str(attempt.parent)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
            for i in range(WORKERS)
        ]
        reports = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        last_arrival = max(r["last_arrival"] for r in reports)
        failures = sum(r["failed"] for r in reports)
        if failures:
            print(f"  {world}: {failures} ranks failed, e.g. {reports[0]['first_failure'] or reports[-1]['first_failure']}", file=sys.stderr)
    else:
        last_arrival = preload(ctl.wait_store(), world, hosts, str(attempt.parent))
    watcher.join(600)
    timings = ctl.timings()
    usage = ctl.stop()
    manifest = attempt / "manifest.json"
    verdict = json.loads((attempt / "verdict.json").read_text())
    row = {
        "ranks": world,
        "mode": "live" if live else "preloaded",
        "ok": bool(verdict.get("ok")) and usage["code"] == 0 and not failures,
        "verdict_s": round(seen["verdict"] - last_arrival, 3),
        "collect_s": timings["collect_s"],
        "judge_s": timings["judge_s"],
        "manifest_s": timings["manifest_s"],
        "us_per_rank": round(timings["cpu_s"] / world * 1e6, 2),
        "controller_cpu_s": round(usage["cpu_s"], 2),
        "peak_rss_mb": round(usage["peak_rss_mb"]),
        "manifest_mb": round(manifest.stat().st_size / 1e6, 1) if manifest.exists() else None,
        "wall_s": round(time.time() - started, 1),
    }
    shutil.rmtree(attempt.parent, ignore_errors=True)
    return row


def in_namespace(sources: int = 1) -> None:
    """Re-run in a private mount namespace whose /etc/hosts names ::ffff:127.0.0.1 and the loopback addresses
    127.0.0.2 .. 127.0.0.<sources> that stand-ins connect from (torch's store looks up every peer's name: one not in
    /etc/hosts goes to DNS). Root + unshare only."""
    if os.environ.get(NAMESPACE_FLAG) or os.geteuid() != 0 or not shutil.which("unshare") or "--no-namespace" in sys.argv:
        return
    hosts = Path(tempfile.mkdtemp(prefix="ctlscale-")) / "hosts"
    named = "".join(f"127.0.0.{i} loopback{i}\n" for i in range(2, sources + 1))
    hosts.write_text(Path("/etc/hosts").read_text() + "\n::ffff:127.0.0.1 localhost\n" + named)
    script = f'mount --bind "{hosts}" /etc/hosts && exec "$0" "$@"'
    env = dict(os.environ, **{NAMESPACE_FLAG: "1"})
    rc = subprocess.call(["unshare", "-m", "--propagation", "private", "sh", "-c", script, sys.executable, *sys.argv], env=env)
    shutil.rmtree(hosts.parent, ignore_errors=True)
    sys.exit(rc)


def sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        port, world, first, last = (int(x) for x in sys.argv[2:6])
        worker(port, world, first, last, sys.argv[6], gated="--gated" in sys.argv)
        return
    in_namespace()
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--live", type=sizes)
    parser.add_argument("--preloaded", type=sizes)
    parser.add_argument("--stress", type=sizes)
    parser.add_argument("--no-namespace", action="store_true")
    args = parser.parse_args()
    live = args.live if args.live is not None else ([] if args.quick else [1024, 16384])
    preloaded = args.preloaded if args.preloaded is not None else ([1024, 16384] if args.quick else [1024, 16384, 32768, 65536, 100000])
    stress = args.stress if args.stress is not None else ([] if args.quick else [150000])
    from clusterctl.runtime.controller.filelimit import needed_files

    largest = max(live + preloaded + stress, default=0)
    limit = raise_nofile(needed_files(largest, largest // GPN) + 64)
    print(f"open-file limit for the controller: {limit}")
    print(f"name resolution: {'private /etc/hosts with ::ffff:127.0.0.1' if os.environ.get(NAMESPACE_FLAG) else 'the host’s'}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ctlscale-") as tmp:
        plan = [(n, True) for n in live] + [(n, False) for n in preloaded] + [(n, False) for n in stress]
        print(f"{'ranks':>8} {'mode':>9} {'verdict s':>9} {'collect':>8} {'judge':>7} {'manifest':>8} {'us/rank':>8}"
              f" {'ctl cpu s':>9} {'rss MB':>7} {'manif MB':>8} {'ok':>4}")
        for n, is_live in plan:
            try:
                row = one_size(Path(tmp), n, is_live)
            except Exception as exc:  # noqa: BLE001 - a failure at a size is a result
                row = {"ranks": n, "mode": "live" if is_live else "preloaded", "ok": False, "error": str(exc)[:300]}
                print(f"{n:>8} failed: {row['error']}")
            else:
                print(f"{n:>8} {row['mode']:>9} {row['verdict_s']:>9} {row['collect_s']:>8} {row['judge_s']:>7}"
                      f" {row['manifest_s']:>8} {row['us_per_rank']:>8} {row['controller_cpu_s']:>9} {row['peak_rss_mb']:>7}"
                      f" {row['manifest_mb']:>8} {str(row['ok']):>4}", flush=True)
            rows.append(row)
    # The headline compares like with like: the controller's own work on preloaded stores (live rows when none).
    measured = [r for r in rows if "verdict_s" in r and r["ranks"] not in stress]
    same_mode = [r for r in measured if r["mode"] == "preloaded"] or measured
    largest = max(same_mode, key=lambda r: r["ranks"]) if same_mode else {}
    small = min(same_mode, key=lambda r: r["ranks"]) if same_mode else {}
    at_16k = {r["mode"]: r["verdict_s"] for r in measured if r["ranks"] == 16384}
    print(json.dumps({
        "ranks": largest.get("ranks"),
        "verdict_s": largest.get("verdict_s"),
        "us_per_rank_1k": small.get("us_per_rank"),
        "us_per_rank_max": max((r["us_per_rank"] for r in same_mode), default=None),
        "peak_rss_mb": largest.get("peak_rss_mb"),
        "manifest_mb": largest.get("manifest_mb"),
        "verdict_s_16k": at_16k,
        "all_ok": all(r.get("ok") for r in rows),
        "stress": [{k: r.get(k) for k in ("ranks", "ok", "verdict_s", "peak_rss_mb", "error") if k in r}
                   for r in rows if r["ranks"] in stress],
    }))


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_all()
