"""The `memory` check: the node has the free host memory a rank needs, read from /proc/meminfo.

It reads only PROC_MEMINFO, which tests point at a fake file.
"""

from __future__ import annotations

from typing import Any

from clusterctl.runtime.rank.preflight.context import CheckResult, PreflightContext

# Module-level so tests can point it at a fake file.
PROC_MEMINFO = "/proc/meminfo"


def check_memory(ctx: PreflightContext) -> CheckResult:
    """The node has the free host memory a rank needs to start.

    A node still holding a previous job's memory (a leaked process, a full
    tmpfs) gets OOM-killed mid-step, which costs a whole restart.
    """
    fields = _meminfo(PROC_MEMINFO)
    data: dict[str, Any] = {"min_free_bytes": ctx.min_free_memory_bytes}
    if "MemTotal" in fields:
        data["mem_total_bytes"] = fields["MemTotal"]
    if "MemAvailable" in fields:
        available = fields["MemAvailable"]
        data["source"] = "MemAvailable"
    else:
        # Kernels before 3.14 have no MemAvailable; this is its usual estimate.
        parts = [fields.get(k) for k in ("MemFree", "Buffers", "Cached")]
        if any(p is None for p in parts):
            raise ValueError(f"{PROC_MEMINFO} has neither MemAvailable nor MemFree/Buffers/Cached")
        available = sum(p for p in parts if p is not None)
        data["source"] = "MemFree+Buffers+Cached"
    data["mem_available_bytes"] = available
    if available >= ctx.min_free_memory_bytes:
        return CheckResult(
            "memory",
            True,
            False,
            f"{ctx.host}: {_bytes(available)} available (need {_bytes(ctx.min_free_memory_bytes)})",
            data,
        )
    return CheckResult(
        "memory",
        False,
        False,
        f"{ctx.host}: only {_bytes(available)} of host memory available, need {_bytes(ctx.min_free_memory_bytes)}",
        data,
    )


def _meminfo(path: str) -> dict[str, int]:
    """/proc/meminfo as bytes per field (the kernel writes kB, meaning KiB)."""
    out: dict[str, int] = {}
    with open(path, encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            words = rest.split()
            if not words or not words[0].isdigit():
                continue
            value = int(words[0])
            if len(words) > 1 and words[1].lower() == "kb":
                value *= 1024
            out[key.strip()] = value
    return out


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
