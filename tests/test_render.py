"""Rendered scripts: valid shell, shellcheck-clean, golden per site, and executed.

The wrapper is run for real with the environment srun would give each task,
and what it hands the rank's process must equal the plan.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.errors import ConfigError
from clusterctl.plan.binding import binding_table, rank_env
from clusterctl.plan.job import load_job
from clusterctl.render.container import package_dir
from clusterctl.render.scripts import render_run
from clusterctl.syntax.ports import master_port

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
REPORT = ROOT / "tests" / "programs" / "report_env.py"
RUN_DIR = Path("/runs/golden")
PYTHON = "/usr/bin/python3"

# One job per shipped site, valid for it.
SITE_JOBS = {
    "dgx-h100": ["nodes=2", "parallel.tp=8"],
    "mi300x": ["nodes=2", "parallel.tp=4", "parallel.pp=2"],
    "gh200": ["nodes=4", "partition=gh200x4", "parallel.tp=4", "container.image=nvcr.io#nvidia/pytorch:25.01-py3"],
    "pcie-4gpu": ["nodes=2", "parallel.tp=2", "topology.tp_in_nvlink=false"],
    "local": ["nodes=2", "gpus_per_node=2", "parallel.tp=2"],
    "slurm-lab": ["nodes=2", "gpus_per_node=2", "parallel.tp=2", "topology.switches=1"],
}


def write_spec(tmp_path: Path, site: str, **extra: object) -> Path:
    spec = {
        "name": f"golden-{site}",
        "site": site,
        "time_limit": "2h",
        "command": ["python3", "train.py", "--config", "my config.yaml"],
        "env": {"NCCL_DEBUG": "WARN"},
        **extra,
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(spec))
    return path


def render_site(tmp_path: Path, site: str, standalone: bool = False, **extra: object):  # noqa: ANN201
    overrides = SITE_JOBS[site]
    job = load_job(write_spec(tmp_path, site, **extra), overrides)
    return job, render_run(job.plan, RUN_DIR, python=PYTHON, standalone=standalone, site_path=job.site_path)


@pytest.mark.parametrize("site", sorted(SITE_JOBS))
@pytest.mark.parametrize("standalone", [False, True], ids=["managed", "standalone"])
def test_golden(tmp_path: Path, site: str, standalone: bool) -> None:
    _, rendered = render_site(tmp_path, site, standalone)
    mode = "standalone" if standalone else "managed"
    for name in ("job.sbatch", "wrapper.sh"):
        text = rendered.files[name].replace(package_dir(), "/opt/clusterctl")  # where the checkout is varies
        golden = GOLDEN / site / mode / name
        if os.environ.get("UPDATE_GOLDEN"):
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
        assert text == golden.read_text(), f"{golden} differs (UPDATE_GOLDEN=1 to accept a deliberate change)"


@pytest.mark.parametrize("site", sorted(SITE_JOBS))
@pytest.mark.parametrize("standalone", [False, True], ids=["managed", "standalone"])
def test_golden_scripts_pass_bash_and_shellcheck(site: str, standalone: bool) -> None:
    """The golden files are what render writes (test_golden): bash parses them and shellcheck finds nothing."""
    scripts = [GOLDEN / site / ("standalone" if standalone else "managed") / n for n in ("job.sbatch", "wrapper.sh")]
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is not installed (.ci/run installs it)")
        pytest.skip("shellcheck is not installed")
    out = subprocess.run(["shellcheck", "--severity=info", *map(str, scripts)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_sbatch_is_one_gang_allocation(tmp_path: Path) -> None:
    job, rendered = render_site(tmp_path, "dgx-h100")
    sbatch = rendered.files["job.sbatch"]
    directives = re.findall(r"^#SBATCH (\S+)$", sbatch, re.M)
    assert "--nodes=2" in directives and "--ntasks-per-node=8" in directives
    assert "--gpus-per-node=8" in directives and "--exclusive" in directives
    assert "--requeue" in directives and "--open-mode=append" in directives
    assert "--signal=B:USR2@300" in directives and "--time=0-02:00:00" in directives
    assert "--cpus-per-task=28" in directives
    assert "export SRUN_CPUS_PER_TASK=$CPUS_PER_TASK" in sbatch
    assert "--no-kill" in directives  # a failed node leaves the allocation to the recovery step
    srun = sbatch[sbatch.index("\n  srun --label") :]
    for flag in ("--label", "--kill-on-bad-exit=1", "--wait=", "--distribution=block:block", "/node-%n.log"):
        assert flag in srun
    assert sbatch.count("\n  srun --label") == 1  # one launch of all ranks (per attempt)


def test_switches_constraint_exclude_container_modules(tmp_path: Path) -> None:
    extra = {
        "topology": {"switches": 1, "switch_wait": "30m", "features": ["h100", "ib"], "exclude": ["dgx-[007-008]"]},
        "modules": ["cuda/12.4", "nccl"],
        "container": {"image": "nvcr.io#nvidia/pytorch:25.01-py3", "mounts": ["/lustre:/lustre"]},
    }
    _, rendered = render_site(tmp_path, "dgx-h100", **extra)
    sbatch = rendered.files["job.sbatch"]
    assert "#SBATCH --switches=1@0-00:30:00" in sbatch
    assert "#SBATCH --constraint=h100&ib" in sbatch
    assert "#SBATCH --exclude=dgx-[007-008]" in sbatch
    assert "module load cuda/12.4" in sbatch and "module load nccl" in sbatch
    assert "--container-image=nvcr.io#nvidia/pytorch:25.01-py3" in sbatch
    assert "--container-mounts=/lustre:/lustre" in sbatch



def test_run_dir_with_spaces_is_rejected(tmp_path: Path) -> None:
    job = load_job(write_spec(tmp_path, "local"), SITE_JOBS["local"])
    with pytest.raises(ConfigError, match="runs_root"):
        render_run(job.plan, Path("/runs/my runs/x"), python=PYTHON)


def test_run_json_stays_small_at_102400_ranks(tmp_path: Path) -> None:
    from clusterctl.config.site import Partition, load_site
    from clusterctl.config.spec import load_spec
    from clusterctl.plan import make_plan

    spec = load_spec(write_spec(tmp_path, "dgx-h100", parallel={"tp": 8, "pp": 16, "dp": 800}))
    site, _ = load_site("dgx-h100")
    site = site.model_copy(
        update={"partitions": {"batch": Partition(node_type="dgx-h100", nodes="dgx-[00001-12800]", default=True)}}
    )
    plan = make_plan(spec, site)
    assert plan.world_size == 102400
    rendered = render_run(plan, RUN_DIR, python=PYTHON)
    assert len(rendered.files["run.json"]) < 8000
    assert len(rendered.files["wrapper.sh"]) < 8000


def fake_binders(where: Path) -> str:
    """taskset/numactl stand-ins that record their arguments, for rail maps this machine lacks."""
    where.mkdir(exist_ok=True)
    (where / "taskset").write_text('#!/bin/bash\nexport CLUSTERCTL_TEST_BIND="taskset $*"\nshift 2\nexec "$@"\n')
    (where / "taskset").chmod(0o755)
    return f"{where}:{os.environ['PATH']}"


def run_wrapper(
    wrapper: Path, rank: int, gpn: int, world: int, nodes: list[str], extra_env: dict[str, str], path: str | None = None
) -> dict:
    env = {
        "PATH": path or os.environ["PATH"],
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % gpn),
        "SLURM_NODEID": str(rank // gpn),
        "SLURM_NTASKS": str(world),
        "SLURMD_NODENAME": nodes[rank // gpn],
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "23456",
        **extra_env,
    }
    out = subprocess.run(["bash", str(wrapper)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads((Path(extra_env["CLUSTERCTL_ATTEMPT_DIR"]) / f"report-{rank}.json").read_text())


@pytest.mark.parametrize("site", ["dgx-h100", "local", "mi300x"])
def test_wrapper_gives_each_rank_the_plan(tmp_path: Path, site: str) -> None:
    """Run the wrapper as srun would for every rank; compare with the plan's binding."""
    hostile = "it's $(touch pwned) `touch pwned2` \"q\" \n new line"
    job = load_job(
        write_spec(tmp_path, site, command=["python3", str(REPORT), "arg with space", "$HOME", hostile],
                   env={"USER_VALUE": hostile, "NCCL_DEBUG": "INFO"}),
        SITE_JOBS[site],
    )
    rendered = render_run(job.plan, tmp_path / "run", python=sys.executable, standalone=True)
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(rendered.files["wrapper.sh"])
    plan = job.plan
    table = binding_table(plan.node_type)
    nodes = [f"node{i}" for i in range(plan.nodes)]
    attempt_dir = tmp_path / "attempt"
    attempt_dir.mkdir()
    path = fake_binders(tmp_path / "bin")
    for rank in range(plan.world_size):
        got = run_wrapper(
            wrapper, rank, plan.gpus_per_node, plan.world_size, nodes, {"CLUSTERCTL_ATTEMPT_DIR": str(attempt_dir)}, path
        )
        expected = rank_env(plan.dims.layout, plan.gpus_per_node, table, plan.node_type.gpu_vendor, rank)
        for key, value in expected.items():
            assert got.get(key) == value, (rank, key)
        assert got["argv"] == ["arg with space", "$HOME", hostile]
        assert got["MASTER_ADDR"] == "10.1.2.3"
        assert got["USER_VALUE"] == hostile
        cpus = expected["CLUSTERCTL_CPUS"]
        assert got["CLUSTERCTL_TEST_BIND"] == f"taskset -c {cpus} python3 {REPORT} arg with space $HOME {hostile}"
    assert not (tmp_path / "pwned").exists() and not (Path.cwd() / "pwned").exists()
    assert not (Path.cwd() / "pwned2").exists()


