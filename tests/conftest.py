"""Shared test set-up: the real Slurm test cluster (tests/slurmlab) for tests marked `slurm`,
and the `backend` fixture that runs a test once on the local backend and once on that cluster."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.slurmlab.plugin", "tests.sshlab.plugin"]

BACKEND_SITES = {"slurm": "slurm-lab", "local": "local"}
"""The site each backend's jobs use: the embedded local one, or the test cluster's."""


@pytest.fixture(params=["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """`local` (a private state directory) or `slurm` (the test cluster, SLURM_CONF set).

    Jobs a test leaves behind (a continuation the recovery step submitted, say) are cancelled at
    its end: they would otherwise run on for their whole time limit and take the CPUs of later tests.
    """
    if request.param == "slurm":
        monkeypatch.setenv("SLURM_CONF", request.getfixturevalue("slurm_lab").conf)
    else:
        monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    yield request.param
    if request.param == "slurm":
        cancel_slurm_jobs_under(tmp_path)


def cancel_slurm_jobs_under(tmp_path: Path) -> None:
    """scancel the test cluster's jobs whose batch script lives under tmp_path."""
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%o"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return
    ids = [line.split("|", 1)[0] for line in out.stdout.splitlines() if str(tmp_path) in line]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30, check=False)


@pytest.fixture(autouse=True)
def _own_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test has its own user state: the runs roots it submitted into (rundir/roots.py) and the local
    backend's jobs, so a run id or `local-N` one test made never resolves in another (or the machine's own).
    The state home sits beside tmp_path, not in it: the user's checkpoint key (checkpoint/trust.py) lives
    there, and tests that use tmp_path as a checkpoint directory list exactly what a save left."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path.with_name(tmp_path.name + "-state")))
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))


@pytest.fixture(autouse=True)
def _no_local_jobs_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Cancel every local-backend job still active in a state directory under the test's tmp_path."""
    yield
    tmp_path = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if tmp_path is None:
        return
    roots = [p.parent for p in tmp_path.glob("*/jobs") if p.is_dir()] + [p.parent for p in tmp_path.glob("*/*/jobs") if p.is_dir()]
    if not roots:
        return
    from clusterctl.backends.local.backend import LocalBackend
    from clusterctl.backends.local.records import list_jobs

    for root in roots:
        backend = LocalBackend(state_dir=root)
        for record in list_jobs(root):
            try:
                info = backend.info(str(record.job_id))
                if info is not None and not info.finished:
                    backend.cancel(str(record.job_id))
            except Exception:  # noqa: BLE001 - best effort at teardown
                continue



# --- the fast tier: `make test-fast` (pytest -m unit) --------------------------------------------------------------
# A test is `unit` when the code it runs in its module (its body, the module's helpers and fixtures it reaches, the
# names it imports) names none of these, and it asks for no fixture that starts a cluster. The mark is checked, not
# trusted: a unit test that starts a process anyway fails and says so (the guard below), in every run.
PROCESS_HINTS = (
    "subprocess", "Popen", "multiprocessing", "os.fork", "mp.spawn", "submit_job(", "run_job(", "slurm_lab",
    "ssh_lab", "CLUSTERCTL_LOCAL_STATE", '"submit"', "crashdrill", "detection_harness", "LocalBackend", "fork_ranks",
    "sys.executable", "--probe", "fake_sbatch", "from test_", "squeue",
)
SAFE_FIXTURES = {  # pytest's own, and the autouse ones of this file: every other fixture from outside the module counts
    "tmp_path", "tmp_path_factory", "tmpdir", "tmpdir_factory", "monkeypatch", "capsys", "capsysbinary", "capfd",
    "capfdbinary", "caplog", "request", "recwarn", "pytestconfig", "record_property", "cache", "doctest_namespace",
    "_own_state_home", "_no_local_jobs_left_behind", "_unit_tests_start_no_process",
}
_MODULES: dict[str, tuple[dict[str, str], dict[str, set[str]], str]] = {}


def _module_parts(path: Path) -> tuple[dict[str, str], dict[str, set[str]], str]:
    """(each top-level function's or class's source, the top-level names it uses, the module's import lines)."""
    import ast

    key = str(path)
    if key not in _MODULES:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        sources: dict[str, str] = {}
        uses: dict[str, set[str]] = {}
        imports = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                sources[node.name] = ast.get_source_segment(text, node) or ""
                names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                uses[node.name] = names | {a.attr for a in ast.walk(node) if isinstance(a, ast.Attribute)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append(ast.get_source_segment(text, node) or "")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        sources[target.id] = ast.get_source_segment(text, node) or ""
                        uses[target.id] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        _MODULES[key] = (sources, uses, "\n".join(imports))
    return _MODULES[key]


def _starts_no_process(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    if function is None:
        return False
    sources, uses, imports = _module_parts(Path(str(item.fspath)))
    for name, defs in item._fixtureinfo.name2fixturedefs.items():  # noqa: SLF001 - where each fixture comes from
        where = getattr(defs[-1].func, "__module__", "") if defs else ""
        if name not in sources and name not in SAFE_FIXTURES and not where.startswith("_pytest"):
            return False  # a fixture of a plugin or conftest (a cluster, a server, a job): not the fast tier's
    reached, todo = set(), [function.__name__, *getattr(item, "fixturenames", ())]
    while todo:
        name = todo.pop()
        if name in reached or name not in sources:
            continue
        reached.add(name)
        todo.extend(uses.get(name, ()))
    used = set().union(*(uses[n] for n in reached)) if reached else set()
    imported = [line for line in imports.splitlines() if used & set(re.findall(r"\w+", line.split(" import ")[-1]))]
    text = "\n".join([*(sources[n] for n in reached), *imported])
    return not any(hint in text for hint in PROCESS_HINTS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _starts_no_process(item):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test in the fast tier that starts a process fails at once, naming the call (name what starts it in the
    test's text, or take the process out)."""
    if request.node.get_closest_marker("unit") is None:
        return
    import os

    def refuse(what: str):  # noqa: ANN202
        def call(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"{request.node.nodeid} is in the fast tier (`unit`) but starts a process ({what})")
        return call

    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp", "execvpe", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("subprocess.Popen"))
