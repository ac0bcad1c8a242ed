"""Start-up to the first barrier: clusterctl vs torchrun (c10d) vs plain env://.

    python bench/rendezvous.py [--quick] [--sizes 8,16,32,64]

For each N, in one run on this machine:
- clusterctl: the controller and N ranks through the real rendered wrapper
  (bash binding, `python -m clusterctl.launch`: preflight, registration,
  verdict, then the rank script's init_process_group on the controller's store);
- torchrun: one `torchrun --nnodes=N --nproc-per-node=1 --rdzv-backend=c10d`
  per emulated node, all on this machine;
- env://: N plain processes, rank 0 hosting the TCPStore, no checks.
Every rank runs bench/programs/first_barrier.py (gloo, one barrier). Time is
from just before the first process starts to the last rank past its barrier;
"after import" is from the moment the last process had torch imported (the
protocol's own cost). Targets at N=64: clusterctl <= half of torchrun, and
<= 1 s over env://.

Last line: {"n", "clusterctl_s", "torchrun_s", "env_s", "ratio", "overhead_vs_env_s"} for the largest N.
A torchrun that does not finish within --torchrun-timeout is stopped; its
ratio is then clusterctl / timeout, an upper bound ("ratio_is_upper_bound").
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BARRIER = ROOT / "bench" / "programs" / "first_barrier.py"
TORCHRUN_REPEATED_UP_TO = 16
MB_PER_PROCESS = 140  # a process with torch imported: torchrun at N=64 (128 processes) peaks near 17 GB here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def collect(out: Path, n: int, t0: float, imported: dict[int, float] | None = None) -> dict[str, float]:
    rows = [json.loads(p.read_text()) for p in out.glob("*.json")]
    if len(rows) != n:
        raise RuntimeError(f"only {len(rows)} of {n} ranks passed the barrier")
    done = max(r["done"] for r in rows)
    last_import = max((imported or {r["rank"]: r["imported"] for r in rows}).values())
    return {"total_s": round(done - t0, 3), "after_import_s": round(done - last_import, 3)}


def wait_all(procs: list[subprocess.Popen], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        left = max(1.0, deadline - time.monotonic())
        try:
            p.wait(timeout=left)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    bad = [p.args for p in procs if p.returncode != 0]
    if bad:
        raise RuntimeError(f"{len(bad)} processes failed, e.g. {bad[0]}")


def run_env(n: int, work: Path) -> dict[str, float]:
    out = work / "env"
    out.mkdir()
    port = free_port()
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n), BENCH_OUT=str(out))
    t0 = time.time()
    procs = [
        subprocess.Popen([sys.executable, str(BARRIER)], env=dict(base, RANK=str(r), LOCAL_RANK="0"))
        for r in range(n)
    ]
    wait_all(procs)
    return collect(out, n, t0)


def run_torchrun(n: int, work: Path, timeout: float = 600) -> dict[str, float]:
    out = work / "torchrun"
    out.mkdir()
    port = free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    base = dict(os.environ, BENCH_OUT=str(out), OMP_NUM_THREADS="1")
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [
                *torchrun,
                f"--nnodes={n}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=bench",
                "--max-restarts=0",
                "--monitor-interval=0.1",
                str(BARRIER),
            ],
            env=base,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    wait_all(procs, timeout)
    return collect(out, n, t0)


def render_local_run(n: int, work: Path) -> Path:
    """The real run directory of an n-rank job on the local site (n/4 emulated nodes)."""
    from clusterctl.config.site import Partition, load_site
    from clusterctl.config.spec import JobSpec
    from clusterctl.plan import make_plan
    from clusterctl.render.scripts import render_run
    from clusterctl.syntax.cpulist import format_cpulist

    site, _ = load_site("local")
    gpn = 4 if n >= 4 else n
    nodes = n // gpn
    # Every rank may run on every CPU here, as the env:// and torchrun processes do: the
    # local site pins emulated GPUs to CPU 0 or 1, which on 2 cores measures the pinning.
    emulated = site.node_types["emulated"]
    all_cpus = format_cpulist(os.sched_getaffinity(0))
    emulated = emulated.model_copy(update={"gpus": [g.model_copy(update={"cpus": all_cpus}) for g in emulated.gpus]})
    site = site.model_copy(
        update={
            "node_types": {"emulated": emulated},
            "partitions": {"local": Partition(node_type="emulated", nodes=f"node[1-{nodes}]", default=True)},
            "network": site.network.model_copy(update={"addresses": {f"node{i}": "127.0.0.1" for i in range(1, nodes + 1)}}),
        }
    )
    spec = JobSpec.model_validate(
        {
            "name": "bench",
            "time_limit": "1h",
            "nodes": nodes,
            "gpus_per_node": gpn,
            "command": ["python3", str(BARRIER)],
            "runs_root": str(work),
        }
    )
    plan = make_plan(spec, site)
    run_dir = work / "run"
    run_dir.mkdir()
    rendered = render_run(plan, run_dir, python=sys.executable)
    for name, text in rendered.files.items():
        (run_dir / name).write_text(text)
    (run_dir / "checkpoints").mkdir()
    return run_dir


def run_clusterctl(n: int, work: Path) -> dict[str, float]:
    run_dir = render_local_run(n, work)
    attempt = run_dir / "attempt-1"
    (attempt / "logs").mkdir(parents=True)
    out = work / "clusterctl"
    out.mkdir()
    gpn = 4 if n >= 4 else n
    hosts = [f"node{i + 1}" for i in range(n // gpn)]
    (attempt / "hosts").write_text("\n".join(hosts) + "\n")
    token = os.urandom(8).hex()
    base = dict(
        os.environ,
        CLUSTERCTL_RUN_DIR=str(run_dir),
        CLUSTERCTL_ATTEMPT_DIR=str(attempt),
        CLUSTERCTL_ATTEMPT="1",
        CLUSTERCTL_TOKEN=token,
        MASTER_ADDR="127.0.0.1",
        BENCH_OUT=str(out),
    )
    t0 = time.time()
    controller = subprocess.Popen(
        [sys.executable, "-m", "clusterctl.runtime.controller", "--attempt-dir", str(attempt), "--port", str(free_port())],
        env=dict(base, SLURMD_NODENAME=hosts[0]),
        stdout=subprocess.DEVNULL,
    )
    ready = attempt / "controller.json"
    while not ready.exists():  # what the batch script waits for before srun
        if controller.poll() is not None:
            raise RuntimeError("controller failed")
        time.sleep(0.01)
    port = json.loads(ready.read_text())["port"]
    procs = []
    for r in range(n):
        env = dict(
            base,
            MASTER_PORT=str(port),
            SLURM_PROCID=str(r),
            SLURM_LOCALID=str(r % gpn),
            SLURM_NODEID=str(r // gpn),
            SLURM_NTASKS=str(n),
            SLURMD_NODENAME=hosts[r // gpn],
        )
        procs.append(subprocess.Popen(["bash", str(run_dir / "wrapper.sh")], env=env))
    wait_all(procs)
    controller.terminate()
    controller.wait(30)
    from clusterctl.rundir import MANIFEST, rankmanifest

    imported = {r["rank"]: r["timings"]["torch_imported"] for r in rankmanifest.iter_ranks(attempt / MANIFEST)}
    return collect(out, n, t0, imported)


def median_run(rows: list[dict[str, float]]) -> dict[str, float] | None:
    """The run with the median total (its after-import figure comes with it)."""
    if not rows:
        return None
    return sorted(rows, key=lambda r: r["total_s"])[len(rows) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=8 only, one repetition")
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (torchrun: once above N=16)")
    parser.add_argument("--torchrun-timeout", type=float, default=600, help="seconds before a torchrun run is given up")
    parser.add_argument("--no-torchrun", action="store_true", help="clusterctl and env:// only (the overhead)")
    args = parser.parse_args()
    # As a pip install leaves it: byte-compiled (torch is). Without this, every rank of an
    # editable install under PYTHONDONTWRITEBYTECODE compiles clusterctl's modules anew.
    compileall.compile_dir(ROOT / "clusterctl", quiet=1)
    sizes = [8] if args.quick else [int(x) for x in args.sizes.split(",")]
    result: dict[str, object] = {}
    for n in sizes:
        repeats = 1 if args.quick else args.repeat
        runs: dict[str, list[dict[str, float]]] = {"env": [], "clusterctl": [], "torchrun": []}
        torchrun_gave_up = False
        needed = 2 * n * MB_PER_PROCESS
        for i in range(repeats):  # interleaved, so drift on a shared machine hits all three alike
            with tempfile.TemporaryDirectory() as tmp:
                work = Path(tmp)
                runs["env"].append(run_env(n, work))
                runs["clusterctl"].append(run_clusterctl(n, work))
                print(f"N={n} run {i + 1}: env:// {runs['env'][-1]}, clusterctl {runs['clusterctl'][-1]}", flush=True)
                if args.no_torchrun or (n > TORCHRUN_REPEATED_UP_TO and i > 0):
                    continue  # above that, torchrun once: minutes per run, and most of the memory
                if available_mb() > needed * 1.1:
                    try:
                        runs["torchrun"].append(run_torchrun(n, work, args.torchrun_timeout))
                    except subprocess.TimeoutExpired:
                        torchrun_gave_up = True
                        print(f"N={n}: torchrun did not finish within {args.torchrun_timeout:.0f} s", flush=True)
                    except RuntimeError as exc:
                        print(f"N={n}: torchrun failed: {str(exc)[:200]}", flush=True)
                else:
                    print(f"N={n}: torchrun skipped: needs ~{needed} MB, {available_mb()} MB available")
        row = {name: median_run(rows) for name, rows in runs.items()}
        c, t, e = row["clusterctl"], row["torchrun"], row["env"]
        line = (
            f"N={n:>3}: clusterctl {c['total_s']:.2f} s (after import {c['after_import_s']:.2f}), "
            f"env:// {e['total_s']:.2f} s (after import {e['after_import_s']:.2f})"
        )
        # A torchrun that never finished bounds the ratio from above: it took longer than the limit.
        torchrun_s = t["total_s"] if t else (args.torchrun_timeout if torchrun_gave_up else None)
        ratio = round(c["total_s"] / torchrun_s, 3) if torchrun_s else None
        if t:
            line += f", torchrun {t['total_s']:.2f} s (after import {t['after_import_s']:.2f}); ratio {ratio:.2f}"
        elif torchrun_gave_up:
            line += f", torchrun > {torchrun_s:.0f} s (did not finish); ratio < {ratio:.2f}"
        print(line, flush=True)
        result = {
            "n": n,
            "clusterctl_s": c["total_s"],
            "torchrun_s": t["total_s"] if t else None,
            "env_s": e["total_s"],
            "ratio": ratio,
            "ratio_is_upper_bound": bool(torchrun_gave_up and not t),
            "overhead_vs_env_s": round(c["total_s"] - e["total_s"], 3),
            "clusterctl_after_import_s": c["after_import_s"],
            "torchrun_after_import_s": t["after_import_s"] if t else None,
            "env_after_import_s": e["after_import_s"],
        }
    print(json.dumps(result))


if __name__ == "__main__":
    if shutil.which("bash") is None:
        sys.exit("bash is required")
    main()