# The shipped dgx-h100 rail map, written out: GPU i's own NIC (the storage ports mlx5_1/2/7/8 are on no rail).
DGX_H100_NICS = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]


@pytest.mark.parametrize(
    ("gpn", "physical"),
    [(8, [0, 1, 2, 3, 4, 5, 6, 7]), (4, [4, 5, 6, 7]), (2, [1, 6])],
    ids=["whole-node", "upper-half", "two-gpus"],
)
def test_wrapper_gives_each_rank_its_own_rail(tmp_path: Path, gpn: int, physical: list[int]) -> None:
    """A multi-rail site: each rank gets the HCA of the GPU Slurm gave its task, exactly (`=mlx5_N:1`).

    As on a real cluster with cgroup-constrained devices: every task sees its
    node's GPUs renumbered from 0 (CUDA_VISIBLE_DEVICES) and SLURM_STEP_GPUS
    names the physical ones, which key the rail map.
    """
    overrides = ["nodes=2", f"gpus_per_node={gpn}", f"parallel.tp={gpn}"]
    job = load_job(write_spec(tmp_path, "dgx-h100", command=["python3", str(REPORT)]), overrides)
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(render_run(job.plan, tmp_path / "run", python=sys.executable, standalone=True).files["wrapper.sh"])
    attempt_dir = tmp_path / "attempt"
    attempt_dir.mkdir()
    path = fake_binders(tmp_path / "bin")
    slurm = {
        "CLUSTERCTL_ATTEMPT_DIR": str(attempt_dir),
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpn)),
        "SLURM_STEP_GPUS": ",".join(str(g) for g in physical),
        "NCCL_IB_HCA": "=mlx5_1:1",  # inherited from the login node: replaced
    }
    hcas = {}
    for rank in range(2 * gpn):
        got = run_wrapper(wrapper, rank, gpn, 2 * gpn, ["dgx-001", "dgx-002"], slurm, path)
        gpu = physical[rank % gpn]
        nic = DGX_H100_NICS[gpu]
        assert got["CUDA_VISIBLE_DEVICES"] == str(rank % gpn)
        assert got["CLUSTERCTL_GPU"] == str(gpu)
        assert got["NCCL_IB_HCA"] == f"={nic}:1", rank
        assert got["UCX_NET_DEVICES"] == f"{nic}:1"
        assert got["CLUSTERCTL_NIC"] == nic
        hcas.setdefault(rank // gpn, []).append(got["NCCL_IB_HCA"])
    for node in hcas.values():
        assert node == [f"={DGX_H100_NICS[g]}:1" for g in physical]  # one rail per rank, none shared


def test_wrapper_binds_cpus_on_this_machine(tmp_path: Path) -> None:
    job = load_job(write_spec(tmp_path, "local", command=["python3", str(REPORT)]), SITE_JOBS["local"])
    rendered = render_run(job.plan, tmp_path / "run", python=sys.executable, standalone=True)
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(rendered.files["wrapper.sh"])
    attempt_dir = tmp_path / "attempt"
    attempt_dir.mkdir()
    for rank in range(job.plan.world_size):
        got = run_wrapper(wrapper, rank, 2, 4, ["node1", "node2"], {"CLUSTERCTL_ATTEMPT_DIR": str(attempt_dir)})
        if got["CLUSTERCTL_BIND"] != "none":
            assert got["affinity"] == [int(got["CLUSTERCTL_CPUS"])]


def test_wrapper_rejects_a_task_count_that_is_not_the_plan(tmp_path: Path) -> None:
    job = load_job(write_spec(tmp_path, "local", command=["true"]), SITE_JOBS["local"])
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(render_run(job.plan, tmp_path / "run", python=PYTHON, standalone=True).files["wrapper.sh"])
    env = {"PATH": os.environ["PATH"], "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "3"}
    out = subprocess.run(["bash", str(wrapper)], env=env, capture_output=True, text=True)
    assert out.returncode == 80
    assert "srun started 3 tasks, the attempt has 4 (2 nodes)" in out.stderr
    env.update(SLURM_NTASKS="4", SLURM_PROCID="2", SLURM_LOCALID="0", SLURM_NODEID="0")
    out = subprocess.run(["bash", str(wrapper)], env=env, capture_output=True, text=True)
    assert out.returncode == 80 and "rank 2 landed on node slot 0" in out.stderr


def test_bash_port_hash_equals_python(tmp_path: Path) -> None:
    _, rendered = render_site(tmp_path, "local")
    sbatch = rendered.files["job.sbatch"]
    func = sbatch[sbatch.index("port_for() {") : sbatch.index("\n}\n", sbatch.index("port_for() {")) + 3]
    cases = [("1", 1), ("12345", 1), ("12345", 2), ("987654321", 7), ("4242_3", 1)]
    script = "PORT_LO=20000; PORT_HI=29999\n" + func + "".join(f"port_for {j} {a}\n" for j, a in cases)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert [int(x) for x in out.stdout.split()] == [master_port(j, a, (20000, 29999)) for j, a in cases]
    assert len({master_port(str(j), 1, (20000, 29999)) for j in range(1000, 1100)}) > 95
