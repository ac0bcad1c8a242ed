"""`python -m clusterctl.qualify.commbench`: collective bandwidth per group kind, run as the comm rung's job.

Every rank runs it under clusterctl (the rendezvous passed, the process group
comes from the controller's store). For each group kind whose groups have
more than one rank (world, tp, dp, ...; the plan's layout from run.json),
all-reduce, all-gather and reduce-scatter are timed at the message sizes that
kind carries in training (the traffic map's: a data-parallel gradient bucket,
a tensor-parallel activation), every group of the kind at once. Bandwidth is
reported as nccl-tests does: algbw = bytes / time; busbw = algbw x 2(n-1)/n
for all-reduce and x (n-1)/n for all-gather and reduce-scatter. When one
group of a kind is much slower than the others, each pair of its nodes is
measured alone, so that the report names the bad link. Rank 0 writes
attempt-N/commbench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from clusterctl import envnames, rundir
from clusterctl.plan.ranks import RankLayout
from clusterctl.rundir import runjson
from clusterctl.rundir.runjson import RunJson

OUTPUT = "commbench.json"
ITERS = 5
SLOW = 0.7  # a group below this fraction of its kind's median busbw is slow: its links are measured pair by pair
KINDS = ("world", "tp", "cp", "dp", "pp", "ep")
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n}


def sizes_for(kind: str, run: RunJson, cuda: bool) -> list[int]:
    """Bytes per message: what `kind` carries in a training step (capped on CPU, where gloo is slow)."""
    model = run.model or {}
    hidden, seq = int(model.get("hidden") or 1024), int(run.seq_len or 2048)
    micro = int(run.batch.micro or 1)
    activation = micro * seq * hidden * 2  # one bf16 activation tensor: what tp/cp exchange per layer
    bucket = 25 << 20  # DDP's default gradient bucket: what dp all-reduces
    wanted = {"tp": activation, "cp": activation, "ep": activation, "pp": activation, "dp": bucket, "world": bucket}[kind]
    cap = 1 << 30 if cuda else 4 << 20
    return sorted({max(4096, min(wanted, cap) // 16), max(4096, min(wanted, cap))})


def _time(op: str, tensor: torch.Tensor, group: Any, size: int, device: torch.device) -> float:
    out = torch.empty(tensor.numel() * size, dtype=tensor.dtype, device=device)
    chunk = torch.empty(max(1, tensor.numel() // size), dtype=tensor.dtype, device=device)

    def run() -> None:
        if op == "all_reduce":
            dist.all_reduce(tensor, group=group)
        elif op == "all_gather":
            dist.all_gather_into_tensor(out, tensor, group=group)
        else:
            dist.reduce_scatter_tensor(chunk, tensor[: chunk.numel() * size], group=group)

    run()  # warm-up (connections, buffers)
    times = []
    for _ in range(ITERS):
        if device.type == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _groups(layout: RankLayout, kind: str) -> list[list[int]]:
    return [list(range(layout.world))] if kind == "world" else layout.groups(kind)


def measure(layout: RankLayout, run: RunJson, hosts: list[str]) -> dict[str, Any]:
    rank = dist.get_rank()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    results: list[dict[str, Any]] = []
    slow: list[dict[str, Any]] = []
    for kind in KINDS:
        groups = _groups(layout, kind)
        if not groups or len(groups[0]) < 2 or (kind != "world" and len(groups[0]) == layout.world and "world" in KINDS):
            continue
        handles = [dist.new_group(g) for g in groups]  # every rank creates every group, in the same order
        mine = next(i for i, g in enumerate(groups) if rank in g)
        size = len(groups[0])
        for op in BUS:
            if op != "all_reduce" and not cuda and dist.get_backend() == "gloo" and op == "reduce_scatter":
                results.append({"op": op, "kind": kind, "skipped": "gloo has no reduce-scatter"})
                continue
            for nbytes in sizes_for(kind, run, cuda):
                tensor = torch.ones(max(size, nbytes // 4) // size * size, dtype=torch.float32, device=device)
                seconds = _time(op, tensor, handles[mine], size, device)
                per_group = torch.zeros(len(groups), dtype=torch.float64, device=device)
                per_group[mine] = seconds
                dist.all_reduce(per_group, op=dist.ReduceOp.MAX)  # each group's slowest member
                times = per_group.tolist()
                bus = [tensor.numel() * 4 / t * BUS[op](size) / 1e9 for t in times]
                row = {"op": op, "kind": kind, "group_size": size, "groups": len(groups), "bytes": tensor.numel() * 4,
                       "seconds": max(times), "busbw_gbs": round(statistics.median(bus), 4), "min_busbw_gbs": round(min(bus), 4),
                       "slowest_group": groups[bus.index(min(bus))]}
                results.append(row)
                if op == "all_reduce" and len(groups) > 1 and min(bus) < SLOW * statistics.median(bus):
                    slow.append(row)
    return {"results": results, "links": _pairs(slow, hosts, device), "backend": dist.get_backend(), "world": layout.world}


def _pairs(slow: list[dict[str, Any]], hosts: list[str], device: torch.device) -> list[dict[str, Any]]:
    """Each pair of nodes of the slowest group, measured alone: the bad link is the pair that is slow."""
    if not slow:
        return []
    group = min(slow, key=lambda r: r["min_busbw_gbs"])["slowest_group"]
    by_node: dict[str, int] = {}
    for r in group:
        by_node.setdefault(hosts[r] if r < len(hosts) else str(r), r)
    nodes = sorted(by_node)
    pairs = [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1 :]][:32]
    links = []
    tensor = torch.ones((8 << 20) // 4, dtype=torch.float32, device=device)
    for a, b in pairs:
        handle = dist.new_group([by_node[a], by_node[b]])
        if dist.get_rank() in (by_node[a], by_node[b]):
            seconds = _time("all_reduce", tensor, handle, 2, device)
            links.append({"nodes": [a, b], "busbw_gbs": round(tensor.numel() * 4 / seconds / 1e9, 4)})
        dist.barrier()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, links)
    return sorted({json.dumps(x): x for part in gathered for x in part}.values(), key=lambda x: x["busbw_gbs"])


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m clusterctl.qualify.commbench", description=__doc__.splitlines()[0]).parse_args(argv)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    run_dir = Path(os.environ[envnames.RUN_DIR])
    run = runjson.load(run_dir)
    layout = RankLayout(**run.parallel.sizes())
    attempt = Path(os.environ[envnames.ATTEMPT_DIR])
    node_hosts = rundir.read_hosts(attempt)
    per_node = run.gpus_per_node or 1
    hosts = [node_hosts[r // per_node] if r // per_node < len(node_hosts) else str(r) for r in range(layout.world)]
    report = measure(layout, run, hosts)
    if dist.get_rank() == 0:
        rundir.write_json_atomic(attempt / OUTPUT, report)
        best = {(r["op"], r["kind"]): r["busbw_gbs"] for r in report["results"] if "busbw_gbs" in r}
        print("commbench: " + ", ".join(f"{op} {kind} {bw} GB/s" for (op, kind), bw in best.items()), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
