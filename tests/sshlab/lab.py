"""Real OpenSSH servers on 127.0.0.1 for the test suite, and a "laptop" side that cannot
read the remote side's files.

Remote use (``--remote HOST``) must be tested against Debian's own sshd, not a mock: host key
checking, ProxyJump, SFTP and the login shell all behave as users meet them.  Each
:class:`SshLab` is a private ``/usr/sbin/sshd -D`` on a free port of 127.0.0.1 with a throwaway
ed25519 host key and a throwaway key pair for root; all its files live under ``state_dir`` and
nothing in /etc/ssh or ~/.ssh is read or written (only ``/run/sshd``, sshd's privilege
separation directory, is created when missing).

By hand (as root; ``ensure_sshd_installed`` installs openssh-server when it is missing)::

    .venv/bin/python -m tests.sshlab.lab            # one lab, prints how to connect; Ctrl-C stops
    .venv/bin/python -m tests.sshlab.lab --bastion  # a bastion and a target behind it

or from Python::

    from tests.sshlab.lab import ssh_lab, write_client_config, HostEntry
    with ssh_lab() as lab:
        cfg = write_client_config(tmp / "ssh_config", {"cluster": lab})
        subprocess.run(["ssh", "-F", str(cfg.config), "cluster", "hostname"])

Only the standard library, paramiko and the OpenSSH executables (sshd, ssh-keygen) are used.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import paramiko

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
PRIVSEP_DIR = Path("/run/sshd")
APT_INSTALL = (
    "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
    "--no-install-recommends openssh-server"
)


class LabUnavailable(RuntimeError):
    """The lab cannot run here (no root, sshd missing and not installable, ...); says why."""


# ---------------------------------------------------------------- install


def sshd_installed() -> bool:
    """True when Debian's sshd and ssh-keygen are present."""
    return os.access(SSHD, os.X_OK) and shutil.which("ssh-keygen") is not None


