"""The command check: a `command:` whose script, module or program is not where the ranks run is refused at
submit (exit 65, nothing written, nothing submitted), or only warned about where it may exist on the nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_names, cli, expect_cli_config_error, expect_config_error, write_spec

from clusterctl.actions.submit import remote_command_warnings
from clusterctl.config.spec import load_spec
from clusterctl.errors import Problem
from clusterctl.plan.commandcheck import CommandCheck, Where, check_command
from clusterctl.plan.job import read_job


def where(workdir: Path, **fields: object) -> Where:
    return Where(workdir=workdir, path=os.environ.get("PATH", ""), this_python=sys.executable, **fields)  # type: ignore[arg-type]


def check(command: list[str], workdir: Path, **fields: object) -> CommandCheck:
    return check_command(command, where(workdir, **fields))


def only_problem(found: CommandCheck) -> Problem:
    assert len(found.problems) == 1 and not found.warnings, found
    return found.problems[0]


def only_warning(found: CommandCheck) -> str:
    assert len(found.warnings) == 1 and not found.problems, found
    return found.warnings[0]


def fine(found: CommandCheck) -> bool:
    return not found.problems and not found.warnings


# --- python SCRIPT -----------------------------------------------------------------------------------------------


def test_a_typo_in_the_script_is_refused_naming_the_directory_searched(tmp_path: Path) -> None:
    (tmp_path / "train.py").touch()
    problem = only_problem(check(["python3", "trian.py", "--lr", "1e-3"], tmp_path))
    assert (problem.path, problem.value) == ("command[1]", "trian.py")
    assert f"{tmp_path / 'trian.py'} does not exist" in problem.allowed
    assert f"the ranks run in {tmp_path}" in problem.allowed
    assert f"run clusterctl submit from the directory that holds it, or give a path relative to {tmp_path}" in problem.allowed


def test_the_script_is_found_after_the_interpreters_options(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").touch()
    for command in (["python3", "-u", "-X", "dev", "-W", "ignore", "sub/train.py", "--lr", "1"],
                    ["python3.12", "-OO", "-Xfrozen_modules=off", "-Wignore", "sub/train.py"],
                    ["python", "-uB", "--", "sub/train.py"], [sys.executable, "-u", str(tmp_path / "sub" / "train.py")]):
        assert fine(check(command, tmp_path)), command
    problem = only_problem(check(["python3", "-u", "-W", "ignore", "sub/tain.py"], tmp_path))
    assert (problem.path, problem.value) == ("command[4]", "sub/tain.py")  # the option's value is no script


def test_inline_code_and_stdin_name_no_file(tmp_path: Path) -> None:
    for command in (["python3", "-c", "print(1)"], ["python3", "-uc", "print(1)"], ["python3", "-"], ["python3", "-V"],
                    ["bash", "-c", "echo hi"], ["bash", "-ec", "echo hi"], ["sh", "-s"]):
        assert fine(check(command, tmp_path)), command


def test_a_script_beside_the_spec_is_named_in_the_hint(tmp_path: Path) -> None:
    """The README's own example submitted from the repository's root: the hint says where the script is."""
    examples = tmp_path / "examples" / "own-script"
    examples.mkdir(parents=True)
    (examples / "train_ddp.py").touch()
    problem = only_problem(check(["python3", "train_ddp.py"], tmp_path, spec_dir=examples))
    assert f"cd {examples}" in problem.allowed
    assert "write it as examples/own-script/train_ddp.py" in problem.allowed


def test_a_path_nothing_expands_says_so(tmp_path: Path) -> None:
    problem = only_problem(check(["python3", "$HOME/train.py"], tmp_path))
    assert "nothing expands ~ or $VARIABLES" in problem.allowed and "[bash, -c" in problem.allowed


# --- python -m MODULE ------------------------------------------------------------------------------------------


def test_a_module_in_the_ranks_directory_is_found_without_importing_it(tmp_path: Path) -> None:
    package = tmp_path / "mytrainpkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('imported at submit')\n")
    (package / "train.py").touch()
    assert fine(check(["python3", "-m", "mytrainpkg.train", "--steps", "3"], tmp_path))
    assert "mytrainpkg" not in sys.modules
    problem = only_problem(check(["python3", "-m", "mytrainpkg.trian"], tmp_path))
    assert (problem.path, problem.value) == ("command[2]", "mytrainpkg.trian")
    assert "no module named 'mytrainpkg.trian'" in problem.allowed and str(tmp_path) in problem.allowed


def test_a_module_this_python_has_is_found(tmp_path: Path) -> None:
    for module in ("clusterctl.trainer", "json.tool", "timeit"):
        assert fine(check(["python3", "-m", module], tmp_path)), module
    assert fine(check(["python3", "-mjson.tool"], tmp_path))


def test_a_module_found_nowhere_is_refused_when_this_is_the_ranks_python(tmp_path: Path) -> None:
    problem = only_problem(check(["python3", "-u", "-m", "no_such_module_anywhere.train"], tmp_path))
    assert (problem.path, problem.value) == ("command[3]", "no_such_module_anywhere.train")
    assert "no module named 'no_such_module_anywhere'" in problem.allowed and str(tmp_path) in problem.allowed
    package = tmp_path / "pkgnomain"
    package.mkdir()
    (package / "__init__.py").touch()
    assert "without a __main__ module" in only_problem(check(["python3", "-m", "pkgnomain"], tmp_path)).allowed


@pytest.mark.parametrize(
    "fields, command, why",
    [
        ({"python_env": ("PYTHONPATH",)}, ["python3"], "PYTHONPATH is set for the ranks"),
        ({"modules": ("pytorch/2.5",)}, ["python3"], "modules pytorch/2.5 are loaded first"),
        ({"image": "nvcr.io#nvidia/pytorch:25.01-py3"}, ["python3"], "the image's"),
        ({"python_here": False}, ["python3"], "another interpreter"),
        ({}, ["env/bin/python3"], "another interpreter"),
        ({"remote": "login1"}, ["python3"], "login1"),
    ],
    ids=["pythonpath", "modules", "container", "site-python", "other-interpreter", "remote"],
)
def test_a_module_found_nowhere_is_a_warning_where_the_ranks_python_may_differ(
    tmp_path: Path, fields: dict[str, object], command: list[str], why: str
) -> None:
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "bin" / "python3").symlink_to(sys.executable)  # a venv's python: its own packages
    found = check([*command, "-m", "no_such_module_anywhere"], tmp_path, **fields)
    assert not found.problems, found.problems
    warning = found.warnings[-1]
    assert warning.startswith("command[2]: python -m no_such_module_anywhere: no module named") and why in warning


# --- bash SCRIPT, programs --------------------------------------------------------------------------------------


def test_a_shell_script_must_exist(tmp_path: Path) -> None:
    problem = only_problem(check(["bash", "-x", "-o", "pipefail", "run.sh", "arg"], tmp_path))
    assert (problem.path, problem.value) == ("command[4]", "run.sh") and "does not exist" in problem.allowed
    (tmp_path / "run.sh").write_text("echo hi\n")
    assert fine(check(["bash", "-x", "-o", "pipefail", "run.sh", "arg"], tmp_path))
    assert fine(check(["sh", "run.sh"], tmp_path))
    (tmp_path / "dir.sh").mkdir()
    assert "is a directory" in only_problem(check(["bash", "dir.sh"], tmp_path)).allowed


def test_a_program_path_must_be_an_executable_file(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    problem = only_problem(check(["./run.sh"], tmp_path))
    assert (problem.path, problem.value) == ("command[0]", "./run.sh") and "is not executable" in problem.allowed
    script.chmod(0o755)
    assert fine(check(["./run.sh"], tmp_path))
    assert "does not exist" in only_problem(check(["/no/such/dir/train"], tmp_path)).allowed
    assert "does not exist" in only_problem(check(["/no/such/python3", "-c", "pass"], tmp_path)).allowed


def test_a_bare_program_not_on_path_is_a_warning_only(tmp_path: Path) -> None:
    assert fine(check(["true"], tmp_path))
    assert fine(check(["python3", "-c", "pass"], tmp_path))  # the rank's own interpreter runs it
    warning = only_warning(check(["torchrun-not-installed", "train.py"], tmp_path))
    assert "'torchrun-not-installed' is not on PATH here" in warning
    (tmp_path / "launch.sh").touch()
    assert "write ./launch.sh" in only_warning(check(["launch.sh"], tmp_path))


# --- where the file may exist only at run time -----------------------------------------------------------------


def test_a_path_in_the_image_is_a_warning_but_the_submit_directory_is_bound_into_it(tmp_path: Path) -> None:
    image = "nvcr.io#nvidia/pytorch:25.01-py3"
    warning = only_warning(check(["python3", "/workspace/train.py"], tmp_path, image=image))
    assert warning.startswith("command[1]: '/workspace/train.py'") and image in warning
    assert image in only_warning(check(["/opt/app/bin/train"], tmp_path, image=image))
    assert image in only_warning(check(["python3", "../elsewhere/train.py"], tmp_path, image=image))
    # The ranks' directory is bound into the image at the same place: a typo there is no less a typo.
    assert only_problem(check(["python3", "trian.py"], tmp_path, image=image)).value == "trian.py"


def test_modules_make_no_script_appear(tmp_path: Path) -> None:
    assert only_problem(check(["python3", "trian.py"], tmp_path, modules=("cuda/12",))).value == "trian.py"


def test_a_remote_submission_only_warns(tmp_path: Path) -> None:
    warning = only_warning(check(["python3", "trian.py"], tmp_path, remote="login1"))
    assert warning.startswith("command[1]: 'trian.py'") and str(tmp_path) in warning and "login1" in warning


def test_a_remote_submission_looks_in_the_top_of_the_work_tree_it_ships(tmp_path: Path) -> None:
    """Remote ranks run in the shipped copy of the git work tree, at its top, not in the spec's directory."""
    repo = tmp_path / "repo"
    (repo / "jobs").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "jobs" / "train.py").touch()
    spec = write_spec(repo / "jobs", site="local", nodes=1, gpus_per_node=1, command=["python3", "train.py"])
    (warning,) = remote_command_warnings(read_job(spec), "login1", repo / "jobs")
    assert warning.startswith("command[1]: 'train.py'") and f"{repo / 'train.py'} does not exist" in warning
    assert "a copy of it shipped to login1" in warning
    assert remote_command_warnings(read_job(spec), "login1", None) == ()  # --code-on-cluster: nothing here to look at
    (repo / "train.py").touch()
    assert remote_command_warnings(read_job(spec), "login1", repo / "jobs") == ()


