"""The run record: assembled from hand-written run files (fast), and from one real run and its requeue (torch)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import cli
from typer.testing import CliRunner

from clusterctl import rundir
from clusterctl.cli import app
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, attemptjson, history
from clusterctl.runtime.rank.rankinfo import recorded_env
from clusterctl.views import record as runrecord

GROUPS = ("training", "data", "recovery", "environment")
TREE = {"name": "lab", "topology": {"kind": "tree", "switches": [
    {"name": "leaf1", "nodes": "n[1-2]"}, {"name": "leaf2", "nodes": "n[3-4]"}, {"name": "spine", "switches": "leaf[1-2]"}]}}


# --- assembly from hand-written files ---------------------------------------------------------
def write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def hand_run(tmp_path: Path, site: dict[str, Any] | None = None) -> RunDir:
    run = RunDir(tmp_path / "r-1")
    write(run.run_json, {"name": "r", "site": "lab", "spec_hash": "abc", "world_size": 4, "rank_order": "tp-cp-ep-dp-pp",
                         "parallel": {"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 1, "vpp": 1},
                         "batch": {"micro": 1, "grad_accum": 2, "global": 4}, "seq_len": 128,
                         "model": {"layers": 2}, "precision": {"compute": "bf16"}, "command": ["python", "train.py"],
                         "env": {"NCCL_DEBUG": "INFO"}, "site_env": {}, "checkpoint": {"dir": None}})
    write(run.path / rundir.SPEC, yaml.safe_dump({"name": "r", "optimizer": "adamw", "sharding": "none",
                                                  "container": {"image": "nvcr.io/nvidia/pytorch:24.01-py3"}}))
    write(run.path / rundir.SITE, yaml.safe_dump(site if site is not None else TREE))
    return run


def registration(rank: int, host: str, local: int, **extra: Any) -> dict[str, Any]:
    return {"rank": rank, "host": host, "local_rank": local, "token": "t0k3n",
            "versions": {"torch": "2.13.0", "cuda": "12.4", "nccl": "2.21.5"}, **extra}


def test_a_run_without_attempts_has_every_group_with_reasons_not_a_traceback(tmp_path: Path) -> None:
    record = runrecord.load(hand_run(tmp_path))
    assert record["attempt"] is None and all(g in record for g in GROUPS)
    assert record["training"]["parallel"]["tp"] == 2 and record["training"]["batch"]["plan"]["seq_len"] == 128
    assert record["training"]["source"] is None and "code/revision.txt" in record["training"]["unknown"]["source"]
    assert record["environment"]["nodes"] is None and "no attempt" in record["environment"]["unknown"]["nodes"]
    assert record["recovery"]["resumed_from"] is None and "no attempt" in record["recovery"]["unknown"]["resumed_from"]
    assert record["data"]["dataset"] is None and record["data"]["unknown"]["dataset"]
    container = record["environment"]["container"]
    assert container["image"].endswith(":24.01-py3") and container["digest"] is None
    assert "not resolved" in container["unknown"]["digest"]
    shown = cli("record", str(tmp_path / "r-1"))
    assert shown.exit_code == 0 and "unknown: no attempt has started yet" in shown.stdout, shown.output


def test_an_attempt_assembles_registrations_switches_and_the_trainers_part(tmp_path: Path) -> None:
    run = hand_run(tmp_path)
    adir = run.attempt(2)
    write(adir / rundir.ATTEMPT_JSON, {"job_id": "7", "hosts": ["n2", "n3"], "nodelist": "n[2-3]", "token": "t0k3n",
                                       "master_addr": "10.0.0.2", "master_port": 23456, "spares": 0})
    env = {"NCCL_IB_HCA": "mlx5_0", "OMP_NUM_THREADS": "8"}
    write(adir / rundir.MANIFEST, {"world_size": 4, "ranks": [
        registration(0, "n2", 0, env=env, driver="nvidia 550.54.15"), registration(1, "n2", 1),
        registration(2, "n3", 0), registration(3, "n3", 1, versions={"torch": "2.12.0"})]})  # n3 registered no env
    write(adir / rundir.RECORD, {"recovery": {"schema_version": "clusterctl-checkpoint/1", "resumed": True, "start_step": 11,
                                              "resumed_from": {"step": 10, "path": "/ck/step-00000010"}, "how": "resumed"},
                                 "data": {"resumed_position": {"epoch": 0, "data_position": 22}},
                                 "training": {"seeds": {"model_init": 5}}})
    history.append(run, history.EVENT_NEXT, attempt=1, how=history.NEXT_ALLOCATION, exit=84, committed_step=10)
    history.append(run, history.EVENT_START, attempt=2, job_id="7")
    record = runrecord.load(run)
    assert record["attempt"] == 2
    nodes = {n["host"]: n for n in record["environment"]["nodes"]}
    assert nodes["n2"]["ranks"] == "0-1" and nodes["n2"]["env"] == env and nodes["n2"]["driver"] == "nvidia 550.54.15"
    assert nodes["n2"]["switches"] == ["leaf1", "spine"] and nodes["n3"]["switches"] == ["leaf2", "spine"]
    assert nodes["n3"]["env"] is None and "did not record" in nodes["n3"]["unknown"]["env"]
    assert nodes["n3"]["versions_differ_on_ranks"] == [3]
    assert record["recovery"]["resumed_from"]["step"] == 10 and record["recovery"]["begun_by"]["how"] == "allocation"
    assert record["data"]["resumed_position"] == {"epoch": 0, "data_position": 22}
    assert record["training"]["seeds"] == {"model_init": 5}
    assert record["environment"]["allocation"]["master"] == "10.0.0.2:23456"
    assert "t0k3n" not in json.dumps(record)  # the attempt token never leaves attempt.json/manifest.json
    shown = cli("record", str(run.path))
    assert shown.exit_code == 0 and "leaf1 > spine" in shown.stdout and "not recorded" in shown.stdout, shown.output
    narrow = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["record", str(run.path)])  # a default terminal: a block a node
    assert "Node n2" in narrow.stdout and "nvidia 550.54.15" in narrow.stdout and "leaf1 > spine" in narrow.stdout
    assert max(map(len, narrow.stdout.splitlines())) <= 80, narrow.stdout
    # The trainer's part absent or torn: null with the reason, the rest still there.
    (adir / rundir.RECORD).write_text("{torn")
    torn = runrecord.load(run, 2)
    assert torn["recovery"]["resumed_from"] is None and "record.json is missing" in torn["recovery"]["unknown"]["resumed_from"]
    assert torn["environment"]["nodes"]


def test_unknowable_switches_source_and_a_missing_attempt(tmp_path: Path) -> None:
    run = hand_run(tmp_path, site={"name": "flat"})
    write(run.attempt(1) / rundir.ATTEMPT_JSON, {"hosts": ["node1"]})
    record = runrecord.load(run)
    assert record["environment"]["switches"] is None and "no switch tree" in record["environment"]["unknown"]["switches"]
    assert "manifest.json is missing" in record["environment"]["unknown"]["nodes"]
    blocks = {"topology": {"kind": "block", "blocks": [{"name": "b1", "nodes": "node[1-2]"}]}}
    assert runrecord.switch_paths(blocks, ["node1", "x"]) == ({"node1": ["b1"]}, None)
    code = run.path / rundir.CODE
    write(code / "revision.txt", "repository: /src\nrevision: 0123abcd\n")
    write(code / "status.txt", " M train.py\n?? notes.txt\n")
    write(code / "diff.patch", "diff --git a/train.py b/train.py\n-x\n+y\n")
    found, why = runrecord.source(run)
    assert why is None and found["revision"] == "0123abcd" and found["dirty"] and found["untracked_paths"] == 1
    assert found["diff"]["sha256"] == hashlib.sha256((code / "diff.patch").read_bytes()).hexdigest() and found["diff"]["files"] == 1
    with pytest.raises(ClusterctlError) as err:
        runrecord.load(run, 5)
    assert err.value.exit_code == ExitCode.USAGE and "no attempt 5" in err.value.message
    result = cli("record", str(run.path), "--attempt", "5")
    assert result.exit_code == ExitCode.USAGE and "Traceback" not in result.output


def test_the_recorded_environment_keeps_communication_settings_and_drops_secrets() -> None:
    env = {"NCCL_SOCKET_IFNAME": "ib0", "OMP_NUM_THREADS": "4", "UCX_TLS": "rc", "CLUSTERCTL_TOKEN": "x",
           "CLUSTERCTL_GPU": "0", "PATH": "/bin", "HOME": "/root", "NCCL_SECRET_TOKEN_FILE": "/s", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert recorded_env(env) == {"NCCL_SOCKET_IFNAME": "ib0", "OMP_NUM_THREADS": "4", "UCX_TLS": "rc",
                                 "CLUSTERCTL_GPU": "0", "TORCH_NCCL_BLOCKING_WAIT": "1"}


# --- one real run and its requeue ---------------------------------------------------------
def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                   check=True, capture_output=True)


def ended(run: RunDir, attempt: int) -> bool:
    return any(e.get("event") == history.EVENT_NEXT and e.get("attempt") == attempt for e in history.read_events(run.events_file))


def wait_for(what: str, check: Any, run: RunDir, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            logs = "\n".join(p.read_text()[-3000:] for p in run.path.glob("slurm-*.out"))
            pytest.fail(f"{what}: not within {timeout} s\n{history.read_events(run.events_file)}\n{logs}")
        time.sleep(0.3)


def record_json(run: RunDir, *args: str) -> dict[str, Any]:
    result = cli("record", str(run.path), *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_real_run_records_what_its_ranks_saw_and_its_requeue_what_it_resumed_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterctl.actions.submit import submit_job
    from clusterctl.plan.job import load_job

    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(tmp_path / "local-state"))
    repo = tmp_path / "src"
    repo.mkdir()
    (repo / "train_notes.txt").write_text("v1\n")
    git(repo, "init", "-q")
    git(repo, "add", "train_notes.txt")
    git(repo, "commit", "-q", "-m", "v1")
    (repo / "train_notes.txt").write_text("v2\n")  # submitted dirty: the record names the diff
    spec = {
        "name": "rec", "site": "local", "time_limit": "20m", "nodes": 2, "gpus_per_node": 1,
        "runs_root": str(tmp_path / "runs"), "checkpoint": {"interval": 2}, "restart": {"mode": "none"},
        "model": {"layers": 1, "hidden": 16, "heads": 2, "vocab": 32, "ffn": 32}, "seq_len": 8,
        "batch": {"micro": 1, "grad_accum": 1}, "env": {"NCCL_DEBUG": "WARN"},
        "command": ["python3", "-m", "clusterctl.trainer", "--steps", "3", "--eval-interval", "0"],
    }
    (repo / "job.yaml").write_text(json.dumps(spec))
    run = submit_job(load_job(repo / "job.yaml"), "local").run
    wait_for("attempt 1 to end", lambda: ended(run, 1), run)

    first = record_json(run)
    assert first["attempt"] == 1 and all(isinstance(first[g], dict) for g in GROUPS)
    source = first["training"]["source"]
    assert source["dirty"] and source["revision"] and len(source["revision"]) == 40
    assert source["diff"]["sha256"] == hashlib.sha256((run.path / rundir.CODE / "diff.patch").read_bytes()).hexdigest()
    assert first["training"]["optimizer"]["trainer"]["type"] == "AdamW"
    assert first["training"]["batch"]["trainer"] == {"micro": 1, "grad_accum": 1, "global": 2, "seq_len": 8}
    assert first["training"]["seeds"]["torch_initial_seed"] == 0
    assert first["data"]["dataset"]["size"] > 0 and first["data"]["sampler"]["seed"] == 0
    assert first["recovery"]["resumed"] is False and first["recovery"]["resumed_from"] is None
    assert first["recovery"]["how"].startswith("from scratch") and first["data"]["resumed_position"] is None
    assert first["recovery"]["schema_version"] == "clusterctl-checkpoint/1"
    nodes = first["environment"]["nodes"]
    assert [n["host"] for n in nodes] == first["environment"]["allocation"]["hosts"]
    torch_version = importlib.metadata.version("torch")  # torch.__version__ without importing it here
    for node in nodes:
        assert node["versions"]["torch"] == torch_version
        assert node["env"]["NCCL_DEBUG"] == "WARN"  # from the spec, as the wrapper exported it
        assert node["env"]["OMP_NUM_THREADS"] == "1"  # the wrapper's: one CPU per emulated GPU
        assert "CLUSTERCTL_TOKEN" not in node["env"]
    token = attemptjson.token(run.attempt(1))
    assert token and token not in json.dumps(first)
    text = cli("record", str(run.path), cwd=tmp_path)
    assert text.exit_code == 0, text.output
    for title in ("Training definition", "Data", "Recovery", "Execution environment", "NCCL_DEBUG"):
        assert title in text.stdout

    committed = json.loads((run.path / rundir.CHECKPOINTS / "step-00000001" / "manifest.json").read_text())
    result = cli("requeue", str(run.path), "--json")
    assert result.exit_code == 0, result.output
    wait_for("attempt 2 to end", lambda: ended(run, 2), run)
    second = record_json(run, "--attempt", "2")
    recovery = second["recovery"]
    assert recovery["resumed"] is True and recovery["start_step"] == 2
    assert recovery["resumed_from"]["step"] == 1 and recovery["resumed_from"]["path"].endswith("step-00000001")
    assert recovery["resumed_from"]["format"] == "clusterctl-checkpoint/1" and not recovery["resumed_from"]["resharded"]
    assert recovery["begun_by"]["event"] == history.EVENT_REQUEUE
    assert second["data"]["resumed_position"] == {"epoch": committed["epoch"], "data_position": committed["data_position"]}
    assert second["data"]["sampler"]["state"]["position"] == committed["data_position"] == 2
    assert record_json(run, "--attempt", "1")["recovery"]["resumed"] is False  # each attempt keeps its own record
