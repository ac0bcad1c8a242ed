"""The ssh test servers themselves (tests/sshlab): what remote-use tests rely on holds.

Strict host key checking by both clients, refusal of unknown and changed keys and of an
unauthorized user key, ProxyJump through the bastion, the keyboard-interactive stand-in, the
login profile, and the laptop runner that cannot read the remote runs root.
"""

from __future__ import annotations

import contextlib
import io
import signal
import socket
import subprocess
import time
from pathlib import Path

import paramiko
import pytest

from tests.sshlab.kbdint import PROMPT, KbdIntServer
from tests.sshlab.lab import (
    HostEntry,
    SshLab,
    generate_key,
    popen_as_laptop,
    run_as_laptop,
    write_client_config,
)
from tests.sshlab.lab import (
    ssh_lab as start_ssh_lab,
)


def strict_client(known_hosts: Path) -> paramiko.SSHClient:
    """What the product does: known_hosts only, unknown hosts rejected."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


def test_both_clients_connect_with_strict_host_key_checking(ssh_lab: SshLab, tmp_path: Path) -> None:
    cfg = write_client_config(tmp_path / "ssh" / "config", {"cluster": ssh_lab})
    text = cfg.config.read_text()
    for line in ("Host cluster", "HostName 127.0.0.1", f"Port {ssh_lab.port}", "User root",
                 f"IdentityFile {ssh_lab.user_key}", "IdentitiesOnly yes",
                 f"UserKnownHostsFile {cfg.known_hosts}", "StrictHostKeyChecking yes"):
        assert line in text
    assert cfg.known_hosts.read_text() == ssh_lab.host_key_line + "\n"
    assert ssh_lab.host_key_line.startswith(f"[127.0.0.1]:{ssh_lab.port} ssh-ed25519 ")

    proc = run(cfg.ssh_argv("cluster", "echo hello from $(id -un)"))
    assert (proc.returncode, proc.stdout) == (0, "hello from root\n"), proc.stderr

    with contextlib.closing(strict_client(cfg.known_hosts)) as client:
        client.connect(ssh_lab.host, port=ssh_lab.port, username="root",
                       key_filename=str(ssh_lab.user_key), look_for_keys=False, allow_agent=False)
        _, out, _ = client.exec_command("echo $((6 * 7)); exit 3")
        assert out.read() == b"42\n"
        assert out.channel.recv_exit_status() == 3
        with contextlib.closing(client.open_sftp()) as sftp:  # the sftp subsystem is there too
            sftp.putfo(io.BytesIO(b"up"), str(tmp_path / "uploaded"))
        assert (tmp_path / "uploaded").read_bytes() == b"up"


def test_unknown_and_changed_host_keys_are_refused(
    ssh_lab: SshLab, ssh_bastion: SshLab, tmp_path: Path
) -> None:
    unknown = write_client_config(tmp_path / "u" / "config", [HostEntry("cluster", ssh_lab, known=False)])
    assert unknown.known_hosts.read_text() == ""
    proc = run(unknown.ssh_argv("cluster", "true"))
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr
    with contextlib.closing(strict_client(unknown.known_hosts)) as client:
        with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
            client.connect(ssh_lab.host, port=ssh_lab.port, username="root",
                           key_filename=str(ssh_lab.user_key), look_for_keys=False, allow_agent=False)

    # The right name with another server's key: what a changed (or spoofed) host looks like.
    changed = write_client_config(tmp_path / "c" / "config", {"cluster": ssh_lab})
    other_key = ssh_bastion.host_key_line.split(" ", 1)[1]
    changed.known_hosts.write_text(f"[127.0.0.1]:{ssh_lab.port} {other_key}\n")
    proc = run(changed.ssh_argv("cluster", "true"))
    assert proc.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in proc.stderr
    with contextlib.closing(strict_client(changed.known_hosts)) as client:
        with pytest.raises(paramiko.BadHostKeyException):
            client.connect(ssh_lab.host, port=ssh_lab.port, username="root",
                           key_filename=str(ssh_lab.user_key), look_for_keys=False, allow_agent=False)


def test_a_key_that_is_not_authorized_is_refused(ssh_lab: SshLab, tmp_path: Path) -> None:
    wrong = generate_key(tmp_path / "wrong_ed25519")
    cfg = write_client_config(tmp_path / "config", [HostEntry("cluster", ssh_lab, identity_file=wrong)])
    proc = run(cfg.ssh_argv("cluster", "true"))
    assert proc.returncode == 255 and "Permission denied" in proc.stderr
    with contextlib.closing(strict_client(cfg.known_hosts)) as client:
        with pytest.raises(paramiko.AuthenticationException):
            client.connect(ssh_lab.host, port=ssh_lab.port, username="root", key_filename=str(wrong),
                           look_for_keys=False, allow_agent=False)


def test_proxyjump_through_the_bastion(ssh_lab: SshLab, ssh_bastion: SshLab, tmp_path: Path) -> None:
    cfg = write_client_config(tmp_path / "config", [
        HostEntry("bastion", ssh_bastion),
        HostEntry("target", ssh_lab),
        HostEntry("cluster", ssh_lab, proxy_jump="bastion"),
    ])
    assert "ProxyJump bastion" in cfg.config.read_text()
    for argv in (cfg.ssh_argv("-J", "bastion", "target", "echo via-J"),
                 cfg.ssh_argv("cluster", "echo via-config")):
        proc = run(argv)
        assert proc.returncode == 0, proc.stderr
    # paramiko does not act on ProxyJump: a direct-tcpip channel from the bastion is the socket.
    with contextlib.closing(strict_client(cfg.known_hosts)) as jump:
        jump.connect(ssh_bastion.host, port=ssh_bastion.port, username="root",
                     key_filename=str(ssh_bastion.user_key), look_for_keys=False, allow_agent=False)
        channel = jump.get_transport().open_channel(  # type: ignore[union-attr]
            "direct-tcpip", (ssh_lab.host, ssh_lab.port), ("127.0.0.1", 0))
        with contextlib.closing(strict_client(cfg.known_hosts)) as client:
            client.connect(ssh_lab.host, port=ssh_lab.port, username="root", sock=channel,
                           key_filename=str(ssh_lab.user_key), look_for_keys=False, allow_agent=False)
            _, out, _ = client.exec_command("echo through")
            assert out.read() == b"through\n"


def _kbdint_transport(server: KbdIntServer, answer: str, prompts: list[str]) -> paramiko.Transport:
    transport = paramiko.Transport(socket.create_connection((server.host, server.port), timeout=10))
    transport.start_client(timeout=10)
    key = transport.get_remote_server_key()
    assert f"{key.get_name()} {key.get_base64()}" == server.host_key_line.split(" ", 1)[1]

    def handler(title: str, instructions: str, questions: list[tuple[str, bool]]) -> list[str]:
        prompts.extend(q for q, _ in questions)
        return [answer for _ in questions]

    try:
        transport.auth_interactive("root", handler)
    except BaseException:
        transport.close()
        raise
    return transport


def test_keyboard_interactive_right_and_wrong_answer(kbdint_server: KbdIntServer) -> None:
    prompts: list[str] = []
    with pytest.raises(paramiko.AuthenticationException):
        _kbdint_transport(kbdint_server, "not-" + kbdint_server.answer, prompts)
    assert prompts == [PROMPT]

    transport = _kbdint_transport(kbdint_server, kbdint_server.answer, prompts)
    try:
        channel = transport.open_session()
        channel.update_environment({"GREETING": "hi"})
        channel.exec_command("pwd; echo $GREETING; read x; echo got $x; echo oops >&2; exit 4")
        channel.sendall(b"input\n")
        channel.shutdown_write()
        out, err = channel.makefile("rb").read(), channel.makefile_stderr("rb").read()
        assert out.decode() == f"{kbdint_server.cwd}\nhi\ngot input\n"
        assert err == b"oops\n"
        assert channel.recv_exit_status() == 4
    finally:
        transport.close()
    assert kbdint_server.answers == [["not-" + kbdint_server.answer], [kbdint_server.answer]]
    assert len(kbdint_server.commands) == 1
    assert "mfa" in write_client_config(
        kbdint_server.cwd / "config", [HostEntry("mfa", kbdint_server)]).config.read_text()


def test_login_profile_is_read_by_login_shells_only(tmp_path: Path, ssh_lab: SshLab) -> None:
    code, out, err = ssh_lab.exec("echo \"[$SLURM_CONF]\"; bash -lc 'echo $SLURM_CONF; command -v clusterctl; cd; pwd'")
    assert code == 0, err
    plain, conf, exe, home = out.splitlines()
    assert plain == "[]" and conf.endswith("/slurm.conf") and exe.endswith("/.venv/bin/clusterctl")
    assert home == "/root" and ssh_lab.home is not None and (ssh_lab.home / ".profile").is_file()

    with start_ssh_lab(tmp_path / "lab", name="profile", profile="export SLURM_CONF=/lab/slurm.conf\n",
                       set_env={"FROM_SSHD": "a b"}) as lab:
        code, out, err = lab.exec("echo \"[$SLURM_CONF] [$FROM_SSHD]\"; bash -lc 'echo \"[$SLURM_CONF]\"'")
        assert (code, out) == (0, "[] [a b]\n[/lab/slurm.conf]\n"), err
    real = Path("/root/.profile")  # the real home is untouched
    assert not real.exists() or "/lab/slurm.conf" not in real.read_text()


def test_laptop_cannot_read_the_remote_runs_root(ssh_lab: SshLab, tmp_path: Path) -> None:
    runs = tmp_path / "remote-runs"
    runs.mkdir()
    (runs / "job.txt").write_text("remote only")
    proc = run_as_laptop(["sh", "-c", 'ls -A "$1"; cat "$1/job.txt"; touch "$1/new"', "sh", str(runs)],
                         [runs], cwd=tmp_path)
    assert proc.stdout == ""
    assert "No such file" in proc.stderr and "Read-only file system" in proc.stderr
    assert sorted(p.name for p in runs.iterdir()) == ["job.txt"]  # outside: untouched
    assert ssh_lab.exec(f"cat {runs}/job.txt") == (0, "remote only", "")  # sshd sees it

    # The laptop reaches the remote side over ssh from inside the namespace.
    cfg = write_client_config(tmp_path / "config", {"cluster": ssh_lab})
    proc = run_as_laptop(cfg.ssh_argv("cluster", f"cat {runs}/job.txt"), [runs], input="")
    assert (proc.returncode, proc.stdout) == (0, "remote only"), proc.stderr

    started = time.monotonic()
    popen = popen_as_laptop(["sleep", "60"], [runs])
    try:
        time.sleep(0.2)
        popen.send_signal(signal.SIGTERM)  # the pid is the command's own
        assert popen.wait(timeout=10) == -signal.SIGTERM
    finally:
        popen.kill()
    assert time.monotonic() - started < 10


def test_stop_ends_open_connections(ssh_lab: SshLab, tmp_path: Path) -> None:
    """(ssh_lab: installs sshd, or skips when it cannot.)"""
    with start_ssh_lab(tmp_path / "lab", name="stop") as lab:
        client = lab.connect()
        _, out, _ = client.exec_command("echo $$; exec sleep 300")
        pid = int(out.readline())
        assert Path(f"/proc/{pid}").exists()
    client.close()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert lab.pid is None