# --- a command given as one string -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, feature",
    [
        ("python train.py && echo done", "`&&`"),
        ("python train.py | tee log", "`|`"),
        ("python train.py > log 2>&1", "`>`"),
        ("python train.py; echo done", "`;`"),
        ("python train.py --out $HOME/out", "`$HOME`"),
        ('python train.py --name "run-${SLURM_JOB_ID}"', "`${SLURM_JOB_ID}`"),
        ("python train.py --tag `date`", "`"),
        ("OMP_NUM_THREADS=4 python train.py", "`OMP_NUM_THREADS=4` would be run as the program"),
    ],
)
def test_a_string_command_that_needs_a_shell_is_refused(tmp_path: Path, text: str, feature: str) -> None:
    spec = write_spec(tmp_path, command=text)
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert_names(err, "command", text, feature, "no shell runs it", "[bash, -c, ")


def test_a_string_command_with_quoted_operators_is_split_as_before(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, command="python train.py --sep '|' --name '$HOME' --x \\$y --p 'a && b'"))
    assert spec.command == ["python", "train.py", "--sep", "|", "--name", "$HOME", "--x", "$y", "--p", "a && b"]


# --- clusterctl submit -----------------------------------------------------------------------------------------


def typo_spec(tmp_path: Path, **fields: object) -> Path:
    (tmp_path / "train.py").touch()
    return write_spec(tmp_path, **{"site": "local", "nodes": 1, "gpus_per_node": 2, "runs_root": str(tmp_path / "runs"),
                                   "command": ["python3", "trian.py"], **fields})


