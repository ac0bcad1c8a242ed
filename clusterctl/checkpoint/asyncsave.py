"""Asynchronous saves: stage to CPU buffers, then commit in a background thread.

The visible pause is one memcpy of the state into CPU buffers that are kept
and reused across saves (pinned when CUDA is present, so device-to-host
copies run at full speed); DCP's write, the checksums, the manifest and the
rename then run in a background thread on the checkpoint's own gloo group,
so they never interleave with the training group's collectives. Because the
buffers are a private copy, training may change its tensors the moment
`save` returns and the generation still holds the state of its step, bit for
bit. One save is in flight at a time: the next one waits for it.

Staging takes plain tensors and DTensors (the local shard is copied and the
DTensor rebuilt around the copy, same mesh and placements, so DCP still
reshards it); Stateful objects are turned into their state dicts; other
values are deep-copied. The first save allocates the buffers (page faults:
on these machines ~3 s per GiB), later ones reuse them.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any, Callable

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from clusterctl.checkpoint.errors import CheckpointError
from clusterctl.checkpoint.generations import Generation
from clusterctl.checkpoint.protocol import Timings


def _is_sharded_tensor(value: Any) -> bool:
    return type(value).__name__ == "ShardedTensor"


class Stager:
    """Copies a state dict into CPU buffers that are reused while shapes stay the same."""

    def __init__(self, pin_memory: bool | None = None) -> None:
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._used: dict[tuple[Any, ...], torch.Tensor] = {}
        self.bytes_staged = 0

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """A private CPU copy of `state`, complete when this returns."""
        self._used = {}
        self.bytes_staged = 0
        staged = self._stage(state, ())
        self._buffers = self._used  # buffers of keys that vanished are dropped
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the copies are non-blocking; they must land before training resumes
        return staged

    def _buffer(self, key: tuple[Any, ...], like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=self.pin_memory)
        self._used[key] = buf
        return buf

    def _copy(self, key: tuple[Any, ...], tensor: torch.Tensor) -> torch.Tensor:
        src = tensor.detach()
        if not src.is_contiguous():
            src = src.contiguous()
        buf = self._buffer(key, src)
        buf.copy_(src, non_blocking=src.device.type != "cpu")
        self.bytes_staged += buf.numel() * buf.element_size()
        return buf

    def _stage(self, value: Any, key: tuple[Any, ...]) -> Any:
        if isinstance(value, Stateful) and not isinstance(value, torch.Tensor):
            return self._stage(value.state_dict(), key)
        if _is_sharded_tensor(value):
            where = ".".join(map(str, key))
            raise CheckpointError(f"{where}: ShardedTensor (FSDP1) state is not staged; use DTensor (FSDP2) or a sync save")
        if isinstance(value, DTensor):
            local = self._copy(key, value.to_local())
            return DTensor(local, value._spec, requires_grad=False)
        if isinstance(value, torch.Tensor):
            return self._copy(key, value)
        if isinstance(value, dict):
            return {k: self._stage(v, (*key, k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self._stage(v, (*key, i)) for i, v in enumerate(value)]
            if isinstance(value, list):
                return items
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # namedtuple or tuple
        return copy.deepcopy(value)


class SaveHandle:
    """A save's completion: `wait()` returns its Generation or raises its CheckpointError.

    `timings` (protocol.Timings) tells where the time went: `stage` is an async
    save's visible pause; the rest is filled in when the save has committed.
    """

    def __init__(self, step: int, timings: Timings) -> None:
        self.step = step
        self.timings = timings
        self._done = threading.Event()
        self._generation: Generation | None = None
        self._error: BaseException | None = None
        self.error_reported = False  # its failure has been raised to a caller once

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Generation:
        """Block until the save has committed (or failed)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"checkpoint of step {self.step} still in flight after {timeout} s")
        if self._error is not None:
            self.error_reported = True
            if isinstance(self._error, CheckpointError):
                raise self._error
            raise CheckpointError(f"checkpoint of step {self.step} failed: {self._error}") from self._error
        assert self._generation is not None
        return self._generation

    def _finish(self, generation: Generation | None, error: BaseException | None) -> None:
        self._generation, self._error = generation, error
        self._done.set()

    @classmethod
    def completed(cls, generation: Generation, timings: Timings) -> "SaveHandle":
        handle = cls(generation.step, timings)
        handle._finish(generation, None)
        return handle


def start_background(
    step: int,
    timings: Timings,
    run: Callable[[], tuple[Generation, Timings]],
) -> SaveHandle:
    """Run `run` (a save of staged state) in a thread; the handle completes with it."""
    handle = SaveHandle(step, timings)

    def target() -> None:
        try:
            generation, done = run()
            done.stage = timings.stage
            handle.timings = done
            handle._finish(generation, None)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            handle._finish(None, exc)

    threading.Thread(target=target, name=f"checkpoint-step-{step}", daemon=False).start()
    return handle


def stage_timed(stager: Stager, state: dict[str, Any]) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    staged = stager.stage(state)
    return staged, time.perf_counter() - t0
