"""Checks that need the ranks connected: communication bandwidth and compute speed.

Run after the rendezvous, before the user's script, on process groups built
directly on a prefix of the controller's store (not the default group, which
stays the user's to create):

- comm: all-reduce over the world and inside each tensor-parallel group at a
  few message sizes, reporting bus bandwidth as nccl-tests does
  (busbw = algbw * 2(n-1)/n); gloo on CPU, NCCL on GPU.
- compute: every rank times the same fixed matrix multiply; rank 0 names any
  rank slower than its peers' median by the straggler factor, so a throttled or
  failing GPU is caught before it stalls anyone.

Rank 0 writes attempt-N/checks.json and publishes the outcome in the store;
a failure ends every rank with the verdict's code, and the controller
records it in verdict.json.
"""

from __future__ import annotations

import json
import statistics
import time
from datetime import timedelta
from typing import Any

from clusterctl import rundir
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.ranks import RankLayout
from clusterctl.rundir import write_json_atomic
from clusterctl.rundir.verdict import Verdict
from clusterctl.runtime.controller import straggler
from clusterctl.runtime.rank.rankinfo import RankInfo
from clusterctl.runtime.wire import registration
from clusterctl.store import sealed

CPU_SIZES = (64 << 10, 1 << 20, 8 << 20)
GPU_SIZES = (1 << 20, 64 << 20, 256 << 20)
ITERS = 5


def _group(store: Any, name: str, rank: int, size: int, timeout_s: float) -> Any:
    import torch
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"{registration.PREFIX}check/{name}/", store)
    if torch.cuda.is_available():
        return dist.ProcessGroupNCCL(prefixed, rank, size)
    return dist.ProcessGroupGloo(prefixed, rank, size, timedelta(seconds=timeout_s))


