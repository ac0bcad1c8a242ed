"""`clusterctl submit` on the real Slurm test cluster (tests/slurmlab).

A 2-node x 2-task job whose ranks report their environment and affinity;
each must equal the plan. Plus --switches placement and the error paths:
no sbatch, Slurm refusing the job, an unreachable controller.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers import dead_slurm_conf

from clusterctl.actions.submit import submit_job
from clusterctl.backends.slurm.backend import SlurmBackend
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.binding import binding_table, rank_env
from clusterctl.plan.job import load_job
from clusterctl.rundir import RunDir, history

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "tests" / "programs" / "report_env.py"


def lab_spec(tmp_path: Path, **extra: object) -> Path:
    spec = {
        "name": "lab-env",
        "site": "slurm-lab",
        "time_limit": "5m",
        "nodes": 2,
        "gpus_per_node": 2,
        "parallel": {"tp": 2},
        "signal": {"lead_s": 60},
        "runs_root": str(tmp_path / "runs"),
        "command": ["python3", str(REPORT), "arg with space"],
        **extra,
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture
def lab_env(slurm_lab, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001, ANN201
    monkeypatch.setenv("SLURM_CONF", slurm_lab.conf)
    return slurm_lab


def wait_done(job_id: str, timeout: float = 60) -> object:
    backend = SlurmBackend()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = backend.info(job_id)
        if info is not None and info.finished:
            return info
        time.sleep(0.3)
    backend.cancel(job_id)
    raise AssertionError(f"job {job_id} did not finish within {timeout} s")


def reports(run: RunDir, attempt: int = 1) -> dict[int, dict]:
    return {
        int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in run.attempt(attempt).glob("report-*.json")
    }


def test_each_rank_gets_what_the_plan_says(lab_env, tmp_path: Path) -> None:  # noqa: ANN001
    job = load_job(lab_spec(tmp_path))
    done = submit_job(job, "slurm")
    info = wait_done(done.job_id)
    run = done.run
    assert info.state == "COMPLETED", (info, (run.path / f"slurm-{done.job_id}.out").read_text())
    attempt = json.loads((run.attempt(1) / "attempt.json").read_text())
    got = reports(run)
    assert sorted(got) == [0, 1, 2, 3]
    plan = job.plan
    table = binding_table(plan.node_type)
    for rank, report in got.items():
        # Slurm's --gpus-per-node=2 shows each task GPUs 0,1; the rank takes entry LOCAL_RANK.
        expected = rank_env(plan.dims.layout, 2, table, "emulated", rank, visible=[0, 1], physical=[0, 1])
        for key, value in expected.items():
            assert report.get(key) == value, (rank, key, report)
        assert report["SLURMD_NODENAME"] == attempt["hosts"][rank // 2]
        assert report["MASTER_ADDR"] == "127.0.0.1" == attempt["master_addr"]
        assert report["MASTER_PORT"] == str(attempt["master_port"])
        assert report["NCCL_IB_HCA"] is None  # the lab's one NIC is lo: no HCA for NCCL
        assert report["CLUSTERCTL_NIC"] == "lo" and report["UCX_NET_DEVICES"] == "lo"
        assert report["affinity"] == [int(expected["CLUSTERCTL_CPUS"])]
        assert report["argv"] == ["arg with space"]
    assert len(set(attempt["hosts"])) == 2
    # Per-node logs, every line labelled with its rank.
    logs = sorted((run.attempt(1) / "logs").glob("node-*.log"))
    assert [p.name for p in logs] == ["node-0.log", "node-1.log"]  # by node slot; attempt.json maps slot -> host
    aggregators = sorted(p.name for p in (run.attempt(1) / "logs").glob("aggregator-*.log"))
    assert aggregators == ["aggregator-0.log", "aggregator-1.log"]  # one heartbeat aggregator per node
    for slot, log in enumerate(logs):
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        ranks = {int(line.split(":", 1)[0]) for line in lines}
        assert ranks == {2 * slot, 2 * slot + 1}, lines  # srun --label: "<rank>: text"
        for line in lines:
            rank = int(line.split(":", 1)[0])
            assert line.endswith(f"rank {rank} reporting from {attempt['hosts'][slot]}")
    events = [json.loads(line) for line in (run.path / "attempts.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "end", "next"] and events[1]["exit"] == 0
    assert events[-1]["how"] == "stop" and events[-1]["reason"] == "every rank finished"
    assert run.read_state()["state"] == "submitted" and run.read_state()["job_id"] == done.job_id


def test_switches_keeps_the_job_under_one_leaf(lab_env, tmp_path: Path) -> None:  # noqa: ANN001
    job = load_job(lab_spec(tmp_path, topology={"switches": 1, "switch_wait": "1m"}, command=["true"]))
    done = submit_job(job, "slurm")
    info = wait_done(done.job_id)
    assert info.state == "COMPLETED"
    assert info.nodes in ("n[1-2]", "n[3-4]")


def test_failing_rank_ends_the_job_with_the_script_code(lab_env, tmp_path: Path) -> None:  # noqa: ANN001
    script = tmp_path / "fail_rank1.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(120)\n")
    job = load_job(lab_spec(tmp_path, command=["python3", str(script)]))
    done = submit_job(job, "slurm")
    started = time.monotonic()
    info = wait_done(done.job_id, timeout=90)
    assert time.monotonic() - started < 80  # --kill-on-bad-exit, not the 120 s sleeps
    # One rank's exit is ambiguous: a restart in place with every node; the same exit on the same rank again is the
    # script's (88), and no node becomes a suspect.
    assert info.state == "FAILED" and info.exit_code == ExitCode.SCRIPT_ERROR
    events = history.read_events(done.run.events_file)
    assert [e["exit"] for e in events if e["event"] == "end"] == [ExitCode.SCRIPT_FAILED, ExitCode.SCRIPT_ERROR]
    nexts = [e for e in events if e["event"] == "next"]
    assert [e["how"] for e in nexts] == ["allocation", "stop"] and "same failure on rank 1" in nexts[-1]["reason"]
    assert not any(e.get("exclude") for e in nexts)


def test_no_sbatch_is_exit_69_and_writes_nothing(lab_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("PATH", "/nonexistent")
    job = load_job(lab_spec(tmp_path))
    with pytest.raises(ClusterctlError) as err:
        submit_job(job, "slurm")
    assert err.value.exit_code == ExitCode.BACKEND_UNAVAILABLE and "sbatch is not on PATH" in err.value.message
    assert not (tmp_path / "runs").exists()


def test_slurm_refusal_names_slurms_reason_and_leaves_no_run(lab_env, tmp_path: Path) -> None:  # noqa: ANN001
    site = (ROOT / "site-configs" / "slurm-lab.yaml").read_text().replace("  gpu:\n", "  nosuchpart:\n")
    (tmp_path / "site.yaml").write_text(site)
    job = load_job(lab_spec(tmp_path, site=str(tmp_path / "site.yaml")))
    with pytest.raises(ClusterctlError) as err:
        submit_job(job, "slurm")
    assert err.value.exit_code == ExitCode.BAD_CONFIG
    assert "Slurm rejected the job" in err.value.message and "partition" in err.value.message.lower()
    assert not list((tmp_path / "runs").iterdir())  # no job: no run to look at, nothing half-made


def test_unreachable_controller_is_exit_69(lab_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("SLURM_CONF", str(dead_slurm_conf(lab_env.conf, tmp_path / "slurm.conf")))
    job = load_job(lab_spec(tmp_path))
    with pytest.raises(ClusterctlError) as err:
        submit_job(job, "slurm")
    assert err.value.exit_code == ExitCode.BACKEND_UNAVAILABLE
    assert err.value.message.startswith("cannot reach slurmctld, nothing was submitted")  # told apart from a refusal
    assert not list((tmp_path / "runs").iterdir())


def test_a_job_slurm_will_never_start_is_flagged(lab_env, tmp_path: Path) -> None:  # noqa: ANN001
    """More nodes than the partition has: sbatch accepts it and it pends forever (PartitionConfig on 22.05)."""
    site = (ROOT / "site-configs" / "slurm-lab.yaml").read_text().replace("nodes: n[1-4]", "nodes: n[1-8]")
    (tmp_path / "site.yaml").write_text(site)
    job = load_job(lab_spec(tmp_path, site=str(tmp_path / "site.yaml"), nodes=6, command=["true"]))
    done = submit_job(job, "slurm")
    try:
        (warning,) = done.warnings
        assert "pending with reason Partition" in warning and "will not start it" in warning
    finally:
        SlurmBackend().cancel(done.job_id)


SAME_KEYS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
    "MASTER_ADDR", "CLUSTERCTL_GPU", "CLUSTERCTL_CPUS", "CLUSTERCTL_NUMA", "CLUSTERCTL_NODE_SLOT",
    "CLUSTERCTL_TP_RANK", "CLUSTERCTL_DP_RANK", "CLUSTERCTL_PP_RANK", "CLUSTERCTL_CP_RANK", "CLUSTERCTL_EP_RANK",
    "CLUSTERCTL_BIND", "affinity", "argv",
)


def test_local_backend_gives_the_same_rank_env(lab_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The same 2 x 2 job on the real cluster and on the local backend: the ranks see the same world."""
    from clusterctl.backends.local.backend import LocalBackend

    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    seen, submitted = {}, {}
    for backend, site in (("slurm", "slurm-lab"), ("local", "local")):  # both at once: they run side by side
        work = tmp_path / backend
        work.mkdir()
        submitted[backend] = submit_job(load_job(lab_spec(work, site=site)), backend)
    for backend, done in submitted.items():
        be = SlurmBackend() if backend == "slurm" else LocalBackend()
        deadline = time.monotonic() + 90
        while not ((info := be.info(done.job_id)) and info.finished):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert info.state == "COMPLETED", (backend, info)
        seen[backend] = reports(done.run)
    assert sorted(seen["slurm"]) == sorted(seen["local"]) == [0, 1, 2, 3]
    for rank in range(4):
        slurm = {k: seen["slurm"][rank].get(k) for k in SAME_KEYS}
        local = {k: seen["local"][rank].get(k) for k in SAME_KEYS}
        assert slurm == local, rank


def test_standalone_scripts_run_with_plain_sbatch(lab_env, tmp_path: Path) -> None:  # noqa: ANN001
    """What an admin does: render --standalone, then sbatch the script; no clusterctl on the nodes."""
    from clusterctl.render.runfiles import write_rendered

    out = tmp_path / "templates"
    job = load_job(lab_spec(tmp_path))
    write_rendered(job, out, standalone=True)
    assert "clusterctl" not in (out / "wrapper.sh").read_text().split("cmd=(", 1)[1].split(")", 1)[0]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"  # no virtualenv: the clusterctl package is not importable
    proc = subprocess.run(["sbatch", "--parsable", str(out / "job.sbatch")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    info = wait_done(proc.stdout.strip().split(";")[0])
    assert info.state == "COMPLETED", (out / f"slurm-{info.job_id}.out").read_text()
    got = reports(RunDir(out))
    assert sorted(got) == [0, 1, 2, 3]
    assert {r["MASTER_ADDR"] for r in got.values()} == {"127.0.0.1"}
    assert [got[r]["CLUSTERCTL_TP_RANK"] for r in range(4)] == ["0", "1", "0", "1"]
