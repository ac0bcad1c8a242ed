"""Linux CPU list syntax (`0-13,112-125`), as in /sys and `taskset -c`.

Standard library only: the node side checks its affinity against the plan.
"""

from __future__ import annotations

import re

_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse `0-3,8,10-11` into a set of CPU ids; raise ValueError with the reason."""
    text = str(text).strip()
    if not text:
        raise ValueError("empty CPU list")
    cpus: set[int] = set()
    for item in text.split(","):
        match = _ITEM.match(item.strip())
        if not match:
            raise ValueError(f"'{item}' is not a CPU id or range like 0-7")
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"range '{item}' runs backwards")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpulist(cpus: frozenset[int] | set[int] | list[int]) -> str:
    """The shortest canonical form: sorted ranges, `0-3,8`."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start = prev = None
    for cpu in ordered:
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:
            prev = cpu
        else:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = cpu
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(parts)
