"""Job ids as the run directory keeps them, and as a user sees them.

The batch script records the scheduler's own id (SLURM_JOB_ID). The local
backend shows its job N as `local-N` (state.json, `status`), so that local
job 2 is never mistaken for Slurm's job 2. This is the one place that knows
the prefix.
"""

from __future__ import annotations

from typing import Any

LOCAL_PREFIX = "local-"


def native(job_id: Any) -> str:
    """The scheduler's own id: `local-7` and `7` are the same job; anything else is kept as written."""
    text = str(job_id or "").strip()
    bare = text.removeprefix(LOCAL_PREFIX)
    return bare if bare.isascii() and bare.isdigit() else text


def display(job_id: str | None, backend: str | None) -> str | None:
    """The id as the user sees it: `local-N` for the local backend's job N."""
    if not job_id:
        return None
    bare = native(job_id)
    return f"{LOCAL_PREFIX}{bare}" if backend == "local" and bare.isdigit() else bare


def local_number(job_id: Any) -> int | None:
    """The local backend's job number from `N` or `local-N`; None for anything else."""
    bare = native(job_id)
    return int(bare) if bare.isascii() and bare.isdigit() else None
