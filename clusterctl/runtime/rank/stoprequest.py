"""Whether this rank has been asked to stop (save, commit, exit 85): the one test every training loop makes.

A stop comes two ways: the controller sets the rendezvous store's stop key
when the batch shell traps the pre-timeout signal or a preemption (rank 0
reads it; the loop then agrees with its peers in one all-reduce), or a stop
signal (SIGUSR2, SIGTERM) reaches the rank itself, as it does for a script
run by hand or by torchrun. The Contract and the Lightning and Hugging Face
adapters all ask here.
"""

from __future__ import annotations

import signal
from typing import Any, NoReturn

from clusterctl.exitcodes import ExitCode
from clusterctl.runtime.wire import registration
from clusterctl.store import sealed

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)


class StopRequest:
    """A stop asked of this rank; install once per process (it takes over the stop signals)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.signalled = False
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self.signalled = True

    def here(self) -> bool:
        """Whether this rank was asked: a stop signal, or (rank 0) the controller's stop key."""
        if self.signalled:
            return True
        if self.rank == 0:
            from clusterctl.runtime.rank import rendezvous

            store = rendezvous.CURRENT_STORE
            if store is not None and sealed.read(store, sealed.rank_token(), registration.STOP) is not None:
                self.signalled = True
        return self.signalled


def exit_stopped(rank: int, step: int) -> NoReturn:
    """After the stop's save has committed `step`: exit 85 (every rank), so the run continues in a new job."""
    if rank == 0:
        print(f"clusterctl: stop requested; step {step} committed, exiting {int(ExitCode.PRE_TIMEOUT)}", flush=True)
    raise SystemExit(int(ExitCode.PRE_TIMEOUT))


def agree_max(values: list[int]) -> list[int]:
    """An all-reduce MAX of a few small integers over the default process group (NCCL needs them on the GPU)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return values
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    flags = torch.tensor(values, dtype=torch.int32, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return [int(v) for v in flags.tolist()]
