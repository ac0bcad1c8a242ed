"""What a preflight check is given and what it returns.

`PreflightContext` (what one rank must find on its node) and `CheckResult`
(one check's verdict) live here, apart from the package's `__init__`, so that
every check module and `run_checks` can import them without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PreflightContext:
    """What one rank must find on its node, as the plan and the wrapper say."""

    rank: int
    local_rank: int
    host: str  # SLURMD_NODENAME (emulated nodes share one hostname)
    gpu: int | None  # physical GPU index from the wrapper (CLUSTERCTL_GPU), None if unknown
    gpu_vendor: str  # "nvidia", "amd", "emulated"
    expected_cpus: frozenset[int]  # the CPU set the plan binds this rank to (empty: unknown)
    nics: tuple[str, ...]  # NIC names the plan gives this rank
    nic_kinds: tuple[str, ...]  # matching kinds: ib, roce, ethernet, efa, slingshot, loopback
    dirs: tuple[str, ...]  # directories that must be writable
    shared_marker: str | None  # marker the first node wrote in the checkpoint dir; None: skip
    shared_token: str | None  # the attempt token: the marker must hold its id (sharedfs.marker_id)
    min_free_memory_bytes: int = 1 << 30
    max_gpu_temp_c: int = 85
    imex: bool = False  # the job's groups span nodes over NVLink (segments): the node must give it an IMEX channel
    imex_dir: str = "/dev/nvidia-caps-imex-channels"


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict: `ok` decides, `detail` explains, `data` goes to the manifest."""

    name: str
    ok: bool
    skipped: bool  # the check does not apply here (no GPU, no NVML); ok stays True
    detail: str
    data: dict[str, Any]
