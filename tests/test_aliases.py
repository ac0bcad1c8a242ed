"""Old names keep working: run directories rendered before a move call their entry points by the old module names,
and users import clusterctl.watch, the integrations and submitit's entry points (docs/design.md)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys

import pytest

MOVED = {
    "clusterctl.runtime.aggregator": "clusterctl.runtime.node.aggregator",
    "clusterctl.runtime.nextattempt": "clusterctl.runtime.recovery.nextattempt",
    "clusterctl.runtime.warm.client": "clusterctl.runtime.node.warm.client",
    "clusterctl.runtime.warm.server": "clusterctl.runtime.node.warm.server",
}
ADAPTERS = {  # the rank side's adapters, where users import them (their test loads Lightning and transformers)
    "clusterctl.integrations.lightning": "clusterctl.integrations.rank.lightning",
    "clusterctl.integrations.hf": "clusterctl.integrations.rank.hf",
    "clusterctl.integrations.framework": "clusterctl.integrations.rank.framework",
}
USERS_IMPORT = ("clusterctl.watch", "clusterctl.integrations.lightning", "clusterctl.integrations.hf",
                "clusterctl.integrations.submitit")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_name_is_the_moved_module(old: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])


ENTRY_POINTS = {**MOVED, "clusterctl.runtime.controller": "clusterctl.runtime.controller.main"}


@pytest.mark.parametrize("old", sorted(ENTRY_POINTS))
def test_an_old_entry_point_runs_the_moved_module(old: str) -> None:
    """`python -m OLD ARGS` does what `python -m NEW ARGS` does, outside a job too (where most refuse by name)."""
    args = ["--", "/bin/echo", "ran"] if old.endswith("warm.client") else ["--help"]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    seen = [subprocess.run([sys.executable, "-m", name, *args], capture_output=True, text=True, timeout=60, env=env)
            for name in (old, ENTRY_POINTS[old])]
    assert "Traceback" not in seen[0].stderr, seen[0]
    said = [(done.returncode, re.sub(r"^\S+Z ", "", done.stdout, flags=re.M)) for done in seen]  # timestamps aside
    assert said[0] == said[1], seen
    assert seen[0].stdout or seen[0].stderr  # it said something: a usage, a refusal, the command's output


@pytest.mark.parametrize("name", USERS_IMPORT)
def test_what_users_import_is_where_they_import_it(name: str) -> None:
    """Found where users' scripts import it (the adapters themselves, which load Lightning or transformers, are run
    by their own tests)."""
    assert importlib.util.find_spec(name) is not None, name
    assert callable(importlib.import_module("clusterctl.watch").record)


@pytest.mark.parametrize("old", sorted(ADAPTERS))
def test_an_adapter_imported_by_its_old_name_is_the_moved_module(old: str) -> None:
    pytest.importorskip("lightning" if old.endswith("lightning") else "transformers" if old.endswith("hf") else "torch")
    assert importlib.import_module(old) is importlib.import_module(ADAPTERS[old])
