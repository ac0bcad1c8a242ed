"""One spec section runs the ranks under pyxis or Apptainer: rendered scripts for each runtime (shellcheck-clean,
every value quoted), the refusals, and a real job on the local backend inside a container made here (bubblewrap
standing in for Apptainer), whose image sets wrong GPU, NCCL and rendezvous values: the ranks must not see them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, cli, expect_cli_config_error

from clusterctl.config.site import Site, load_site
from clusterctl.config.spec import JobSpec
from clusterctl.errors import ConfigError
from clusterctl.plan import make_plan
from clusterctl.render.scripts import Rendered, render_run

STANDIN = REPO / "tests" / "programs" / "apptainer_standin.py"
IMAGE_ENV = """export CUDA_VISIBLE_DEVICES=7
export NCCL_SOCKET_IFNAME=eth9
export NCCL_IB_HCA=mlx5_9
export MASTER_ADDR=10.9.9.9
export IMAGE_MARK=inside
export PYTHONPATH=/nonexistent
"""


def dgx(**container: Any) -> Site:
    site, _ = load_site("dgx-h100")
    data = site.model_dump(mode="json")
    data["container"] = {**data["container"], **container}
    return Site.model_validate(data)


def job(**container: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "c", "site": "dgx-h100", "time_limit": "1h", "nodes": 2, "parallel": {"tp": 8},
                                   "command": ["python", "train.py"], "container": container})


def rendered(spec: JobSpec, site: Site, tmp_path: Path) -> Rendered:
    return render_run(make_plan(spec, site), tmp_path / "run", python="/usr/bin/python3", run_id="c-1")


def shellcheck(out: Rendered, tmp_path: Path) -> None:
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is not installed (CI is set): make sysdeps installs it", pytrace=False)
        return
    for name in ("job.sbatch", "wrapper.sh"):
        (tmp_path / name).write_text(out.files[name])
    done = subprocess.run(["shellcheck", "-S", "warning", str(tmp_path / "job.sbatch"), str(tmp_path / "wrapper.sh")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_pyxis_enters_the_image_in_srun_with_the_run_bound_and_the_tasks_own_variables(tmp_path: Path) -> None:
    out = rendered(job(image="nvcr.io#nvidia/pytorch:25.01-py3", mounts=["/lustre:/lustre"], writable=False), dgx(), tmp_path)
    sbatch = out.files["job.sbatch"]
    assert "'--container-image=nvcr.io#nvidia/pytorch:25.01-py3'" in sbatch
    assert "--container-name=clusterctl-c-1" in sbatch  # one named container, reused by every attempt of the job
    assert "--container-env=SLURM_PROCID," in sbatch and ",CUDA_VISIBLE_DEVICES" in sbatch
    assert "--container-readonly" in sbatch
    mounts = next(line for line in sbatch.splitlines() if "--container-mounts=" in line)
    assert f"/lustre:/lustre,{tmp_path}/run," in mounts and '",$PWD,${TMPDIR:-/tmp}"' in mounts
    assert "'--container-workdir=" not in sbatch and '--container-workdir="$PWD"' in sbatch
    wrapper = out.files["wrapper.sh"]
    assert f"source '{tmp_path}/run/.rank.env'" in wrapper and "apptainer" not in wrapper
    assert out.run_json.argv[0] == "python3"  # the image's interpreter, not the login node's
    assert out.run_json.container == "pyxis"
    shellcheck(out, tmp_path)


def test_the_same_spec_runs_under_apptainer_by_changing_one_field(tmp_path: Path) -> None:
    out = rendered(job(image="/images/pytorch.sif", runtime="apptainer", env={"HF_HOME": "/scratch/$USER hf"}), dgx(), tmp_path)
    assert "--container-image" not in out.files["job.sbatch"]
    wrapper = out.files["wrapper.sh"]
    assert "exec 'apptainer' 'exec' '--nv' '--bind' " in wrapper and "'/images/pytorch.sif' bash \"$0\"" in wrapper
    assert "export HF_HOME='/scratch/$USER hf'" in wrapper  # container.env quoted like every value
    assert 'eval "${CLUSTERCTL_TASK_ENV:-}"' in wrapper
    assert "MASTER_ADDR" in out.files["job.sbatch"].split("--- the rank environment")[1].split("\n")[2]
    shellcheck(out, tmp_path)


def test_refusals_name_the_field_and_what_is_allowed(tmp_path: Path) -> None:
    site, _ = load_site("pcie-4gpu")  # offers no runtime
    spec = JobSpec.model_validate({"name": "c", "site": "pcie-4gpu", "time_limit": "1h", "nodes": 1, "command": ["x"],
                                   "container": {"image": "img.sif"}})
    with pytest.raises(ConfigError, match=r"container.image.*offers no container runtime.*expected container.runtime"):
        rendered(spec, site, tmp_path)
    with pytest.raises(ConfigError, match=r"container.image.*expected an image for container.runtime apptainer"):
        rendered(job(runtime="apptainer"), dgx(), tmp_path)
    with pytest.raises(ValueError, match="container.runtime"):
        job(image="x", runtime="docker")
    assert Site.model_validate({**dgx().model_dump(mode="json"), "container": {"plugin": "pyxis"}}).container.runtime == "pyxis"


def test_submit_refuses_an_image_file_that_is_not_there(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "c", "site": "dgx-h100", "time_limit": "1h", "nodes": 2, "parallel": {"tp": 8},
                                    "command": ["python", "t.py"], "container": {"image": "./missing.sqsh"}}))
    err = expect_cli_config_error(["submit", spec, "--dry-run"], tmp_path, "container.image", "./missing.sqsh",
                                  "does not exist")
    assert "registry reference" in err


@pytest.fixture
def container_site(tmp_path: Path) -> Path:
    if shutil.which("bwrap") is None:
        if os.environ.get("CI"):
            pytest.fail("bubblewrap is not installed (CI is set): make sysdeps installs it", pytrace=False)
        pytest.skip("bubblewrap (bwrap) is not installed: make sysdeps installs Debian's")
    tried = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"],
                           capture_output=True, text=True)
    if tried.returncode != 0:  # a machine that cannot make mount namespaces cannot host a container at all
        pytest.skip(f"bwrap cannot make a container here: {tried.stderr.strip()}")
    image = tmp_path / "work" / "image"
    (image / ".singularity.d" / "env").mkdir(parents=True)
    (image / ".singularity.d" / "env" / "90-environment.sh").write_text(IMAGE_ENV)
    site = yaml.safe_load((REPO / "site-configs" / "local.yaml").read_text())
    site["container"] = {"runtime": "apptainer", "apptainer": str(STANDIN), "python": sys.executable}
    site.setdefault("env", {})["NCCL_SOCKET_IFNAME"] = "lo"
    (tmp_path / "work" / "site.yaml").write_text(yaml.safe_dump(site))
    return tmp_path / "work"


HOSTILE = "it's $(touch pwned) `touch pwned2` \"q\""
PROBE = """
import json, os
keys = ["RANK", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "MASTER_ADDR", "IMAGE_MARK", "ONLY_INSIDE",
        "HOSTILE"]