def test_submit_refuses_a_typo_writes_no_run_and_submits_no_job(tmp_path: Path) -> None:
    spec = typo_spec(tmp_path)
    refused = cli("submit", spec, cwd=tmp_path)
    assert refused.exit_code == 65, refused.output
    assert refused.stderr.startswith("error: invalid job spec") and "Traceback" not in refused.output
    for needle in ("command[1]: got 'trian.py'", f"{tmp_path / 'trian.py'} does not exist", f"the ranks run in {tmp_path}"):
        assert needle in refused.stderr, refused.stderr
    assert not (tmp_path / "runs").exists()
    assert not list(Path(os.environ["CLUSTERCTL_LOCAL_STATE"]).glob("jobs/*"))  # the local backend ran nothing


def test_a_dry_run_refuses_it_too_and_writes_nothing(tmp_path: Path) -> None:
    expect_cli_config_error(["submit", typo_spec(tmp_path), "--dry-run"], tmp_path, "command[1]: got 'trian.py'",
                            f"the ranks run in {tmp_path}")


def test_submit_prints_a_warning_and_submits(tmp_path: Path) -> None:
    spec = typo_spec(tmp_path, command=["python3", "-m", "no_such_module_anywhere"], env={"PYTHONPATH": "/opt/mine"})
    done = cli("submit", spec, "--dry-run", "--json", cwd=tmp_path)
    assert done.exit_code == 0, done.output
    (warning,) = json.loads(done.stdout)["warnings"]
    assert "no module named 'no_such_module_anywhere'" in warning and "PYTHONPATH is set for the ranks" in warning
    shown = cli("submit", spec, "--dry-run", cwd=tmp_path)
    assert shown.exit_code == 0 and "warning: command[2]: python -m no_such_module_anywhere" in shown.stdout
