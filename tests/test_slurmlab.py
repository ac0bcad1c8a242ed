"""The Slurm test cluster itself: multi-node launch, fake GPUs, topology and
signals to the batch shell behave like on a real site."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_slurm_submit import lab_spec

from clusterctl import rundir
from clusterctl.actions.submit import submit_job
from clusterctl.config.spec import DEFAULT_PREFLIGHT
from clusterctl.plan.job import load_job
from clusterctl.rundir import rankmanifest
from tests.slurmlab.plugin import SlurmLab, wait_job

pytestmark = pytest.mark.slurm

LEAVES = ({"n1", "n2"}, {"n3", "n4"})


def hostnames(lab: SlurmLab, nodelist: str) -> set[str]:
    out = lab.run(["scontrol", "show", "hostnames", nodelist]).stdout
    return set(out.split())


def write_script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_multinode_tasks_see_rank_node_and_gpus(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "job.sh",
        """#!/bin/bash
#SBATCH --job-name=lab-ranks
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
#SBATCH --time=2
srun bash -c 'echo "task rank=$SLURM_PROCID node=$SLURM_NODEID host=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES"'
""",
    )
    out = tmp_path / "job.out"
    job = slurm_lab.sbatch(f"--chdir={tmp_path}", f"--output={out}", str(script))
    result = wait_job(slurm_lab, job, timeout=30)
    text = out.read_text() if out.exists() else "(no output file)"
    assert (result.state, result.exit_code) == ("COMPLETED", 0), text

    tasks = []
    for line in text.splitlines():
        if line.startswith("task "):
            tasks.append(dict(kv.split("=", 1) for kv in line.split()[1:]))
    assert len(tasks) == 4, text
    assert sorted(int(t["rank"]) for t in tasks) == [0, 1, 2, 3]

    by_host: dict[str, list[dict[str, str]]] = {}
    for t in tasks:
        by_host.setdefault(t["host"], []).append(t)
    assert len(by_host) == 2, text
    assert all(len(ts) == 2 for ts in by_host.values()), text
    assert by_host.keys() <= {"n1", "n2", "n3", "n4"}
    # SLURM_NODEID is 0/1 and the same for both tasks of a node.
    assert sorted({t["node"] for ts in by_host.values() for t in ts}) == ["0", "1"]
    assert all(len({t["node"] for t in ts}) == 1 for ts in by_host.values())
    # Each task sees the node's two allocated fake GPUs.
    for t in tasks:
        assert len(t["gpus"].split(",")) == 2, text


def test_switches_keeps_job_on_one_leaf(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    # Hold n2, so that a topology-blind choice of two free nodes could span
    # both leaves (n1 + n3); --switches=1 must pick n3 and n4.
    blocker = slurm_lab.sbatch(
        "--exclusive", "-w", "n2", f"--chdir={tmp_path}", "--output=/dev/null",
        "--wrap", "sleep 60",
    )
    try:
        deadline = time.monotonic() + 15
        while slurm_lab.show_job(blocker).get("JobState") != "RUNNING":
            assert time.monotonic() < deadline, slurm_lab.show_job(blocker)
            time.sleep(0.2)

        job = slurm_lab.sbatch(
            "--nodes=2", "--switches=1", f"--chdir={tmp_path}",
            f"--output={tmp_path / 'sw.out'}", "--wrap", "srun hostname",
        )
        result = wait_job(slurm_lab, job, timeout=30)
        assert (result.state, result.exit_code) == ("COMPLETED", 0), result
        nodes = hostnames(slurm_lab, result.nodes or slurm_lab.show_job(job)["NodeList"])
        assert len(nodes) == 2
        assert any(nodes <= leaf for leaf in LEAVES), nodes
        assert nodes == {"n3", "n4"}
    finally:
        slurm_lab.run(["scancel", str(blocker)], check=False)


def test_scancel_batch_signal_reaches_trap(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    marker = tmp_path / "got-usr2"
    script = write_script(
        tmp_path / "trap.sh",
        f"""#!/bin/bash
#SBATCH --nodes=1
#SBATCH --time=2
on_usr2() {{
    echo "USR2 in batch shell" > {marker}
    kill "$child" 2>/dev/null
    exit 0
}}
trap on_usr2 USR2
sleep 120 &
child=$!
touch {ready}
# A trap only runs while bash waits, not while a foreground command runs.
wait "$child"
exit 7
""",
    )
    job = slurm_lab.sbatch(f"--chdir={tmp_path}", f"--output={tmp_path / 'trap.out'}", str(script))

    deadline = time.monotonic() + 15
    while not ready.exists():
        info = slurm_lab.show_job(job)
        assert info.get("JobState") in ("PENDING", "CONFIGURING", "RUNNING"), info
        assert time.monotonic() < deadline, info
        time.sleep(0.1)

    slurm_lab.run(["scancel", "--signal=USR2", "--batch", str(job)])
    result = wait_job(slurm_lab, job, timeout=20)
    assert marker.exists(), (tmp_path / "trap.out").read_text()
    assert marker.read_text().strip() == "USR2 in batch shell"
    assert (result.state, result.exit_code) == ("COMPLETED", 0), result


def test_default_preflight_passes_the_nic_check_on_the_lab(
    slurm_lab: SlurmLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slurm-lab site describes the NIC the lab's nodes really have, so a job with the default checks runs."""
    monkeypatch.setenv("SLURM_CONF", slurm_lab.conf)
    path = lab_spec(tmp_path, name="lab-nic", command=["true"])  # no preflight: the defaults
    job = load_job(path)
    assert job.spec.preflight.checks == list(DEFAULT_PREFLIGHT) and "nic" in DEFAULT_PREFLIGHT
    done = submit_job(job, "slurm")
    result = wait_job(slurm_lab, done.job_id, timeout=90)
    log = (done.run.path / f"slurm-{done.job_id}.out").read_text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), log
    manifest = rankmanifest.read(done.run.attempt(1) / rundir.MANIFEST)
    assert len(manifest["ranks"]) == 4
    for rank in manifest["ranks"]:
        checks = {c["name"]: c for c in rank["preflight"]}
        assert set(checks) == set(DEFAULT_PREFLIGHT), checks
        nic = checks["nic"]
        assert (nic["ok"], nic["skipped"]) == (True, False), nic
        assert nic["detail"].startswith(f"NICs on {rank['host']}: lo "), nic
        assert [n["name"] for n in nic["data"]["nics"]] == ["lo"]


def test_the_jobs_sigterm_lets_a_steps_tasks_save_within_killwait(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    """What the local backend's srun copies (test_local_shims' twin): scancel's TERM reaches srun, which says it forces
    termination, and the step's tasks still finish a 1.5 s save before KillWait (2 s) is over."""
    from test_local_shims import SAVES_ON_TERM

    script = write_script(tmp_path / "save.sh", f"#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --time=2\n{SAVES_ON_TERM}")
    out = tmp_path / "save.out"
    job = slurm_lab.sbatch(f"--chdir={tmp_path}", f"--output={out}", str(script))
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"ready-{i}").exists() for i in (0, 1)):
        assert time.monotonic() < deadline, slurm_lab.show_job(job)
        time.sleep(0.1)
    slurm_lab.run(["scancel", str(job)])
    result = wait_job(slurm_lab, job, timeout=20)
    assert result.state == "CANCELLED", result
    text = out.read_text()
    assert [(tmp_path / f"saved-{i}").exists() for i in (0, 1)] == [True, True], text
    assert "forcing job termination" in text and (tmp_path / "batch.txt").read_text() == "batch got TERM\n"
