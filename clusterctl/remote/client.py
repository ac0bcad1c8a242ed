"""The login node's clusterctl, spoken to over one SSH connection.

Every command runs there in a bash login shell (non-interactive shells lack
SLURM_CONF and modules). Its version is checked first: a laptop and a login
node that disagree on the run directory's format are refused, naming both.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from clusterctl import __version__, rundir
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.remote.transport import Completed, Transport, login_command, open_transport

REMOTE_ENV = "CLUSTERCTL_REMOTE"  # a default for --remote
COMMAND_ENV = "CLUSTERCTL_REMOTE_COMMAND"  # the clusterctl command on the login node, when no site says
FORMAT_ENV = "CLUSTERCTL_EXPECT_FORMAT"  # set on every command run there: a clusterctl of another format refuses it


@dataclass
class Remote:
    """A connected login node and the clusterctl command there."""

    transport: Transport
    command: str = "clusterctl"
    facts: dict[str, Any] | None = None

    @property
    def host(self) -> str:
        return self.transport.destination.hostname

    def argv(self, args: list[str]) -> list[str]:
        """The far command: this side's run-directory format travels with it (cli.refuse_other_format)."""
        return ["env", f"{FORMAT_ENV}={rundir.FORMAT}", self.command, *args]

    def call(self, args: list[str], stdin: bytes | None = None, timeout: float | None = None) -> Completed:
        return self.transport.run(login_command(self.argv(args)), stdin=stdin, timeout=timeout)

    def json(self, args: list[str], timeout: float | None = None) -> Any:
        """Run a command that prints JSON; its own error message (and exit code) when it fails."""
        done = self.call(args, timeout=timeout)
        if done.returncode != 0:
            raise ClusterctlError(self._failure(args, done), _code(done.returncode))
        try:
            return json.loads(done.stdout)
        except ValueError:
            raise ClusterctlError(f"clusterctl {args[0]} on {self.host} printed no JSON: {done.stdout[-300:]!r}",
                                  ExitCode.BACKEND_UNAVAILABLE) from None

    def _failure(self, args: list[str], done: Completed) -> str:
        said = done.stderr.strip().removeprefix("error: ") or done.stdout.strip()[-500:]
        if done.returncode == 127:
            return (f"{self.command!r} was not found on {self.host} (through its login shell's PATH): install clusterctl"
                    " there, or give its path as the site's login.clusterctl or in $" + COMMAND_ENV)
        return f"on {self.host}: {said or f'clusterctl {args[0]} exited {done.returncode}'}"

    def check(self, expand: list[str] = ()) -> dict[str, Any]:
        """The login node's clusterctl facts (with the suspects of the runs roots in `expand`); refused unless it
        writes the run directories this one does."""
        args = ["version", "--json", *[a for path in expand for a in ("--expand", path)], *(["--suspects"] if expand else [])]
        done = self.transport.run(login_command([self.command, *args]), timeout=120)  # no format of ours: its own facts
        if done.returncode != 0:
            raise ClusterctlError(self._failure(args, done), _code(done.returncode))
        try:
            found = json.loads(done.stdout)
        except ValueError:
            raise ClusterctlError(f"clusterctl version on {self.host} printed no JSON: {done.stdout[-300:]!r}",
                                  ExitCode.BACKEND_UNAVAILABLE) from None
        if found.get("run_dir_format") != rundir.FORMAT:
            raise ClusterctlError(
                f"clusterctl here is {__version__} (run directory format {rundir.FORMAT}) but on {self.host} it is"
                f" {found.get('version')} (format {found.get('run_dir_format')}): install the same release on both",
                ExitCode.BACKEND_UNAVAILABLE,
            )
        self.facts = found
        return found

    def forward(self, args: list[str]) -> int:
        """Run a command there, its output shown here as it comes; its exit code."""
        write = sys.stdout.buffer.write if hasattr(sys.stdout, "buffer") else (lambda b: sys.stdout.write(b.decode(errors="replace")))

        def out(data: bytes) -> None:
            write(data.replace(b"\r\n", b"\n"))
            sys.stdout.flush()

        return self.transport.stream(login_command(self.argv(args)), out)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "Remote":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _code(returncode: int) -> int:
    return returncode if returncode in {int(c) for c in ExitCode} else int(ExitCode.BACKEND_UNAVAILABLE)


def target(remote: str | None) -> str | None:
    """--remote as given, else $CLUSTERCTL_REMOTE; None to work here."""
    chosen = remote if remote is not None else os.environ.get(REMOTE_ENV)
    return chosen or None


def connect(remote: str, command: str | None = None, transport: str = "auto", expand: list[str] | None = None) -> Remote:
    """Connect; one connection for everything the command does.

    With `expand` (what submit needs: paths expanded there), the far clusterctl's version is asked first
    and a different run-directory format refused before anything is shipped; every other command carries
    this side's format along and a far clusterctl of another format refuses to run it."""
    link = open_transport(remote, transport)
    found = Remote(link, command or os.environ.get(COMMAND_ENV) or "clusterctl")
    if expand is not None:
        try:
            found.check(expand)
        except BaseException:
            link.close()
            raise
    return found
