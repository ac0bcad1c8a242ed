"""Shared test set-up: the real Slurm test cluster (tests/slurmlab) for tests marked `slurm`,
and the `backend` fixture that runs a test once on the local backend and once on that cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.slurmlab.plugin"]

BACKEND_SITES = {"slurm": "slurm-lab", "local": "local"}
"""The site each backend's jobs use: the embedded local one, or the test cluster's."""


@pytest.fixture(params=["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """`local` (a private state directory) or `slurm` (the test cluster, SLURM_CONF set)."""
    if request.param == "slurm":
        monkeypatch.setenv("SLURM_CONF", request.getfixturevalue("slurm_lab").conf)
    else:
        monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    return request.param
