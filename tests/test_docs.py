"""The documentation site: its reference is generated from the code, every entry has a description, it builds.

`mkdocs build --strict` runs here as `make docs` runs it: a broken link, a
page missing from the navigation or a reference page that fails to generate
fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.cli import app
from clusterctl.config.site import Site
from clusterctl.config.spec import JobSpec
from clusterctl.docsgen import commands, fields
from clusterctl.exitcodes import DESCRIPTIONS, ExitCode

ROOT = Path(__file__).resolve().parent.parent
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


@pytest.mark.parametrize("model", [JobSpec, Site], ids=["spec", "site"])
def test_every_field_at_any_depth_has_a_description(model: type) -> None:
    found = fields.fields(model)
    assert len(found) > 50
    assert [f.path for f in found if not f.description] == []


def test_every_option_argument_and_exit_code_has_a_description() -> None:
    undescribed = [(name, row["names"]) for name, command, _ in commands.commands(app)
                   for row in commands.parameters(command) if not row["help"]]
    assert undescribed == []
    assert [name for name, command, _ in commands.commands(app) if not (command.help or "").strip()] == []
    assert set(DESCRIPTIONS) == set(ExitCode) and all(meaning and effect for meaning, effect in DESCRIPTIONS.values())


def test_the_site_builds_strictly_with_the_reference_generated_from_the_code(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET})
    assert done.returncode == 0, done.stdout + done.stderr
    spec = (site / "reference" / "spec" / "index.html").read_text()
    assert "watchdog.straggler_factor" in spec and "topology.avoid_drill_suspects" in spec  # nested fields, new ones too
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert all(f"<code>{name}</code>" in cli for name, _, _ in commands.commands(app))  # every command, site's too
    codes = (site / "reference" / "exit-codes" / "index.html").read_text()
    assert all(f"<code>{code.name}</code>" in codes for code in ExitCode)
    assert (site / "search" / "search_index.json").stat().st_size > 10_000
