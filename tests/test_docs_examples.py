"""The guides' runnable examples, run as a reader would type them, their output checked against the page.

In README.md and the pages under docs/, a ```console block right after `<!-- runnable -->` is a sequence of `$ command`
lines, each followed by the output it must print: those lines must appear
in that order (other lines may come between them), `...` inside a line stands
for anything, and a line that is only `...` is there for the reader. Each
page's blocks run in order, as in one shell (a `cd`, `export` or `source` carries over), from one
fresh directory holding a copy of examples/ and the tests' fixtures, on the local backend, with a terminal 100
columns wide; every command must exit 0. README.md's run as in a fresh shell after `make demo`: without clusterctl
on PATH until the page says how (`source .venv/bin/activate`, the checkout's .venv).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(p for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")] if "<!-- runnable -->" in p.read_text())


def blocks(page: Path) -> list[list[tuple[str, list[str]]]]:
    """Each runnable block as (command, expected lines) pairs."""
    found = []
    for body in re.findall(r"<!-- runnable -->\n```console\n(.*?)\n```", page.read_text(), re.S):
        steps: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif line.strip() != "..." and steps:
                steps[-1][1].append(line.rstrip())
        found.append(steps)
    return found


def matches(expected: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, actual.rstrip()) is not None


def in_order(expected: list[str], actual: list[str]) -> list[str]:
    """The expected lines not found, in order, among the actual ones."""
    at = 0
    for i, want in enumerate(expected):
        while at < len(actual) and not matches(want, actual[at]):
            at += 1
        if at == len(actual):
            return expected[i:]
        at += 1
    return []


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_every_page_with_runnable_examples_is_found() -> None:
    names = {name(p) for p in PAGES}
    assert {"README.md", "docs/guide/spec.md", "docs/guide/plan-render-submit.md", "docs/guide/own-script.md",
            "docs/guide/recovery.md", "docs/admin/sites.md"} <= names, names


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_the_runnable_examples_print_what_the_page_says(page: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("report", "hf-output"))
    (work / "tests").mkdir()
    (work / "tests" / "fixtures").symlink_to(ROOT / "tests" / "fixtures")
    env = {**os.environ, "COLUMNS": "100"}
    if page == ROOT / "README.md":  # a fresh shell after `make demo`: clusterctl is in .venv, not on PATH
        (work / ".venv").symlink_to(sys.prefix)
        env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if not (Path(d) / "clusterctl").exists())
        env.pop("VIRTUAL_ENV", None)
    else:  # the guides' reader has installed clusterctl
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    cwd = work  # a `cd`, an `export` or a `source` carries over to the next command, as in the reader's shell
    for steps in blocks(page):
        for command, expected in steps:
            done = subprocess.run(["bash", "-c", 'eval "$1"; code=$?; pwd > "$2"; env -0 > "$3"; exit $code', "-", command,
                                   str(tmp_path / "cwd"), str(tmp_path / "env")],
                                  cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
            cwd = Path((tmp_path / "cwd").read_text().strip())
            env = dict(v.split("=", 1) for v in (tmp_path / "env").read_text().split("\0") if "=" in v)
            assert done.returncode == 0, f"$ {command}\n{done.stdout}{done.stderr}"
            missing = in_order(expected, done.stdout.splitlines())
            assert not missing, f"$ {command}: not printed (in order): {missing}\n--- it printed:\n{done.stdout}"
