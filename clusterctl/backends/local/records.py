"""The state directory of the emulated Slurm: job ids, job records, requests.

    <state>/
      next_job_id            the counter (read-modify-write under an fcntl lock)
      lock                   that lock
      jobs/<id>/
        job.json             the submission (immutable): request, script, env, ...
        script               the batch script as submitted (Slurm runs a copy too)
        state.json           the job's state (the supervisor writes it; scontrol
                             update edits ExcNodeList under jobs/<id>/lock)
        requests/            cancel / requeue requests for the supervisor
        steps/               one file per running srun step (pid, process group)
        supervisor.log       the supervisor's own messages
      nodes/<name>.json      an emulated node that is DOWN (scontrol update
                             NodeName=X State=DOWN Reason=...): its reason and
                             time; State=RESUME removes it

Every JSON file is replaced atomically, so readers never need the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from clusterctl.backends.local import (
    BIN_DIR,
    DEFAULT_NODES,
    DEFAULT_PARTITION,
    DEFAULT_STATE,
    NODES_ENV,
    REQUEUE_DELAY_ENV,
    REQUEUE_DELAY_S,
    STATE_ENV,
    SUPERVISOR_MODULE,
    TIME_SCALE_ENV,
)
from clusterctl.backends.local.batchopts import OptionError, Request, parse_request
from clusterctl.syntax.hostlist import HostlistError, expand

FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
SHORT_STATE = {
    "PENDING": "PD", "RUNNING": "R", "COMPLETING": "CG", "COMPLETED": "CD", "FAILED": "F",
    "CANCELLED": "CA", "TIMEOUT": "TO", "NODE_FAIL": "NF", "REQUEUED": "RQ",
}


class SubmitError(Exception):
    """sbatch's refusal, in Slurm's words where Slurm has words for it."""


def state_root(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get(STATE_ENV) or DEFAULT_STATE).expanduser().absolute()


def job_dir(root: Path, job_id: int | str) -> Path:
    return root / "jobs" / str(job_id)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, data: Any) -> None:
    """Atomically, owner-only: job.json holds the job's whole environment."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive fcntl lock on `path` (created if needed)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def next_counter(directory: Path, name: str, first: int) -> int:
    """Increment the counter file directory/name under a lock and return the new value."""
    with locked(directory / f"{name}.lock"):
        path = directory / name
        try:
            value = int(path.read_text().strip() or first - 1) + 1
        except FileNotFoundError:
            value = first
        path.write_text(f"{value}\n")
        return value


