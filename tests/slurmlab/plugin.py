"""pytest plugin: a real multi-node Slurm cluster on this machine.

Enable it with ``pytest_plugins = ["tests.slurmlab.plugin"]`` in the top-level
conftest, or ``-p tests.slurmlab.plugin`` on the command line.

The session fixture ``slurm_lab`` brings the cluster up with ``lab.sh up``
(four nodes n1..n4 on 127.0.0.1, partition ``gpu``, 4 fake GPUs per node,
topology leaf1=n[1-2], leaf2=n[3-4]) and yields a :class:`SlurmLab`.  A lab that
is already up (``tests/slurmlab/lab.sh up`` run by hand) is reused and left
running; a lab this fixture started is torn down at the end of the session
unless ``CLUSTERCTL_LAB_KEEP=1``.  With pytest-xdist, start the lab before the
run (``tests/slurmlab/lab.sh up``) so that the workers share it.

``CLUSTERCTL_LAB_DIR`` (state dir, default /tmp/clusterctl-slurmlab) and
``CLUSTERCTL_LAB_CTLD_PORT`` / ``CLUSTERCTL_LAB_SLURMD_PORT`` (16817 / 16901)
select another lab.

When the lab cannot be started (not root, packages cannot be installed, ...)
tests using the fixture are skipped with the reason, or fail when the ``CI``
environment variable is set.

Only the standard library and pytest are used here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest

LAB_SH = Path(__file__).resolve().with_name("lab.sh")
DEFAULT_STATE_DIR = "/tmp/clusterctl-slurmlab"
NODES = ("n1", "n2", "n3", "n4")

# Job states in which a job has not finished yet.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)

# Variables that make Slurm clients talk to another cluster or job.
_SLURM_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: needs the real Slurm test cluster")


class LabCommandError(subprocess.CalledProcessError):
    """A command run through :meth:`SlurmLab.run` failed; shows its output."""

    def __str__(self) -> str:
        text = super().__str__()
        for name, data in (("stdout", self.stdout), ("stderr", self.stderr)):
            if data:
                if isinstance(data, bytes):
                    data = data.decode(errors="replace")
                text += f"\n--- {name} ---\n{data.rstrip()}"
        return text


@dataclass(frozen=True)
class JobResult:
    """Final state of a job, as reported by squeue --json or scontrol."""

    job_id: int
    state: str
    exit_code: int | None
    signal: int | None = None
    nodes: str | None = None
    info: Mapping[str, Any] = field(default_factory=dict, repr=False)

    # Allows ``state, code = wait_job(...)``.
    def __iter__(self):
        return iter((self.state, self.exit_code))


@dataclass
class SlurmLab:
    """A running lab: environment, paths and a command helper."""

    env: dict[str, str]
    conf: str
    nodes: list[str]
    state_dir: str
    started_here: bool = False

    def run(
        self, args: Sequence[str] | str, **kw: Any
    ) -> subprocess.CompletedProcess:
        """Run a command (list, or a string split like a shell would) with the
        lab's environment.  Defaults: capture text output, ``check=True``
        (raising :class:`LabCommandError` with the output), 120 s timeout."""
        if isinstance(args, str):
            args = shlex.split(args)
        kw.setdefault("env", self.env)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        check = kw.pop("check", True)
        proc = subprocess.run(list(args), **kw)
        if check and proc.returncode != 0:
            raise LabCommandError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc

    def sbatch(self, *args: str) -> int:
        """Submit with ``sbatch --parsable ARGS`` and return the job id."""
        out = self.run(["sbatch", "--parsable", *args]).stdout.strip()
        return int(out.split(";")[0])

    def wait_job(self, job_id: int | str, timeout: float = 60) -> JobResult:
        return wait_job(self, job_id, timeout)

    def show_job(self, job_id: int | str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict ({} if the job is unknown)."""
        proc = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        if proc.returncode != 0:
            return {}
        return _parse_scontrol(proc.stdout)

    def kill_node(self, node: str) -> float:
        """Lose ``node`` for real (``lab.sh kill-node``: SIGKILL its slurmd, its
        slurmstepds and its job processes); returns when it was killed (epoch
        seconds).  slurmctld marks it DOWN about 25 s later.  Always pair with
        :meth:`revive`, in a ``finally``."""
        out = _lab_sh("kill-node", self.env, timeout=60, args=[node])
        if out.returncode != 0:
            raise LabCommandError(out.returncode, out.args, out.stdout, out.stderr)
        found = re.search(r" at ([0-9.]+) \(epoch s\)", out.stdout)
        return float(found.group(1)) if found else time.time()

    def revive(self, node: str) -> None:
        """Bring a node lost with :meth:`kill_node` back (``lab.sh revive``)."""
        out = _lab_sh("revive", self.env, timeout=90, args=[node])
        if out.returncode != 0:
            raise LabCommandError(out.returncode, out.args, out.stdout, out.stderr)


