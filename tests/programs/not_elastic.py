"""A plain DDP loop that is not elastic: it keeps a per-rank file keyed by the rank count and fails without it.

At its planned world size it trains (a linear model's gradients all-reduced, 0.05 s of sleep a step); resumed at another world
size, as after an elastic shrink, every rank fails the same way at start: the script's own error.
"""

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
state = Path(sys.argv[1]) / f"rank-{rank}-of-{world}.txt"
planned = int(sys.argv[2])
if world != planned and not state.exists():
    raise FileNotFoundError(f"{state}: this script keeps per-rank state by rank count and cannot resume at {world} ranks")
state.parent.mkdir(parents=True, exist_ok=True)
state.write_text("kept")
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100000):  # an optimizer step a step: the watchdog counts them
    optimizer.zero_grad()
    model(torch.ones(1, 1)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    time.sleep(0.05)
