"""Run a function on N ranks forked from this process, joined by a gloo group.

For tests, benchmarks and crash drills of the checkpoint protocol on one
machine: forking after torch is imported spares each rank the ~2 s import, so
a 2- or 4-rank world starts in tens of milliseconds. The ranks rendezvous on
a FileStore in a private directory; each returns a picklable result or its
traceback. Call only from a process that has not initialised
torch.distributed itself.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable


class RankFailed(RuntimeError):
    """A forked rank raised, died or did not finish in time."""


def _child(rank: int, world_size: int, store: str, result_path: Path, fn: Callable[..., Any], args: tuple) -> None:
    code = 1
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        file_store = dist.FileStore(store, world_size)
        dist.init_process_group("gloo", store=file_store, rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
        try:
            result: Any = ("ok", fn(rank, world_size, *args))
            code = 0
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        result = ("error", traceback.format_exc())
    try:
        result_path.write_bytes(pickle.dumps(result))
    except Exception:  # noqa: BLE001 - an unpicklable result is the caller's bug; say so
        result_path.write_bytes(pickle.dumps(("error", traceback.format_exc())))
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def spawn_ranks(world_size: int, fn: Callable[..., Any], args: tuple, workdir: Path) -> list[int]:
    """Fork the ranks into one new process group (so all can be killed at once); their pids.

    Rank r writes its outcome to `workdir/rank-r.pickle`; `os.killpg(pids[0], SIGKILL)`
    kills them all.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("forking ranks needs a parent without torch.distributed initialised")
    store = str(workdir / "store")
    pids: list[int] = []
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, pids[0] if pids else 0)
            except OSError:
                pass
            _child(rank, world_size, store, workdir / f"rank-{rank}.pickle", fn, args)
        try:
            os.setpgid(pid, pids[0] if pids else pid)
        except OSError:  # the child got there first
            pass
        pids.append(pid)
    return pids


def reap(pids: list[int], timeout: float) -> dict[int, int | None]:
    """Wait for the ranks (by index) to exit; a rank still running at the deadline maps to None."""
    status: dict[int, int | None] = {}
    deadline = time.monotonic() + timeout
    while len(status) < len(pids) and time.monotonic() < deadline:
        for rank, pid in enumerate(pids):
            if rank in status:
                continue
            try:
                done, code = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                done, code = pid, -1
            if done:
                status[rank] = code
        if len(status) < len(pids):
            time.sleep(0.002)
    for rank in range(len(pids)):
        status.setdefault(rank, None)
    return status


def signal_all(pids: list[int], signum: int = signal.SIGKILL) -> None:
    """Send `signum` to every rank that has not been reaped."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def kill_all(pids: list[int]) -> None:
    """SIGKILL every rank and reap them."""
    signal_all(pids)
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def fork_ranks(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0) -> list[Any]:
    """`fn(rank, world_size, *args)` on every rank; the results, in rank order.

    Raises RankFailed naming each rank that raised (with its traceback), died or
    ran past `timeout` (the others are then killed).
    """
    with tempfile.TemporaryDirectory(prefix="localworld-") as tmp:
        pids = spawn_ranks(world_size, fn, args, Path(tmp))
        status = reap(pids, timeout)
        late = [r for r, code in status.items() if code is None]
        if late:
            kill_all(pids)
        out, problems = [], []
        for rank in range(world_size):
            if rank in late:
                problems.append(f"rank {rank}: still running after {timeout} s (killed)")
                continue
            try:
                kind, value = pickle.loads((Path(tmp) / f"rank-{rank}.pickle").read_bytes())
            except FileNotFoundError:
                problems.append(f"rank {rank}: died (wait status {status[rank]})")
                continue
            if kind == "error":
                problems.append(f"rank {rank}:\n{value}")
            out.append(value)
        if problems:
            raise RankFailed("\n".join(problems))
        return out
