"""Carrying commands and files to a login node: paramiko, or the ssh executable where paramiko cannot.

One connection per command, reused for all its operations. Host keys are
checked strictly against known_hosts: an unknown or changed key is refused
with what to do, never accepted. Uploads are one tar stream into a
temporary directory on the far side that is renamed into place only once
complete; when the connection drops, tar sees the stream end early and the
temporary directory is removed, so nothing half-made is left.
"""

from __future__ import annotations

import getpass
import io
import shlex
import socket
import subprocess
import sys
import tarfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paramiko

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.remote.sshconfig import Destination, load_config, resolve

CONNECT_TIMEOUT_S = 20.0
EXISTS = 17  # the upload script's exit when the destination already exists

# Runs on the far side with sh: unpack the stream into a temporary sibling, rename it into place. Private
# until `submit-run` gives it the run's access (rundir/access.py) with the login node's groups.
UPLOAD_SCRIPT = r"""set -e
umask 077
root=$1 name=$2
tmp="$root/.$name.upload-$$"
mkdir -p "$root"
mkdir "$tmp"
trap 'rm -rf "$tmp"' EXIT HUP INT TERM PIPE
tar -x -f - -C "$tmp"
if [ -e "$root/$name" ]; then echo "$root/$name exists already" >&2; exit 17; fi
mv "$tmp" "$root/$name"
trap - EXIT
"""


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


def _unavailable(message: str) -> ClusterctlError:
    return ClusterctlError(message, ExitCode.BACKEND_UNAVAILABLE)


def login_command(argv: list[str]) -> str:
    """A command line for the far side's shell that runs argv in a bash login shell (modules, SLURM_CONF)."""
    return shlex.join(["bash", "-lc", 'exec "$0" "$@"', *argv])


class Transport(ABC):
    """A connection to one login node."""

    name: str
    destination: Destination

    @abstractmethod
    def run(self, command: str, stdin: bytes | None = None, timeout: float | None = None) -> Completed:
        """Run a shell command line there and collect its output."""

    @abstractmethod
    def stream(self, command: str, out: Callable[[bytes], None]) -> int:
        """Run a command line there with a terminal, handing its output over as it comes; its exit code.

        A terminal, so that closing the connection (Ctrl-C here) hangs the far command up."""

    @abstractmethod
    def _send_tar(self, command: str, write: Callable[[io.RawIOBase], None]) -> Completed:
        """Run `command` with a tar stream written by `write` on its standard input."""

    def upload_tree(self, local: Path, root: str, name: str) -> None:
        """Copy the directory `local` to `root/name` there, whole or not at all."""
        command = shlex.join(["sh", "-c", UPLOAD_SCRIPT, "upload", root, name])

        def write(fh: io.RawIOBase) -> None:
            with tarfile.open(fileobj=fh, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for path in sorted(local.iterdir()):
                    tar.add(path, arcname=path.name)

        done = self._send_tar(command, write)
        if done.returncode == EXISTS:
            raise _unavailable(f"{root}/{name} exists already on {self.destination.hostname}")
        if done.returncode != 0:
            raise _unavailable(f"upload to {self.destination.hostname}:{root}/{name} failed: {done.stderr.strip() or done.returncode}")

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- paramiko


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}" if hasattr(key, "fingerprint") else key.get_name()


def check_host_key(dest: Destination, key: paramiko.PKey) -> None:
    """Refuse an unknown or changed host key, saying how to accept a new one after checking it."""
    keys = paramiko.HostKeys()
    for path in dest.known_hosts:
        if Path(path).is_file():
            try:
                keys.load(path)
            except (OSError, paramiko.SSHException) as exc:
                raise _unavailable(f"cannot read known hosts file {path}: {exc}") from None
    name = dest.known_hosts_name
    known = keys.lookup(name)
    if known is not None and key.get_name() in known:
        if known[key.get_name()] == key:
            return
        raise _unavailable(
            f"the host key of {name} has CHANGED (it now offers {_fingerprint(key)}): either the login node was"
            " reinstalled or someone is in the way. Ask the cluster's admins for the new fingerprint; once it"
            f" matches, remove the old line (ssh-keygen -R '{name}') and accept the new key"
        )
    where = dest.known_hosts[0] if dest.known_hosts else "~/.ssh/known_hosts"
    port = f"-p {dest.port} " if dest.port != 22 else ""
    raise _unavailable(
        f"the host key of {name} ({_fingerprint(key)}) is not in {where}: it is not accepted silently."
        f" Check the fingerprint with the cluster's admins, then add it: ssh-keyscan {port}{dest.hostname} >> {where}"
        " (or connect once with ssh and answer yes)"
    )


