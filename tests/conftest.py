"""Shared test set-up: the real Slurm test cluster (tests/slurmlab) for tests marked `slurm`,
and the `backend` fixture that runs a test once on the local backend and once on that cluster."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.slurmlab.plugin", "tests.sshlab.plugin"]

BACKEND_SITES = {"slurm": "slurm-lab", "local": "local"}
"""The site each backend's jobs use: the embedded local one, or the test cluster's."""


@pytest.fixture(params=["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """`local` (a private state directory) or `slurm` (the test cluster, SLURM_CONF set).

    Jobs a test leaves behind (a continuation the recovery step submitted, say) are cancelled at
    its end: they would otherwise run on for their whole time limit and take the CPUs of later tests.
    """
    if request.param == "slurm":
        monkeypatch.setenv("SLURM_CONF", request.getfixturevalue("slurm_lab").conf)
    else:
        monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    yield request.param
    if request.param == "slurm":
        cancel_slurm_jobs_under(tmp_path)


def cancel_slurm_jobs_under(tmp_path: Path) -> None:
    """scancel the test cluster's jobs whose batch script lives under tmp_path."""
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%o"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return
    ids = [line.split("|", 1)[0] for line in out.stdout.splitlines() if str(tmp_path) in line]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30, check=False)


@pytest.fixture(autouse=True)
def _own_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test has its own user state: the runs roots it submitted into (rundir/roots.py) and the local
    backend's jobs, so a run id or `local-N` one test made never resolves in another (or the machine's own).
    The state home sits beside tmp_path, not in it: the user's checkpoint key (checkpoint/trust.py) lives
    there, and tests that use tmp_path as a checkpoint directory list exactly what a save left."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path.with_name(tmp_path.name + "-state")))
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))


@pytest.fixture(autouse=True)
def _no_local_jobs_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Cancel every local-backend job still active in a state directory under the test's tmp_path."""
    yield
    tmp_path = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if tmp_path is None:
        return
    roots = [p.parent for p in tmp_path.glob("*/jobs") if p.is_dir()] + [p.parent for p in tmp_path.glob("*/*/jobs") if p.is_dir()]
    if not roots:
        return
    from clusterctl.backends.local.backend import LocalBackend
    from clusterctl.backends.local.records import list_jobs

    for root in roots:
        backend = LocalBackend(state_dir=root)
        for record in list_jobs(root):
            try:
                info = backend.info(str(record.job_id))
                if info is not None and not info.finished:
                    backend.cancel(str(record.job_id))
            except Exception:  # noqa: BLE001 - best effort at teardown
                continue

