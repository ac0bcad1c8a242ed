"""A stand-in SSH server that demands a keyboard-interactive answer (a site's second factor).

Debian's sshd asks keyboard-interactive questions only through PAM, which the lab does not
configure; paramiko's server class asks exactly one ``Verification code: `` prompt instead.
After that it behaves like a login node for what clusterctl needs: ``exec`` runs the command
with ``bash -c`` (cwd and environment given at start, plus variables the client sends),
relaying stdin, stdout, stderr and the exit status, and the ``sftp`` subsystem serves the
local filesystem.  Each connection is served in its own thread until :meth:`stop`.

    server = start_kbdint_server("123456", cwd=tmp_path)
    ... HostEntry("mfa", server, identity_file=None) in write_client_config ...
    server.stop()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from .lab import _track, _untrack, generate_key, known_hosts_line

PROMPT = "Verification code: "


class _Interface(paramiko.ServerInterface):
    """One connection's policy: keyboard-interactive only, exec and sftp channels."""

    def __init__(self, server: KbdIntServer) -> None:
        self.server = server
        self.env: dict[str, str] = {}
        self.user = ""

    def get_allowed_auths(self, username: str) -> str:
        return "keyboard-interactive"

    def check_auth_password(self, username: str, password: str) -> int:
        return paramiko.AUTH_FAILED

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_FAILED

    def check_auth_interactive(self, username: str, submethods: str) -> paramiko.InteractiveQuery:
        self.user = username
        return paramiko.InteractiveQuery("", "", (PROMPT, False))

    def check_auth_interactive_response(self, responses: list[str]) -> int:
        answers = list(responses)
        with self.server._lock:
            self.server.answers.append(answers)
        ok = answers == [self.server.answer] and self.user == self.server.user
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_env_request(self, channel: paramiko.Channel, name: bytes, value: bytes) -> bool:
        key = name.decode() if isinstance(name, bytes) else name
        self.env[key] = value.decode() if isinstance(value, bytes) else value
        return True

    def check_channel_pty_request(self, *args: Any) -> bool:
        return True  # accepted and ignored: commands run without a terminal

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        return False

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        cmd = command.decode(errors="replace") if isinstance(command, bytes) else command
        with self.server._lock:
            self.server.commands.append(cmd)
        env = {**os.environ, **self.server.env, **self.env}
        threading.Thread(
            target=self.server._run, args=(channel, cmd, env), daemon=True, name="kbdint-exec"
        ).start()
        return True


class _SftpHandle(paramiko.SFTPHandle):
    def stat(self) -> Any:
        try:
            return paramiko.SFTPAttributes.from_stat(os.fstat(self.readfile.fileno()))
        except OSError as e:
            return paramiko.SFTPServer.convert_errno(e.errno)

    def chattr(self, attr: paramiko.SFTPAttributes) -> int:
        try:
            paramiko.SFTPServer.set_file_attr(self.filename, attr)
            return paramiko.SFTP_OK
        except OSError as e:
            return paramiko.SFTPServer.convert_errno(e.errno)


