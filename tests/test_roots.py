"""Where runs go and where they are found (rundir/roots.py): one resolver for submit, the commands that look a run
up, `suspects` and a laptop's submit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterctl.errors import ConfigError
from clusterctl.rundir import roots


def test_the_spec_wins_over_the_site_and_both_over_dot_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCRATCH", "/lustre/scratch")
    assert roots.of_spec("$SCRATCH/mine", "/site/runs") == Path("/lustre/scratch/mine")
    assert roots.of_spec(None, "/site/runs/$USER") == Path(f"/site/runs/{os.environ.get('USER') or roots.getpass.getuser()}")
    assert roots.of_spec(None, None) == tmp_path / "runs"
    assert roots.chosen(None, "/site/$USER") == ("/site/$USER", "site runs_root")  # the login node expands it


def test_an_unset_variable_names_the_field_and_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_ROOT", raising=False)
    for spec, site, field in (("${NOPE_ROOT}/runs", None, "runs_root"), (None, "$NOPE_ROOT/runs", "site runs_root")):
        with pytest.raises(ConfigError) as caught:
            roots.of_spec(spec, site)
        assert f"{field}: got '{spec or site}'" in str(caught.value) and "NOPE_ROOT is not set" in str(caught.value)


def test_a_run_is_looked_up_in_each_root_once_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    roots.remember(tmp_path / "submitted")
    monkeypatch.setenv(roots.ENV, os.pathsep.join([str(tmp_path / "env"), str(tmp_path / "submitted")]))
    found = roots.search(None, [str(tmp_path / "site"), "$UNSET_FOR_THIS_TEST/x"])
    assert found == [tmp_path / "env", tmp_path / "submitted", tmp_path / "site", tmp_path / "runs"]
    assert roots.search(tmp_path / "given", ["/elsewhere"]) == [tmp_path / "given"]  # --runs-root: that root alone
    assert roots.listing(None) == tmp_path / "runs"
