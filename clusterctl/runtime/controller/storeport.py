"""Where the controller's rendezvous store listens: a port reserved before torch is imported, on the rendezvous
address only, with the kernel's largest backlog, then handed to torch's TCPStore as it is.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

BIND_TRIES = 64
SOMAXCONN = Path("/proc/sys/net/core/somaxconn")
BACKLOG_FALLBACK = 65535  # when somaxconn cannot be read: the kernel caps listen()'s backlog at it anyway


def listen_backlog() -> int:
    """The largest listen backlog the kernel allows (net.core.somaxconn).

    At 16,384 ranks a 4,096 backlog overflowed thousands of times and each
    dropped connect was retried 1-3 s later. torch's store listens again
    with its own 16,384 once it starts; the kernel caps both at somaxconn,
    which only the admin can raise (see docs/admin/scale.md).
    """
    try:
        return max(1, min(int(SOMAXCONN.read_text()), 2**31 - 1))
    except (OSError, ValueError):
        return BACKLOG_FALLBACK


def reserve_port(port: int, port_range: tuple[int, int], address_family: str = "ipv4",
                 address: str = "", log: Callable[[str], None] = print) -> tuple[socket.socket, int]:
    """A listening socket on `port` or the next free port in the range (standard library: fast).

    The batch script waits only for this, so srun starts while the controller
    is still importing torch: early ranks' connections wait in the backlog.
    The socket is handed to the TCPStore as is (no window in which another
    process could take the port). It is IPv4 where the host has IPv4:
    torch's store server looks up the name of every peer it accepts, and an
    IPv4-mapped IPv6 peer address is never in /etc/hosts, so each lookup went
    to DNS; one dropped query stalls the whole store for the resolver's 5 s.
    On an IPv6 site (network.address_family) it is a dual-stack IPv6 socket.

    It listens on `address` only, the rendezvous address the ranks are given
    (MASTER_ADDR): the store has no authentication, so an interface the site
    did not name for the rendezvous (a login or management network) must not
    reach it. An address this host does not have (a site table that names a
    NAT address, say) falls back to every address, with a warning; "" is
    every address.
    """
    lo, hi = port_range
    last: OSError | None = None
    for family, host in _bind_targets(address, address_family, log):
        for i in range(BIND_TRIES):
            candidate = lo + (port - lo + i) % (hi - lo + 1)
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:  # the host lacks this address family: try the other
                last = exc
                break
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store does: TIME_WAIT is not "taken"
                if family == socket.AF_INET6 and not host:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind((host, candidate))
                sock.listen(listen_backlog())
                return sock, candidate
            except OSError as exc:
                sock.close()
                last = exc
                if exc.errno == errno.EADDRNOTAVAIL:
                    log(f"cannot listen on {host} (not an address of this host): listening on every address")
                    break
    raise RuntimeError(f"no free port among {BIND_TRIES} tried from {port} in {lo}-{hi}: {last}")


def _bind_targets(address: str, address_family: str, log: Callable[[str], None]) -> list[tuple[socket.AddressFamily, str]]:
    """Where to try listening: the rendezvous address (its own family), then every address of each family."""
    families = [socket.AF_INET6, socket.AF_INET] if address_family == "ipv6" else [socket.AF_INET, socket.AF_INET6]
    targets: list[tuple[socket.AddressFamily, str]] = []
    if address:
        try:
            found = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
        except OSError as exc:
            log(f"cannot resolve the rendezvous address {address} ({exc}): listening on every address")
        else:
            family, sockaddr = found[0][0], found[0][4]
            targets.append((family, str(sockaddr[0])))
            families = [family]  # the wildcard fallback stays in the address's family: the ranks connect to it
    return targets + [(family, "") for family in families]


def local_host(listener: socket.socket) -> str:
    """Where this process's own clients reach a socket it listens on: its address, loopback for the wildcard."""
    host = str(listener.getsockname()[0])
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1" if listener.family == socket.AF_INET else "::1"
    return host


def host_store(listener: socket.socket, world: int, timeout_s: float):  # noqa: ANN201 - torch type
    """torch's TCPStore served on the already listening socket (the store owns it from here)."""
    from torch.distributed import TCPStore

    store = TCPStore(
        local_host(listener),
        listener.getsockname()[1],
        world_size=world,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
        master_listen_fd=listener.fileno(),
        use_libuv=True,
    )
    listener.detach()
    return store
