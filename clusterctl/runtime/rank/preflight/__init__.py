"""Per-rank preflight checks, run on every rank before rendezvous completes.

A bad node is cheapest to find before thousands of ranks wait on it: a GPU
with uncorrected ECC errors, a NIC whose port is down, a rank bound to the
wrong CPUs or a checkpoint directory that is not shared would otherwise show
up minutes later as a hang or a lost checkpoint. Each check returns one line a
person reads, naming the rank's host, and a dict of facts for the run
manifest.

One module per check: gpu.py (NVML health), nic.py (the plan's NICs present
and up), cpu.py (the rank's CPU binding), memory.py (free host memory),
dirs.py (directories take a durable write) and sharedfs.py (the checkpoint
directory is shared: the marker the first node writes, and the check that
every node sees it). context.py holds what a check is given and returns,
common.py the small helpers the checks share; this module runs them by name.

Standard library only at import time: this runs in every rank before the
training script, so it must start fast. nvidia-ml-py's `pynvml` is imported
inside the GPU check, and torch is never imported here. The checks that need
the process group ("comm", "compute") run after rendezvous, elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from clusterctl.runtime.rank.preflight.common import _one_line
from clusterctl.runtime.rank.preflight.context import CheckResult, PreflightContext
from clusterctl.runtime.rank.preflight.cpu import check_cpu
from clusterctl.runtime.rank.preflight.dirs import check_dirs
from clusterctl.runtime.rank.preflight.gpu import check_gpu, slowdown_reasons
from clusterctl.runtime.rank.preflight.memory import check_memory
from clusterctl.runtime.rank.preflight.nic import check_nic
from clusterctl.runtime.rank.preflight.sharedfs import check_shared_fs
from clusterctl.runtime.wire.registration import POST_RENDEZVOUS

CHECKS: tuple[str, ...] = ("gpu", "nic", "cpu", "memory", "dirs", "shared_fs")

_CHECKS: dict[str, Callable[[PreflightContext], CheckResult]] = {
    "gpu": check_gpu,
    "nic": check_nic,
    "cpu": check_cpu,
    "memory": check_memory,
    "dirs": check_dirs,
    "shared_fs": check_shared_fs,
}


def run_checks(names: Sequence[str], ctx: PreflightContext) -> list[CheckResult]:
    """Run the named checks in order.

    Every name is validated before any check runs, so a typo in the spec fails
    at once rather than after slow checks. A check that raises is skipped,
    naming the exception: one broken probe must not hide the others, and a
    probe's own bug (a binding whose signature changed, the same on every
    node) must not put healthy nodes on the suspect list.
    """
    if isinstance(names, str):
        raise TypeError("names must be a sequence of check names, not one string")
    for name in names:
        if name in POST_RENDEZVOUS:
            raise ValueError(
                f"check '{name}' runs after rendezvous (it needs the process group), "
                f"not in preflight; preflight checks are: {', '.join(CHECKS)}"
            )
        if name not in _CHECKS:
            raise ValueError(f"unknown preflight check '{name}'; known checks: {', '.join(CHECKS)}")
    results: list[CheckResult] = []
    for name in names:
        try:
            result = _CHECKS[name](ctx)
        except Exception as exc:  # noqa: BLE001 - a probe that breaks is not a node that failed
            result = CheckResult(
                name=name,
                ok=True,
                skipped=True,
                detail=_one_line(f"{name} check on {ctx.host} could not run (raised {type(exc).__name__}: {exc});"
                                 " the node is not judged by it"),
                data={"exception": type(exc).__name__, "message": str(exc)},
            )
        results.append(result)
    return results


def failed(results: Sequence[CheckResult]) -> list[CheckResult]:
    """The results that fail the rank (skipped ones never do)."""
    return [r for r in results if not r.ok]


__all__ = [
    "CHECKS",
    "CheckResult",
    "PreflightContext",
    "failed",
    "run_checks",
    "slowdown_reasons",
]
