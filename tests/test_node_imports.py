"""The node side stays light: no login-node libraries, and torch only where it is the point."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pydantic", "typer", "rich", "jinja2", "yaml", "click", "paramiko")


def imported_by(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_launcher_controller_and_checks_import_no_login_node_libraries() -> None:
    for module in (
        "clusterctl.launch",
        "clusterctl.runtime.controller",
        "clusterctl.runtime.preflight",
        "clusterctl.runtime.rendezvous",
        "clusterctl.runtime.postchecks",
        "clusterctl.syntax.hostlist",
    ):
        loaded = imported_by(module)
        heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
        assert not heavy, f"{module} imports {heavy}"
        assert "torch" not in loaded, f"{module} imports torch at import time"
