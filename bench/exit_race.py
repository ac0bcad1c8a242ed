"""A plain DDP loop's exit race with gloo's worker thread, with and without the launcher's way of ending.

    .venv/bin/python bench/exit_race.py [--quick] [--pairs N]

Each pair is two gloo ranks of a plain DDP loop (no clusterctl code in the
loop; rank 1 works 0.15 s longer each step, so rank 0 waits in the gradient
all-reduce) that train 8 steps, destroy the process group and exit, with the GIL
switch interval set so long that the training thread never hands the GIL
over while it runs Python: what a starved CPU does by chance. gloo's worker
thread destroys each finished work after the training thread moved on, and
that takes the GIL; asked for during the interpreter's shutdown, the thread
is ended mid-C++ and the process aborts ("terminate called without an
active exception"). `settled` ranks end with the launcher's
`procexit.end_process(0)` after the loop, as every rank does
(runtime/rank/procexit.py: no interpreter shutdown). Last line: `{"processes",
"plain_aborts", "settled_aborts"}` (processes per mode).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys

RANK = """
import os, sys, time
sys.setswitchinterval(100.0)
rank, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
for _ in range(8):
    if rank == 1:
        time.sleep(0.15)  # this rank works longer: rank 0 waits for it in the gradient all-reduce
    loss = model(torch.ones(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
if mode == "settled":
    from clusterctl.runtime.rank.procexit import end_process
    end_process(0)
"""


def pair(mode: str) -> int:
    """How many of the pair's two processes aborted."""
    port = str(random.randint(30000, 39999))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), port, mode], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    aborted = 0
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            if "terminate called" not in err:
                raise SystemExit(f"a rank failed another way (exit {proc.returncode}): {err[-2000:]}")
            aborted += 1
    return aborted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 pairs per mode (under a minute)")
    parser.add_argument("--pairs", type=int, default=None)
    args = parser.parse_args()
    pairs = args.pairs or (4 if args.quick else 10)
    aborts = {"plain": 0, "settled": 0}
    for i in range(pairs):
        for mode in (("plain", "settled") if i % 2 == 0 else ("settled", "plain")):
            aborts[mode] += pair(mode)
    for mode, count in aborts.items():
        print(f"{mode:8s} {count} of {2 * pairs} processes aborted at exit")
    print(json.dumps({"processes": 2 * pairs, "plain_aborts": aborts["plain"], "settled_aborts": aborts["settled"]}))


if __name__ == "__main__":
    main()
