"""A rank that joins the default process group (env://, gloo) and passes one barrier.

Writes {rank, imported, done} (wall-clock seconds) to $BENCH_OUT/<rank>.json.
"""

import json
import os
import time

import torch  # noqa: F401 - timed: when the process has torch
import torch.distributed as dist

imported = time.time()
dist.init_process_group("gloo")
dist.barrier()
done = time.time()
rank = dist.get_rank()
with open(os.path.join(os.environ["BENCH_OUT"], f"{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "imported": imported, "done": done}, fh)
dist.destroy_process_group()
