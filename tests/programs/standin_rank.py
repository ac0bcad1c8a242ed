"""A stand-in training rank: heartbeats, busy compute and a barrier for its collective; no torch.

Run by the local srun shim (SLURM_PROCID, SLURM_NTASKS, SLURMD_NODENAME set),
it behaves as the reference trainer does towards the watchdog: phases
forward -> collective per step, a `step` beat with step and compute times,
saves and evaluations on a schedule, stack dumps armed, a closing beat. Its
collective is a barrier served by the test: a stopped rank holds everyone
there, and a dead one makes the others fail with "Connection closed by peer",
as gloo reports it. Errors go to <attempt>/errors/rank-R.txt, as the launcher
reports them to the store.

    standin_rank.py --barrier HOST:PORT --steps N --units U [--save-every K --save-s S] [--eval-every E --eval-units V]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
from pathlib import Path

from clusterctl import envnames
from clusterctl.runtime.rank import heartbeat
from clusterctl.runtime.rank.computeclock import compute_clock
from clusterctl.runtime.wire import stacks
from clusterctl.trainer.busy import spin


class Barrier:
    def __init__(self, address: str, rank: int) -> None:
        host, _, port = address.rpartition(":")
        self.conn = socket.create_connection((host, int(port)))
        self.conn.sendall(f"{rank}\n".encode())
        self.reader = self.conn.makefile("rb")

    def wait(self, tag: str) -> None:
        self.conn.sendall(f"{tag}\n".encode())
        if self.reader.readline().strip() != b"go":
            raise RuntimeError("[barrier] Connection closed by peer: a peer of this collective is gone")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--barrier", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--units", type=int, required=True, help="busy-compute units per step")
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--save-s", type=float, default=0.0)
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--eval-units", type=int, default=0)
    args = parser.parse_args()
    rank = int(os.environ["SLURM_PROCID"])
    os.environ.setdefault(envnames.GPU, os.environ.get("SLURM_LOCALID", "0"))  # as the wrapper binds it
    attempt_dir = Path(os.environ[envnames.ATTEMPT_DIR])
    stacks.arm(attempt_dir, rank)
    hb = heartbeat.shared(rank, 1)
    clock = compute_clock()
    try:
        barrier = Barrier(args.barrier, rank)
        for step in range(args.steps):
            t0, c0 = time.perf_counter(), clock()
            hb.phase("forward", step)
            spin(args.units)
            compute = clock() - c0
            hb.phase("collective", step)
            barrier.wait(f"step {step}")
            hb.step_done(step, time.perf_counter() - t0, compute)
            if args.save_every and (step + 1) % args.save_every == 0:
                hb.phase("save", step)
                time.sleep(args.save_s)  # a save waits on the filesystem, not on the CPU
                barrier.wait(f"save {step}")
            if args.eval_every and (step + 1) % args.eval_every == 0:
                hb.phase("eval", step)
                spin(args.eval_units)
                barrier.wait(f"eval {step}")
            hb.phase("idle", step)
    except BaseException:
        text = traceback.format_exc()
        sys.stderr.write(text)
        errors = attempt_dir / "errors"
        errors.mkdir(exist_ok=True)
        (errors / f"rank-{rank}.txt").write_text(text)
        return 1
    finally:
        hb.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
