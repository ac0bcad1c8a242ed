"""A plain DDP loop with a bug of its own (bench/precision.py's script faults): whatever it does, no node is to blame.

    FAULT=every     every rank raises the same ValueError at step AT
    FAULT=shard     rank RANK_AT raises an IndexError on its data shard at step AT (the same one every attempt)
    FAULT=barrier   rank RANK_AT enters a barrier its peers never enter at step AT: a deadlock of the script
    FAULT=argparse  the script requires --lr and is not given it: argparse exits 2 before any step
    STEPS, BUSY_S   how many steps, and the extra compute of each (seconds, the same work on every rank)
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

fault = os.environ.get("FAULT", "")
if fault == "argparse":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.parse_args()
at, rank_at = int(os.environ.get("AT", "10")), int(os.environ.get("RANK_AT", "1"))
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
busy_s = float(os.environ.get("BUSY_S", "0.02"))
for step in range(int(os.environ.get("STEPS", "100"))):
    if step == at and fault == "every":
        raise ValueError(f"the learning-rate schedule has no value for step {step} (rank {rank})")
    if step == at and fault == "shard" and rank == rank_at:
        raise IndexError(f"index {4096 + step} is out of bounds for shard {rank} with size 4096")
    if step == at and fault == "barrier" and rank == rank_at:
        dist.barrier()  # only this rank: its peers go on to the next all-reduce and wait there for ever
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step * 1000 + rank))
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    began = time.perf_counter()
    a = torch.eye(32)
    while time.perf_counter() - began < busy_s:
        a = torch.tanh(a @ a)
    optimizer.step()
dist.destroy_process_group()
