"""The node side stays light: no login-node libraries, and torch only where it is the point.

Every module that runs on a compute node — the launcher, the controller, the
aggregator, the recovery step, the run directory's records, the notations,
the local backend's Slurm shims, the checkpoint protocol and the trainer —
is imported in a fresh interpreter, and what it loaded is checked.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import clusterctl

LOGIN_SIDE = ("pydantic", "typer", "rich", "jinja2", "yaml", "click", "paramiko", "matplotlib")
NODE_FOLDERS = ("syntax", "rundir", "runtime", "checkpoint", "trainer")
NODE_MODULES = (
    "clusterctl.exitcodes", "clusterctl.envnames", "clusterctl.errors", "clusterctl.launch", "clusterctl.plan.ranks",
    "clusterctl.qualify.commbench", "clusterctl.qualify.faultsignal",
)
TORCH_IS_THE_POINT = ("clusterctl.checkpoint.", "clusterctl.trainer.", "clusterctl.qualify.commbench")
TORCH_FREE_CHECKPOINT = ("checksums", "durable", "errors", "generations", "manifest", "names", "phases", "reshard", "retention", "verify")


def node_side() -> list[str]:
    found = []
    for info in pkgutil.walk_packages(clusterctl.__path__, "clusterctl."):
        parts = info.name.split(".")
        if info.name.endswith("__main__"):
            continue
        if parts[1] in NODE_FOLDERS or info.name in NODE_MODULES or info.name.startswith("clusterctl.backends.local"):
            found.append(info.name)
    return found


def loaded_by(modules: list[str]) -> set[str]:
    code = f"import sys; import {', '.join(modules)}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_every_node_side_module_imports_no_login_node_library() -> None:
    modules = node_side()
    assert {"clusterctl.runtime.controller.main", "clusterctl.runtime.rank.launch", "clusterctl.runtime.node.aggregator",
            "clusterctl.runtime.recovery.nextattempt", "clusterctl.rundir.history", "clusterctl.backends.local.srun"} <= set(modules)
    for group in ([m for m in modules if not m.startswith(TORCH_IS_THE_POINT)], modules):
        loaded = loaded_by(group)
        heavy = sorted({m.split(".")[0] for m in loaded} & set(LOGIN_SIDE))
        assert not heavy, f"node-side modules load {heavy}"


def test_torch_only_where_torch_is_the_point() -> None:
    light = [m for m in node_side() if not m.startswith(TORCH_IS_THE_POINT)]
    light += [f"clusterctl.checkpoint.{name}" for name in TORCH_FREE_CHECKPOINT]
    loaded = loaded_by(light)
    assert "torch" not in loaded, "a node-side module outside checkpoint/trainer imports torch at import time"


def test_numpy_only_in_the_controller() -> None:
    """The controller judges columns of step times with numpy; it is one process a job.

    Every rank's wrapper and every node's aggregator start on each attempt, so
    they stay free of it. The opt-in checks after the rendezvous judge their
    timed matmul by the controller's rule, and run torch anyway: the wrapper
    imports them only when they are asked for.
    """
    judged_like_the_controller = ("clusterctl.runtime.controller.", "clusterctl.runtime.rank.postchecks")
    light = [m for m in node_side() if not m.startswith(TORCH_IS_THE_POINT + judged_like_the_controller)]
    light += [f"clusterctl.checkpoint.{name}" for name in TORCH_FREE_CHECKPOINT]
    assert "clusterctl.runtime.rank.launch" in light and "clusterctl.runtime.node.aggregator" in light
    assert "numpy" not in loaded_by(light)