def _prompt_answers(title: str, instructions: str, prompts: list[tuple[str, bool]]) -> list[str]:
    """Keyboard-interactive prompts (a second factor): asked on the terminal, else read from standard input."""
    for text in (title, instructions):
        if text:
            print(text, file=sys.stderr)
    answers = []
    for prompt, echo in prompts:
        if sys.stdin is not None and sys.stdin.isatty():
            answers.append(input(prompt) if echo else getpass.getpass(prompt))
        else:
            print(prompt, end="", file=sys.stderr, flush=True)
            answers.append((sys.stdin.readline() if sys.stdin else "").rstrip("\n"))
    return answers


def _keys(dest: Destination) -> list[paramiko.PKey]:
    """Keys to offer: the agent's, then IdentityFile, then the default files (unless IdentitiesOnly)."""
    found: list[paramiko.PKey] = []
    try:
        found.extend(paramiko.Agent().get_keys())
    except paramiko.SSHException:
        pass
    files = list(dest.identity_files)
    if not dest.identities_only or not files:
        files += [str(Path.home() / ".ssh" / n) for n in ("id_ed25519", "id_ecdsa", "id_rsa")]
    for path in dict.fromkeys(files):
        if not Path(path).is_file():
            continue
        try:
            found.append(paramiko.PKey.from_path(path))
        except paramiko.PasswordRequiredException:
            print(f"note: {path} is encrypted: load it into ssh-agent (ssh-add {path})", file=sys.stderr)
        except (paramiko.SSHException, OSError, ValueError):
            continue
    return found


