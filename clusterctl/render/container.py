"""The job's container: which runtime runs each rank's wrapper in which image, with what bound. Pure.

Pyxis enters the image in srun itself (`--container-image`); Apptainer by the
wrapper, which on the host carries its task's own variables in and execs
`apptainer exec ... bash wrapper.sh` (so Apptainer needs nothing of srun). The
batch script, the controller and the aggregators stay on the host either way.
Inside, the image's environment wins over the host's (an NGC image sets
NCCL_* and CUDA_* values of its own), so nothing a rank needs is left to
inheritance: the task's own variables (its rank, its GPUs) are carried in by
name (pyxis `--container-env`, Apptainer's APPTAINERENV_ prefix), and the
wrapper sources the attempt's rank environment (the site's env, the
rendezvous, clusterctl's own variables, the secrets), which the batch script
writes for it, and sets the rest itself as it always does. The image's
interpreter runs clusterctl's launcher from the submitting tree, bound in and
put first on PYTHONPATH.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from clusterctl import envnames
from clusterctl.config.site import Site
from clusterctl.config.spec import JobSpec
from clusterctl.errors import Problem

TASK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURMD_NODENAME", "SLURM_STEP_GPUS",
             "SLURM_JOB_GPUS", "SLURM_JOB_ID", "SLURM_STEP_ID")
"""What srun gives each task and the wrapper reads: kept as the host has it inside the container."""
ATTEMPT_VARS = ("MASTER_ADDR", "MASTER_PORT", envnames.RUN_DIR, envnames.ATTEMPT, envnames.ATTEMPT_DIR, envnames.TOKEN,
                envnames.HOSTFILE, envnames.NODES, envnames.WATCH_ADDR, envnames.HEARTBEAT_DIR, envnames.OVERSUBSCRIBED)
"""What the batch script exports for the ranks of one attempt."""


@dataclass(frozen=True)
class ContainerPlan:
    runtime: str  # pyxis or apptainer
    image: str
    binds: tuple[str, ...]  # SRC[:DST[:FLAGS]]: the site's, the spec's, then the run directory and clusterctl's tree
    env: dict[str, str] = field(default_factory=dict)  # the spec's container.env
    writable: bool | None = None
    python: str = "python3"  # the image's interpreter
    apptainer: str = "apptainer"
    name: str = ""  # pyxis: one named container per job, reused by its attempts
    package_dir: str = ""  # the directory holding clusterctl/, put first on PYTHONPATH inside


def package_dir() -> str:
    """The directory that holds this clusterctl package (bound into the container, first on PYTHONPATH)."""
    return str(Path(__file__).resolve().parents[2])


def resolve(spec: JobSpec, site: Site, run_dir: Path, checkpoint_dir: Path | None, name: str) -> tuple[ContainerPlan | None, list[Problem]]:
    """The job's container, None without one, or the problems with its section."""
    box = spec.container
    runtime = box.runtime or site.container.runtime
    if box.image is None:
        if box.runtime not in (None, "none"):
            return None, [Problem("container.image", None, f"expected an image for container.runtime {box.runtime}")]
        return None, []
    if runtime == "none":
        why = ("container.runtime is none" if box.runtime == "none"
               else f"site {site.name} offers no container runtime (its container.runtime is none)")
        return None, [Problem("container.image", box.image, f"{why}: expected container.runtime pyxis or apptainer")]
    own = [str(run_dir)] + ([str(checkpoint_dir)] if checkpoint_dir and not _under(checkpoint_dir, run_dir) else [])
    binds = tuple(dict.fromkeys([*site.container.mounts, *box.mounts, *own, f"{package_dir()}:{package_dir()}:ro"]))
    return ContainerPlan(runtime, box.image, binds, dict(box.env), box.writable, site.container.python,
                         site.container.apptainer, name, package_dir()), []


def _under(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def task_vars(visibility_var: str) -> list[str]:
    """The task's own variables kept as the host has them inside the image: srun's, and the GPUs it gave."""
    return [*TASK_VARS, visibility_var]


def pyxis_flags(c: ContainerPlan, visibility_var: str) -> list[str]:
    """srun's flags for pyxis but the mounts, which the batch script gives with the submit directory (known only
    there) added, as mount and as working directory."""
    flags = [f"--container-image={c.image}", f"--container-name={c.name}",
             f"--container-env={','.join(task_vars(visibility_var))}"]
    if c.writable is not None:
        flags.append("--container-writable" if c.writable else "--container-readonly")
    return flags


def apptainer_flags(c: ContainerPlan, gpu_vendor: str) -> list[str]:
    """`apptainer exec`'s flags before the image (the wrapper adds the submit directory)."""
    flags = {"nvidia": ["--nv"], "amd": ["--rocm"]}.get(gpu_vendor, [])
    for bind in c.binds:
        flags += ["--bind", bind]
    if c.writable:
        flags.append("--writable-tmpfs")
    return flags


def rank_env_names(site_env: list[str], secret_env: list[str]) -> list[str]:
    """Every variable the batch script exports for the ranks, which the wrapper sets again inside the image."""
    return list(dict.fromkeys([*site_env, *ATTEMPT_VARS, *secret_env]))
