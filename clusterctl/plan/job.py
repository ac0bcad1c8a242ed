"""Load a job: spec + overrides + its site, and plan it. The one entry for every command."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterctl.plan import Plan, make_plan
from clusterctl.config.site import Site, load_site
from clusterctl.errors import ConfigError, Problem
from clusterctl.config.spec import JobSpec, spec_from_located
from clusterctl.config.yamlload import load_yaml


@dataclass(frozen=True)
class Job:
    spec_path: Path
    spec: JobSpec
    site: Site
    site_path: Path
    plan: Plan


def _site_ref(spec: JobSpec, spec_path: Path, site_option: str | None) -> str:
    if site_option:
        return site_option
    ref = spec.site
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        candidate = Path(ref).expanduser()
        if not candidate.is_absolute():
            candidate = spec_path.parent / candidate
        return str(candidate)
    return ref


def load_job(spec_path: Path | str, overrides: list[str] | None = None, site: str | None = None) -> Job:
    """Validate the spec and the site and plan the job; ConfigError on any problem."""
    path = Path(spec_path)
    located = load_yaml(path, "job spec").with_overrides(overrides or [])
    spec = spec_from_located(located)
    site_ref = _site_ref(spec, path, site)
    try:
        site_obj, site_path = load_site(site_ref)
    except ConfigError as exc:
        if exc.source != "site":
            raise  # a problem inside the site file: its own source and lines
        if site:
            problems = [Problem("site", p.value, p.allowed, None, "from --site") for p in exc.problems]
        else:
            problems = located.with_lines([Problem("site", p.value, p.allowed) for p in exc.problems])
        raise ConfigError(located.source, problems) from None
    try:
        plan = make_plan(spec, site_obj, source=located.source)
    except ConfigError as exc:
        raise ConfigError(exc.source, located.with_lines(exc.problems)) from None
    return Job(path, spec, site_obj, site_path, plan)
