"""pytest plugin: real OpenSSH servers on 127.0.0.1 (tests/sshlab/lab.py), enabled from the
top-level conftest's ``pytest_plugins``.

Fixtures (tests that use any of them are marked ``ssh``, so ``-m "not ssh"`` leaves them out):

``ssh_lab`` (one per test run)
    A running :class:`~tests.sshlab.lab.SshLab`: private sshd, root logs in with ``user_key``,
    ``host_key_line`` is what known_hosts must hold.  Pass it to
    :func:`~tests.sshlab.lab.write_client_config` to get a laptop's ``~/.ssh/config``.
``ssh_bastion`` (one per test run)
    A second SshLab that forwards (direct-tcpip) to ``ssh_lab``: ProxyJump tests.
``kbdint_server`` (one per test)
    A :class:`~tests.sshlab.kbdint.KbdIntServer` that asks ``Verification code: `` and accepts
    only ``kbdint_server.answer``; commands run with ``bash -c`` in ``kbdint_server.cwd``
    (a directory under the test's tmp_path).

``ssh_lab`` stands in front of the Slurm test cluster as a login node does: its login shells
(``bash -lc``, not plain commands) read a ``~/.profile`` that exports the Slurm lab's
SLURM_CONF and puts this checkout's ``.venv/bin`` (clusterctl) first on PATH.  That home is
``ssh_lab.home``, a lab directory only sshd's children see as root's home.  The Slurm lab is
not started by this fixture: use ``slurm_lab`` too when a test needs it.

sshd is installed with apt when missing (as ``make sysdeps`` does).  When that or starting
the server fails, the tests are skipped with the reason, or fail when ``CI`` is set.
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported lazily: paramiko is only loaded when a test uses a fixture
    from tests.sshlab.kbdint import KbdIntServer
    from tests.sshlab.lab import SshLab

SSH_FIXTURES = frozenset({"ssh_lab", "ssh_bastion", "kbdint_server"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ssh: needs the real OpenSSH test servers (tests/sshlab)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses an ssh fixture ``ssh`` (directly or through other fixtures)."""
    for item in items:
        if SSH_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ssh)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"ssh test servers unavailable (CI is set): {reason}", pytrace=False)
    pytest.skip(f"ssh test servers unavailable: {reason}")


def _start(tmp_path_factory: pytest.TempPathFactory, name: str, profile: str | None = None) -> SshLab:
    from tests.sshlab.lab import LabUnavailable, start_lab

    if not sys.platform.startswith("linux"):
        _unavailable(f"needs Linux, this is {sys.platform}")
    if os.geteuid() != 0:
        _unavailable("a private sshd that logs in as root needs root")
    try:
        return start_lab(tmp_path_factory.mktemp(name), name=name, profile=profile)
    except LabUnavailable as e:
        _unavailable(str(e))
    except (OSError, ImportError) as e:
        _unavailable(f"{type(e).__name__}: {e}")
    raise AssertionError("unreachable")


def login_profile() -> str:
    """The target's ~/.profile: what a cluster's login shell sets (see module docstring)."""
    from tests.slurmlab.plugin import DEFAULT_STATE_DIR

    slurm_dir = os.path.abspath(os.environ.get("CLUSTERCTL_LAB_DIR") or DEFAULT_STATE_DIR)
    venv_bin = Path(__file__).resolve().parents[2] / ".venv" / "bin"
    return (
        "# clusterctl ssh lab: a login node's profile\n"
        f"export SLURM_CONF={shlex.quote(slurm_dir + '/slurm.conf')}\n"
        f"export PATH={shlex.quote(str(venv_bin))}:$PATH\n"
    )


@pytest.fixture(scope="session")
def ssh_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    """The target server (see module docstring); stopped at the end of the test run."""
    lab = _start(tmp_path_factory, "sshlab-target", login_profile())
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture(scope="session")
def ssh_bastion(ssh_lab: SshLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    """A jump host in front of ``ssh_lab`` (both on 127.0.0.1, TCP forwarding allowed)."""
    lab = _start(tmp_path_factory, "sshlab-bastion")
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture
def kbdint_server(tmp_path: Path) -> Iterator[KbdIntServer]:
    """A keyboard-interactive server; its ``answer`` is a fresh 6-digit code."""
    from tests.sshlab.kbdint import start_kbdint_server

    work = tmp_path / "kbdint-home"
    work.mkdir()
    server = start_kbdint_server(f"{secrets.randbelow(10**6):06d}", work,
                                 state_dir=tmp_path / "kbdint-state")
    try:
        yield server
    finally:
        server.stop()
