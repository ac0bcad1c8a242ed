"""Shared helpers for the spec, site and CLI tests.

Writing a spec or site to a directory, finding the line a field sits on, and
the checks every error test makes: exit code 65, a message that names the
field path, the bad value and what is allowed, no traceback, nothing written.
"""

from __future__ import annotations

import contextlib
import copy
import socket
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from typer.testing import CliRunner, Result

from clusterctl.cli import app
from clusterctl.errors import MISSING, OMIT, ConfigError, Problem
from clusterctl.exitcodes import ExitCode

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))

MINIMAL_SPEC: dict[str, Any] = {"name": "t", "time_limit": "1h"}

# Wide enough that rich never wraps a line the tests look for.
RUNNER = CliRunner(env={"COLUMNS": "200"})

_NOT_GIVEN: Any = object()


def write_yaml(directory: Path, data: Any, name: str = "job.yaml") -> Path:
    """Write `data` (a dict dumped in insertion order, or YAML text as is) to directory/name."""
    path = directory / name
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    path.write_text(text, encoding="utf-8")
    return path


def write_spec(directory: Path, filename: str = "job.yaml", **fields: Any) -> Path:
    """A job spec: the minimal valid one (name, time_limit) updated with `fields`."""
    data = dict(MINIMAL_SPEC)
    data.update(fields)
    return write_yaml(directory, data, filename)


def minimal_site() -> dict[str, Any]:
    """A small valid site: one partition of 4 nodes, 2 GPUs per node, each with its own NUMA node, CPUs and rail."""
    return copy.deepcopy(
        {
            "name": "mini",
            "partitions": {"gpu": {"node_type": "box", "nodes": "n[1-4]", "default": True, "max_time": "1-00:00:00"}},
            "node_types": {
                "box": {
                    "gpu_model": "X-40GB",
                    "gpu_memory_gb": 40,
                    "nvlink_domain": 2,
                    "gpus": [
                        {"index": 0, "numa": 0, "cpus": "0-3", "nics": ["ib0"]},
                        {"index": 1, "numa": 1, "cpus": "4-7", "nics": ["ib1"]},
                    ],
                    "nics": {"ib0": {"rail": 0}, "ib1": {"rail": 1}},
                }
            },
            "network": {"interface": "eth0", "port_range": [20000, 29999]},
        }
    )


def line_of(path: Path, needle: str, after: int = 0) -> int:
    """The 1-based number of the first line after line `after` that contains `needle`."""
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if number > after and needle in text:
            return number
    raise AssertionError(f"{needle!r} not found in {path}")


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under root, with size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def problem_at(err: ConfigError, path: str) -> Problem:
    """The one problem of `err` at field `path`."""
    found = [p for p in err.problems if p.path == path]
    assert len(found) == 1, f"expected one problem at {path!r}, got {[p.path for p in err.problems]}: {err}"
    return found[0]


def expect_config_error(call: Callable[[], Any], root: Path) -> ConfigError:
    """`call()` raises ConfigError (exit 65), its message holds no traceback, and nothing under root changed."""
    before = snapshot(root)
    with pytest.raises(ConfigError) as info:
        call()
    err = info.value
    assert err.exit_code == ExitCode.BAD_CONFIG == 65
    assert "Traceback" not in str(err)
    assert snapshot(root) == before
    return err


def assert_names(
    err: ConfigError, path: str, value: Any = _NOT_GIVEN, *allowed: str, line: int | None | Any = _NOT_GIVEN
) -> Problem:
    """The message names `path`, shows `value` as given, and says what is allowed (each of `allowed`).

    `value=OMIT` is for rules about several fields, where no one value is wrong;
    `value=MISSING` for a required field that is absent.
    """
    problem = problem_at(err, path)
    text = str(err)
    assert problem.render() in text
    if path:
        assert text.count(path) >= 1
    if value is not _NOT_GIVEN:
        if value is OMIT or value is MISSING:
            assert problem.value is value
        else:
            assert problem.value == value
            assert repr(value) in text, f"{value!r} not shown in: {text}"
    for fragment in allowed:
        assert fragment in problem.allowed, f"{fragment!r} not in {problem.allowed!r}"
        assert fragment in text
    if line is not _NOT_GIVEN:
        assert problem.line == line, f"line {problem.line}, expected {line}: {text}"
        if line is not None:
            assert f"(line {line})" in text or f"line {line}:" in text
    return problem


def cli(*args: str, cwd: Path | None = None) -> Result:
    """Run `clusterctl ARGS` in-process, in `cwd` when given."""
    with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
        return RUNNER.invoke(app, [str(a) for a in args])


def expect_cli_config_error(args: list[Any], root: Path, *needles: str) -> str:
    """The command exits 65 with one `error:` line naming every needle on stderr; no traceback; nothing written.

    Runs with root as the working directory, so a stray relative write would show.
    """
    before = snapshot(root)
    result = cli(*args, cwd=root)
    assert result.exit_code == 65, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.stdout == ""
    assert "Traceback" not in result.output
    assert result.stderr.startswith("error: invalid ")
    assert result.stderr.count("error:") == 1
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in {result.stderr!r}"
    assert snapshot(root) == before
    return result.stderr


def free_port() -> int:
    """A TCP port free on this machine now (for a test's own rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_slurm_conf(conf: str | Path, path: Path) -> Path:
    """The test cluster's slurm.conf naming a dead controller port, with 1 s timeouts: commands fail at once, not after 9 s."""
    lines = [line for line in Path(conf).read_text().splitlines() if not line.startswith(("TCPTimeout=", "MessageTimeout="))]
    lines = ["SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line for line in lines]
    path.write_text("\n".join([*lines, "TCPTimeout=1", "MessageTimeout=1"]) + "\n")
    return path
