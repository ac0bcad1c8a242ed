"""The documentation site: its reference is generated from the code, every entry has a description, it builds.

`mkdocs build --strict` runs here as `make docs` runs it: a broken link, a
page missing from the navigation or a reference page that fails to generate
fails the test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterctl.cli import app
from clusterctl.cli.status_view import runs_json
from clusterctl.config.site import Site
from clusterctl.config.spec import JobSpec
from clusterctl.docsgen import commands, fields, records
from clusterctl.exitcodes import DESCRIPTIONS, ExitCode
from clusterctl.rundir.verdict import Verdict
from clusterctl.views.state import RunState

ROOT = Path(__file__).resolve().parent.parent
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


@pytest.mark.parametrize("model", [JobSpec, Site], ids=["spec", "site"])
def test_every_field_at_any_depth_has_a_description(model: type) -> None:
    found = fields.fields(model)
    assert len(found) > 50
    assert [f.path for f in found if not f.description] == []


def test_the_reference_types_read_as_the_user_writes_them() -> None:
    """A duration is a duration (`time_limit: 10m`), not an integer; a shorthand a field takes is shown with it."""
    from clusterctl.config.specschema import SHORTHANDS

    kinds = {f.path: f.kind for f in fields.fields(JobSpec, shorthands=SHORTHANDS)}
    assert kinds["time_limit"].startswith("duration") and "minutes" in kinds["time_limit"]
    assert kinds["watchdog.hang_timeout"].startswith("duration") and "seconds" in kinds["watchdog.hang_timeout"]
    assert kinds["topology.switch_wait"].startswith("duration") and kinds["topology.switch_wait"].endswith("or null")
    assert kinds["precision"].startswith("a compute dtype alone (`precision: bf16`), or")


def test_every_option_argument_and_exit_code_has_a_description() -> None:
    undescribed = [(name, row["names"]) for name, command, _ in commands.commands(app)
                   for row in commands.parameters(command) if not row["help"]]
    assert undescribed == []
    assert [name for name, command, _ in commands.commands(app) if not (command.help or "").strip()] == []
    assert set(DESCRIPTIONS) == set(ExitCode) and all(meaning and effect for meaning, effect in DESCRIPTIONS.values())


def test_every_key_of_every_record_has_a_meaning() -> None:
    tables = records.keyed_records()
    assert len(tables) >= 5 and all(len(rows) >= 8 for _, _, rows in tables)
    assert [(title, key) for title, _, rows in tables for key, _, meaning in rows if not meaning] == []
    # the verdict's keys are its fields and what as_dict adds; runs --json's are those the reference lists
    listed = {key for title, _, rows in tables if title.startswith("attempt-N/verdict") for key, _, _ in rows}
    assert listed == set(Verdict(ok=False, code=82, message="").as_dict())
    listed = [key for title, _, rows in tables if title.startswith("runs --json") for key, _, _ in rows]
    blank = RunState.from_dict({f.name: None for f in dataclasses.fields(RunState)} | {"attempts": [], "path": "run"})
    assert listed == list(runs_json(blank))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it (strict: a broken link or a page that fails to generate fails here)."""
    out = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET})
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strictly_with_the_reference_generated_from_the_code(site: Path) -> None:
    spec = (site / "reference" / "spec" / "index.html").read_text()
    assert "watchdog.straggler_factor" in spec and "topology.avoid_drill_suspects" in spec  # nested fields, new ones too
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert all(f"<code>{name}</code>" in cli for name, _, _ in commands.commands(app))  # every command, site's too
    codes = (site / "reference" / "exit-codes" / "index.html").read_text()
    assert all(f"<code>{code.name}</code>" in codes for code in ExitCode)
    assert (site / "search" / "search_index.json").stat().st_size > 10_000
    assert "fonts.googleapis" not in (site / "index.html").read_text()  # nothing fetched from the network


@contextlib.contextmanager
def served(directory: Path) -> Iterator[str]:
    """The directory over HTTP on 127.0.0.1 (search's worker does not run from file://)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (CI is set): make sysdeps installs it", pytrace=False)
        pytest.skip("chromium is not installed (make sysdeps installs Debian's)")
    return found


def test_the_site_and_a_report_page_work_in_a_browser(site: Path, tmp_path: Path) -> None:
    """Pages render without console errors, the navigation and the search work, and images load."""
    from playwright.sync_api import sync_playwright

    from clusterctl.rundir import RunDir
    from clusterctl.testing.runsynth import write_synthetic_run
    from clusterctl.views.report import build_report

    report = tmp_path / "report"
    build_report(RunDir(write_synthetic_run(tmp_path, steps=40, ranks=4, attempts=2, straggler=1)), report)
    executable = chromium()
    with sync_playwright() as pw, served(site) as docs, served(report) as page_root:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])  # root in CI needs it
        page = browser.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "Failed to load resource" not in m.text else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        # A resource that failed, by its address (the console does not say which); a report page has no favicon.
        page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
        page.goto(docs + "/")
        assert page.title() == "clusterctl"
        page.click("nav >> text=Command line")  # the navigation
        page.wait_for_url("**/reference/cli/")
        assert page.locator("h2#clusterctl-submit").count() == 1
        page.fill("input.md-search__input", "straggler_factor")  # the search, from its index in a worker
        page.wait_for_selector(".md-search-result__item", timeout=20_000)
        page.goto(docs + "/guide/report/")
        assert page.evaluate("[...document.images].length > 0 && [...document.images].every(i => i.naturalWidth > 0)")
        page.goto(page_root + "/index.html")  # a `clusterctl report` page, as a user opens it
        assert page.evaluate("[...document.images].length == 6 && [...document.images].every(i => i.naturalWidth > 0)")
        browser.close()
    assert errors == []
