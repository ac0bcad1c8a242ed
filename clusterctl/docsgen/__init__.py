"""The reference pages of the documentation site, generated from the code so that they cannot drift from it.

docs/gen_reference.py (run by mkdocs-gen-files at every `mkdocs build`)
writes each page from one of these modules: spec and site fields from the
pydantic models (fields.py), the command line from the typer application
(commands.py), exit codes from clusterctl/exitcodes.py (codes.py), the
run directory's record formats from their definitions (records.py), and the
home page from README.md. Each
function returns Markdown text and does nothing else.
"""

from __future__ import annotations

import re
from pathlib import Path


def pages(root: Path) -> dict[str, str]:
    """Every generated page by its path under docs/: the reference, and the benchmarks page (bench/README.md)."""
    from clusterctl.cli import app
    from clusterctl.config.site import Site
    from clusterctl.config.spec import JobSpec
    from clusterctl.config.specschema import SHORTHANDS
    from clusterctl.docsgen import codes, commands, fields, records

    return {
        "reference/spec.md": fields.markdown(
            JobSpec, "Job spec", "Every field of a job spec (`job.yaml`), at any depth: the path `--set` takes, its type,"
            " default, allowed values and meaning. `NAME` stands for a key you choose; `[]` for a list's items.",
            SHORTHANDS),
        "reference/site.md": fields.markdown(
            Site, "Site config", "Every field of a site config (`site-configs/NAME.yaml`), as the admin writes it."),
        "reference/cli.md": commands.markdown(app),
        "reference/exit-codes.md": codes.markdown(),
        "reference/records.md": records.markdown(root / "examples" / "quickstart.yaml"),
        "benchmarks.md": (root / "bench" / "README.md").read_text(encoding="utf-8"),
        "index.md": home(root),
    }


def home(root: Path) -> str:
    """The site's home page is README.md (the one copy of the overview and the quickstart), its links
    pointed at the site's pages."""
    text = (root / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\]\((?:docs/([^)]+)|bench/README\.md)\)", lambda m: f"]({m.group(1) or 'benchmarks.md'})", text)


def images(root: Path) -> dict[str, bytes]:
    """The example reports' plots (examples/report/), for the guide pages that show them."""
    return {f"images/report/{p.parent.name}/{p.name}": p.read_bytes() for p in sorted((root / "examples" / "report").glob("*/*.png"))}
