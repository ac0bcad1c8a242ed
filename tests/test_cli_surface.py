"""The command line a newcomer can guess: one way to name a run, options that mean one thing, refusals as documented.

Each test is what a user types and what they must see: a run found by its
id or job id from another directory, the same options on every command
that takes RUN, `--help` in groups, a job that cannot fit refused with the
plan's numbers, a runs root on a missing file system refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer.main
import yaml
from helpers import cli, write_spec

from clusterctl import rundir
from clusterctl.cli import app
from clusterctl.cli.app import PANELS
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, history, roots

ROOT = Path(__file__).resolve().parent.parent
RUN_COMMANDS = ("status", "logs", "report", "trace", "record", "checkpoints", "cancel", "requeue", "drill")


def commands() -> dict[str, object]:
    """Every command by its full name (`site show` too)."""
    group = typer.main.get_command(app)
    found: dict[str, object] = {}
    for name, command in group.commands.items():
        found[name] = command
        for sub, inner in getattr(command, "commands", {}).items():
            found[f"{name} {sub}"] = inner
    return found


def make_run(root: Path, name: str, job: str, backend: str = "local") -> RunDir:
    """A submitted run as the batch script leaves one: state.json, run.json, its job in the history."""
    run = RunDir(root / name)
    run.path.mkdir(parents=True)
    (run.path / "run.json").write_text(json.dumps({"name": name, "world_size": 1, "gpus_per_node": 1, "nodes": 1}))
    run.write_state(state="submitted", backend=backend, job_id=f"local-{job}" if backend == "local" else job)
    history.append(run, history.EVENT_START, attempt=1, job_id=job, time=1_800_000_000.0, nodes=1)
    return run


# --- one resolver for RUN ----------------------------------------------------------------------------------


def test_a_run_is_found_by_id_or_job_id_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))  # its job 7 is not this machine's
    elsewhere = tmp_path / "project" / "runs"
    run = make_run(elsewhere, "hello-20270101-000000-ab12", "7")
    roots.remember(elsewhere)  # as `submit` does
    away = tmp_path / "home"
    away.mkdir()
    for name in (run.path.name, "local-7", "7"):
        result = cli("status", name, "--json", cwd=away)
        assert result.exit_code == 0, (name, result.output)
        assert json.loads(result.stdout)["run"] == run.path.name
    assert cli("status", "slurm-7", cwd=away).exit_code == ExitCode.USAGE
    # $CLUSTERCTL_RUNS_ROOTS names roots nobody submitted into from here.
    listed = make_run(tmp_path / "shared" / "runs", "other-20270101-000000-cd34", "99", backend="slurm")
    monkeypatch.setenv("CLUSTERCTL_RUNS_ROOTS", f"{tmp_path / 'nowhere'}:{listed.path.parent}")
    assert json.loads(cli("status", "99", "--json", cwd=away).stdout)["run"] == listed.path.name
    assert cli("status", "local-99", cwd=away).exit_code == ExitCode.USAGE  # `local-` names local runs only
    # Slurm's job 7 beside local job 7: a bare 7 is Slurm's (Slurm's ids have no prefix), local-7 the local one.
    slurm7 = make_run(listed.path.parent, "slurm-20270101-000000-ef56", "7", backend="slurm")
    assert json.loads(cli("status", "7", "--json", cwd=away).stdout)["run"] == slurm7.path.name
    assert json.loads(cli("status", "local-7", "--json", cwd=away).stdout)["run"] == run.path.name


def test_a_missing_or_ambiguous_run_exits_2_in_every_command_and_says_where_it_looked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))  # a local backend that ran none of them
    for root in ("a", "b"):
        make_run(tmp_path / root / "runs", f"{root}-20270101-000000-ab12", "5")
        roots.remember(tmp_path / root / "runs")
    for command in RUN_COMMANDS:
        extra = ["--hang", "0"] if command == "drill" else []
        missing = cli(command, "nope", *extra, cwd=tmp_path)
        assert missing.exit_code == ExitCode.USAGE, (command, missing.output)
        assert "no run 'nope'" in missing.output and str(tmp_path / "a" / "runs") in missing.output, (command, missing.output)
        assert "Traceback" not in missing.output
        both = cli(command, "local-5", *extra, cwd=tmp_path)
        assert both.exit_code == ExitCode.USAGE and "names more than one run" in both.output, (command, both.output)
    # --runs-root narrows the search to one root: the same name is then one run.
    one = cli("status", "local-5", "--runs-root", tmp_path / "b" / "runs", "--json", cwd=tmp_path)
    assert one.exit_code == 0 and json.loads(one.stdout)["run"].startswith("b-")
    # The local backend knows which run its own job 5 was: no ambiguity (local job numbers restart per state directory).
    ran = tmp_path / "local-state" / "jobs" / "5"
    ran.mkdir(parents=True)
    (ran / "job.json").write_text(json.dumps({"script": str(tmp_path / "a" / "runs" / "a-20270101-000000-ab12" / "job.sbatch")}))
    mine = cli("status", "local-5", "--json", cwd=tmp_path)
    assert mine.exit_code == 0 and json.loads(mine.stdout)["run"].startswith("a-"), mine.output


def test_a_spec_name_names_its_newest_run_and_runs_lists_what_status_finds(tmp_path: Path) -> None:
    """`drill cc-pl ...` from anywhere: a spec's name is its newest run; `runs` away from ./runs lists the runs a RUN
    argument can name; a lookup that fails is short and names the newest runs; a removed root is forgotten."""
    project = tmp_path / "project" / "runs"
    old = make_run(project, "cc-pl-20270101-000000-ab12", "3")
    new = make_run(project, "cc-pl-20270102-000000-cd34", "4")
    make_run(project, "cc-pl-long-20270103-000000-ef56", "5")  # another spec whose name starts the same
    roots.remember(project)
    gone = tmp_path / "scratch" / "runs"
    gone.mkdir(parents=True)
    roots.remember(gone)
    gone.rmdir()
    away = tmp_path / "home"
    away.mkdir()
    found = cli("status", "cc-pl", "--json", cwd=away)
    assert found.exit_code == 0 and json.loads(found.stdout)["run"] == new.path.name, found.output
    listed = cli("runs", "--json", cwd=away)
    assert [r["run"] for r in json.loads(listed.stdout)] == ["cc-pl-long-20270103-000000-ef56", new.path.name, old.path.name]
    missing = cli("status", "cc", cwd=away)
    assert missing.exit_code == ExitCode.USAGE and "Newest runs: cc-pl-long-20270103-000000-ef56, " in missing.output
    assert str(gone) not in missing.output and len(missing.output) < 600, missing.output
    assert roots.remembered() == [project]  # the removed root is no longer searched, and goes at the next submit


# --- options mean one thing everywhere -------------------------------------------------------------------------


def test_help_groups_the_commands_and_every_option_name_means_one_thing() -> None:
    top = cli("--help")
    assert top.exit_code == 0
    for title in PANELS:
        assert f"\n{title}:\n" in top.stdout
    assert "Other:" not in top.stdout  # every command has its group
    version = cli("--version")
    assert version.exit_code == 0 and version.stdout.startswith("clusterctl ")
    assert "--expand" not in cli("version", "--help").stdout  # plumbing is hidden
    long_of_short: dict[str, set[str]] = {}
    flag_of: dict[str, set[bool]] = {}
    for name, command in commands().items():
        if getattr(command, "hidden", False):
            continue
        helped = cli(*name.split(), "--help")
        assert helped.exit_code == 0, name
        arguments = helped.stdout.split("Arguments:")[1].split("Options:")[0] if "Arguments:" in helped.stdout else ""
        assert "<" not in helped.stdout.splitlines()[0] + arguments, (name, helped.stdout)  # one placeholder style
        for param in getattr(command, "params", []):
            if getattr(param, "param_type_name", "") != "option" or param.hidden:
                continue
            long = next(o for o in param.opts if o.startswith("--"))
            flag_of.setdefault(long, set()).add(bool(param.is_flag))
            for short in (o for o in param.opts if not o.startswith("--")):
                long_of_short.setdefault(short, set()).add(long)
            assert not getattr(param, "metavar", "") or not param.metavar.startswith("<"), (name, long, param.metavar)
    assert {s: ls for s, ls in long_of_short.items() if len(ls) > 1} == {}  # -o is --output everywhere, ...
    assert {o: fs for o, fs in flag_of.items() if len(fs) > 1} == {}  # ... and an option is a flag everywhere or nowhere
    for name in RUN_COMMANDS:
        opts = {o for p in commands()[name].params for o in getattr(p, "opts", [])}
        assert {"--runs-root", "--remote"} <= opts, name
    for name in ("submit", "render", "plan", "site validate", "site show", "status", "report", "checkpoints", "qualify"):
        assert "--json" in {o for p in commands()[name].params for o in getattr(p, "opts", [])}, name
    for name in ("submit", "render", "plan", "qualify"):
        assert "--set" in {o for p in commands()[name].params for o in getattr(p, "opts", [])}, name
    assert "--node-counts" in cli("qualify", "--help").stdout and "HOSTLIST" in cli("site", "import", "--help").stdout
    assert "parallel.dp" in cli("requeue", "--help").stdout  # its example is one requeue accepts
    for name in ("submit", "logs", "status"):  # following a job is one idea: each takes the others' names for it
        following = [set(p.opts) for p in commands()[name].params if {"--wait", "--follow", "--watch"} & set(p.opts)]
        assert len(following) == 1 and {"--wait", "--follow", "--watch"} <= following[0], name


# --- refusals the README promises -------------------------------------------------------------------------------


def test_a_job_that_cannot_fit_is_refused_with_the_plans_numbers_unless_allowed(tmp_path: Path) -> None:
    spec = ROOT / "examples" / "llama-70b.yaml"
    too_big = ["--set", "parallel.pp=1", "--set", "parallel.vpp=1", "--set", "sharding=none",
               "--set", f"runs_root={tmp_path / 'runs'}"]
    (tmp_path / "pretrain_gpt.py").touch()  # the example's script: the ranks would run it here
    for command in (["submit", spec, "--dry-run"], ["render", spec, "-o", tmp_path / "out"]):
        refused = cli(*command, *too_big, cwd=tmp_path)
        assert refused.exit_code == ExitCode.BAD_CONFIG, refused.output
        assert "model (line 14): got '163.92 GB per GPU'" in refused.stderr and "at most 72.00 GB" in refused.stderr
        assert "--allow-oom" in refused.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
    allowed = cli("submit", spec, "--dry-run", *too_big, "--allow-oom", "--json", cwd=tmp_path)
    assert allowed.exit_code == 0, allowed.output
    run = Path(json.loads(allowed.stdout)["run"])
    assert yaml.safe_load((run / rundir.SPEC).read_text())["allow_oom"] is True  # the run keeps it
    # Without a model shape nothing is known about memory: never refused for it.
    shapeless = write_spec(tmp_path, site="local", nodes=1, gpus_per_node=1, command=["true"], runs_root=str(tmp_path / "r2"))
    assert cli("submit", shapeless, "--dry-run", cwd=tmp_path).exit_code == 0


def test_a_runs_root_on_a_missing_file_system_is_refused_not_created(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, site="local", nodes=1, gpus_per_node=1, command=["true"], runs_root="/nonexistent-fs/clusterctl/runs")
    refused = cli("submit", spec, "--dry-run", cwd=tmp_path)
    assert refused.exit_code == ExitCode.BAD_CONFIG
    assert "runs_root (line 8): got '/nonexistent-fs/clusterctl/runs'" in refused.stderr and "/nonexistent-fs/clusterctl does not" in refused.stderr
    assert not Path("/nonexistent-fs").exists()


def test_problems_found_when_the_run_is_rendered_name_their_spec_line(tmp_path: Path) -> None:
    """A runs root sbatch cannot read unquoted, an unset variable in it, a missing command: found while rendering,
    reported like the planner's problems, with the line of the field."""
    for root, needle in ((str(tmp_path / "my runs"), "expected an absolute path of letters"),
                         ("$NO_SUCH_VARIABLE_HERE/runs", "NO_SUCH_VARIABLE_HERE is not set")):
        spec = write_spec(tmp_path, site="local", nodes=1, gpus_per_node=1, command=["true"], runs_root=root)
        line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if text.startswith("runs_root:"))
        refused = cli("submit", spec, "--dry-run", cwd=tmp_path)
        assert refused.exit_code == ExitCode.BAD_CONFIG, refused.output
        assert f"runs_root (line {line})" in refused.stderr and needle in refused.stderr, refused.stderr


