"""The shape whose end deadlocked: a DDP model still alive in the script's globals when the script returns
after `destroy_process_group()`, as most tutorials end. A long GIL switch interval makes the race likely:
the training thread keeps the GIL while gloo's worker thread waits for it (as a starved CPU does by chance)."""

import sys
import time

sys.setswitchinterval(100.0)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    if rank == 1:
        time.sleep(0.1)  # its peers wait for it in the gradient all-reduce
    loss = model(torch.ones(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if rank == 0:
    print("trained 8 steps", flush=True)
dist.destroy_process_group()