def ensure_sshd_installed(timeout: float = 300) -> None:
    """Install openssh-server with apt when sshd is missing (CI starts from a bare machine).

    Idempotent; raises :class:`LabUnavailable` with the reason when it cannot.  Debian's
    postinst may fail to start the system sshd (no systemd): only the binaries count.
    """
    if sshd_installed():
        return
    if os.geteuid() != 0:
        raise LabUnavailable(f"{SSHD} is missing and installing openssh-server needs root")
    if shutil.which("apt-get") is None:
        raise LabUnavailable(f"{SSHD} is missing and apt-get is not available to install it")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        proc = subprocess.run(
            ["sh", "-c", APT_INSTALL], env=env, capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise LabUnavailable(f"installing openssh-server took more than {timeout:.0f} s") from None
    if not sshd_installed():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise LabUnavailable(f"installing openssh-server failed (exit {proc.returncode}):\n{tail}")


# ---------------------------------------------------------------- helpers


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's pick; callers retry on a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def generate_key(path: Path, comment: str = "clusterctl-sshlab") -> Path:
    """Write a passphrase-less ed25519 key pair (``path`` and ``path.pub``) with ssh-keygen.

    paramiko cannot generate ed25519 keys; tests use this for extra keys too (an
    unauthorized "wrong" key, say).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    path.chmod(0o600)
    return path


def known_hosts_line(host: str, port: int, public_key_file: Path) -> str:
    """The known_hosts line OpenSSH and paramiko expect for HOST:PORT (``[h]:p`` unless port 22)."""
    kind, blob = Path(public_key_file).read_text().split()[:2]
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {kind} {blob}"


def _descendants(pid: int) -> list[int]:
    """All descendants of ``pid`` (from /proc), so that per-connection sshd processes, which
    call setsid() and leave the listener's process group, are stopped with it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _stop_tree(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM a process and every descendant, then SIGKILL what is left; reap the process."""
    if proc.poll() is not None:
        return
    pids = [proc.pid, *_descendants(proc.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            alive = [p for p in pids if p != proc.pid and _alive(p)]
            if proc.returncode is not None and not alive:
                return
            time.sleep(0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_banner(host: str, port: int, proc: subprocess.Popen, timeout: float) -> bool:
    """Wait until the server on host:port sends its SSH banner (False if proc died or time ran out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                if s.recv(8).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


_LIVE: set[Any] = set()
_LIVE_LOCK = threading.Lock()


def _track(obj: Any) -> None:
    with _LIVE_LOCK:
        _LIVE.add(obj)


def _untrack(obj: Any) -> None:
    with _LIVE_LOCK:
        _LIVE.discard(obj)


@atexit.register
def _stop_all() -> None:
    """Last resort: never leave a lab's sshd behind when the interpreter exits."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for obj in live:
        with contextlib.suppress(Exception):
            obj.stop()


# ---------------------------------------------------------------- the lab


class SshServer(Protocol):
    """What :func:`write_client_config` needs of a server (an SshLab or a KbdIntServer)."""

    host: str
    port: int
    user: str
    host_key_line: str


@dataclass(eq=False)
class SshLab:
    """A running private sshd: connect as ``user`` with ``user_key``, trust ``host_key_line``."""

    host: str
    port: int
    user: str
    user_key: Path
    host_key_line: str
    state_dir: Path
    sshd_config: Path
    log: Path
    known_hosts: Path
    """A known_hosts file holding just ``host_key_line``."""
    home: Path | None = None
    """The directory mounted over the user's home for sshd's children (``profile=``), else None."""
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _owns_state: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int | None:
        """The listening sshd's pid (None once stopped)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def stop(self) -> None:
        """Kill the sshd and its open connections (and remove a temporary state dir)."""
        if self._proc is not None:
            _stop_tree(self._proc)
            self._proc = None
        _untrack(self)
        if self._owns_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self._owns_state = False

    def connect(self, timeout: float = 10, **kw: Any) -> paramiko.SSHClient:
        """A paramiko client connected strictly (known_hosts + RejectPolicy) with the lab's key."""
        client = paramiko.SSHClient()
        client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        kw.setdefault("key_filename", str(self.user_key))
        kw.setdefault("look_for_keys", False)
        kw.setdefault("allow_agent", False)
        client.connect(self.host, port=self.port, username=self.user, timeout=timeout, **kw)
        return client

    def exec(self, command: str, timeout: float = 30) -> tuple[int, str, str]:
        """Run one command over a fresh connection: (exit status, stdout, stderr)."""
        with contextlib.closing(self.connect()) as client:
            _, out, err = client.exec_command(command, timeout=timeout)
            stdout, stderr = out.read().decode(), err.read().decode()
            return out.channel.recv_exit_status(), stdout, stderr

    def add_authorized_key(self, public_key: str | Path) -> None:
        """Authorize another public key (a line, or a .pub file) for the lab's user."""
        text = Path(public_key).read_text() if isinstance(public_key, Path) else public_key
        with open(self.state_dir / "authorized_keys", "a") as f:
            f.write(text.strip() + "\n")

    def log_text(self) -> str:
        """sshd's log (LogLevel VERBOSE): why a connection was refused, for failure messages."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def _sshd_config(
    state: Path, port: int, host: str, user: str, set_env: Mapping[str, str]
) -> str:
    lines = [
        f"ListenAddress {host}",
        f"Port {port}",
        f"HostKey {state / 'host_ed25519'}",
        f"PidFile {state / 'sshd.pid'}",
        f"AuthorizedKeysFile {state / 'authorized_keys'}",
        f"AllowUsers {user}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        # ProxyJump through this server opens direct-tcpip channels.
        "AllowTcpForwarding yes",
        "PermitOpen any",
        "X11Forwarding no",
        "PrintMotd no",
        "PrintLastLog no",
        "PermitUserEnvironment no",
        # Tests open many short connections, some in parallel.
        "MaxStartups 64:30:128",
        "MaxSessions 32",
        "LoginGraceTime 30",
        "LogLevel VERBOSE",
        f"Subsystem sftp {SFTP_SERVER}",
    ]
    if set_env:
        pairs = " ".join(shlex.quote(f"{k}={v}") for k, v in set_env.items())
        lines.append(f"SetEnv {pairs}")
    return "\n".join(lines) + "\n"


_OWN_DOTFILES = {".profile", ".bashrc", ".bash_profile", ".bash_login", ".ssh"}  # the lab's, not the real home's


def start_lab(
    state_dir: Path | None = None,
    *,
    name: str = "sshlab",
    host: str = "127.0.0.1",
    user: str = "root",
    set_env: Mapping[str, str] | None = None,
    profile: str | None = None,
    timeout: float = 15,
) -> SshLab:
    """Start a private sshd and return the running :class:`SshLab` (call ``.stop()``).

    ``state_dir`` (created) holds keys, config and log; by default a temp dir removed on stop.
    ``set_env`` is set in every connection by sshd (``SetEnv``), login shell or not.
    ``profile``, when given, becomes the user's ``~/.profile`` as sshd's children see it: sshd
    runs in a private mount namespace with a lab directory bind-mounted over the user's home,
    so a login shell (``bash -lc``) reads it and a plain command does not -- as on a real login
    node where SLURM_CONF comes from the profile.  The real home is not touched.
    """
    ensure_sshd_installed()
    if os.geteuid() != 0:
        raise LabUnavailable("a private sshd that logs in as root needs root")
    owns = state_dir is None
    state = Path(tempfile.mkdtemp(prefix=f"clusterctl-{name}-")) if owns else Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    try:
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        host_key = generate_key(state / "host_ed25519", f"{name}-host")
        user_key = generate_key(state / "id_ed25519", f"{name}-{user}")
        (state / "authorized_keys").write_text((state / "id_ed25519.pub").read_text())
        home: Path | None = None
        if profile is not None:
            home = state / "home"
            home.mkdir(exist_ok=True)
            (home / ".profile").write_text(profile)
            (home / ".bashrc").write_text("# clusterctl ssh lab: empty on purpose\n")
            # Everything else of the real home stays reachable (an interpreter under ~/.pyenv, say):
            # the real home is bound at state/realhome inside the namespace, and linked from the lab home.
            real = Path(os.path.expanduser(f"~{user}"))
            (state / "realhome").mkdir(exist_ok=True)
            for entry in sorted(os.listdir(real)) if real.is_dir() else []:
                link = home / entry
                if entry not in _OWN_DOTFILES and not os.path.lexists(link):
                    link.symlink_to(state / "realhome" / entry)
        last_error = ""
        for _attempt in range(3):  # a free port can be taken between picking and binding
            port = free_port(host)
            config = state / "sshd_config"
            config.write_text(_sshd_config(state, port, host, user, set_env or {}))
            log = state / "sshd.log"
            log.write_text("")
            check = subprocess.run(
                [SSHD, "-t", "-f", str(config)], capture_output=True, text=True, timeout=30
            )
            if check.returncode != 0:
                raise LabUnavailable(f"sshd -t rejected the lab's config: {check.stderr.strip()}")
            argv = [SSHD, "-D", "-f", str(config), "-E", str(log)]
            if home is not None:
                user_home = os.path.expanduser(f"~{user}")
                script = 'mount --bind "$2" "$3" && mount --bind "$1" "$2" && shift 3 && exec "$@"'
                argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                        "sh", str(home), user_home, str(state / "realhome"), *argv]
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True,
            )
            if _wait_banner(host, port, proc, timeout):
                proc.stderr.close()  # type: ignore[union-attr]
                lab = SshLab(
                    host=host, port=port, user=user, user_key=user_key,
                    host_key_line=known_hosts_line(host, port, host_key.with_suffix(".pub")),
                    state_dir=state, sshd_config=config, log=log,
                    known_hosts=state / "known_hosts", home=home, _proc=proc, _owns_state=owns,
                )
                lab.known_hosts.write_text(lab.host_key_line + "\n")
                _track(lab)
                return lab
            _stop_tree(proc)
            stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            last_error = (stderr + log.read_text(errors="replace")).strip()
            if "Address already in use" not in last_error:
                break
        raise LabUnavailable(f"sshd did not start on {host}: {last_error[-2000:] or 'no output'}")
    except BaseException:
        if owns:
            shutil.rmtree(state, ignore_errors=True)
        raise


@contextlib.contextmanager
def ssh_lab(state_dir: Path | None = None, **kw: Any) -> Iterator[SshLab]:
    """:func:`start_lab` as a context manager: the sshd is stopped on exit."""
    lab = start_lab(state_dir, **kw)
    try:
        yield lab
    finally:
        lab.stop()


# ---------------------------------------------------------------- client config


@dataclass
class HostEntry:
    """One ``Host`` block of a client config: ``alias`` reaches ``server``.

    ``identity_file`` defaults to the server's ``user_key`` (None for none);
    ``known=False`` leaves the host key out of known_hosts (an unknown-host test);
    ``options`` adds raw lines (``{"ProxyCommand": "..."}``).
    """

    alias: str
    server: SshServer
    proxy_jump: str | None = None
    user: str | None = None
    identity_file: Path | None | bool = True
    known: bool = True
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientConfig:
    """Files written by :func:`write_client_config`; ``env`` points the product at them."""

    config: Path
    known_hosts: Path

    @property
    def env(self) -> dict[str, str]:
        """``CLUSTERCTL_SSH_CONFIG`` for the product (merge into a subprocess env)."""
        return {"CLUSTERCTL_SSH_CONFIG": str(self.config)}

    def ssh_argv(self, *args: str) -> list[str]:
        """``ssh -F CONFIG -o BatchMode=yes ARGS``: the real client, never prompting."""
        return ["ssh", "-F", str(self.config), "-o", "BatchMode=yes", *args]


def write_client_config(
    path: Path,
    entries: Mapping[str, SshServer] | Sequence[HostEntry],
    known_hosts: Path | None = None,
) -> ClientConfig:
    """Write an OpenSSH ``~/.ssh/config``-style file plus its known_hosts, as a laptop has them.

    ``entries`` maps aliases to servers, or lists :class:`HostEntry` for ProxyJump, other users
    or unknown hosts.  Every block says ``IdentitiesOnly yes`` and ``StrictHostKeyChecking yes``
    so neither the real client nor the product may fall back on keys or trust from the
    machine's own ~/.ssh.  known_hosts defaults to ``known_hosts`` next to ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    known_hosts = Path(known_hosts) if known_hosts is not None else path.with_name("known_hosts")
    if isinstance(entries, Mapping):
        entries = [HostEntry(alias, server) for alias, server in entries.items()]
    blocks: list[str] = []
    known_lines: list[str] = []
    for e in entries:
        s = e.server
        lines = [f"Host {e.alias}", f"    HostName {s.host}", f"    Port {s.port}",
                 f"    User {e.user or s.user}"]
        key = getattr(s, "user_key", None) if e.identity_file is True else e.identity_file
        if key:
            lines.append(f"    IdentityFile {key}")
        lines += [
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {known_hosts}",
            "    StrictHostKeyChecking yes",
        ]
        if e.proxy_jump:
            lines.append(f"    ProxyJump {e.proxy_jump}")
        lines += [f"    {k} {v}" for k, v in e.options.items()]
        blocks.append("\n".join(lines))
        if e.known and s.host_key_line not in known_lines:
            known_lines.append(s.host_key_line)
    path.write_text("\n\n".join(blocks) + "\n")
    path.chmod(0o600)  # ssh refuses a config others can write
    known_hosts.write_text("".join(line + "\n" for line in known_lines))
    return ClientConfig(config=path, known_hosts=known_hosts)


# ---------------------------------------------------------------- the laptop side

_HIDE_SCRIPT = r"""
n=$1; shift
while [ "$n" -gt 0 ]; do
    mount -t tmpfs -o ro,size=4k,mode=0555 clusterctl-hidden "$1" || exit 125
    shift; n=$((n - 1))
done
exec "$@"
"""


def laptop_argv(argv: Sequence[str], hidden: Sequence[Path]) -> list[str]:
    """``argv`` wrapped so it runs in a private mount namespace with each hidden dir covered
    by an empty read-only tmpfs: a backend that quietly reads or writes the remote runs root
    locally fails there, while sshd and the Slurm daemons (root namespace) see the real dir.
    ``unshare`` and ``sh`` exec, so the pid is the command's own."""
    for d in hidden:
        Path(d).mkdir(parents=True, exist_ok=True)  # a mount point must exist
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _HIDE_SCRIPT, "sh",
            str(len(hidden)), *(str(Path(d).resolve()) for d in hidden), *argv]


def run_as_laptop(
    argv: Sequence[str],
    hidden: Sequence[Path],
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    input: str | None = None,
    timeout: float | None = 120,
) -> subprocess.CompletedProcess:
    """Run ``argv`` as the laptop (see :func:`laptop_argv`); text output captured.

    Exit 125 means a hidden dir could not be covered (the lab's fault, not the product's).
    """
    return subprocess.run(
        laptop_argv(argv, hidden), env=None if env is None else dict(env), cwd=cwd,
        input=input, capture_output=True, text=True, timeout=timeout,
        stdin=None if input is not None else subprocess.DEVNULL,
    )


def popen_as_laptop(
    argv: Sequence[str],
    hidden: Sequence[Path],
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    **popen_kw: Any,
) -> subprocess.Popen:
    """:func:`run_as_laptop` as a Popen, to stream output or kill the command mid-way
    (``.pid`` is the command itself).  Popen keywords pass through (stdout=PIPE, text=True, ...)."""
    return subprocess.Popen(
        laptop_argv(argv, hidden), env=None if env is None else dict(env), cwd=cwd, **popen_kw
    )


# ---------------------------------------------------------------- by hand


def _main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Start an ssh lab by hand; Ctrl-C stops it.")
    parser.add_argument("--bastion", action="store_true", help="also a bastion in front of it")
    parser.add_argument("--dir", type=Path, help="state dir (default: a temp dir)")
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="clusterctl-sshlab-"))
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(ssh_lab(base / "target", name="target"))
        entries = [HostEntry("target", target)]
        if args.bastion:
            bastion = stack.enter_context(ssh_lab(base / "bastion", name="bastion"))
            entries = [HostEntry("bastion", bastion), HostEntry("jumped", target, proxy_jump="bastion"),
                       *entries]
        cfg = write_client_config(base / "ssh_config", entries)
        print(f"client config: {cfg.config}\nknown_hosts:   {cfg.known_hosts}")
        for e in entries:
            print(f"  ssh -F {cfg.config} {e.alias}")
        print(f"  export CLUSTERCTL_SSH_CONFIG={cfg.config}\nCtrl-C stops the lab.")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    _main()