def test_site_names_are_found_in_site_configs_and_an_unknown_gpu_is_never_guessed(tmp_path: Path) -> None:
    (tmp_path / "site-configs").mkdir()
    site = yaml.safe_load((ROOT / "site-configs" / "local.yaml").read_text())
    site["name"] = "mycluster"
    (tmp_path / "site-configs" / "mycluster.yaml").write_text(yaml.safe_dump(site))
    shown = cli("site", "show", "mycluster", cwd=tmp_path)
    assert shown.exit_code == 0, shown.output
    missing = cli("site", "show", "nosuch", cwd=tmp_path)
    assert missing.exit_code == ExitCode.BAD_CONFIG
    assert str(tmp_path / "site-configs") in missing.stderr and "CLUSTERCTL_SITES" in missing.stderr
    # What `site import` writes for a GPU it does not know: an empty memory that validate refuses until a person sets it.
    (node_type,) = site["node_types"].values()
    node_type["gpu_memory_gb"] = None
    (tmp_path / "unknown.yaml").write_text(yaml.safe_dump(site))
    refused = cli("site", "validate", tmp_path / "unknown.yaml", cwd=tmp_path)
    assert refused.exit_code == ExitCode.BAD_CONFIG and "gpu_memory_gb" in refused.stderr and "it is not set" in refused.stderr
    ok = cli("site", "validate", "mycluster", "--json", cwd=tmp_path)
    assert ok.exit_code == 0 and json.loads(ok.stdout)["site"] == "mycluster"


def test_suspects_names_a_missing_runs_root(tmp_path: Path) -> None:
    result = cli("suspects", cwd=tmp_path)
    assert result.exit_code == ExitCode.USAGE and f"no runs root {tmp_path / 'runs'}" in result.output


def test_the_remembered_runs_roots_are_readable_by_their_user_alone(tmp_path: Path) -> None:
    for name in ("runs", "other"):
        (tmp_path / name).mkdir()
        roots.remember(tmp_path / name)
    written = roots.state_dir() / roots.FILE
    assert roots.remembered() == [tmp_path / "other", tmp_path / "runs"]  # newest first
    assert written.stat().st_mode & 0o077 == 0 and roots.state_dir().stat().st_mode & 0o077 == 0