try:
    open("/var/clusterctl-container-probe", "w").close()
    read_only = False
except OSError:
    read_only = True
print("probe " + json.dumps({**{k: os.environ.get(k) for k in keys}, "read_only_root": read_only}))
"""


def test_a_job_runs_inside_the_image_and_the_wrapper_sets_its_environment_there(container_site: Path) -> None:
    spec = {"name": "ct", "site": str(container_site / "site.yaml"), "time_limit": "10m", "nodes": 1, "gpus_per_node": 2,
            "container": {"image": "./image", "env": {"ONLY_INSIDE": "yes", "HOSTILE": HOSTILE}},
            "command": ["python3", "-c", PROBE]}
    (container_site / "ct.yaml").write_text(yaml.safe_dump(spec))
    try:
        result = cli("submit", "ct.yaml", "--wait", "-b", "local", cwd=container_site)
        assert result.exit_code == 0, result.output
        assert "completed" in result.stdout
        logs = cli("logs", "local-1", "--runs-root", container_site / "runs", "--grep", "probe", cwd=container_site)
        probes = {int(p["RANK"]): p for p in (json.loads(line.split("probe ", 1)[1]) for line in logs.stdout.splitlines())}
    finally:
        Path("/var/clusterctl-container-probe").unlink(missing_ok=True)
    assert sorted(probes) == [0, 1]
    for rank, seen in probes.items():
        assert seen["CUDA_VISIBLE_DEVICES"] == str(rank % 2)  # the task's GPU, not the image's 7
        assert seen["NCCL_SOCKET_IFNAME"] == "lo" and seen["MASTER_ADDR"] == "127.0.0.1"  # the site's, the attempt's
        assert seen["NCCL_IB_HCA"] is None  # the image's mlx5_9 is not a NIC of the rail map: the wrapper clears it
        assert seen["IMAGE_MARK"] == "inside" and seen["ONLY_INSIDE"] == "yes" and seen["read_only_root"]
        assert seen["HOSTILE"] == HOSTILE  # quoted on the way: never run
    assert not (container_site / "pwned").exists() and not (container_site / "pwned2").exists()
    record = cli("record", "local-1", "--runs-root", container_site / "runs", "--json", cwd=container_site)
    container = json.loads(record.stdout)["environment"]["container"]
    assert container["runtime"] == "apptainer" and container["rank0_env"]["IMAGE_MARK"] == "inside"
    assert container["rank0_env"]["CLUSTERCTL_TOKEN"] == "(secret)"


def test_an_image_the_runtime_cannot_open_is_named_at_the_rendezvous(container_site: Path) -> None:
    spec = {"name": "ct", "site": str(container_site / "site.yaml"), "time_limit": "10m", "nodes": 1, "gpus_per_node": 2,
            "restart": {"budget": 0}, "container": {"image": "docker://example.invalid/nope:1"}, "command": ["true"]}
    (container_site / "ct.yaml").write_text(yaml.safe_dump(spec))
    result = cli("submit", "ct.yaml", "--wait", "-b", "local", cwd=container_site)
    assert result.exit_code != 0
    assert "could not open image docker://example.invalid/nope:1" in result.output and "failed before registering" in result.output