class ParamikoTransport(Transport):
    name = "paramiko"

    def __init__(self, dest: Destination, hops: int = 0, via: "ParamikoTransport | None" = None) -> None:
        self.destination = dest
        self._jump: ParamikoTransport | None = via
        sock = via.channel_to(dest) if via is not None else self._socket(dest, hops)
        try:
            self._t = paramiko.Transport(sock)
            self._t.start_client(timeout=CONNECT_TIMEOUT_S)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise _unavailable(f"SSH to {dest} failed: {exc or type(exc).__name__}") from None
        try:
            check_host_key(dest, self._t.get_remote_server_key())
            self._authenticate(dest)
        except BaseException:
            self.close()
            raise

    def channel_to(self, dest: Destination) -> paramiko.Channel:
        """A TCP stream to `dest` from this host (direct-tcpip): how ProxyJump is done, one hop after another."""
        try:
            return self._t.open_channel("direct-tcpip", (dest.hostname, dest.port), ("127.0.0.1", 0), timeout=CONNECT_TIMEOUT_S)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _unavailable(f"the jump host {self.destination} could not reach {dest.hostname}:{dest.port}: {exc}") from None

    def _socket(self, dest: Destination, hops: int) -> socket.socket | paramiko.Channel | paramiko.ProxyCommand:
        if dest.proxy_jump:
            if hops >= 8:
                raise _unavailable(f"ProxyJump for {dest.alias} goes round in circles (more than 8 hops)")
            config = load_config()
            first, *rest = dest.proxy_jump
            jump = ParamikoTransport(resolve(first, config), hops + 1)
            for hop in rest:
                jump = ParamikoTransport(resolve(hop, config), hops + 1, via=jump)
            self._jump = jump
            return jump.channel_to(dest)
        if dest.proxy_command:
            command = dest.proxy_command.replace("%h", dest.hostname).replace("%p", str(dest.port)).replace("%r", dest.user)
            return paramiko.ProxyCommand(command.replace("%%", "%"))
        try:
            return socket.create_connection((dest.hostname, dest.port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise _unavailable(f"cannot reach {dest.hostname}:{dest.port}: {exc.strerror or exc}") from None

    def _authenticate(self, dest: Destination) -> None:
        allowed: list[str] | None = None
        for key in _keys(dest):
            try:
                self._t.auth_publickey(dest.user, key)
            except paramiko.BadAuthenticationType as exc:
                allowed = list(exc.allowed_types)
                break
            except paramiko.AuthenticationException:
                continue
            if self._t.is_authenticated():
                return
        if allowed is None:
            try:
                self._t.auth_none(dest.user)
                if self._t.is_authenticated():
                    return
            except paramiko.BadAuthenticationType as exc:
                allowed = list(exc.allowed_types)
            except paramiko.SSHException:
                allowed = []
        if allowed and "keyboard-interactive" in allowed:
            try:
                self._t.auth_interactive(dest.user, _prompt_answers)
            except paramiko.AuthenticationException as exc:
                raise _unavailable(f"SSH to {dest}: keyboard-interactive authentication failed ({exc})") from None
            if self._t.is_authenticated():
                return
        self.close()
        raise _unavailable(
            f"SSH to {dest}: no key was accepted for user {dest.user}"
            + (f" (the server allows: {', '.join(allowed)})" if allowed else "")
            + "; load your key into ssh-agent or name it with IdentityFile in ~/.ssh/config"
        )

    def _session(self, pty: bool = False) -> paramiko.Channel:
        try:
            channel = self._t.open_session(timeout=CONNECT_TIMEOUT_S)
            if pty:
                channel.get_pty(term="dumb", width=200)
            return channel
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _unavailable(f"SSH to {self.destination} dropped: {exc}") from None

    def run(self, command: str, stdin: bytes | None = None, timeout: float | None = None) -> Completed:
        channel = self._session()
        channel.settimeout(timeout)
        try:
            channel.exec_command(command)
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = _drain(channel)
            return Completed(channel.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace"))
        except (socket.timeout, paramiko.SSHException, OSError, EOFError) as exc:
            raise _unavailable(f"SSH to {self.destination}: {command[:80]!r} failed: {exc or 'timed out'}") from None
        finally:
            channel.close()

    def stream(self, command: str, out: Callable[[bytes], None]) -> int:
        channel = self._session(pty=True)
        try:
            channel.exec_command(command)
            while True:
                data = channel.recv(65536)
                if not data:
                    break
                out(data)
            return channel.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _unavailable(f"SSH to {self.destination} dropped: {exc}") from None
        finally:
            channel.close()

    def _send_tar(self, command: str, write: Callable[[io.RawIOBase], None]) -> Completed:
        channel = self._session()
        try:
            channel.exec_command(command)
            write(_ChannelWriter(channel))
            channel.shutdown_write()
            out, err = _drain(channel)
            return Completed(channel.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace"))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _unavailable(f"upload to {self.destination} dropped: {exc}") from None
        finally:
            channel.close()

    def close(self) -> None:
        if getattr(self, "_t", None) is not None:
            self._t.close()
        if self._jump is not None:
            self._jump.close()


class _ChannelWriter(io.RawIOBase):
    """A channel's standard input as a file for tarfile's stream mode (no buffering of its own to flush late)."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._channel.sendall(data)
        return len(data)


def _drain(channel: paramiko.Channel) -> tuple[bytes, bytes]:
    """Both output streams to their end, read side by side so that neither fills up and blocks the other."""
    err = bytearray()

    def read_err() -> None:
        while chunk := channel.recv_stderr(65536):
            err.extend(chunk)

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    out = bytearray()
    while chunk := channel.recv(65536):
        out.extend(chunk)
    reader.join()
    return bytes(out), bytes(err)


# ---------------------------------------------------------------- the ssh executable


class OpenSSHTransport(Transport):
    """The user's own `ssh`, for what paramiko cannot do (GSSAPI, ControlMaster, FIDO keys, Match blocks)."""

    name = "openssh"

    def __init__(self, dest: Destination) -> None:
        self.destination = dest
        base = ["ssh", "-o", "StrictHostKeyChecking=yes", "-o", f"ConnectTimeout={int(CONNECT_TIMEOUT_S)}"]
        if dest.config_file:
            base += ["-F", dest.config_file]
        target = dest.alias if dest.alias != dest.hostname else dest.hostname
        self._base = base + ["-p", str(dest.port), "-l", dest.user, target]
        probe = self.run("true")
        if probe.returncode != 0:
            raise _unavailable(f"ssh to {dest} failed: {probe.stderr.strip() or f'exit {probe.returncode}'}")

    def run(self, command: str, stdin: bytes | None = None, timeout: float | None = None) -> Completed:
        try:
            done = subprocess.run([*self._base, "--", command], input=stdin or b"", capture_output=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise _unavailable("the ssh executable is not on PATH") from None
        except subprocess.TimeoutExpired:
            raise _unavailable(f"ssh to {self.destination}: {command[:80]!r} timed out") from None
        return Completed(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))

    def stream(self, command: str, out: Callable[[bytes], None]) -> int:
        proc = subprocess.Popen([*self._base[:-1], "-tt", self._base[-1], "--", command], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        try:
            for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
                out(chunk)
        finally:
            proc.stdout.close()
        return proc.wait()

    def _send_tar(self, command: str, write: Callable[[io.RawIOBase], None]) -> Completed:
        proc = subprocess.Popen([*self._base, "--", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin is not None
        err: list[bytes] = []
        reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        try:
            write(proc.stdin)  # type: ignore[arg-type]
        except BrokenPipeError:
            pass
        finally:
            proc.stdin.close()
        out = proc.stdout.read()  # type: ignore[union-attr]
        code = proc.wait()
        reader.join()
        return Completed(code, out.decode(errors="replace"), b"".join(err).decode(errors="replace"))

    def close(self) -> None:
        pass


def connect(dest: Destination, choice: str = "auto") -> Transport:
    """paramiko unless asked otherwise, or unless the SSH config asks for what only `ssh` does."""
    if choice == "openssh" or (choice == "auto" and dest.unsupported):
        if choice == "auto":
            print(f"note: using the ssh executable for {dest.alias}: paramiko cannot honour"
                  f" {', '.join(dest.unsupported)} of {dest.config_file}", file=sys.stderr)
        return OpenSSHTransport(dest)
    return ParamikoTransport(dest)


def open_transport(remote: str, choice: str = "auto") -> Transport:
    return connect(resolve(remote), choice)

