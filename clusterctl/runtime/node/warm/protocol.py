"""What a warm client and its node's server say to each other (one definition for both sides).

One stream connection per child, on an abstract Unix socket named
`<CLUSTERCTL_WARM>.<node>` (no file to leave behind; the server takes only
its own user's connections, by SO_PEERCRED, and a client talks only to a
server of its own user's, the same way). Messages are JSON objects, each
preceded by its length (4 bytes, big-endian). The client opens with a `run`
request carrying its standard input, output and error as file descriptors
(SCM_RIGHTS); the server answers `{"pid": P}` once the child is forked, or
`{"cold": why}` when it will not fork one (the client then starts cold);
then the client may send `{"signal": N}` any number of times, and the server
ends with `{"exit": code}` or `{"killed": signal}`. A closed connection ends
the child: the client is gone, so is the task srun tracks. An `owns` request
(`{"op": "owns", "pid": P, "token": T}`, answered `{"ok": bool}`) lets the
fault injector check a forked rank's attempt token, which its /proc environ
(the server's, from exec) cannot show. A `ready` request (`{"op": "ready"}`,
answered `{"ok": true}`) is answered only once the server's imports are done,
as every request is: the server listens from its start and serves after.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
from typing import Any

from clusterctl.runtime.node import leftovers

HEADER = struct.Struct(">I")
SO_PEERCRED = getattr(socket, "SO_PEERCRED", 17)
CRED = struct.Struct("3i")  # pid, uid, gid
MAX_MESSAGE = 64 << 20  # a request carries the rank's environment: large, never this large
FDS = 3  # stdin, stdout, stderr


class ProtocolError(Exception):
    """The other side said something that is not a message, or went away mid-message."""


def node() -> str:
    """This node's name as Slurm gives it (emulated nodes share one hostname)."""
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename


def socket_name(prefix: str, node: str) -> str:
    """The abstract socket of `node`'s server (the leading NUL makes it abstract)."""
    return f"\0{prefix}.{node}"


def pid_file(prefix: str, node: str) -> str:
    """Where `node`'s server writes its pid once it listens: a client refused can tell "not yet" from "ended"."""
    return os.path.join(leftovers.tmpdir(), f"{prefix}.{node}.pid")


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    data = HEADER.pack(len(body)) + body
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        if sent < len(data):
            sock.sendall(data[sent:])
    else:
        sock.sendall(data)


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(size - got)
        if not chunk:
            raise ProtocolError("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket, with_fds: bool = False) -> tuple[dict[str, Any], list[int]]:
    """One message (and the descriptors sent with it: with_fds asks for them, on the first recv)."""
    fds: list[int] = []
    if with_fds:
        data, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, FDS)
        if not data:
            raise ProtocolError("connection closed")
        if len(data) < HEADER.size:
            data += _exactly(sock, HEADER.size - len(data))
    else:
        data = _exactly(sock, HEADER.size)
    (size,) = HEADER.unpack(data)
    if size > MAX_MESSAGE:
        raise ProtocolError(f"a message of {size} bytes")
    try:
        message = json.loads(_exactly(sock, size))
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("not a JSON object")
    return message, fds


class Reader:
    """Messages out of bytes as they arrive (the server reads a child's connection only when it is readable)."""

    def __init__(self) -> None:
        self.data = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self.data += data
        out = []
        while len(self.data) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.data)
            if size > MAX_MESSAGE:
                raise ProtocolError(f"a message of {size} bytes")
            if len(self.data) < HEADER.size + size:
                break
            body, self.data = self.data[HEADER.size:HEADER.size + size], self.data[HEADER.size + size:]
            with contextlib.suppress(ValueError):
                message = json.loads(body)
                if isinstance(message, dict):
                    out.append(message)
        return out


def peer(conn: socket.socket) -> tuple[int, int]:
    """The process at the other end of a Unix socket: its pid and uid, as the kernel vouches for them."""
    pid, uid, _gid = CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, SO_PEERCRED, CRED.size))
    return pid, uid


def not_mine(sock: socket.socket) -> str:
    """Why the server at the other end is not to be told anything ('' when it runs as this user). An abstract
    socket's name is anyone's to take first: a request carries the rank's environment, the attempt's token and
    the secret_env values with it."""
    try:
        _, uid = peer(sock)
    except OSError as exc:
        return f"its owner cannot be checked ({exc.strerror or exc})"
    return "" if uid == os.geteuid() else f"it is held by uid {uid}, not this user's (uid {os.geteuid()})"


def owns(prefix: str, node: str, pid: int, token: str, timeout_s: float = 5.0) -> bool:
    """Does `node`'s server have a child `pid` that it forked with this attempt token? False when it cannot say."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(socket_name(prefix, node))
        if not_mine(sock):
            return False
        send(sock, {"op": "owns", "pid": pid, "token": token})
        answer, _ = receive(sock)
        return answer.get("ok") is True
    except (OSError, ProtocolError):
        return False
    finally:
        sock.close()