class _Sftp(paramiko.SFTPServerInterface):
    """The local filesystem over SFTP (absolute paths; relative ones from the server's cwd)."""

    def __init__(self, server: paramiko.ServerInterface, *args: Any, **kw: Any) -> None:
        super().__init__(server, *args, **kw)
        self.root = Path(server.server.cwd)  # type: ignore[attr-defined]

    def _path(self, path: str) -> str:
        return str(self.root / path) if not path.startswith("/") else path

    def _err(self, e: OSError) -> int:
        return paramiko.SFTPServer.convert_errno(e.errno)

    def canonicalize(self, path: str) -> str:
        return os.path.normpath(self._path(path))

    def list_folder(self, path: str) -> Any:
        p = self._path(path)
        try:
            out = []
            for name in os.listdir(p):
                attr = paramiko.SFTPAttributes.from_stat(os.lstat(os.path.join(p, name)))
                attr.filename = name
                out.append(attr)
            return out
        except OSError as e:
            return self._err(e)

    def stat(self, path: str) -> Any:
        try:
            return paramiko.SFTPAttributes.from_stat(os.stat(self._path(path)))
        except OSError as e:
            return self._err(e)

    def lstat(self, path: str) -> Any:
        try:
            return paramiko.SFTPAttributes.from_stat(os.lstat(self._path(path)))
        except OSError as e:
            return self._err(e)

    def open(self, path: str, flags: int, attr: paramiko.SFTPAttributes) -> Any:
        p = self._path(path)
        try:
            mode = getattr(attr, "st_mode", None) or 0o666
            fd = os.open(p, flags | getattr(os, "O_BINARY", 0), mode & 0o7777)
        except OSError as e:
            return self._err(e)
        if flags & os.O_WRONLY:
            fstr = "ab" if flags & os.O_APPEND else "wb"
        elif flags & os.O_RDWR:
            fstr = "a+b" if flags & os.O_APPEND else "r+b"
        else:
            fstr = "rb"
        handle = _SftpHandle(flags)
        handle.filename = p
        handle.readfile = handle.writefile = os.fdopen(fd, fstr)
        return handle

    def _call(self, fn: Any, *args: Any) -> int:
        try:
            fn(*args)
            return paramiko.SFTP_OK
        except OSError as e:
            return self._err(e)

    def remove(self, path: str) -> int:
        return self._call(os.remove, self._path(path))

    def rename(self, oldpath: str, newpath: str) -> int:
        if os.path.exists(self._path(newpath)):
            return paramiko.SFTP_FAILURE  # SFTPv3 rename does not overwrite
        return self._call(os.rename, self._path(oldpath), self._path(newpath))

    def posix_rename(self, oldpath: str, newpath: str) -> int:
        return self._call(os.rename, self._path(oldpath), self._path(newpath))

    def mkdir(self, path: str, attr: paramiko.SFTPAttributes) -> int:
        mode = getattr(attr, "st_mode", None) or 0o777
        return self._call(os.mkdir, self._path(path), mode & 0o7777)

    def rmdir(self, path: str) -> int:
        return self._call(os.rmdir, self._path(path))

    def chattr(self, path: str, attr: paramiko.SFTPAttributes) -> int:
        return self._call(paramiko.SFTPServer.set_file_attr, self._path(path), attr)

    def symlink(self, target_path: str, path: str) -> int:
        return self._call(os.symlink, target_path, self._path(path))

    def readlink(self, path: str) -> Any:
        try:
            return os.readlink(self._path(path))
        except OSError as e:
            return self._err(e)


