"""Load a job: its spec (with `--set` overrides) and its site, validated, then planned once.

`read_job` validates what the files say (a JobConfig); `plan_job` plans it,
with the suspect nodes to avoid when a submission read them, and its
problems keep the spec's line numbers. `load_job` does both for the commands
that only plan (plan, render, suspects, qualify).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterctl.config.site import Site, load_site
from clusterctl.config.spec import JobSpec, spec_from_located
from clusterctl.config.yamlload import Located, load_yaml
from clusterctl.errors import ConfigError, Problem
from clusterctl.plan import Plan, make_plan
from clusterctl.rundir.suspects import Suspect


@dataclass(frozen=True)
class JobConfig:
    """A job as its files say: the spec (overrides applied) and its site, both valid; not planned yet."""

    spec_path: Path
    spec: JobSpec
    site: Site
    site_path: Path
    located: Located  # the spec's YAML with where each value came from (problems name the line)

    def refused(self, problems: list[Problem]) -> ConfigError:
        """A refusal of problems found after validation (the runs root, its trust), each with its spec line."""
        return refusal(self.spec_path, self.located, problems)


@dataclass(frozen=True)
class PlannedJob:
    """A job and its plan: spec + site + plan, what every command after planning works with."""

    spec_path: Path
    spec: JobSpec
    site: Site
    site_path: Path
    plan: Plan
    located: Located | None = None  # the spec as read, with its lines: what problems found after planning point at

    def refused(self, problems: list[Problem]) -> ConfigError:
        """A refusal of problems found after planning (rendering the run), each with its spec line."""
        return refusal(self.spec_path, self.located, problems)


def refusal(spec_path: Path, located: Located | None, problems: list[Problem]) -> ConfigError:
    """The ConfigError of problems found after the spec was read, with their lines where the spec's YAML is known."""
    if located is None:
        return ConfigError(str(spec_path), problems)
    return ConfigError(located.source, located.with_lines(problems))


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


def read_job(spec_path: Path | str, overrides: list[str] | None = None, site: str | None = None) -> JobConfig:
    """Validate the spec and its site; ConfigError on any problem."""
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
    return JobConfig(path, spec, site_obj, site_path, located)


def plan_job(config: JobConfig, suspects: dict[str, Suspect] | None = None) -> PlannedJob:
    """Plan the job once, leaving out the suspect nodes it can do without; ConfigError names the spec's lines."""
    try:
        plan = make_plan(config.spec, config.site, source=config.located.source, suspects=suspects)
    except ConfigError as exc:
        raise ConfigError(exc.source, config.located.with_lines(exc.problems)) from None
    return PlannedJob(config.spec_path, config.spec, config.site, config.site_path, plan, config.located)


def load_job(spec_path: Path | str, overrides: list[str] | None = None, site: str | None = None) -> PlannedJob:
    """Validate the spec and the site and plan the job; ConfigError on any problem."""
    return plan_job(read_job(spec_path, overrides, site))

