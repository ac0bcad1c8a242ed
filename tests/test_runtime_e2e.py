"""Start-up failures end to end, on the real Slurm test cluster and on the local backend.

A 2-node x 2-rank job whose rank 3 (or 1) is broken in one way; the attempt
must end with the documented code and a verdict that names the rank and host,
and the batch log must say it. Faults are injected by
tests/programs/faults/sitecustomize.py. The rest of the controller's judgment
(a stale token, a wrong world size or node, another torch) is the same
whatever the ranks are: test_controller drives a real controller and store
with every one of them, test_admission each rule.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import BACKEND_SITES

from clusterctl import rundir
from clusterctl.actions.submit import submit_job
from clusterctl.backends import get_backend
from clusterctl.config.spec import DEFAULT_PREFLIGHT
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.job import load_job
from clusterctl.rundir import rankmanifest

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "programs" / "faults"
CHECKS = list(DEFAULT_PREFLIGHT)  # the defaults, nic included: both sites name NICs their nodes have (lo)


def run_job(backend: str, tmp_path: Path, fault: str | None, *, checks: list[str] = CHECKS, **extra: object) -> tuple:
    env = {"PYTHONPATH": str(FAULTS)}
    if fault:
        env["CLUSTERCTL_TEST_FAULT"] = fault
    spec = {
        "name": "e2e",
        "site": BACKEND_SITES[backend],
        "time_limit": "10m",
        "nodes": 2,
        "gpus_per_node": 2,
        "parallel": {"tp": 2},
        "signal": {"lead_s": 60},
        "rendezvous": {"timeout": 8},
        # The verdicts themselves; test_recovery_e2e restarts. A rank slowed from sitecustomize must start its own
        # interpreter: a rank forked warm ran the server's start-up, not its own (docs/guide/recovery.md).
        "restart": {"mode": "none", "warm": not (fault or "").startswith("slow")},
        "preflight": {"checks": checks},
        "runs_root": str(tmp_path / "runs"),
        "env": env,
        "command": ["python3", "-c", "print('rank ran')"],
        **extra,
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(spec))
    job = load_job(path)
    done = submit_job(job, backend)
    be = get_backend(backend)
    deadline = time.monotonic() + 120
    while True:
        info = be.info(done.job_id)
        if info is not None and info.finished:
            break
        assert time.monotonic() < deadline, f"job {done.job_id} still {info}"
        time.sleep(0.3)
    run = done.run
    batch_log = (run.path / f"slurm-{done.job_id}.out").read_text()
    verdict_path = run.attempt(1) / "verdict.json"
    verdict = json.loads(verdict_path.read_text()) if verdict_path.exists() else None
    events = [json.loads(line) for line in (run.path / "attempts.jsonl").read_text().splitlines()]
    return info, verdict, batch_log, events, run


def hosts(run) -> list[str]:  # noqa: ANN001
    return json.loads((run.attempt(1) / "attempt.json").read_text())["hosts"]


def test_healthy_job_runs(backend: str, tmp_path: Path) -> None:
    info, verdict, log, events, run = run_job(backend, tmp_path, None)
    assert events[-1]["exit"] == 0, log
    assert verdict["ok"] and "all 4 ranks registered" in log
    manifest = rankmanifest.read(run.attempt(1) / rundir.MANIFEST)
    assert [r["host"] for r in manifest["ranks"]] == [h for h in hosts(run) for _ in (0, 1)]
    assert all(r["versions"]["torch"] for r in manifest["ranks"])


SLURM_FAULTS = ("never", "crash")  # what srun's launching decides; the rest is the controller's judgment alone
SLURM_ONLY = ("never",)  # the same verdict on both backends: run where srun is real


@pytest.mark.parametrize(
    ("fault", "code", "expected"),
    [
        ("never:3", ExitCode.RENDEZVOUS_FAILED, "1 of 4 ranks never arrived: rank 3 on {h1}"),
        ("crash:3", ExitCode.RENDEZVOUS_FAILED, "rank 3 on {h1} failed before registering: fault: this node's Python environment is broken"),
        ("dup:3", ExitCode.RENDEZVOUS_FAILED, "rank 2 registered 2 times"),
    ],
    ids=lambda v: v.split(":")[0] if isinstance(v, str) and ":" in v else None,
)
def test_startup_failure_names_rank_and_host(backend: str, tmp_path: Path, fault: str, code: int, expected: str) -> None:
    if backend == "slurm" and fault.split(":")[0] not in SLURM_FAULTS:
        pytest.skip("the controller's judgment of what the ranks registered is the same on every backend: run on local")
    if backend == "local" and fault.split(":")[0] in SLURM_ONLY:
        pytest.skip("a rank that never arrives is judged the same on every backend: run on the test cluster")
    info, verdict, log, events, run = run_job(backend, tmp_path, fault)
    h = hosts(run)
    text = expected.format(h1=h[1])
    assert events[-1]["exit"] == code, log
    assert verdict["code"] == code and text in verdict["message"], verdict
    assert text in log  # the batch log's last lines say it


def test_preflight_failure_names_the_nodes(backend: str, tmp_path: Path) -> None:
    if backend == "local":
        pytest.skip("the ranks' checks and the controller's judgment are the same on every backend: run on the test cluster")
    # The user's own directory passes submit's ownership rule; made immutable, no node can write in it (root
    # included), which only the ranks' `dirs` check finds out.
    frozen = tmp_path / "frozen"
    frozen.mkdir(mode=0o700)
    if subprocess.run(["chattr", "+i", str(frozen)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs CAP_LINUX_IMMUTABLE and a file system that keeps the flag")
    try:
        info, verdict, log, events, run = run_job(backend, tmp_path, None, checkpoint={"dir": str(frozen)})
    finally:
        subprocess.run(["chattr", "-i", str(frozen)], check=True)
    assert events[-1]["exit"] == ExitCode.PREFLIGHT_FAILED, log
    assert verdict["evidence"]["nodes"] == sorted(hosts(run))
    assert "dirs" in verdict["message"] and "Operation not permitted" in verdict["message"]


def test_compute_check_names_the_slow_rank(backend: str, tmp_path: Path) -> None:
    if backend == "local":
        pytest.skip("the controller judges the checks' results the same on every backend: run on the test cluster")
    info, verdict, log, events, run = run_job(backend, tmp_path, "slow:3", checks=[*CHECKS, "compute", "comm"])
    assert events[-1]["exit"] == ExitCode.STRAGGLER, log
    assert verdict["culprits"][0]["rank"] == 3 and verdict["culprits"][0]["host"] == hosts(run)[1]
    checks = json.loads((run.attempt(1) / "checks.json").read_text())
    assert checks["comm"]["world"][-1]["busbw_gbs"] > 0 and len(checks["comm"]["tp_groups"]) == 2
