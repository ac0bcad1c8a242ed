"""Where `--remote HOST` really goes: `[USER@]HOST[:PORT]` read through the user's ~/.ssh/config.

paramiko parses the file but acts on little of it; this module turns a
lookup into what the transports need (address, user, port, keys, known
hosts, proxy command or jump hosts) and names the directives paramiko
cannot honour, so that the caller can fall back to the ssh executable.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass
from pathlib import Path

import paramiko

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

CONFIG_ENV = "CLUSTERCTL_SSH_CONFIG"  # another config file than ~/.ssh/config (tests, CI)
_TARGET = re.compile(r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>\d{1,5}))?$")

# Directives paramiko does not act on, where ignoring them would connect differently than `ssh` does.
UNSUPPORTED = {
    "gssapiauthentication": lambda v: v.lower() == "yes",
    "controlmaster": lambda v: v.lower() not in ("no", ""),
    "controlpath": lambda v: v.lower() != "none",
    "securitykeyprovider": lambda v: True,
    "pkcs11provider": lambda v: v.lower() != "none",
    "certificatefile": lambda v: True,
}


@dataclass(frozen=True)
class Destination:
    """One SSH endpoint as ~/.ssh/config resolves it."""

    alias: str  # what the user typed (the Host pattern lookup key)
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    known_hosts: tuple[str, ...] = ()
    proxy_command: str | None = None
    proxy_jump: tuple[str, ...] = ()  # jump hosts, first hop first
    unsupported: tuple[str, ...] = ()  # directives only the ssh executable honours
    config_file: str | None = None

    @property
    def known_hosts_name(self) -> str:
        """How known_hosts names this host: `host` on port 22, `[host]:port` elsewhere."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}" + (f" (as {self.alias})" if self.alias != self.hostname else "")


def config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or Path.home() / ".ssh" / "config").expanduser()


def load_config() -> paramiko.SSHConfig:
    path = config_path()
    if not path.is_file():
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except (OSError, ValueError, paramiko.ssh_exception.ConfigParseError) as exc:
        raise ClusterctlError(f"cannot read the SSH config {path}: {exc}", ExitCode.BACKEND_UNAVAILABLE) from None


def parse_target(text: str) -> tuple[str | None, str, int | None]:
    """`[USER@]HOST[:PORT]` into its parts; anything else is refused with the form expected."""
    match = _TARGET.match(text.strip())
    if not match:
        raise ClusterctlError(
            f"--remote {text!r}: expected [USER@]HOST[:PORT] or a Host alias of your SSH config", ExitCode.USAGE
        )
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        raise ClusterctlError(f"--remote {text!r}: port {port} is not between 1 and 65535", ExitCode.USAGE)
    return match["user"], match["host"].strip("[]"), port


def resolve(text: str, config: paramiko.SSHConfig | None = None) -> Destination:
    """The destination `text` names, with ~/.ssh/config applied as OpenSSH applies it (first value wins)."""
    config = config if config is not None else load_config()
    user, host, port = parse_target(text)
    found = config.lookup(host)
    known = found.get("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2")
    jumps = found.get("proxyjump", "")
    unsupported = tuple(sorted(k for k, ok in UNSUPPORTED.items() if k in found and ok(str(found[k]))))
    return Destination(
        alias=host,
        hostname=found.get("hostname", host),
        port=port or int(found.get("port", 22)),
        user=user or found.get("user") or getpass.getuser(),
        identity_files=tuple(found.get("identityfile", [])),
        identities_only=str(found.get("identitiesonly", "no")).lower() == "yes",
        known_hosts=tuple(os.path.expanduser(p) for p in str(known).split()),
        proxy_command=None if str(found.get("proxycommand", "none")).lower() == "none" else found["proxycommand"],
        proxy_jump=() if not jumps or jumps.lower() == "none" else tuple(j.strip() for j in jumps.split(",")),
        unsupported=unsupported,
        config_file=str(config_path()) if config_path().is_file() else None,
    )  # StrictHostKeyChecking is not read: an unknown or changed host key is always refused
