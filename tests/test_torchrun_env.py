"""torchrun's whole environment, and clusterctl's value for each: the table in docs/guide/own-script.md checked against
a real `torchrun --standalone --nproc-per-node 2` here and against a clusterctl job's ranks on the local backend."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.actions.submit import submit_job
from clusterctl.backends import get_backend
from clusterctl.plan.job import load_job

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "guide" / "own-script.md"
DUMP = "import json, os; print('ENV ' + json.dumps(dict(os.environ)), flush=True)"


def table() -> dict[str, str]:
    """The page's table: variable -> its clusterctl column."""
    body = PAGE.read_text().split("<!-- torchrun-env -->", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(" | ") for line in body.splitlines() if line.startswith("| `")]
    return {row[0].strip("| `"): row[2] for row in rows}


def torchrun_env(tmp_path: Path) -> dict[str, str]:
    """Rank 1's variables that torchrun added to a bare environment."""
    script = tmp_path / "dump.py"
    script.write_text(f"import os\nif os.environ.get('RANK') == '1':\n    {DUMP}\n")
    bare = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(script)], capture_output=True,
                         text=True, timeout=180, env=bare, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    alone = subprocess.run([sys.executable, "-c", DUMP], capture_output=True, text=True, timeout=60, env=bare)
    before = json.loads(alone.stdout[4:])  # what a Python started without torchrun has (LC_CTYPE, ...)
    dumped = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("ENV "))[4:])
    return {k: v for k, v in dumped.items() if k not in before}


def clusterctl_env(tmp_path: Path) -> dict[str, str]:
    """Rank 1's environment in a 2-node, 2-rank job on the local backend (its script: python -c, in-process)."""
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps({
        "name": "env", "site": "local", "nodes": 2, "gpus_per_node": 1, "time_limit": "10m",
        "runs_root": str(tmp_path / "runs"), "restart": {"budget": 2},
        "command": ["python3", "-c", f"import os\nif os.environ['RANK'] == '1':\n    {DUMP}"]}))
    done = submit_job(load_job(spec), "local")
    backend = get_backend("local")
    import time

    deadline = time.monotonic() + 120
    while not ((info := backend.info(done.job_id)) is not None and info.finished):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.3)
    text = "".join(p.read_text() for p in done.run.attempt(1).glob("logs/*"))
    line = next(line for line in text.splitlines() if "ENV {" in line)
    return json.loads(line.split("ENV ", 1)[1])


def test_the_table_lists_every_variable_torchrun_sets_and_clusterctl_sets_them_as_it_says(tmp_path: Path) -> None:
    documented = table()
    theirs = torchrun_env(tmp_path)
    assert set(theirs) == set(documented), "the table and torchrun differ: " + str(set(theirs) ^ set(documented))
    ours = clusterctl_env(tmp_path)
    unset = {name for name, said in documented.items() if said.startswith("not set")}
    assert unset == {"TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
                     "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
    assert not unset & set(ours), unset & set(ours)
    assert set(documented) - unset <= set(ours), set(documented) - unset - set(ours)
    # What each value means, as torchrun means it: nodes, one role, no restart yet, the run's budget.
    assert (ours["RANK"], ours["WORLD_SIZE"], ours["LOCAL_RANK"], ours["LOCAL_WORLD_SIZE"]) == ("1", "2", "0", "1")
    assert (ours["GROUP_RANK"], ours["GROUP_WORLD_SIZE"]) == ("1", "2")  # GROUP_WORLD_SIZE counts nodes
    assert (ours["ROLE_RANK"], ours["ROLE_WORLD_SIZE"]) == (ours["RANK"], ours["WORLD_SIZE"])
    assert (theirs["ROLE_RANK"], theirs["ROLE_WORLD_SIZE"]) == (theirs["RANK"], theirs["WORLD_SIZE"])
    assert ours["ROLE_NAME"] == theirs["ROLE_NAME"] == "default"
    assert ours["TORCHELASTIC_RESTART_COUNT"] == theirs["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert ours["TORCHELASTIC_MAX_RESTARTS"] == "2" and theirs["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert ours["TORCHELASTIC_USE_AGENT_STORE"] == "True"


@pytest.mark.parametrize(("attempt", "count"), [("1", "0"), ("3", "2")])
def test_the_restart_count_is_the_runs_restarts_so_far(attempt: str, count: str) -> None:
    """The wrapper's line, as rendered: attempt 3 (a restart, or a continuation's first attempt) has had 2 restarts."""
    wrapper = (ROOT / "tests" / "golden" / "local" / "managed" / "wrapper.sh").read_text()
    line = next(line for line in wrapper.splitlines() if line.startswith("export TORCHELASTIC_RESTART_COUNT="))
    out = subprocess.run(["bash", "-c", f"{line}; echo $TORCHELASTIC_RESTART_COUNT"], capture_output=True, text=True,
                         env={"CLUSTERCTL_ATTEMPT": attempt, "PATH": os.environ["PATH"]}, timeout=10)
    assert out.stdout.strip() == count and re.search(r"MAX_RESTARTS=\d+", line)
