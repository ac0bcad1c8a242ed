"""Submission without a scheduler: dry runs, the run directory, site template overrides."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from clusterctl.actions.submit import submit_job
from clusterctl.plan.job import load_job
from clusterctl.render.scripts import render_run
from clusterctl.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent


def spec_file(tmp_path: Path, **extra: object) -> Path:
    spec = {
        "name": "dry",
        "site": "local",
        "time_limit": "10m",
        "nodes": 2,
        "gpus_per_node": 2,
        "runs_root": str(tmp_path / "runs"),
        "command": ["python3", "train.py"],
        **extra,
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(spec))
    (tmp_path / "train.py").touch()  # the command's script, where a submission from tmp_path looks for it
    return path


def test_dry_run_writes_exactly_what_a_submission_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    (repo / "train.py").write_text("print('changed')\n")
    spec = spec_file(tmp_path)
    (repo / "job.yaml").write_text(spec.read_text())
    monkeypatch.chdir(repo)  # the ranks run where the job is submitted from: train.py is here
    done = submit_job(load_job(repo / "job.yaml"), "local", dry_run=True)
    run = done.run
    assert done.job_id is None
    names = sorted(p.name for p in run.path.iterdir())
    assert names == sorted(
        ["attempts.jsonl", "checkpoints", "code", "job.sbatch", "run.json", "site.yaml", "spec.yaml", "state.json", "wrapper.sh"]
    )
    assert run.read_state()["state"] == "dry-run"
    assert "revision:" in (run.path / "code" / "revision.txt").read_text()
    assert "?? train.py" in (run.path / "code" / "status.txt").read_text()
    rendered = render_run(load_job(repo / "job.yaml").plan, run.path, python=json.loads((run.path / "run.json").read_text())["argv"][0])
    assert (run.path / "job.sbatch").read_text() == rendered.files["job.sbatch"]
    assert not list((tmp_path / "runs").glob(".*.tmp"))


def test_a_site_can_override_one_template(tmp_path: Path) -> None:
    site = (ROOT / "site-configs" / "local.yaml").read_text() + "templates: my-templates\n"
    (tmp_path / "mysite.yaml").write_text(site.replace("name: local", "name: mysite"))
    overrides = tmp_path / "my-templates"
    overrides.mkdir()
    shipped = (ROOT / "templates" / "wrapper.sh.j2").read_text()
    (overrides / "wrapper.sh.j2").write_text(shipped.replace("set -u\n", "set -u\n# site: mysite wrapper\n", 1))
    job = load_job(spec_file(tmp_path, site=str(tmp_path / "mysite.yaml")))
    rendered = render_run(job.plan, tmp_path / "run", python="/usr/bin/python3", site_path=job.site_path)
    assert "# site: mysite wrapper" in rendered.files["wrapper.sh"]
    assert "#SBATCH --job-name=dry" in rendered.files["job.sbatch"]  # the other template is still the shipped one


def test_a_broken_site_template_is_a_clear_error(tmp_path: Path) -> None:
    from clusterctl.errors import ConfigError

    site = (ROOT / "site-configs" / "local.yaml").read_text() + "templates: bad\n"
    (tmp_path / "bad.yaml").write_text(site)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "job.sbatch.j2").write_text("#!/bin/bash\n{{ no_such_variable }}\n")
    job = load_job(spec_file(tmp_path, site=str(tmp_path / "bad.yaml")))
    with pytest.raises(ConfigError, match="no_such_variable"):
        render_run(job.plan, tmp_path / "run", python="/usr/bin/python3", site_path=job.site_path)
    assert RunDir(tmp_path / "run").attempts() == []
