"""A plain DDP training script: it imports nothing of clusterctl, and clusterctl watches it anyway.

train_ddp_contract.py is the same script with the recovery contract added
(`diff train_ddp.py train_ddp_contract.py` shows the few lines).

Run by torchrun, by hand, or by clusterctl (examples/own-script/ddp.yaml): it
reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://) as any
torch.distributed script does. Under clusterctl every optimizer step is
reported with its step and compute time, so hangs and stragglers are named.

    STEPS=200        how many optimizer steps
    BUSY_S=0.05      extra compute per step, in seconds (the same amount of work on every rank)
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def busy_rate(device: torch.device, seconds: float = 0.3) -> float:
    """Multiply-adds of a small matrix per second on this device, the mean over ranks (so all do the same work)."""
    a = torch.randn(64, 64, device=device)
    count, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        a = torch.tanh(a @ a)
        count += 1
    float(a.sum())  # wait for the device
    rate = torch.tensor([count / (time.perf_counter() - began)], device=device)
    dist.all_reduce(rate)
    return float(rate) / dist.get_world_size()


def main() -> None:
    gpu = torch.cuda.is_available()
    # Each rank sees its own GPU (under torchrun, all of the node's): LOCAL_RANK modulo what it sees.
    device = torch.device("cpu")
    if gpu:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    model = DistributedDataParallel(net, device_ids=[device] if gpu else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    steps, busy_s = int(os.environ.get("STEPS", "200")), float(os.environ.get("BUSY_S", "0"))
    units = round(busy_s * busy_rate(device)) if busy_s > 0 else 0
    began = time.perf_counter()
    for step in range(steps):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step * 1000 + rank)).to(device)  # the step's batch
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        a = torch.eye(64, device=device)
        for _ in range(units):  # the step's extra compute
            a = torch.tanh(a @ a)
        optimizer.step()
        if rank == 0 and step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"trained {steps} steps in {time.perf_counter() - began:.3f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
