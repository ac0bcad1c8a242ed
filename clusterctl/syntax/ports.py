"""MASTER_PORT from the job id and attempt, computable in bash too.

FNV-1a (32 bit) of "<job id>.<attempt>" folded into the site's port range,
which lies outside the kernel's ephemeral range. A hash rather than
`job_id % N` so that neighbouring jobs and a requeued attempt land far apart;
the batch script still probes the port and moves to the next free one.
"""

from __future__ import annotations

FNV_OFFSET = 2166136261
FNV_PRIME = 16777619


def fnv1a32(text: str) -> int:
    h = FNV_OFFSET
    for byte in text.encode():
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFF
    return h


def master_port(job_id: str, attempt: int, port_range: tuple[int, int]) -> int:
    """The first port the batch script tries for this job and attempt."""
    lo, hi = port_range
    return lo + fnv1a32(f"{job_id}.{attempt}") % (hi - lo + 1)
