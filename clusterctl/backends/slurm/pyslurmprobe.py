"""Whether pyslurm can be used in this process, found out without risking the process.

`import pyslurm` initialises libslurm, which calls `fatal()` (the process exits 1,
no exception) when it finds no usable slurm.conf; a pyslurm built for another Slurm
release fails to load or misreads its RPCs. So, in order: pyslurm installed (package
metadata, nothing imported), a slurm.conf readable, pyslurm's major.minor equal to
`scontrol --version`'s (22.5.x goes with 22.05.x), and `import pyslurm` tried once in
a child process. Only then does pyslurmquery import it here. The answer is cached
per process and per slurm.conf, and on disk ($XDG_CACHE_HOME/clusterctl, keyed by the
slurm.conf, pyslurm's version, the scontrol binary and the interpreter, each with its
mtime): the child's import costs ~0.3 s, more than pyslurm saves a `status` of 1,000
jobs, and must not be paid by every command. A process that has loaded pyslurm for
one slurm.conf does not use it for another (libslurm reads its configuration once).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from clusterctl.syntax.slurmrelease import major_minor

DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
PROBE_TIMEOUT_S = 30.0
INSTALL_HINT = "pip install ../shared/vendor/pyslurm/pyslurm-22.5.3-*.whl (the `pyslurm` extra; see docs/admin/pyslurm.md)"

loaded_conf: str | None = None
"""The slurm.conf pyslurm was imported with in this process (set by pyslurmquery)."""


def slurm_conf() -> Path | None:
    """The slurm.conf libslurm would read (SLURM_CONF, else /etc/slurm/slurm.conf), if it is a readable file."""
    path = Path(os.environ.get("SLURM_CONF") or DEFAULT_CONF)
    return path if path.is_file() and os.access(path, os.R_OK) else None


def installed_version() -> str | None:
    """pyslurm's version from its package metadata, without importing it."""
    try:
        return metadata.version("pyslurm")
    except metadata.PackageNotFoundError:
        return None


def problem() -> str | None:
    """Why pyslurm cannot be used here, or None when it can."""
    version = installed_version()
    if version is None:
        return f"pyslurm is not installed ({INSTALL_HINT})"
    conf = slurm_conf()
    if conf is None:
        where = f"SLURM_CONF={os.environ['SLURM_CONF']}" if os.environ.get("SLURM_CONF") else str(DEFAULT_CONF)
        return f"no readable slurm.conf ({where}); importing pyslurm without one ends the process"
    if loaded_conf is not None and loaded_conf != str(conf):
        return f"pyslurm was loaded in this process for {loaded_conf}, not {conf}"
    return _probe(str(conf), version, os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=8)
def _probe(conf: str, version: str, path: str) -> str | None:
    key = _cache_key(conf, version, path)
    cache = _cache_file()
    try:
        stored = json.loads(cache.read_text())
        if stored.get("key") == key:
            return stored.get("problem")
    except (OSError, ValueError, AttributeError):
        pass
    problem, lasting = _probe_now(conf, version, path)
    if lasting and key is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
            tmp.write_text(json.dumps({"key": key, "problem": problem}))
            tmp.replace(cache)
        except OSError:
            pass  # an unwritable cache only costs the probe again
    return problem


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clusterctl" / "pyslurm-probe.json"


def _cache_key(conf: str, version: str, path: str) -> list[object] | None:
    """What the probe's answer depends on; None (no caching) when something cannot be looked at."""
    scontrol = shutil.which("scontrol", path=path)
    try:
        stats = [os.stat(p) for p in (conf, scontrol or "", sys.executable)]
    except OSError:
        return None
    return [conf, version, scontrol, sys.executable, [[s.st_mtime_ns, s.st_size, s.st_ino] for s in stats]]


def _probe_now(conf: str, version: str, path: str) -> tuple[str | None, bool]:
    """(the problem or None, whether the answer lasts: a timeout may not)."""
    slurm = _scontrol_version(conf, path)
    if slurm is None:
        return "scontrol --version did not answer: the running Slurm's release is unknown", False
    if major_minor(version) != major_minor(slurm):
        return f"pyslurm {version} does not match {slurm.strip()} (pyslurm's major.minor must equal Slurm's)", True
    env = {**os.environ, "SLURM_CONF": conf}
    code = "import sys, pyslurm; sys.stdout.write(pyslurm.__version__)"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"import pyslurm did not finish in a child process: {exc}", False
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"import pyslurm fails here (exit {proc.returncode}): {last}", True
    if major_minor(proc.stdout) != major_minor(slurm):
        return f"pyslurm reports {proc.stdout.strip()!r}, which does not match {slurm.strip()}", True
    return None, True


def _scontrol_version(conf: str, path: str) -> str | None:
    return scontrol_version({**os.environ, "SLURM_CONF": conf, "PATH": path})


def scontrol_version(env: dict[str, str] | None = None, run: Callable[..., Any] = subprocess.run) -> str | None:
    """What `scontrol --version` prints ("slurm 24.05.3"), or None when it does not answer with a release
    (no Slurm here, or no configuration it can reach: scontrol then exits non-zero)."""
    try:
        proc = run(["scontrol", "--version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 and major_minor(proc.stdout) else None