@dataclass(eq=False)
class KbdIntServer:
    """A running keyboard-interactive server; ``answers`` and ``commands`` record what it got."""

    host: str
    port: int
    user: str
    answer: str
    cwd: Path
    env: dict[str, str]
    host_key_line: str
    state_dir: Path
    answers: list[list[str]] = field(default_factory=list)
    """Every keyboard-interactive response list received, right or wrong."""
    commands: list[str] = field(default_factory=list)
    """Every exec request's command line."""
    user_key: None = None  # no key: write_client_config writes no IdentityFile
    _sock: socket.socket | None = field(default=None, repr=False)
    _host_key: paramiko.PKey | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _transports: list[paramiko.Transport] = field(default_factory=list, repr=False)
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _stopping: threading.Event = field(default_factory=threading.Event, repr=False)
    _owns_state: bool = field(default=False, repr=False)

    def _serve(self) -> None:
        assert self._sock is not None
        sock = self._sock
        sock.settimeout(0.2)  # so that stop() is noticed: close() does not wake accept()
        while not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=self._connection, args=(conn,), daemon=True,
                             name="kbdint-conn").start()

    def _connection(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        transport.add_server_key(self._host_key)
        transport.set_subsystem_handler("sftp", paramiko.SFTPServer, _Sftp)
        with self._lock:
            if self._stopping.is_set():
                transport.close()
                return
            self._transports.append(transport)
        try:
            transport.start_server(server=_Interface(self))
        except (paramiko.SSHException, EOFError, OSError):
            transport.close()
            return
        # Requests on channels are served by paramiko's thread and our exec threads; accept()
        # only takes them off the queue, and they are kept: a dropped Channel closes itself.
        channels: list[paramiko.Channel] = []
        while transport.is_active() and not self._stopping.is_set():
            channel = transport.accept(0.5)
            if channel is not None:
                channels = [c for c in channels if not c.closed] + [channel]

    def _run(self, channel: paramiko.Channel, cmd: str, env: Mapping[str, str]) -> None:
        """Run one exec request, relaying the streams, then send the exit status."""
        try:
            proc = subprocess.Popen(
                ["bash", "-c", cmd], cwd=self.cwd, env=dict(env), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )
        except OSError as e:
            channel.sendall_stderr(f"kbdint: cannot run bash: {e}\n".encode())
            channel.send_exit_status(127)
            channel.close()
            return
        with self._lock:
            self._procs.append(proc)

        def pump_in() -> None:
            try:
                while True:
                    data = channel.recv(32768)
                    if not data:
                        break
                    proc.stdin.write(data)  # type: ignore[union-attr]
                    proc.stdin.flush()  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]

        def pump_out(stream: Any, send: Any) -> None:
            try:
                for chunk in iter(lambda: stream.read1(32768), b""):
                    send(chunk)
            except (OSError, EOFError, paramiko.SSHException):
                pass

        threading.Thread(target=pump_in, daemon=True).start()
        outs = [threading.Thread(target=pump_out, args=(proc.stdout, channel.sendall), daemon=True),
                threading.Thread(target=pump_out, args=(proc.stderr, channel.sendall_stderr),
                                 daemon=True)]
        for t in outs:
            t.start()
        code = proc.wait()
        for t in outs:
            t.join()
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            channel.send_exit_status(code if code >= 0 else 128 - code)
            channel.shutdown_write()
            channel.close()

    def stop(self) -> None:
        """Stop listening, drop every connection and kill commands still running."""
        self._stopping.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
        with self._lock:
            transports, procs = list(self._transports), list(self._procs)
        for t in transports:
            t.close()
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, 9)
                p.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)
        _untrack(self)
        if self._owns_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self._owns_state = False


def start_kbdint_server(
    answer: str,
    cwd: Path | str,
    *,
    env: Mapping[str, str] | None = None,
    user: str = "root",
    host: str = "127.0.0.1",
    state_dir: Path | None = None,
) -> KbdIntServer:
    """Start serving on host:free port; only ``user`` answering ``answer`` gets in."""
    owns = state_dir is None
    state = Path(tempfile.mkdtemp(prefix="clusterctl-kbdint-")) if owns else Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    key_path = generate_key(state / "host_ed25519", "kbdint-host")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    server = KbdIntServer(
        host=host, port=port, user=user, answer=answer, cwd=Path(cwd), env=dict(env or {}),
        host_key_line=known_hosts_line(host, port, state / "host_ed25519.pub"),
        state_dir=state, _sock=sock,
        _host_key=paramiko.Ed25519Key.from_private_key_file(str(key_path)), _owns_state=owns,
    )
    server._thread = threading.Thread(target=server._serve, daemon=True, name="kbdint-accept")
    server._thread.start()
    _track(server)
    return server


@contextlib.contextmanager
def kbdint_server(answer: str, cwd: Path | str, **kw: Any) -> Iterator[KbdIntServer]:
    """:func:`start_kbdint_server` as a context manager."""
    server = start_kbdint_server(answer, cwd, **kw)
    try:
        yield server
    finally:
        server.stop()
