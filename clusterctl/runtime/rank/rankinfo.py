"""What a rank knows about itself and its job, from the wrapper's environment.

Standard library only. The run directory's run.json (the static plan, small
at any scale) and the attempt's attempt.json (hosts, port) complete
the picture; both were written before the rank started.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from clusterctl import envnames
from clusterctl.rundir import runjson, secretenv
from clusterctl.rundir.runjson import RunJson


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    host: str
    attempt: int
    token: str
    run_dir: Path
    attempt_dir: Path
    master_addr: str
    master_port: int
    gpu: int | None
    cpus: str
    numa: int | None
    nics: tuple[str, ...]
    run: RunJson

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankInfo:
        env = os.environ if env is None else env
        run_dir = Path(env[envnames.RUN_DIR])
        attempt_dir = Path(env[envnames.ATTEMPT_DIR])
        run = runjson.load_attempt(run_dir, env)
        gpu = env.get(envnames.GPU, "")
        numa = env.get(envnames.NUMA, "")
        return cls(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            host=env.get("SLURMD_NODENAME") or os.uname().nodename,
            attempt=int(env.get(envnames.ATTEMPT, "0")),
            token=env.get(envnames.TOKEN, ""),
            run_dir=run_dir,
            attempt_dir=attempt_dir,
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]),
            gpu=int(gpu) if gpu.isdigit() else None,
            cpus=env.get(envnames.CPUS, ""),
            numa=int(numa) if numa.isdigit() else None,
            nics=tuple(n for n in env.get(envnames.NIC, "").split(",") if n),
            run=run,
        )

    @property
    def gpus_per_node(self) -> int:
        return self.run.gpus_per_node

    @property
    def node_slot(self) -> int:
        return self.rank // self.gpus_per_node


# The environment that decides how a rank computes and communicates: recorded once per node
# (local rank 0's registration) for the run record. Never the attempt token, nor any name that
# looks like a secret.
RECORDED_ENV_PREFIXES = (
    "NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "UCX_", "CLUSTERCTL_", "NVIDIA_", "HIP_", "ROCR_", "RCCL_", "ENROOT_", "PYXIS_",
)
RECORDED_ENV_NAMES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED",
                      "SLURM_JOB_SEGMENT_SIZE")  # the segment Slurm gave the job (25.05+), beside the planned one
RECORDED_VALUE_MAX = 1000  # characters: keeps manifest.json small with one record per node


def recorded_env(env: Mapping[str, str] | None = None, secret: Sequence[str] = ()) -> dict[str, str]:
    """The rank's NCCL/CUDA/TORCH/UCX/thread settings, for the run record: compact; the token, the spec's
    secret_env and any name that looks like a secret removed."""
    env = os.environ if env is None else env
    return {
        name: value[:RECORDED_VALUE_MAX]
        for name, value in sorted(env.items())
        if (name.startswith(RECORDED_ENV_PREFIXES) or name in RECORDED_ENV_NAMES)
        and name != envnames.TOKEN
        and name not in secret
        and not secretenv.LOOKS_SECRET.search(name)
    }


def effective_env(env: Mapping[str, str] | None = None, secret: Sequence[str] = ()) -> dict[str, str]:
    """Every variable a rank runs with (inside a container, where the image's values may differ from the host's),
    for the run record: secrets (the token, secret_env, names that look secret) by name only."""
    env = os.environ if env is None else env
    hidden = {envnames.TOKEN, *secret}
    return {name: "(secret)" if name in hidden or secretenv.LOOKS_SECRET.search(name) else value[:RECORDED_VALUE_MAX]
            for name, value in sorted(env.items())}


_DRIVER_FILES = (
    ("nvidia", "/proc/driver/nvidia/version", re.compile(r"Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9.]+)")),
    ("amdgpu", "/sys/module/amdgpu/version", re.compile(r"(\S+)")),
)


def driver_version() -> str | None:
    """The node's GPU kernel driver (`nvidia 550.54.15`), read from /proc or /sys; None where there is none."""
    for vendor, path, pattern in _DRIVER_FILES:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read(4096)
        except OSError:
            continue
        found = pattern.search(text)
        if found:
            return f"{vendor} {found.group(1)}"
    return None