def user_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def proc_stat(pid: int) -> tuple[str, int, str] | None:
    """(state letter, parent pid, start time) from /proc/PID/stat, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return fields[0].decode(), int(fields[1]), fields[19].decode()


def alive(pid: int | None, start: str | None = None) -> bool:
    """The process exists, is not a zombie and (when given) started at `start`."""
    if not pid:
        return False
    stat = proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return start is None or stat[2] == start


class JobRecord:
    """One job's directory."""

    def __init__(self, root: Path, job_id: int | str) -> None:
        self.root = root
        self.job_id = int(job_id)
        self.path = job_dir(root, job_id)

    def exists(self) -> bool:
        return (self.path / "job.json").is_file()

    @property
    def spec(self) -> dict:
        return read_json(self.path / "job.json")

    @property
    def request(self) -> Request:
        return Request.from_dict(self.spec["request"])

    def state(self) -> dict:
        return read_json(self.path / "state.json")

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        with locked(self.path / "lock"):
            yield

    def update(self, **fields: Any) -> dict:
        """Merge fields into state.json under the job's lock; returns the new state."""
        with self.lock():
            state = self.state()
            state.update(fields)
            write_json(self.path / "state.json", state)
            return state

    def post(self, op: str, **fields: Any) -> None:
        """Leave a request (cancel, requeue) for the supervisor."""
        requests = self.path / "requests"
        requests.mkdir(exist_ok=True)
        name = f"{time.time_ns():020d}-{os.getpid()}"
        write_json(requests / f".{name}", {"op": op, **fields})
        os.replace(requests / f".{name}", requests / f"{name}.json")

    def take_requests(self) -> list[dict]:
        requests = self.path / "requests"
        out = []
        try:
            names = sorted(n for n in os.listdir(requests) if n.endswith(".json"))
        except FileNotFoundError:
            return out
        for name in names:
            with contextlib.suppress(OSError, ValueError):
                out.append(read_json(requests / name))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(requests / name)
        return out

    def steps(self) -> list[dict]:
        found = []
        for path in sorted((self.path / "steps").glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                found.append(read_json(path))
        return found

    def supervisor_alive(self, state: dict | None = None) -> bool:
        state = self.state() if state is None else state
        return alive(state.get("supervisor_pid"), state.get("supervisor_start"))

    def effective_state(self) -> dict:
        """state.json, with a job whose supervisor vanished shown as NODE_FAIL (none yet: it is starting)."""
        state = self.state()
        if state["state"] not in FINISHED and state.get("supervisor_pid") and not self.supervisor_alive(state):
            state = dict(state, state="NODE_FAIL", reason="SupervisorLost")
        return state


def down_nodes(root: Path) -> dict[str, dict]:
    """The emulated nodes that are DOWN: name -> {"reason", "time"}."""
    try:
        names = [n for n in os.listdir(root / "nodes") if n.endswith(".json")]
    except FileNotFoundError:
        return {}
    out = {}
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            out[name[: -len(".json")]] = read_json(root / "nodes" / name)
    return out


def set_node_down(root: Path, node: str, reason: str) -> None:
    (root / "nodes").mkdir(parents=True, exist_ok=True)
    write_json(root / "nodes" / f"{node}.json", {"state": "DOWN", "reason": reason, "time": time.time()})


def resume_node(root: Path, node: str) -> bool:
    """Bring a DOWN node back; False when it was not down."""
    try:
        os.unlink(root / "nodes" / f"{node}.json")
    except FileNotFoundError:
        return False
    return True


def list_jobs(root: Path) -> list[JobRecord]:
    try:
        ids = sorted(int(name) for name in os.listdir(root / "jobs") if name.isdigit())
    except FileNotFoundError:
        return []
    return [JobRecord(root, i) for i in ids]


def inventory(env: Mapping[str, str]) -> list[str]:
    text = env.get(NODES_ENV) or DEFAULT_NODES
    try:
        nodes = expand(text)
    except HostlistError as exc:
        raise SubmitError(f"{NODES_ENV}: {exc}") from None
    if not nodes or len(set(nodes)) != len(nodes):
        raise SubmitError(f"{NODES_ENV}={text!r}: expected distinct node names")
    return nodes


def env_seconds(env: Mapping[str, str], name: str, default: float, minimum: float) -> float:
    """A number of seconds from the environment, at least `minimum`."""
    text = env.get(name) or str(default)
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= minimum or value == float("inf"):
        raise SubmitError(f"{name}={text!r}: expected a number of seconds of at least {minimum:g}")
    return value


def job_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a job inherits (sbatch --export=ALL), without a calling job's own SLURM_* variables."""
    out = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SLURMD_", "SRUN_"))}
    path = [p for p in out.get("PATH", "").split(os.pathsep) if p and Path(p) != BIN_DIR]
    out["PATH"] = os.pathsep.join(path) or os.defpath
    return out


def validate(request: Request, nodes: list[str], root: Path) -> None:
    unknown = [n for n in request.exclude + request.nodelist if n not in nodes]
    if unknown:
        raise SubmitError(f"Invalid node name specified: {', '.join(unknown)} (emulated nodes: {', '.join(nodes)})")
    overlap = set(request.exclude) & set(request.nodelist)
    if overlap:
        raise SubmitError(
            f"Requested node configuration is not available: {', '.join(sorted(overlap))} both required and excluded"
        )
    usable = len(nodes) - len(set(request.exclude))
    if request.nodes > usable or len(request.nodelist) > request.nodes:
        raise SubmitError(
            f"Requested node configuration is not available: {request.nodes} nodes requested, "
            f"{usable} emulated nodes usable ({NODES_ENV} sets them)"
        )
    if request.ntasks is not None and request.ntasks < request.nodes:
        raise SubmitError(f"--ntasks={request.ntasks} is less than --nodes={request.nodes}")
    for _, dep in request.dependency:
        if not JobRecord(root, dep).exists():
            raise SubmitError(f"Job dependency problem: job {dep} does not exist")


def submit(
    script: Path,
    workdir: Path,
    *,
    options: list[str] | None = None,
    script_args: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    umask: int | None = None,
) -> int:
    """Create the job record and start its supervisor; returns the job id at once. The job runs with `umask`
    (else the submitting process's), as sbatch hands its own to the job."""
    env = dict(os.environ if env is None else env)
    try:
        text = Path(script).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise SubmitError(f"Unable to open file {script}: {exc.strerror}") from None
    if not text.startswith("#!"):
        raise SubmitError(
            "This does not look like a batch script.  The first line must start with #! followed by the path to an interpreter."
        )
    try:
        request = parse_request(text, list(options or []))
    except OptionError as exc:
        raise SubmitError(str(exc)) from None
    nodes = inventory(env)
    scale = env_seconds(env, TIME_SCALE_ENV, 1.0, 1e-3)  # real seconds per emulated second
    requeue_delay = env_seconds(env, REQUEUE_DELAY_ENV, REQUEUE_DELAY_S, 0.0)
    root = state_root(env)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    (root / "jobs").mkdir(exist_ok=True)
    validate(request, nodes, root)
    if request.chdir:
        workdir = Path(workdir) / request.chdir
    job_id = next_counter(root, "next_job_id", 1)
    record = JobRecord(root, job_id)
    record.path.mkdir(parents=True)
    (record.path / "requests").mkdir()
    (record.path / "steps").mkdir()
    shutil.copyfile(script, record.path / "script")
    now = time.time()
    python = python or sys.executable
    write_json(record.path / "job.json", {
        "job_id": job_id,
        "name": request.name or Path(script).name,
        "script": str(Path(script).absolute()),
        "script_args": list(script_args or []),
        "workdir": str(Path(workdir).absolute()),
        "python": python,
        "env": job_environment(env),
        "inventory": nodes,
        "time_scale": scale,
        "requeue_delay": requeue_delay,
        "request": request.as_dict(),
        "partition": request.partition or DEFAULT_PARTITION,
        "user": user_name(),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "submit_host": socket.gethostname().split(".")[0],
        "submit_time": now,
        "umask": current_umask() if umask is None else umask,  # the job's, as sbatch hands its own on (SLURM_UMASK)
    })
    write_json(record.path / "state.json", {
        "state": "PENDING",
        "reason": "Dependency" if request.dependency else "None",
        "restarts": 0,
        "exc_nodes": list(request.exclude),
        "nodes": [],
        "eligible_time": now,
        "exit_code": [0, 0],
    })
    start_supervisor(record, python, env)
    return job_id


def start_supervisor(record: JobRecord, python: str, env: Mapping[str, str]) -> None:
    """Start the job's supervisor, detached: its pid is in state.json before this returns."""
    with open(record.path / "supervisor.log", "ab") as log:
        out = subprocess.run(
            [python, "-m", SUPERVISOR_MODULE, "--detach", str(record.path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=record.path,
            env=dict(env), start_new_session=True, timeout=60, check=False, umask=record.spec.get("umask", -1),
        )
    if out.returncode != 0:
        record.update(state="FAILED", reason="SupervisorStartFailed", exit_code=[1, 0], end_time=time.time())
        raise SubmitError(f"the job's supervisor did not start (see {record.path / 'supervisor.log'})")

