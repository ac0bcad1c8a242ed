"""Promises about the project itself: docs, schema and packaging stay in step with the code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from clusterctl.config.specschema import json_schema
from clusterctl.docsgen import codes
from clusterctl.exitcodes import DESCRIPTIONS, ExitCode

ROOT = Path(__file__).resolve().parent.parent


def test_the_exit_code_reference_is_the_module() -> None:
    page = codes.markdown()  # the site's exit-codes page, as mkdocs-gen-files writes it
    rows = dict(
        (int(code), (meaning.strip(), restart.strip()))
        for code, _name, meaning, restart in re.findall(r"^\| (\d+) \| `(\w+)` \| (.+?) \| (.+?) \|$", page, re.M)
    )
    assert rows == {int(code): text for code, text in DESCRIPTIONS.items()}
    assert set(DESCRIPTIONS) == set(ExitCode)


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150  # the rest lives in docs/: guides and a generated reference
    local = [link for link in re.findall(r"\]\(([^)#]+)\)", text) if not link.startswith("http")]
    assert local and [link for link in local if not (ROOT / link).exists()] == []


def test_readme_opens_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    block = lines[lines.index("```") + 1 : lines.index("```", lines.index("```") + 1)]
    assert [line.split()[0:2] for line in block] == [["make", "demo"], ["make", "test"]]
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().splitlines()[-1] == "make test"


def test_published_schema_is_current() -> None:
    published = json.loads((ROOT / "clusterctl" / "job.schema.json").read_text())
    assert published == json_schema(), "run `make schema` to refresh clusterctl/job.schema.json"


def test_every_subpackage_is_packaged() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "clusterctl").rglob("__init__.py")
    }
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_wheel_ships_templates_and_site_configs(tmp_path: Path) -> None:
    """A non-editable install must still find the top-level templates/ and site-configs/."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("clusterctl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for site in (ROOT / "site-configs").glob("*.yaml"):
        assert f"clusterctl/site_configs/{site.name}" in names
    for template in (ROOT / "templates").glob("*.j2"):
        assert f"clusterctl/templates/{template.name}" in names
    assert "clusterctl/job.schema.json" in names
    # And the installed layout finds them: import clusterctl from the unpacked wheel.
    unpacked = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(unpacked)
    probe = (
        "import clusterctl.config.site as s, clusterctl.config.shipped as d; "
        "assert s.__file__.startswith(%r), s.__file__; "
        "print(sorted(s.shipped_sites())); print(d.shipped_dir('templates').is_dir())" % str(unpacked)
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(unpacked)}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    shipped = sorted(p.stem for p in (ROOT / "site-configs").glob("*.yaml"))
    has_templates = any((ROOT / "templates").glob("*.j2"))
    assert out.stdout.splitlines() == [str(shipped), str(has_templates)]
    # Every module of the source tree is in the wheel and imports from it (a package missing from pyproject's list
    # would be found by an editable install and by nothing else).
    every = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "clusterctl").rglob("*.py") if p.name != "__main__.py"
    )
    probe = (
        "import importlib, sys; names = sys.argv[1:]; "
        "bad = [n for n in names if not importlib.import_module(n).__file__.startswith(%r)]; print(len(names), bad)" % str(unpacked)
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, *every], cwd=tmp_path, env={"PYTHONPATH": str(unpacked)}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [str(len(every)), "[]"]


def test_core_package_does_not_depend_on_torch() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert not any(dep.lower().startswith("torch") for dep in config["project"]["dependencies"])
    assert any(dep.startswith("torch") for dep in config["project"]["optional-dependencies"]["train"])