def _device() -> Any:
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(0)  # the wrapper exposed exactly one GPU
        return torch.device("cuda", 0)
    return torch.device("cpu")


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def bandwidth(pg: Any, size: int, nbytes: int, device: Any) -> dict[str, float]:
    """Median time of ITERS all-reduces of `nbytes`; algbw and busbw in GB/s."""
    import torch

    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    pg.allreduce([tensor]).wait()  # warm-up: connections, buffers
    times = []
    for _ in range(ITERS):
        _sync(device)
        start = time.perf_counter()
        pg.allreduce([tensor]).wait()
        _sync(device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    algbw = nbytes / seconds / 1e9
    return {"bytes": nbytes, "seconds": seconds, "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (size - 1) / size}


def comm_check(info: RankInfo, store: Any, timeout_s: float) -> dict[str, Any]:
    layout = _layout(info)
    device = _device()
    sizes = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    world_pg = _group(store, "world", info.rank, info.world_size, timeout_s)
    report: dict[str, Any] = {"world": [bandwidth(world_pg, info.world_size, n, device) for n in sizes]}
    if layout.tp > 1:
        for index, members in enumerate(layout.groups("tp")):
            if info.rank in members:
                pg = _group(store, f"tp{index}", members.index(info.rank), len(members), timeout_s)
                results = [bandwidth(pg, len(members), n, device) for n in sizes]
                report["tp"] = {"group": index, "ranks": members, "results": results}
                if members[0] == info.rank:
                    key = f"{registration.PREFIX}comm/tp/{index}"
                    store.set(key, sealed.seal(info.token, key, json.dumps(report["tp"])))
    return report


def matmul_seconds(device: Any) -> float:
    """The same fixed work on every rank, timed as the device spends it: the fastest of 5 timed runs.

    A GPU's time is the wall clock around a synchronised run (the device is the rank's alone). A CPU rank shares
    its host's cores: its wall clock counts the time it waited for one, so it runs on one thread and counts that
    thread's CPU time, the work's own cost. Either way a busy host only adds time while a slow device is slow every
    time, so the fastest run tells them apart: the median of 5 wall-clock runs still named healthy ranks at 1.5x
    to 2.2x their peers in 2 of 12 clean checks of 4 ranks on 2 busy cores."""
    import torch

    cuda = device.type == "cuda"
    n, dtype, reps = (4096, torch.bfloat16, 10) if cuda else (256, torch.float32, 20)
    clock = time.perf_counter if cuda else time.thread_time
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)  # the work stays on the timed thread
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.rand(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        b = torch.rand(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        torch.matmul(a, b)  # warm-up
        times = []
        for _ in range(5):
            _sync(device)
            start = clock()
            for _ in range(reps):
                torch.matmul(a, b)
            _sync(device)
            times.append(clock() - start)
    finally:
        torch.set_num_threads(threads)  # the script's own setting
    return min(times)


def _layout(info: RankInfo) -> RankLayout:
    return RankLayout(**info.run.parallel.sizes())


COMPUTE_FACTOR_MIN = 1.5  # the compute check's factor when watchdog.straggler_factor is lower (judge_compute)


def judge_compute(times: dict[int, float], limits: straggler.Limits, hosts: list[str], gpus_per_node: int) -> dict[str, Any]:
    """Ranks slower than their peers' median by the straggler factor on the one timed matmul (runtime/controller/straggler.py's
    comparison, one step long). The rule's floors in seconds are left out: they stand above a training step's
    jitter, while this is fixed work timed five times (the fastest), milliseconds long on a healthy GPU. Its factor is
    at least COMPUTE_FACTOR_MIN: ranks sharing a busy host's cores time a short matmul 1.3x apart (the lab's 4 ranks
    on 2 cores), and a wrong verdict here ends an attempt before it trains. As in training, a slow rank's loss
    must be its node's (straggler.stands_out): a node's fault slows its own ranks, a busy machine its ranks on
    other nodes too (one of the precision corpus's 16 compute checks at load >= 4 named a healthy rank at 1.52x)."""
    ranks = sorted(times)
    found = straggler.standings([{0: times[r]} for r in ranks], [0], trimmed=0)
    unfloored = straggler.Limits(max(limits.factor, COMPUTE_FACTOR_MIN), 0.0, 0.0)
    nodes = [hosts[r // gpus_per_node] for r in ranks]
    culprits = [{"rank": ranks[s.rank], "host": nodes[s.rank],
                 "reason": f"compute {s.ratio:.2f}x its peers' median", "evidence": "slow"}
                for s in found if straggler.is_straggler(s, unfloored) and straggler.stands_out(s, found, nodes)]
    return {"median_s": statistics.median(times.values()), "factor": unfloored.factor, "slow": culprits}


def run_post_checks(names: list[str], info: RankInfo, store: Any, timeout_s: float) -> Verdict | None:
    """Run the requested checks; returns the failed verdict when one fails (None when all pass)."""
    report: dict[str, Any] = {}
    if "comm" in names:
        report["comm"] = comm_check(info, store, timeout_s)
    if "compute" in names:
        seconds = matmul_seconds(_device())
        key = f"{registration.PREFIX}compute/{info.rank}"
        store.set(key, sealed.seal(info.token, key, str(seconds)))
    if info.rank == 0:
        try:
            outcome = _rank0_judges(names, info, store, report)
        except ValueError as exc:  # a peer's result forged in the store: no result, and nobody's fault
            outcome = Verdict(False, int(ExitCode.PREFLIGHT_FAILED), f"post-rendezvous checks: {exc}; no node is blamed")
        store.set(registration.POSTCHECK, sealed.seal(info.token, registration.POSTCHECK, registration.verdict_body(outcome)))
    store.wait([registration.POSTCHECK], timedelta(seconds=timeout_s))
    body = sealed.unseal(info.token, registration.POSTCHECK, store.get(registration.POSTCHECK))
    if body is None:
        return Verdict(False, int(ExitCode.PREFLIGHT_FAILED), "the post-rendezvous checks' outcome in the store is not"
                       " rank 0's (no valid seal): someone else wrote it; no node is blamed")
    outcome = registration.read_verdict(body)
    return None if outcome.ok else outcome


def _opened(token: str, key: str, raw: bytes) -> bytes:
    """A peer's sealed check result; a forged one raises (the check fails on rank 0, blaming no node) rather than
    naming a healthy rank slow."""
    value = sealed.unseal(token, key, raw)
    if value is None:
        raise ValueError(f"{key} in the store has no valid seal: someone else wrote it")
    return value


def _rank0_judges(names: list[str], info: RankInfo, store: Any, report: dict[str, Any]) -> Verdict:
    hosts = rundir.read_hosts(info.attempt_dir)
    summary = []
    if "comm" in report:
        biggest = report["comm"]["world"][-1]
        summary.append(f"world all-reduce of {biggest['bytes'] >> 20} MiB: busbw {biggest['busbw_gbs']:.2f} GB/s")
        tp = info.run.parallel.tp
        if tp > 1:
            keys = [f"{registration.PREFIX}comm/tp/{index}" for index in range(info.world_size // tp)]
            groups = [json.loads(_opened(info.token, k, v)) for k, v in zip(keys, store.multi_get(keys))]  # waits for each
            report["comm"]["tp_groups"] = groups
            slowest = min(g["results"][-1]["busbw_gbs"] for g in groups)
            summary.append(f"slowest tp group busbw {slowest:.2f} GB/s over {len(groups)} groups")
    outcome = Verdict(True, 0, "; ".join(summary) or "post-rendezvous checks passed")
    if "compute" in names:
        keys = [f"{registration.PREFIX}compute/{r}" for r in range(info.world_size)]
        times = {r: float(_opened(info.token, k, v)) for r, (k, v) in enumerate(zip(keys, store.multi_get(keys)))}
        verdict = judge_compute(times, straggler.limits(info.run.watchdog), hosts, info.gpus_per_node)
        report["compute"] = {**verdict, "seconds": times}
        if verdict["slow"]:
            named = ", ".join(f"rank {c['rank']} on {c['host']} ({c['reason']})" for c in verdict["slow"])
            outcome = Verdict(False, int(ExitCode.STRAGGLER),
                              f"compute check: slower than {verdict['factor']}x its peers' median: {named}",
                              verdict["slow"])
    write_json_atomic(info.attempt_dir / "checks.json", report)
    return outcome
