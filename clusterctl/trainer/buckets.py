"""A resumed DDP process's first step in the uninterrupted run's bucket layout.

torch's DistributedDataParallel all-reduces the first iteration's gradients
in buckets built from the parameters' order, records the order in which the
gradients became ready, and rebuilds its buckets from that order before the
second forward. A gradient's place in a bucket decides which part of a ring
all-reduce sums it and so the order of the sum: with 3 or more ranks, the
same gradients summed in the first layout and in the rebuilt one differ in
the last bits. An uninterrupted run sums step 1 onward in the rebuilt
layout; a process resumed at step k would sum step k in the first one, and
its losses drift from the step after (1.8e-7 by the end of a quickstart run
at 4 ranks). With 2 ranks a sum of two is the same either way.

`align` runs one throwaway forward and backward before the resumed step, so
that DDP records the ready order and rebuilds its buckets as the
uninterrupted run did after its first step. Nothing of it is kept: the
gradients are dropped, the buffers (a BatchNorm's statistics) and the random
number generators are put back. It costs one step's compute and all-reduce
per resume.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def needs_alignment(model: torch.nn.Module, start_step: int) -> bool:
    """A DDP model resumed past its first step: its buckets are still the first iteration's."""
    return start_step > 0 and hasattr(model, "reducer")


def align(model: torch.nn.Module, forward_backward: Callable[[], Any]) -> None:
    """One throwaway pass of `forward_backward` (a forward and a synchronised backward of any batch), then the
    model's gradients, buffers and the random number generators as they were before it."""
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        forward_backward()
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
