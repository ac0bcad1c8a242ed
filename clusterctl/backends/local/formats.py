"""How Slurm writes counts, durations and times (for the environment, scontrol and squeue)."""

from __future__ import annotations

import time


def counts_text(counts: list[int]) -> str:
    """Slurm's compressed per-node counts: [2, 2, 1] -> `2(x2),1`."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        run = j - i + 1
        out.append(f"{counts[i]}(x{run})" if run > 1 else str(counts[i]))
        i = j + 1
    return ",".join(out)


def even_split(ntasks: int, nodes: int) -> list[int]:
    """Tasks per node for block distribution with enough CPUs: as even as possible, first nodes first."""
    base, extra = divmod(ntasks, nodes)
    return [base + 1 if i < extra else base for i in range(nodes)]


def slurm_time(seconds: float | None) -> str:
    """`[D-]HH:MM:SS` as scontrol and squeue print durations; UNLIMITED for None."""
    if seconds is None:
        return "UNLIMITED"
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{text}" if days else text


def timestamp(when: float | None) -> str:
    """Slurm's local-time stamp (`2026-11-30T07:44:54`), or Unknown/None."""
    if not when:
        return "Unknown"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when))