def lab_env(state_dir: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default os.environ) without inherited Slurm job/client
    variables, plus SLURM_CONF of the lab."""
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith(_SLURM_ENV_PREFIXES)
    }
    env["SLURM_CONF"] = os.path.join(state_dir, "slurm.conf")
    env["CLUSTERCTL_LAB_DIR"] = state_dir
    return env


# ---------------------------------------------------------------- job polling

_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def _parse_scontrol(line: str) -> dict[str, str]:
    """Parse one ``scontrol show -o`` line (values may contain spaces, e.g.
    Command= or Comment=, so split on the ``Key=`` tokens)."""
    line = line.strip()
    matches = list(_SCONTROL_KEY.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def _job_from_squeue_json(lab: SlurmLab, job_id: int) -> dict[str, Any] | None:
    # squeue --json in 22.05 ignores -j/-t: filter here.
    proc = lab.run(["squeue", "--json"], check=False, timeout=30)
    if proc.returncode != 0:
        return None
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        return None
    for job in data.get("jobs", []):
        if int(job.get("job_id", -1)) == job_id:
            return job
    return None


def _result_from_json(job_id: int, job: Mapping[str, Any]) -> JobResult:
    state = str(job.get("job_state", "UNKNOWN")).upper()
    status = job.get("exit_code")
    code = sig = None
    if isinstance(status, int):
        # 22.05 (openapi v0.0.38) reports the raw wait() status: 768 = exit 3.
        if status & 0x7F:
            sig = status & 0x7F
        else:
            code = (status >> 8) & 0xFF
    elif isinstance(status, Mapping):  # newer Slurm: {"return_code": .., "signal": ..}
        rc = status.get("return_code")
        code = rc.get("number") if isinstance(rc, Mapping) else rc
        s = status.get("signal", {})
        sig = s.get("id") if isinstance(s, Mapping) else s
    return JobResult(job_id, state, code, sig or None, job.get("nodes"), dict(job))


def _result_from_scontrol(job_id: int, info: Mapping[str, str]) -> JobResult:
    state = info.get("JobState", "UNKNOWN").upper()
    code = sig = None
    m = re.fullmatch(r"(\d+):(\d+)", info.get("ExitCode", ""))
    if m:
        code, sig = int(m.group(1)), int(m.group(2))
    return JobResult(job_id, state, code, sig or None, info.get("NodeList"), dict(info))


def job_state(lab: SlurmLab, job_id: int | str) -> JobResult | None:
    """Current state of a job, or None if Slurm does not know it."""
    jid = int(str(job_id).split(";")[0])
    job = _job_from_squeue_json(lab, jid)
    if job is not None:
        return _result_from_json(jid, job)
    info = lab.show_job(jid)
    if info:
        return _result_from_scontrol(jid, info)
    return None


def wait_job(lab: SlurmLab, job_id: int | str, timeout: float = 60) -> JobResult:
    """Poll until the job is no longer pending/running/completing and return
    its final :class:`JobResult` (``state, exit_code = wait_job(...)`` works).

    Finished jobs stay visible for MinJobAge=600 s in the lab.  Raises
    TimeoutError with the last scontrol record after ``timeout`` seconds."""
    jid = int(str(job_id).split(";")[0])
    deadline = time.monotonic() + timeout
    delay = 0.2
    last: JobResult | None = None
    while True:
        last = job_state(lab, jid)
        if last is not None and last.state not in ACTIVE_STATES:
            return last
        if time.monotonic() >= deadline:
            detail = lab.run(["scontrol", "show", "job", str(jid)], check=False)
            raise TimeoutError(
                f"job {jid} still {last.state if last else 'unknown'} after {timeout} s\n"
                f"{detail.stdout}{detail.stderr}"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


# ---------------------------------------------------------------- fixture


def _lab_sh(
    cmd: str, env: Mapping[str, str], timeout: float, args: Sequence[str] = ()
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(LAB_SH), cmd, *args],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"Slurm test cluster unavailable (CI is set): {reason}", pytrace=False)
    pytest.skip(f"Slurm test cluster unavailable: {reason}")


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@pytest.fixture(scope="session")
def slurm_lab() -> Any:
    """The real Slurm test cluster (see module docstring)."""
    state_dir = os.path.abspath(os.environ.get("CLUSTERCTL_LAB_DIR") or DEFAULT_STATE_DIR)
    env = lab_env(state_dir)

    if not sys.platform.startswith("linux"):
        _unavailable(f"needs Linux, this is {sys.platform}")
    if not LAB_SH.is_file():
        _unavailable(f"{LAB_SH} is missing")

    status = _lab_sh("status", env, timeout=60)
    started_here = False
    if status.returncode != 0:
        if os.geteuid() != 0:
            _unavailable("lab.sh up needs root (it installs packages and runs slurmd)")
        try:
            up = _lab_sh("up", env, timeout=900)
        except subprocess.TimeoutExpired:
            _unavailable("lab.sh up did not finish within 900 s")
        if up.returncode != 0:
            _unavailable(
                f"lab.sh up failed (exit {up.returncode}):\n"
                + _tail(up.stdout + "\n" + up.stderr)
            )
        # Another session may have brought it up while we waited for its lock.
        started_here = "already up" not in up.stdout

    lab = SlurmLab(
        env=env,
        conf=env["SLURM_CONF"],
        nodes=list(NODES),
        state_dir=state_dir,
        started_here=started_here,
    )
    try:
        yield lab
    finally:
        if lab.started_here and os.environ.get("CLUSTERCTL_LAB_KEEP") != "1":
            down = _lab_sh("down", env, timeout=120)
            if down.returncode != 0:
                sys.stderr.write(
                    "slurmlab: lab.sh down failed:\n" + down.stdout + down.stderr
                )
