"""Remote use from a laptop, against real OpenSSH servers in front of the real Slurm test cluster.

The laptop side runs clusterctl as a subprocess in its own mount namespace
where the remote runs root is an empty read-only directory (tests/sshlab):
a command that quietly read or wrote local paths instead of going through
the login node would fail here. The login node is `ssh_lab` (its login
shell has SLURM_CONF and this checkout's clusterctl on PATH).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.sshlab.lab import HostEntry, SshLab, generate_key, popen_as_laptop, run_as_laptop, write_client_config

CLUSTERCTL = str(Path(sys.executable).with_name("clusterctl"))
TRAIN = "import os, sys\nprint('shipped code', open('VERSION').read().strip(), 'on', os.environ.get('SLURMD_NODENAME'), flush=True)\n"


@pytest.fixture
def laptop(tmp_path: Path, ssh_lab: SshLab, ssh_bastion: SshLab) -> dict[str, Any]:
    """A laptop's checkout (a git work tree with an uncommitted change), its SSH config, a hidden remote root."""
    hidden = tmp_path / "cluster"
    root = hidden / "runs"
    root.mkdir(parents=True)
    repo = tmp_path / "laptop" / "project"
    repo.mkdir(parents=True)
    (repo / "train.py").write_text(TRAIN)
    (repo / "VERSION").write_text("committed\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    (repo / "VERSION").write_text("uncommitted\n")  # what the job must run is the working tree, not HEAD
    cfg = write_client_config(tmp_path / "laptop" / "ssh" / "config", [
        HostEntry("cluster", ssh_lab), HostEntry("bastion", ssh_bastion),
        HostEntry("jumped", ssh_lab, proxy_jump="bastion"),
    ])
    env = {**os.environ, **cfg.env}
    for name in ("SLURM_CONF", "CLUSTERCTL_REMOTE", "CLUSTERCTL_REMOTE_COMMAND"):
        env.pop(name, None)
    env["PATH"] = "/usr/bin:/bin"  # no sbatch, no clusterctl of the cluster's here: a laptop
    return {"root": root, "hidden": hidden, "repo": repo, "cfg": cfg, "env": env}


def spec(laptop: dict[str, Any], **fields: Any) -> Path:
    path = laptop["repo"] / "job.yaml"
    path.write_text(json.dumps({"name": "remote", "site": "slurm-lab", "time_limit": "10m", "nodes": 2, "gpus_per_node": 1,
                                "runs_root": str(laptop["root"]), "command": ["python3", "train.py"], **fields}))
    return path


def cli(laptop: dict[str, Any], *args: str, remote: str = "cluster", input: str | None = None, timeout: float = 180,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = [CLUSTERCTL, *args] + (["--remote", remote] if remote else [])
    return run_as_laptop(argv, [laptop["hidden"]], env=env or laptop["env"], cwd=laptop["repo"], input=input, timeout=timeout)


@pytest.mark.slurm
def test_a_remote_job_runs_the_shipped_code_and_is_followed_read_and_cancelled(slurm_lab, laptop: dict[str, Any]) -> None:  # noqa: ANN001
    assert not (laptop["root"] / "x").exists() and run_as_laptop(["ls", str(laptop["hidden"])], [laptop["hidden"]]).stdout == ""
    blamed = {"node": "n1", "reason": "hang in forward", "code": 82, "run": "earlier", "time": time.time() - 60}
    (laptop["root"] / "suspects.jsonl").write_text(json.dumps(blamed) + "\n")  # the cluster's, not the laptop's
    done = cli(laptop, "submit", str(spec(laptop)), "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitted job " in done.stdout and " on 127.0.0.1: 2 ranks on 2 nodes" in done.stdout
    assert "excluding suspect node n1: hang in forward (code 82) in run earlier" in done.stdout
    assert "completed: the command finished (exit 0) without reporting a training step" in done.stdout  # a plain script
    (run,) = [p for p in laptop["root"].iterdir() if p.is_dir() and not p.name.startswith(".")]  # on the cluster's side
    assert (run / "code" / "tree" / "VERSION").read_text() == "uncommitted\n"
    assert "n1" not in json.loads((run / "attempt-1" / "attempt.json").read_text())["hosts"]
    listed = json.loads(cli(laptop, "runs", "--runs-root", str(laptop["root"]), "--json").stdout)
    assert [(r["run"], r["state"]) for r in listed] == [(run.name, "completed")]
    logs = cli(laptop, "logs", str(run), "--rank", "1")
    assert logs.returncode == 0 and "shipped code uncommitted on n" in logs.stdout, logs.stdout + logs.stderr
    status = json.loads(cli(laptop, "status", str(run), "--json").stdout)
    assert (status["state"], status["exit_code"], len(status["attempts"])) == ("completed", 0, 1)

    # A long one: cancelled from the laptop, then continued by hand (requeue) and cancelled again.
    sleeper = spec(laptop, command=["python3", "-c", "import time; print('sleeping', flush=True); time.sleep(300)"])
    second = cli(laptop, "submit", str(sleeper))
    assert second.returncode == 0, second.stdout + second.stderr
    run2 = max((p for p in laptop["root"].iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)
    assert run2 != run
    deadline = time.monotonic() + 90
    while json.loads(cli(laptop, "status", str(run2), "--json").stdout)["state"] not in ("training", "starting"):
        assert time.monotonic() < deadline, "the second job never started"
        time.sleep(1)
    assert cli(laptop, "cancel", str(run2)).returncode == 0
    assert json.loads(cli(laptop, "status", str(run2), "--json").stdout)["state"] == "cancelled"
    again = cli(laptop, "requeue", str(run2), "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["submitted"]
    assert json.loads(cli(laptop, "status", str(run2), "--json").stdout)["state"] in ("continued", "pending", "starting", "training")
    assert cli(laptop, "cancel", str(run2)).returncode == 0


def test_through_a_jump_host_and_with_the_ssh_executable(laptop: dict[str, Any]) -> None:
    jumped = cli(laptop, "runs", "--runs-root", str(laptop["root"]), "--json", remote="jumped")
    assert jumped.returncode == 0 and json.loads(jumped.stdout) == [], jumped.stderr
    cfg = laptop["cfg"].config  # ProxyCommand: the stream comes from a command (here ssh -W through the bastion)
    cfg.write_text(cfg.read_text() + "\nHost proxied\n    HostName 127.0.0.1\n" + _block(cfg, "cluster")
                   + f"    ProxyCommand ssh -F {cfg} -W %h:%p bastion\n")
    proxied = cli(laptop, "runs", "--runs-root", str(laptop["root"]), "--json", remote="proxied")
    assert proxied.returncode == 0 and json.loads(proxied.stdout) == [], proxied.stderr
    # A config paramiko cannot honour (ControlMaster) sends the command to the ssh executable, and says so.
    cfg.write_text(cfg.read_text() + "\nHost viassh\n    HostName 127.0.0.1\n" + _block(cfg, "cluster") + "    ControlMaster auto\n"
                   "    ControlPath none\n")
    env = {**laptop["env"], "PATH": "/usr/bin:/bin"}
    one = spec(laptop, site="local", nodes=1, command=["python3", "train.py"])
    done = cli(laptop, "submit", str(one), "--wait", remote="viassh", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "using the ssh executable for viassh" in done.stderr and "completed: the command finished (exit 0)" in done.stdout
    (run,) = [p for p in laptop["root"].iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert "shipped code uncommitted on node1" in (run / "attempt-1" / "logs" / "node-0.log").read_text()


def _block(cfg: Path, alias: str) -> str:
    """The body of a Host block of the config (every line but Host and HostName)."""
    lines, inside = [], False
    for line in cfg.read_text().splitlines():
        if line.startswith("Host "):
            inside = line.split()[1] == alias
        elif inside and line.strip() and not line.strip().startswith("HostName"):
            lines.append(line)
    return "\n".join(lines) + "\n"


def test_host_keys_are_checked_strictly_and_a_wrong_key_is_refused(tmp_path: Path, laptop: dict[str, Any], ssh_lab: SshLab) -> None:
    unknown = write_client_config(tmp_path / "u" / "config", [HostEntry("cluster", ssh_lab, known=False)])
    done = cli(laptop, "runs", env={**laptop["env"], **unknown.env})
    assert done.returncode == 69 and "is not in" in done.stderr and "ssh-keyscan -p" in done.stderr, done.stderr

    changed = write_client_config(tmp_path / "c" / "config", [HostEntry("cluster", ssh_lab)])
    other = generate_key(tmp_path / "other_host_key")
    changed.known_hosts.write_text(f"[127.0.0.1]:{ssh_lab.port} {Path(str(other) + '.pub').read_text().split(' ')[0]} "
                                   f"{Path(str(other) + '.pub').read_text().split(' ')[1]}\n")
    done = cli(laptop, "runs", env={**laptop["env"], **changed.env})
    assert done.returncode == 69 and "has CHANGED" in done.stderr, done.stderr

    wrong = write_client_config(tmp_path / "w" / "config", [HostEntry("cluster", ssh_lab, identity_file=generate_key(tmp_path / "wrong"))])
    done = cli(laptop, "runs", env={**laptop["env"], **wrong.env})
    assert done.returncode == 69 and "no key was accepted for user root" in done.stderr, done.stderr

    # The key in an ssh-agent only (no IdentityFile): offered from the agent.
    keyless = write_client_config(tmp_path / "a" / "config", [HostEntry("cluster", ssh_lab, identity_file=None)])
    sock = tmp_path / "agent.sock"
    agent = subprocess.run(["ssh-agent", "-a", str(sock)], capture_output=True, text=True, check=True)
    pid = int(agent.stdout.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        subprocess.run(["ssh-add", str(ssh_lab.user_key)], env={**os.environ, "SSH_AUTH_SOCK": str(sock)}, check=True,
                       capture_output=True)
        env = {**laptop["env"], **keyless.env, "SSH_AUTH_SOCK": str(sock), "HOME": str(tmp_path)}  # no default key files either
        done = cli(laptop, "runs", "--runs-root", str(laptop["root"]), "--json", env=env)
        assert done.returncode == 0 and json.loads(done.stdout) == [], done.stderr
        env.pop("SSH_AUTH_SOCK")
        assert cli(laptop, "runs", env=env).returncode == 69
    finally:
        os.kill(pid, signal.SIGTERM)


def test_keyboard_interactive_answered_from_standard_input(tmp_path: Path, laptop: dict[str, Any], kbdint_server: Any) -> None:
    cfg = write_client_config(tmp_path / "k" / "config", [HostEntry("mfa", kbdint_server, identity_file=None)])
    env = {**laptop["env"], **cfg.env, "CLUSTERCTL_REMOTE_COMMAND": CLUSTERCTL}
    args = ("runs", "--runs-root", str(tmp_path / "none"), "--json")
    done = cli(laptop, *args, remote="mfa", input=kbdint_server.answer + "\n", env=env)
    assert done.returncode == 0 and json.loads(done.stdout) == [] and "Verification code: " in done.stderr, done.stderr
    wrong = cli(laptop, *args, remote="mfa", input="000000x\n", env=env)
    assert wrong.returncode == 69 and "keyboard-interactive authentication failed" in wrong.stderr, wrong.stderr


def test_a_dropped_upload_leaves_nothing_and_a_version_mismatch_is_refused(laptop: dict[str, Any], ssh_lab: SshLab) -> None:
    with open(laptop["repo"] / "weights.bin", "wb") as fh:  # big enough to be killed while it streams
        fh.truncate(1 << 30)
    proc = popen_as_laptop([CLUSTERCTL, "submit", str(spec(laptop)), "--remote", "cluster"], [laptop["hidden"]],
                           env=laptop["env"], cwd=laptop["repo"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any(".upload-" in p.name for p in laptop["root"].iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the upload never began"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    while list(laptop["root"].iterdir()):
        assert time.monotonic() < deadline, f"left behind on the cluster: {list(laptop['root'].iterdir())}"
        time.sleep(0.2)
    (laptop["repo"] / "weights.bin").unlink()

    fake = ssh_lab.home / "old-clusterctl"
    fake.write_text("#!/bin/sh\necho '{\"version\": \"0.0.9\", \"run_dir_format\": 0, \"expanded\": {}}'\n")
    fake.chmod(0o755)
    env = {**laptop["env"], "CLUSTERCTL_REMOTE_COMMAND": "~/old-clusterctl"}
    done = cli(laptop, "submit", str(spec(laptop)), env=env)
    assert done.returncode == 69, done.stderr
    assert "but on 127.0.0.1 it is 0.0.9 (format 0)" in done.stderr and "(run directory format 1)" in done.stderr
    assert list(laptop["root"].iterdir()) == []


def test_a_clusterctl_of_another_run_directory_format_refuses_what_a_laptop_asks(tmp_path: Path) -> None:
    """Every command a laptop runs there carries its format; the login node's clusterctl checks it first."""
    env = {**os.environ, "CLUSTERCTL_EXPECT_FORMAT": "99"}
    done = subprocess.run([CLUSTERCTL, "runs", "--runs-root", str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 69 and "the caller's speaks format 99" in done.stderr and "(run directory format 1)" in done.stderr
    env["CLUSTERCTL_EXPECT_FORMAT"] = "1"
    assert subprocess.run([CLUSTERCTL, "runs", "--runs-root", str(tmp_path)], env=env, capture_output=True, timeout=60).returncode == 0
