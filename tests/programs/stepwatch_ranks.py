"""Two gloo ranks under the step watcher, as the launcher installs it; rank 1 works longer before each step.

    python stepwatch_ranks.py RANK WORLD PORT ATTEMPT_DIR [--own-hook] [--sgd]

Rank 0 records its loss as a tensor (clusterctl.watch.record). With
--own-hook the script registers DDP's default all-reduce hook itself (it must
still be timed); with --sgd the optimizer keeps no step count.
"""

import os
import sys
import time

rank, world, port, attempt_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)

from clusterctl.runtime.rank import stepwatch  # noqa: E402

stepwatch.install(rank, world, 1, attempt_dir)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from clusterctl.runtime.rank import procexit  # noqa: E402
from clusterctl.watch import record  # noqa: E402

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
if "--own-hook" in sys.argv:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model.register_comm_hook(dist.group.WORLD, allreduce_hook)
optimizer = (torch.optim.SGD if "--sgd" in sys.argv else torch.optim.AdamW)(model.parameters(), lr=0.01)
for step in range(8):
    if rank == 1:
        time.sleep(0.15)  # this rank's own work: its peers wait for it in the gradient all-reduce
    loss = model(torch.ones(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    record(loss=loss.detach(), tokens=4, schedule={"lr": 0.01})
    optimizer.step()
stepwatch.current().close()
dist.destroy_process_group()
procexit.end_process(0)  # as a rank ends after its script: torch's objects are never torn down
